"""The lab's toy models and tasks, with the outlier knob (the sinks).

Public: ToyMLP (notebook 06's MLP), TinyTransformer, SinkChannels (the sinks: a constant in a few channels of
every token, of a few tokens, or both: PLACEMENTS), make_model, MODELS, TeacherTask, MarkovTask. All generated
from a seed, float32 on the CPU whatever torch.set_default_dtype or set_default_device says (the lab's numbers,
as fp8lab.data's). The next layer's weights for the sink channels are held at zero: fp32 never sees the sinks,
while the scales of that layer's input do."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab.data.synthetic import FLOAT32_CPU

__all__ = ["CHANNEL_LAYOUTS", "MODELS", "PLACEMENTS", "SINK_TOKENS", "MarkovTask", "SinkChannels", "TeacherTask",
           "TinyTransformer", "ToyMLP", "make_model"]

MODELS = ("mlp", "transformer")

# ---- the sinks -----------------------------------------------------------------------------------

# where the sinks sit in h[..., T, C] (T: the tokens, C: the channels)
#   "channels": `count` channels of every token (LLM.int8()'s outlier features, arXiv 2208.07339)
#   "tokens":   the same `count` channels of the first `tokens` tokens only (massive activations, arXiv
#               2402.17762: "two fixed feature dimensions" of "the starting token, and the first period (.) or
#               newline token"); the tokens are the first rows of the MLP's batch (its rows are the tokens a
#               linear layer sees) and the first positions of each of the transformer's sequences
#   "both":     channel sinks in `count` channels, and token sinks in `count` other channels
PLACEMENTS = ("channels", "tokens", "both")
CHANNEL_LAYOUTS = ("adjacent", "spread")  # which channels: 0..count-1 (one block), or drawn at random
SINK_TOKENS = 2  # tokens holding token sinks: the starting token and one more, as Sun et al. find two


class SinkChannels(nn.Module):
    """Set the sink positions of h[..., T, C] to `magnitude` (0 disables); `placement` says where (PLACEMENTS).

    h[..., index] = magnitude for channel sinks (every token); h[..., :tokens, token_index] = magnitude for
    token sinks (the first `tokens` tokens). `index` holds every sink channel (what the next layer's weights
    zero). channel_layout "adjacent": channels 0.. in order (they share one 16/32/128-wide block); "spread":
    drawn at random (they land in different blocks).
    """

    def __init__(self, channels: int, count: int = 4, magnitude: float = 0.0, seed: int = 1234,
                 channel_layout: str = "adjacent", placement: str = "channels", tokens: int = SINK_TOKENS) -> None:
        super().__init__()
        if channel_layout not in CHANNEL_LAYOUTS:
            raise ValueError(f"unknown channel_layout {channel_layout!r}; valid: {', '.join(CHANNEL_LAYOUTS)}")
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; valid: {', '.join(PLACEMENTS)}")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"tokens is how many tokens hold token sinks, an int >= 1, got {tokens!r}")
        n = 2 * count if placement == "both" else count
        if channel_layout == "adjacent":
            chosen = torch.arange(n, device="cpu")
        else:
            chosen = torch.randperm(channels, generator=torch.Generator().manual_seed(seed), device="cpu")[:n]
        column = chosen[:count].sort().values if placement != "tokens" else chosen[:0]
        token = chosen[n - count:].sort().values if placement != "channels" else chosen[:0]
        self.register_buffer("index", chosen.sort().values)  # every sink channel
        self.register_buffer("channel_index", column)  # sinks in every token
        self.register_buffer("token_index", token)  # sinks in the first `tokens` tokens only
        self.magnitude = float(magnitude)
        self.placement, self.tokens = placement, tokens

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.magnitude == 0:
            return h
        h = h.clone()
        h[..., self.channel_index] = self.magnitude
        h[..., : self.tokens, self.token_index] = self.magnitude  # (..., T, C): the first tokens only
        return h

    def mask(self, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        """A bool tensor of h's `shape` (..., T, C): True where forward writes the sinks (whatever the magnitude)."""
        out = torch.zeros(shape, dtype=torch.bool, device=self.index.device)
        out[..., self.channel_index] = True
        out[..., : self.tokens, self.token_index] = True
        return out


class ToyMLP(nn.Module):
    """in -> hidden -> hidden -> out with GELU, sinks after the first layer, and a gain.

    Its rows are the tokens fc2 sees: "tokens" sinks sit in the first rows of each batch.

    gain: the input is multiplied by it and fc1's output divided by it (fc1 has no bias;
    b1 is added after): exact arithmetic does not notice, an FP8 cast of fc1's input does.
    fc2's weight columns for the sink channels are zero and stay zero (see `project`).
    """

    def __init__(self, in_dim: int = 256, hidden: int = 1024, out_dim: int = 8, sinks: int = 4,
                 sink_magnitude: float = 0.0, placement: str = "channels", channel_layout: str = "adjacent") -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden, bias=False, **FLOAT32_CPU)
        self.b1 = nn.Parameter(torch.zeros(hidden, **FLOAT32_CPU))
        self.sink = SinkChannels(hidden, sinks, sink_magnitude, channel_layout=channel_layout, placement=placement)
        self.fc2 = nn.Linear(hidden, hidden, **FLOAT32_CPU)
        self.fc3 = nn.Linear(hidden, out_dim, **FLOAT32_CPU)
        self.gain = 1.0
        self.project()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x * self.gain) / self.gain + self.b1)
        h = self.sink(h)
        h = F.gelu(self.fc2(h))
        return self.fc3(h)

    @torch.no_grad()
    def project(self) -> None:
        """Hold fc2's weights for the sink channels at zero (call after each optimizer step)."""
        self.fc2.weight[:, self.sink.index] = 0


