"""torch's attention modules with their projections in FP8: the GEMMs that nn.MultiheadAttention hides.

Public: attention_forward, FP8MultiheadAttention, InProjection, FAST_PATH_SWITCHES.
nn.MultiheadAttention applies its in-projection (in_proj_weight, or q/k/v_proj_weight) and its out_proj
inside F.multi_head_attention_forward with the raw weights, and nn.TransformerEncoderLayer and
MultiheadAttention take a fused fast path in evaluation that reads every weight directly: neither calls
a linear module's forward. attention_forward computes what MultiheadAttention's slow path computes, op
for op (equal to it bit for bit with plain projections), with each in-projection GEMM routed through
a function of ours and out_proj called as a module; FP8MultiheadAttention (what fp8lab.nn.convert makes
of a MultiheadAttention) routes them through FP8 GEMMs, and fp8lab.inspect through its recorder.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.functional import _canonical_mask, _mha_shape_check, _none_or_dtype

from fp8lab.gemm import GemmBackend
from fp8lab.numerics.recipes import Recipe, RoundingDraws
from fp8lab.training.armour import load_histories, save_histories
from fp8lab.training.delayed import DelayedState
from fp8lab.training.layers import IDENTITY, AmaxReducer, LayerState, fp8_linear
from fp8lab.training.monitor import Monitor

__all__ = ["FAST_PATH_SWITCHES", "FP8MultiheadAttention", "InProjection", "attention_forward"]

# (part, x[..., E_in], weight[E_out, E_in], bias[E_out] or None) -> x @ weight.T + bias. Parts: "qkv"
# (self-attention's packed GEMM), "q", "kv" (query apart, key is value), "k", "v".
Project = Callable[[str, Tensor, Tensor, Tensor | None], Tensor]

# The attributes that let torch's fused evaluation paths run, and the value that turns each off
# (both are read only to decide the fast path): a TransformerEncoderLayer's activation_relu_or_gelu
# (0: "activation_relu_or_gelu was not True") and a TransformerEncoder's use_nested_tensor.
FAST_PATH_SWITCHES: dict[type, tuple[str, object]] = {
    nn.TransformerEncoderLayer: ("activation_relu_or_gelu", 0),
    nn.TransformerEncoder: ("use_nested_tensor", False),
}


def _plain(part: str, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return F.linear(x, weight, bias)


def _split_packed(proj: Tensor, parts: int, e: int) -> tuple[Tensor, ...]:
    # (..., parts * E) -> `parts` tensors (..., E), contiguous, as F._in_projection_packed lays them out
    proj = proj.unflatten(-1, (parts, e)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
    return tuple(proj[i] for i in range(parts))


def _in_projection(mha: nn.MultiheadAttention, q: Tensor, k: Tensor, v: Tensor, project: Project):
    """q, k, v projected as F.multi_head_attention_forward projects them (packed or separate weights)."""
    b = mha.in_proj_bias
    if mha._qkv_same_embed_dim:
        w, e = mha.in_proj_weight, q.size(-1)
        if k is v:
            if q is k:  # self-attention: one GEMM with the packed weight (3E, E)
                return _split_packed(project("qkv", q, w, b), 3, e)
            w_q, w_kv = w.split([e, e * 2])
            b_q, b_kv = (None, None) if b is None else b.split([e, e * 2])
            return (project("q", q, w_q, b_q), *_split_packed(project("kv", k, w_kv, b_kv), 2, e))
        w_q, w_k, w_v = w.chunk(3)
        b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
    else:
        w_q, w_k, w_v = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
        b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
    return project("q", q, w_q, b_q), project("k", k, w_k, b_k), project("v", v, w_v, b_v)


def attention_forward(mha: nn.MultiheadAttention, query: Tensor, key: Tensor, value: Tensor,
                      key_padding_mask: Tensor | None = None, need_weights: bool = True,
                      attn_mask: Tensor | None = None, average_attn_weights: bool = True, is_causal: bool = False,
                      project: Project = _plain) -> tuple[Tensor, Tensor | None]:
    """mha(query, key, value, ...) as nn.MultiheadAttention's slow path computes it (never its fused fast
    path), with each in-projection GEMM computed by `project` and out_proj called as a module (its
    hooks run, and an FP8 out_proj computes in FP8). Same arguments and results as
    nn.MultiheadAttention.forward; with the default `project` (F.linear) equal to it bit for bit."""
    is_batched = query.dim() == 3
    key_padding_mask = _canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                       other_type=_none_or_dtype(attn_mask), other_name="attn_mask",
                                       target_type=query.dtype)
    attn_mask = _canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                target_type=query.dtype, check_other=False)
    if any(t.is_nested for t in (query, key, value)):
        raise ValueError("FP8 attention does not take NestedTensor inputs (torch's MultiheadAttention takes them "
                         "only on its fused evaluation path, which would bypass the FP8 projections)")
    if mha.batch_first and is_batched:  # (N, L, E) -> (L, N, E), keeping which of q, k, v are one tensor
        if key is value:
            if query is key:
                query = key = value = query.transpose(1, 0)
            else:
                query, key = (x.transpose(1, 0) for x in (query, key))
                value = key
        else:
            query, key, value = (x.transpose(1, 0) for x in (query, key, value))

    num_heads = mha.num_heads
    is_batched = _mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not is_batched:  # unbatched (L, E): a batch of one
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    key_padding_mask = _canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                       other_type=_none_or_dtype(attn_mask), other_name="attn_mask",
                                       target_type=query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer module "
                           "method `generate_square_subsequent_mask` to create this mask.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None  # scaled_dot_product_attention applies the causal mask itself
    else:
        attn_mask = _canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                    target_type=query.dtype, check_other=False)
        if key_padding_mask is not None:
            is_causal = False
    if embed_dim != mha.embed_dim:
        raise ValueError(f"was expecting embedding dimension of {mha.embed_dim}, but got {embed_dim}")
    head_dim = embed_dim // num_heads

    q, k, v = _in_projection(mha, query, key, value, project)  # (L, N, E), (S, N, E), (S, N, E)

    if attn_mask is not None:
        if attn_mask.dim() == 2:
            if attn_mask.shape != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is {attn_mask.shape}, but should be "
                                   f"{(tgt_len, src_len)}.")
            attn_mask = attn_mask.unsqueeze(0)
        elif attn_mask.dim() == 3:
            if attn_mask.shape != (bsz * num_heads, tgt_len, src_len):
                raise RuntimeError(f"The shape of the 3D attn_mask is {attn_mask.shape}, but should be "
                                   f"{(bsz * num_heads, tgt_len, src_len)}.")
        else:
            raise RuntimeError(f"attn_mask's dimension {attn_mask.dim()} is not supported")
    if mha.bias_k is not None and mha.bias_v is not None:
        k = torch.cat([k, mha.bias_k.repeat(1, bsz, 1)])
        v = torch.cat([v, mha.bias_v.repeat(1, bsz, 1)])
        if attn_mask is not None:
            attn_mask = F.pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = F.pad(key_padding_mask, (0, 1))

    q = q.view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)  # (N * H, L, D)
    k = k.view(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1)  # (N * H, S, D)
    v = v.view(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
    if mha.add_zero_attn:
        zeros = (bsz * num_heads, 1, head_dim)
        k = torch.cat([k, torch.zeros(zeros, dtype=k.dtype, device=k.device)], dim=1)
        v = torch.cat([v, torch.zeros(zeros, dtype=v.dtype, device=v.device)], dim=1)
        if attn_mask is not None:
            attn_mask = F.pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = F.pad(key_padding_mask, (0, 1))
    src_len = k.size(1)
    if key_padding_mask is not None:
        if key_padding_mask.shape != (bsz, src_len):
            raise RuntimeError(f"expecting key_padding_mask shape of {(bsz, src_len)}, but got "
                               f"{key_padding_mask.shape}")
        key_padding_mask = (key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, num_heads, -1, -1)
                            .reshape(bsz * num_heads, 1, src_len))
        attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
    dropout_p = mha.dropout if mha.training else 0.0

    if need_weights:
        q_scaled = q * math.sqrt(1.0 / float(q.shape[-1]))
        if is_causal and attn_mask is None:
            raise RuntimeError("is_causal with need_weights needs attn_mask (as torch's MultiheadAttention)")
        weights = (torch.baddbmm(attn_mask, q_scaled, k.transpose(-2, -1)) if attn_mask is not None
                   else torch.bmm(q_scaled, k.transpose(-2, -1)))  # (N * H, L, S)
        weights = F.softmax(weights, dim=-1)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        out = torch.bmm(weights, v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)  # (L * N, E)
        out = mha.out_proj(out).view(tgt_len, bsz, -1)
        weights = weights.view(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not is_batched:
            out, weights = out.squeeze(1), weights.squeeze(0)
    else:
        if attn_mask is not None:  # (1, L, S) or (N * H, L, S) -> broadcastable to (N, H, L, S)
            attn_mask = attn_mask.unsqueeze(0) if attn_mask.size(0) == 1 and attn_mask.dim() == 3 \
                else attn_mask.view(bsz, num_heads, -1, src_len)
        q = q.view(bsz, num_heads, tgt_len, head_dim)
        k = k.view(bsz, num_heads, src_len, head_dim)
        v = v.view(bsz, num_heads, src_len, head_dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)  # (N, H, L, D)
        out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
        out = mha.out_proj(out).view(tgt_len, bsz, -1)
        weights = None
        if not is_batched:
            out = out.squeeze(1)
    if mha.batch_first and is_batched:
        out = out.transpose(1, 0)
    return out, weights


class InProjection:
    """The FP8 GEMMs of a MultiheadAttention's in-projection, one state per part (qkv, q, kv, k, v).

    recipe None keeps them in high precision (F.linear). Delayed recipes keep a DelayedState per part,
    made at the part's first call (which parts run depends on whether query, key and value are one
    tensor) or when a state dict brings one."""

    def __init__(self, recipe: Recipe | None, backend: GemmBackend, monitor: Monitor | None, name: str,
                 amax_reducer: AmaxReducer | None) -> None:
        self.recipe, self.backend, self.monitor, self.name = recipe, backend, monitor, name
        self.amax_reducer = amax_reducer
        self.delayed: dict[str, DelayedState] = {}
        self.calls = 0
        self.draws = RoundingDraws(zlib.crc32(name.encode()))  # stochastic rounding's, seeded by the name

    def state(self, owner: nn.Module, part: str) -> DelayedState | None:
        if self.recipe is None or self.recipe.delayed is None:
            return None
        if part not in self.delayed:
            self.delayed[part] = DelayedState(self.recipe.delayed, owner, f"{self.name}[{part}]")
        return self.delayed[part]

    def project(self, owner: nn.Module, part: str, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if self.recipe is None:
            return F.linear(x, weight, bias)
        self.calls += part in ("qkv", "q")
        delayed = self.state(owner, part)
        records = delayed.begin_forward() if delayed is not None else False
        name = self.name if part == "qkv" else f"{self.name}[{part}]"
        state = LayerState(name, self.recipe, delayed, self.monitor, self.backend, self.amax_reducer, records,
                            draws=self.draws)
        return fp8_linear(x, weight, bias, state)


class FP8MultiheadAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention whose projections run in FP8: the in-projection's GEMMs through `fp8_in_proj`
    (an InProjection), out_proj called as a module (fp8lab.nn.convert makes it an FP8Linear). Made by
    convert from a MultiheadAttention in place (its class becomes this one; parameters, buffers, hooks
    and state-dict keys stay); forward computes what torch's slow path does (attention_forward), in
    training and evaluation alike. The attention matmuls themselves (scores, weighted values) stay in
    the input's precision, as in TransformerEngine's and torchao's FP8 linear recipes."""

    fp8_in_proj: InProjection

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        def project(part: str, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
            return self.fp8_in_proj.project(self, part, x, weight, bias)

        return attention_forward(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                                 average_attn_weights, is_causal, project)

    def setup_fp8(self, recipe: Recipe | None, backend: GemmBackend, monitor: Monitor | None, name: str,
                  amax_reducer: AmaxReducer | None = None) -> None:
        """The in-projection's recipe (None or IDENTITY: high precision), backend, monitor and name."""
        recipe = None if recipe == IDENTITY else recipe
        self.fp8_in_proj = InProjection(recipe, backend, monitor, f"{name}.in_proj" if name else "in_proj",
                                        amax_reducer)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for part, delayed in self.fp8_in_proj.delayed.items():
            save_histories(delayed, destination, f"{prefix}in_proj.{part}.")

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                              missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        parts = {k[len(prefix) + len("in_proj."):].split(".", 1)[0] for k in state_dict
                 if k.startswith(prefix + "in_proj.") and ".amax_history." in k}
        for part in sorted(parts):
            load_histories(self.fp8_in_proj.state(self, part), state_dict, f"{prefix}in_proj.{part}.", strict,
                           unexpected_keys)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
