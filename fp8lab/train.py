"""Toy models, synthetic data with an outlier knob, and recipes trained side by side.

Public: ToyMLP, TinyTransformer, make_model, TeacherTask, MarkovTask, train, TrainResult,
BASELINES, LESSON (the documented settings of notebook 06), train_step (the one training
step), compare_real_emulated, lesson_table; cliff_sweep and history_sweep (the runs behind
notebook 06's sink cliff and exercises, shipped in fp8lab.measured), steps_to_recover.
Everything is generated in code from a seed: no downloads. Every recipe in one call
starts from the same initial weights and sees the same batches in the same order.
The outlier knob ("sink channels"): a few hidden channels after the first layer are set
to a constant F and the next layer's weights for them are held at zero, so fp32 never
sees them, while every per-tensor scale of that layer's input does - as LLMs' massive
activations and attention sinks do. Notebook 06 is built on this file.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab.gemm import GemmBackend, default_backend
from fp8lab.nn import Monitor, convert
from fp8lab.recipes import Recipe, get_recipe

__all__ = [
    "BASELINES",
    "CLIFF_RUNS",
    "CLIFF_SINKS",
    "HISTORIES",
    "LESSON",
    "MarkovTask",
    "TeacherTask",
    "TinyTransformer",
    "ToyMLP",
    "TrainResult",
    "block_size_recipes",
    "cliff_sweep",
    "compare_real_emulated",
    "delayed_recipes",
    "history_sweep",
    "make_model",
    "steps_to_recover",
    "train",
    "train_step",
]

BASELINES = ("fp32", "bf16")  # high-precision references trained beside the FP8 recipes
MODELS = ("mlp", "transformer")


# ---- models --------------------------------------------------------------------------------------


PLACEMENTS = ("adjacent", "spread")


class SinkChannels(nn.Module):
    """Overwrite `count` channels of h[..., C] with `magnitude` (0 disables): massive activations.

    placement "adjacent": channels 0..count-1 (they share one 16/32/128-wide block);
    "spread": `count` channels drawn at random (they land in different blocks).
    """

    def __init__(self, channels: int, count: int = 4, magnitude: float = 0.0, seed: int = 1234,
                 placement: str = "adjacent") -> None:
        super().__init__()
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; valid: {', '.join(PLACEMENTS)}")
        if placement == "adjacent":
            index = torch.arange(count)
        else:
            index = torch.randperm(channels, generator=torch.Generator().manual_seed(seed))[:count].sort().values
        self.register_buffer("index", index)
        self.magnitude = float(magnitude)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.magnitude == 0:
            return h
        h = h.clone()
        h[..., self.index] = self.magnitude
        return h


class ToyMLP(nn.Module):
    """in -> hidden -> hidden -> out with GELU, sink channels after the first layer, and a gain.

    gain: the input is multiplied by it and fc1's output divided by it (fc1 has no bias;
    b1 is added after): exact arithmetic does not notice, an FP8 cast of fc1's input does.
    fc2's weight columns for the sink channels are zero and stay zero (see `project`).
    """

    def __init__(self, in_dim: int = 256, hidden: int = 1024, out_dim: int = 8, sinks: int = 4,
                 sink_magnitude: float = 0.0, placement: str = "adjacent") -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden, bias=False)
        self.b1 = nn.Parameter(torch.zeros(hidden))
        self.sink = SinkChannels(hidden, sinks, sink_magnitude, placement=placement)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, out_dim)
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
                 placement: str = "adjacent") -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.sink = SinkChannels(4 * d, sinks, sink_magnitude, seed, placement)
        self.down = nn.Linear(4 * d, d)
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
    """A 2-layer decoder (width 128, 4 heads) for next-token prediction; sinks in each MLP.

    An FP8 GEMM's cost of quantizing grows with its operands (M*K + K*N) and its work with
    M*K*N, so the narrower a toy, the more emulation overhead it shows: bench train also
    measures it at d=64.
    """

    def __init__(self, vocab: int = 64, d: int = 128, layers: int = 2, heads: int = 4, seq: int = 32,
                 sinks: int = 4, sink_magnitude: float = 0.0, placement: str = "adjacent") -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, sinks, sink_magnitude, 1234 + i, placement) for i in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
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
        self.w1 = torch.randn(hidden, in_dim, generator=g) / math.sqrt(in_dim)
        self.w2 = torch.randn(out_dim, hidden, generator=g) / math.sqrt(hidden)
        self.in_dim = in_dim

    def batch(self, g: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(size, self.in_dim, generator=g)
        return x, torch.tanh(x @ self.w1.t()) @ self.w2.t()

    @staticmethod
    def loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(pred, target)


class MarkovTask:
    """Next-token prediction on sequences from a fixed random sparse Markov chain. Cross-entropy."""

    def __init__(self, vocab: int = 64, seq: int = 32, branching: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(20_000 + seed)
        self.next_tokens = torch.stack([torch.randperm(vocab, generator=g)[:branching] for _ in range(vocab)])
        self.probs = torch.softmax(torch.randn(vocab, branching, generator=g) * 2, dim=-1)
        self.vocab, self.seq = vocab, seq

    def batch(self, g: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.empty(size, self.seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.vocab, (size,), generator=g)
        for t in range(self.seq):
            choice = torch.multinomial(self.probs[tokens[:, t]], 1, generator=g).squeeze(1)
            tokens[:, t + 1] = self.next_tokens[tokens[:, t], choice]
        return tokens[:, :-1], tokens[:, 1:]

    @staticmethod
    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


# ---- the documented settings ---------------------------------------------------------------------


@dataclass(frozen=True)
class Lesson:
    """The settings of notebook 06 and tests/test_lessons.py (measured numbers: README).

    MLP 256 -> 1024 -> 1024 -> 8, Adam 2e-3, batch 128, 150 steps, teacher task.
    sink_magnitude: 4 adjacent hidden channels set to 1e6 after fc1 (fc2 ignores them).
    gain_drop: fc1's input shrinks 1e5-fold at step 75 (fp32 does not notice).
    """

    steps: int = 150
    batch: int = 128
    lr: float = 2e-3
    sink_magnitude: float = 1e6
    gain_drop: float = 1e-5
    gain_drop_step: int = 75
    short_history: int = 4
    long_history: int = 256

    def gain_schedule(self, step: int) -> float:
        """Input gain: 1 before gain_drop_step, gain_drop after."""
        return 1.0 if step < self.gain_drop_step else self.gain_drop


LESSON = Lesson()


def block_size_recipes(cols: Sequence[int] = (32, 128, 512)) -> list[Recipe]:
    """DeepSeek-style blockwise recipes whose activation and gradient tiles are 1 x cols."""
    from fp8lab.recipes import RECIPES, TensorScaling
    from fp8lab.scaling import PerBlock

    base = RECIPES["blockwise"]
    return [base.replace(name=f"blockwise 1x{c}", input=TensorScaling(base.input.fmt, PerBlock(1, c)),
                         grad_output=TensorScaling(base.grad_output.fmt, PerBlock(1, c))) for c in cols]


def delayed_recipes(lengths: Sequence[int] = (LESSON.short_history, LESSON.long_history),
                    algo: str = "max", margin: int = 0) -> list[Recipe]:
    """The delayed recipe with amax histories of these lengths (and this margin on every role:
    scale = amax_used * 2**margin / fmt.max_value). Named "delayed h{n}" ("... m{margin}" if any)."""
    from fp8lab.recipes import RECIPES, ROLES, DelayedSpec

    base = RECIPES["delayed"]
    roles = {role: replace(getattr(base, role), margin=margin) for role in ROLES} if margin else {}
    suffix = f" m{margin}" if margin else ""
    return [base.replace(name=f"delayed h{n}{suffix}", delayed=DelayedSpec(n, algo), **roles) for n in lengths]


# ---- training ------------------------------------------------------------------------------------


@dataclass
class Run:
    label: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    recipe: Recipe | None
    monitor: Monitor | None
    autocast: bool = False
    stopped: str = ""
    backend: GemmBackend | None = None  # fp8lab FP8 runs: counts which backend each GEMM used


@dataclass
class TrainResult:
    """history: tidy DataFrame (step, run, loss); monitor: per-layer statistics; messages;
    backends: which backend ran each run's GEMMs (run, gemm, backend, reason, calls)."""

    history: object
    monitor: object
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0
    backends: object = None

    def backend_lines(self) -> list[str]:
        """One line per run and backend: which GEMMs ran real or emulated, and why."""
        if self.backends is None or len(self.backends) == 0:
            return []
        lines = []
        for (run, backend, reason), df in self.backends.groupby(["run", "backend", "reason"], sort=False):
            gemms = "/".join(dict.fromkeys(df["gemm"]))
            lines.append(f"{run}: {gemms} {reason.split(': ', 1)[0] if backend != 'fallback' else 'FELL BACK'} "
                         f"({reason.split(': ', 1)[-1]}; {int(df['calls'].sum())} GEMMs)")
        return lines

    def final_loss(self, last: int = 10):
        """Mean loss of each run over its last `last` recorded steps (NaN-stopped runs: inf)."""
        import pandas as pd

        out = {}
        for run, df in self.history.groupby("run", sort=False):
            vals = df["loss"].tail(last)
            out[run] = float(vals.mean()) if vals.notna().all() and len(vals) else math.inf
        return pd.Series(out, name="final loss")


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable, x: torch.Tensor,
               y: torch.Tensor, autocast: bool = False,
               reduce_loss: Callable[[torch.Tensor], float] | None = None) -> float:
    """One training step, the same everywhere in fp8lab (train, compare_real_emulated, the
    benchmarks, the GPU check, fp8lab.distributed, the capstone): forward (bf16 autocast if
    asked), loss_fn(output, y), backward, step, and the toy models' projection (sink-channel
    weights held at zero). Returns the loss; a non-finite loss is returned without stepping,
    so the caller decides what to do.
    reduce_loss(loss) -> the value returned and checked (None: loss.item()); data-parallel
    ranks pass the mean over ranks, so that every rank sees the same value and all stop together."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(model(x).float(), y)
    value = loss.item() if reduce_loss is None else reduce_loss(loss.detach())
    if not math.isfinite(value):
        return value
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if hasattr(model, "project"):
        model.project()
    return value


def _make_runs(recipes: Sequence[str | Recipe], base: nn.Module, lr: float, engine: str, backend: str | GemmBackend,
               monitor_every: int | None, keep_first_last: bool, skip: Sequence[str] | None) -> list[Run]:
    runs = []
    for r in recipes:
        if r in BASELINES:
            model = copy.deepcopy(base)
            runs.append(Run(r, model, torch.optim.Adam(model.parameters(), lr=lr), None, None, autocast=r == "bf16"))
            continue
        recipe = get_recipe(r)
        monitor = Monitor(monitor_every) if monitor_every else None
        gemms = default_backend(backend).fresh() if engine == "fp8lab" else None  # this run's own counts
        model = convert(base, recipe, engine=engine, backend=gemms if gemms is not None else "auto",
                        monitor=monitor if engine == "fp8lab" else None, keep_first_last=keep_first_last, skip=skip)
        label = recipe.name if engine == "fp8lab" else f"{recipe.name} (torchao)"
        runs.append(Run(label, model, torch.optim.Adam(model.parameters(), lr=lr), recipe, monitor, backend=gemms))
    labels = [run.label for run in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"each recipe once, please: got {labels}")
    return runs


def train(
    recipes: Sequence[str | Recipe] = ("fp32", "tensorwise", "blockwise", "mxfp8"),
    model: str = "mlp",
    steps: int = LESSON.steps,
    seed: int = 0,
    sink_magnitude: float = 0.0,
    batch: int | None = None,
    lr: float = LESSON.lr,
    gain_schedule: Callable[[int], float] | None = None,
    callback: Callable[[TrainResult, int], bool | None] | None = None,
    every: int = 10,
    monitor_every: int | None = 10,
    engine: str = "fp8lab",
    backend: str | GemmBackend = "auto",
    keep_first_last: bool = False,
    skip: Sequence[str] | None = None,
    progress: bool = True,
    should_stop: Callable[[], bool] | None = None,
    device: torch.device | str | None = None,
) -> TrainResult:
    """Train one model per recipe, side by side, from the same weights on the same batches.

    recipes: FP8 recipe names (RECIPES, VARIANTS) and/or baselines "fp32", "bf16" (a single
            name or Recipe trains that one).
    batch: default 128 samples for the mlp, 32 sequences (1024 tokens) for the transformer.
    gain_schedule: step -> input gain (ToyMLP only): a mid-run change of activation size.
    keep_first_last / skip: linears kept in high precision (see fp8lab.nn.convert).
    callback(result_so_far, step) runs every `every` steps (live plots); returning False,
    or should_stop() returning True, ends training early. A run whose loss turns NaN/inf
    stops with a message; the others continue. Returns a TrainResult.
    device: where the models train (None: the GPU if there is one, else the CPU); backend:
    "auto" (real FP8 GEMMs where the GPU has the kernel), "emulated", or a GemmBackend.
    TrainResult.backends says which backend each run's GEMMs used.
    """
    import pandas as pd

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; valid: {', '.join(MODELS)}")
    if isinstance(recipes, str | Recipe):  # one recipe, not a sequence of its letters
        recipes = (recipes,)
    if batch is None:  # the transformer's batch holds 32 tokens per sequence
        batch = LESSON.batch if model == "mlp" else LESSON.batch // 4
    if steps < 1 or batch < 1:
        raise ValueError("steps and batch must be positive")
    if gain_schedule is not None and model != "mlp":
        raise ValueError("gain_schedule needs the mlp (its fc1 carries the gain)")
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    base = make_model(model, seed, sink_magnitude).to(device)
    task = TeacherTask(seed=seed) if model == "mlp" else MarkovTask(seed=seed)
    runs = _make_runs(recipes, base, lr, engine, backend, monitor_every, keep_first_last, skip)
    rows: list[dict] = []
    messages: list[str] = []
    result = TrainResult(pd.DataFrame(columns=["step", "run", "loss"]), None, messages)
    data = torch.Generator().manual_seed(1_000 + seed)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"{model}: {', '.join(r.label for r in runs)}", leave=False)
    t0 = time.perf_counter()
    step = 0
    for step in range(steps):
        x, y = task.batch(data, batch)  # one batch, shared by every run (drawn on the CPU: same on any device)
        x, y = x.to(device), y.to(device)
        gain = gain_schedule(step) if gain_schedule is not None else 1.0
        for run in runs:
            if run.stopped:
                continue
            if run.monitor is not None:
                run.monitor.step = step
            if gain_schedule is not None:
                run.model.gain = gain
            value = train_step(run.model, run.optimizer, task.loss, x, y, run.autocast)
            if not math.isfinite(value):
                run.stopped = f"{run.label} stopped at step {step}: loss is {value} (the other runs go on)"
                messages.append(run.stopped)
                rows.append({"step": step, "run": run.label, "loss": math.nan})
                continue
            rows.append({"step": step, "run": run.label, "loss": value})
        if bar is not None:
            bar.update(1)
        if (callback is not None and (step + 1) % every == 0) or step == steps - 1:
            result.history = pd.DataFrame(rows)
            result.monitor = _monitor_frame(runs)
            result.seconds = time.perf_counter() - t0
            if callback is not None and callback(result, step) is False:
                messages.append(f"stopped by the callback at step {step}")
                break
        if should_stop is not None and should_stop():
            messages.append(f"stopped at step {step}")
            break
        if all(run.stopped for run in runs):
            break
    if bar is not None:
        bar.close()
    result.history = pd.DataFrame(rows, columns=["step", "run", "loss"])
    result.monitor = _monitor_frame(runs)
    result.seconds = time.perf_counter() - t0
    result.backends = _backend_frame(runs)
    return result


def _backend_frame(runs: list[Run]):
    import pandas as pd

    rows = [{"run": run.label, **r} for run in runs if run.backend is not None for r in run.backend.report()]
    cols = ["run", "gemm", "backend", "reason", "calls"]
    if not rows:
        return pd.DataFrame(columns=cols)
    return pd.DataFrame(rows).groupby(cols[:-1], sort=False, as_index=False)["calls"].sum()


def _monitor_frame(runs: list[Run]):
    import pandas as pd

    frames = []
    for run in runs:
        if run.monitor is not None and run.monitor.rows:
            df = run.monitor.frame()
            df.insert(0, "run", run.label)
            frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["run", "step", "layer", "gemm", "role", "amax", "scale_max", "scale_min",
                                     "overflow", "underflow"])
    return pd.concat(frames, ignore_index=True)


# ---- on a GPU: real vs emulated -------------------------------------------------------------------------------------


def compare_real_emulated(steps: int = 200, device: torch.device | str = "cuda",
                          recipes: Sequence[str] = ("tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4"),
                          backend: GemmBackend | None = None) -> list[dict]:
    """Train the toy MLP with real and with emulated FP8 GEMMs, side by side: per recipe the
    final losses, the largest loss difference, and which backend ran its GEMMs (fallbacks: GEMMs
    that should have run real, failed and were emulated). backend: default_backend("auto")."""
    real = train(recipes, steps=steps, device=device, backend=backend or "auto", progress=False,
                 monitor_every=None)
    emulated = train(recipes, steps=steps, device=device, backend="emulated", progress=False, monitor_every=None)
    rows = []
    for name in recipes:
        a = real.history[real.history["run"] == name]["loss"].to_numpy()
        b = emulated.history[emulated.history["run"] == name]["loss"].to_numpy()
        used = real.backends[real.backends["run"] == name]
        calls = {k: int(used[used["backend"] == k]["calls"].sum()) for k in ("scaled_mm", "emulated", "fallback")}
        rows.append({"recipe": name, "steps": steps, "final loss real": float(a[-1]),
                     "final loss emulated": float(b[-1]), "max |loss diff|": float(abs(a - b).max()),
                     "real GEMMs": calls["scaled_mm"], "emulated GEMMs": calls["emulated"],
                     "fallbacks": calls["fallback"]})
    return rows


# ---- the lesson table --------------------------------------------------------------------------------


def lesson_table(seeds: Sequence[int] = (0, 1, 2)):
    """Final losses (mean of the last 10 steps) of every FP8 recipe without and with the sink
    channels, and the delayed-scaling drift run: the numbers behind notebook 06 and the README."""
    import pandas as pd

    recipes = ("fp32", "tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4", *block_size_recipes((32, 512)))
    rows = []
    for seed in seeds:
        for magnitude in (0.0, LESSON.sink_magnitude):
            res = train(recipes, seed=seed, sink_magnitude=magnitude, progress=False, monitor_every=None)
            for run, loss in res.final_loss().items():
                rows.append({"seed": seed, "sinks": magnitude, "run": run, "final loss": loss})
        short, long = delayed_recipes()
        res = train(("tensorwise", short, long), seed=seed, gain_schedule=LESSON.gain_schedule, progress=False,
                    monitor_every=None)
        for run, loss in res.final_loss().items():
            rows.append({"seed": seed, "sinks": "input shrinks 1e5x at step 75", "run": run, "final loss": loss})
    df = pd.DataFrame(rows)
    table = df.pivot_table(index="run", columns="sinks", values="final loss", aggfunc="mean", sort=False)
    print(table.to_string(float_format=lambda v: f"{v:.4f}"))
    return df


# ---- the sweeps behind notebook 06's cliff and exercises (shipped in fp8lab.measured) ----------------

CLIFF_SINKS = (0.0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7)
CLIFF_RUNS = ("fp32", "tensorwise", "delayed", "rowwise", "blockwise", "mxfp8", "nvfp4")
HISTORIES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def cliff_sweep(sinks: Sequence[float] = CLIFF_SINKS, seeds: Sequence[int] = (0, 1, 2),
                runs: Sequence[str] = CLIFF_RUNS, steps: int = LESSON.steps, short: int = 30):
    """Final loss against sink magnitude, per recipe (LESSON settings): one row per seed, sink
    magnitude and run, with `loss` (mean of the last 10 of `steps` steps) and `loss_short`
    (mean of steps short-10 .. short-1: what a `short`-step run ends at, since a run's first
    steps do not depend on how many follow)."""
    import pandas as pd

    rows = []
    for seed in seeds:
        for magnitude in sinks:
            res = train(runs, steps=steps, seed=seed, sink_magnitude=magnitude, progress=False, monitor_every=None)
            early = TrainResult(res.history[res.history.step < short], None).final_loss()
            for run, loss in res.final_loss().items():
                rows.append({"seed": seed, "sinks": magnitude, "run": run, "loss": loss,
                             "loss_short": early[run]})
    return pd.DataFrame(rows)


def history_sweep(lengths: Sequence[int] = HISTORIES, seed: int = 0, margin: int = 0):
    """fc1's input underflow (fprop, every step) of the delayed recipe with each amax history
    length when fc1's input shrinks at LESSON.gain_drop_step: columns history, step, underflow."""
    res = train(delayed_recipes(lengths, margin=margin), seed=seed, gain_schedule=LESSON.gain_schedule,
                progress=False, monitor_every=1)
    m = res.monitor
    m = m[(m.layer == "fc1") & (m.role == "input") & (m.gemm == "fprop")]
    df = m[["run", "step", "underflow"]].copy()
    df.insert(0, "history", [int(r.split()[1][1:]) for r in df.pop("run")])
    return df.reset_index(drop=True)


def steps_to_recover(underflow_by_step, drop_step: int = LESSON.gain_drop_step, threshold: float = 0.01) -> int | None:
    """Steps after `drop_step` until underflow stays below `threshold` to the end (None: never).

    underflow_by_step: a pandas Series indexed by step."""
    after = underflow_by_step[underflow_by_step.index >= drop_step]
    bad = after[after >= threshold]
    if len(bad) == 0:
        return 0
    last_bad = int(bad.index.max())
    return None if last_bad >= int(after.index.max()) else last_bad + 1 - drop_step