class Block(nn.Module):
    def __init__(self, d: int, heads: int, sinks: int, sink_magnitude: float, seed: int,
                 channel_layout: str = "adjacent", placement: str = "channels") -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d, **FLOAT32_CPU)
        self.qkv = nn.Linear(d, 3 * d, **FLOAT32_CPU)
        self.proj = nn.Linear(d, d, **FLOAT32_CPU)
        self.norm2 = nn.LayerNorm(d, **FLOAT32_CPU)
        self.up = nn.Linear(d, 4 * d, **FLOAT32_CPU)
        self.sink = SinkChannels(4 * d, sinks, sink_magnitude, seed, channel_layout, placement)
        self.down = nn.Linear(4 * d, d, **FLOAT32_CPU)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)  # (B, T, D) each
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D/H)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # attention stays in high precision
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        h = self.sink(F.gelu(self.up(self.norm2(x))))  # (B, T, 4D)
        return x + self.down(h)


class TinyTransformer(nn.Module):
    """A 2-layer decoder (width 128, 4 heads) for next-token prediction; sinks in each MLP ("tokens"
    sinks at the first positions of each sequence).

    An FP8 GEMM's cost of quantizing grows with its operands (M*K + K*N) and its work with
    M*K*N, so the narrower a toy, the more emulation overhead it shows: bench train also
    measures it at d=64.
    """

    def __init__(self, vocab: int = 64, d: int = 128, layers: int = 2, heads: int = 4, seq: int = 32,
                 sinks: int = 4, sink_magnitude: float = 0.0, placement: str = "channels",
                 channel_layout: str = "adjacent") -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d, **FLOAT32_CPU)
        self.pos = nn.Parameter(torch.randn(seq, d, **FLOAT32_CPU) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, sinks, sink_magnitude, 1234 + i, channel_layout, placement)
                                    for i in range(layers))
        self.norm = nn.LayerNorm(d, **FLOAT32_CPU)
        self.head = nn.Linear(d, vocab, **FLOAT32_CPU)
        self.project()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    @torch.no_grad()
    def project(self) -> None:
        """Hold each block's `down` weights for its sink channels at zero (after each optimizer
        step). Under FSDP2 the weight is a DTensor sharded by rows: each rank zeroes the
        columns of the rows it holds (its local shard), which is all of them together."""
        for block in self.blocks:
            w = block.down.weight
            local = w.to_local() if hasattr(w, "to_local") else w
            local[:, block.sink.index] = 0


def make_model(kind: str = "mlp", seed: int = 0, sink_magnitude: float = 0.0, **kw) -> nn.Module:
    """A toy model with deterministic initial weights: the same `seed`, the same weights.

    torch's layers draw their initial weights from the global generator; they do so here inside
    torch.random.fork_rng with that generator seeded, so the caller's random state is left as it
    was (building a model does not reseed anyone else's randomness)."""
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; valid: {', '.join(MODELS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "mlp":
            return ToyMLP(sink_magnitude=sink_magnitude, **kw)
        return TinyTransformer(sink_magnitude=sink_magnitude, **kw)


# ---- tasks ---------------------------------------------------------------------------------------


class TeacherTask:
    """Regression on a fixed random teacher: y = W2 tanh(W1 x), x ~ N(0, 1). MSE loss."""

    def __init__(self, in_dim: int = 256, out_dim: int = 8, hidden: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(10_000 + seed)
        self.w1 = torch.randn(hidden, in_dim, generator=g, **FLOAT32_CPU) / math.sqrt(in_dim)
        self.w2 = torch.randn(out_dim, hidden, generator=g, **FLOAT32_CPU) / math.sqrt(hidden)
        self.in_dim = in_dim

    def batch(self, g: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(size, self.in_dim, generator=g, **FLOAT32_CPU)
        return x, torch.tanh(x @ self.w1.t()) @ self.w2.t()

    @staticmethod
    def loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(pred, target)


class MarkovTask:
    """Next-token prediction on sequences from a fixed random sparse Markov chain. Cross-entropy."""

    def __init__(self, vocab: int = 64, seq: int = 32, branching: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(20_000 + seed)
        self.next_tokens = torch.stack([torch.randperm(vocab, generator=g, device="cpu")[:branching]
                                        for _ in range(vocab)])
        self.probs = torch.softmax(torch.randn(vocab, branching, generator=g, **FLOAT32_CPU) * 2, dim=-1)
        self.vocab, self.seq = vocab, seq

    def batch(self, g: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.empty(size, self.seq + 1, dtype=torch.long, device="cpu")
        tokens[:, 0] = torch.randint(self.vocab, (size,), generator=g, device="cpu")
        for t in range(self.seq):
            choice = torch.multinomial(self.probs[tokens[:, t]], 1, generator=g).squeeze(1)
            tokens[:, t + 1] = self.next_tokens[tokens[:, t], choice]
        return tokens[:, :-1], tokens[:, 1:]

    @staticmethod
    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
