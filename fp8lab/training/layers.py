"""FP8Linear: a linear layer whose three GEMMs run in FP8, each operand quantized by its role.

Public: FP8Linear, fp8_linear (its function), layer_gemms (the three GEMMs' operands), IDENTITY (no quantization),
fp8_class (the FP8 class of a linear class: convert makes layers FP8 with it), tokens_per_scale. The definition
comes first: the autograd function, fprop in its forward, dgrad and wgrad in its backward, then how one operand is
quantized; what lets the layer stand in for nn.Linear (autocast, torch.func, empty batches, state_dict, pickling)
sits in fp8lab.training.armour. Each operand is quantized along its GEMM's contraction:
    fprop  y[M, N]  = x[M, K] @ w[N, K]^T     x: input along K,             w: weight along K
    dgrad  dx[M, K] = dy[M, N] @ w[N, K]      dy: grad_output along N,      w^T[K, N]: weight along N
    wgrad  dw[N, K] = dy^T[N, M] @ x[M, K]    dy^T[N, M]: grad_output along M, x^T[K, M]: input along M
(TransformerEngine likewise quantizes row-wise and column-wise copies from the high-precision tensor.)
A transposed operand reuses the other GEMM's codes where they are the same (per tensor, square blocks), else is
quantized down its source's columns. An optional amax reducer (convert(..., amax_reducer=...)) makes the scales
whose region covers the token dim M use an amax reduced across data-parallel ranks (fp8lab.training.distributed).
Infinities: the forward's operands refuse them, as quantize does; a gradient dy with an inf or NaN (a loss
scaler's overflow step) is passed on: the GEMM that reads it runs in high precision (NonFiniteGradient).
Notebook 06 trains with these layers.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab.gemm import GemmBackend, default_backend
from fp8lab.numerics import kernels, kernels_gemm
from fp8lab.numerics.quantize import QuantizedTensor, block_amax, quantize_observing, quantize_with, transformed
from fp8lab.numerics.recipes import Recipe, RoundingDraws, TensorScaling, get_recipe
from fp8lab.numerics.scaling import AmaxHistory, Granularity
from fp8lab.training import delayed as delayed_steps
from fp8lab.training.armour import (
    VMAP_REFUSAL,
    all_finite,
    apply_positional,
    at_least_one_row,
    autocast_operands,
    fp8_subclass,
    load_histories,
    no_autocast,
    quantize_if_finite,
    refuse_double_backward,
    save_histories,
)
from fp8lab.training.delayed import DelayedState
from fp8lab.training.monitor import Monitor

__all__ = [
    "IDENTITY",
    "AmaxReducer",
    "FP8Linear",
    "LayerState",
    "NonFiniteGradient",
    "base_class",
    "fp8_class",
    "fp8_linear",
    "layer_gemms",
    "scale_spans_tokens",
    "tokens_per_scale",
]

# A recipe that quantizes nothing: FP8Linear(recipe=IDENTITY) must equal nn.Linear exactly.
IDENTITY = "identity"

# amax[...] -> the same amax reduced (max) over data-parallel ranks; see scale_spans_tokens
AmaxReducer = Callable[[torch.Tensor], torch.Tensor]


# ---- the definition: fprop, dgrad, wgrad -----------------------------------------------------------------------


class _FP8LinearFunction(torch.autograd.Function):
    """The three GEMMs of a linear layer, each operand quantized as the state's recipe says for its role. The
    forward keeps fprop's quantized x and w on the state (dgrad and wgrad reuse them where the codes are the
    same); setup_context moves them to ctx (a torch.func transform runs forward and setup_context apart)."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: LayerState):
        """fprop y[M, N] = x[M, K] @ w[N, K]^T (+ bias), x and w quantized along K."""
        x2 = x.reshape(-1, x.shape[-1])  # (M, K)
        m = x2.shape[0]
        state.fprop = None
        if state.recipe is None or weight.numel() == 0:  # (N or K of 0: nothing to quantize, nothing to sum)
            out = F.linear(x2, weight, bias)
        elif state.recipe.scaling("input", "fprop") is None:  # the recipe keeps fprop in high precision
            out = F.linear(x2, weight, bias)
        else:
            x_q = _operand(state, at_least_one_row(x2, m), "input", "fprop")  # x[M, K] along K
            w_q = _operand(state, weight, "weight", "fprop")  # w[N, K] along K
            state.fprop = (x_q, w_q)
            out = _mm(state, x_q, w_q, "fprop")[:m].to(x.dtype)
            if bias is not None:  # (in the input's dtype: a float16 input gives a float16 output)
                out = _add_bias(out, bias.to(out.dtype))
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        """dgrad dx = dy @ w and wgrad dw = dy^T @ x, each in FP8 where the recipe quantizes it."""
        refuse_double_backward(ctx.state.name)
        x2, weight = ctx.saved_tensors  # (M, K), (N, K)
        state: LayerState = ctx.state
        dy = grad_out.reshape(-1, grad_out.shape[-1])  # (M, N)
        grad_x = grad_w = grad_b = None
        if state.recipe is None or weight.numel() == 0:  # the ops nn.Linear's backward runs, in its order
            if ctx.needs_input_grad[0]:
                grad_x = dy.mm(weight)
            if ctx.needs_input_grad[1]:
                grad_w = dy.t().mm(x2)
        else:
            dy_q = None
            try:
                with no_autocast(dy.device.type):  # (a backward called inside autocast: the GEMMs stay exact)
                    if ctx.needs_input_grad[0]:
                        grad_x, dy_q = _dgrad(state, dy, weight, ctx.q_w, ctx.m)
                        grad_x = grad_x.to(x2.dtype)
                    if ctx.needs_input_grad[1]:
                        grad_w = _wgrad(state, dy, x2, dy_q, ctx.q_x, ctx.m).to(weight.dtype)
            finally:  # dy's finiteness is these two GEMMs' alone: kept, it would keep dy alive, even past an error
                state.finite_gradient = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = dy.sum(0)
        if delayed_steps.watching() and not all(all_finite(t) for t in (grad_x, grad_w, grad_b) if t is not None):
            delayed_steps.gradients_overflowed()  # (an overflow here, in the gradients this layer hands on)
        if grad_x is not None:
            grad_x = grad_x.reshape(*grad_out.shape[:-1], x2.shape[-1])
        ctx.q_x = ctx.q_w = None
        return grad_x, grad_w, grad_b, None

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        x, weight, bias, state = inputs
        ctx.state = state
        ctx.has_bias = bias is not None
        ctx.q_x, ctx.q_w = state.fprop or (None, None)
        state.fprop = None
        ctx.m = x.reshape(-1, x.shape[-1]).shape[0]
        ctx.save_for_backward(x.reshape(-1, x.shape[-1]), weight)

    @staticmethod
    def vmap(info, in_dims, *args):
        raise RuntimeError(VMAP_REFUSAL)

    @classmethod
    def apply(cls, *args):
        """Function.apply (its four arguments always given, positionally): armour.apply_positional."""
        return apply_positional(cls, args)


def _add_bias(out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """out[M, N] += bias[N], by the kernels' twin where torch would split it over its threads and the kernels may read
    both (the same bits, without waking torch's threads for a few microseconds of work), else torch's add_ (on the
    calling thread: kernels.torch_runs_alone, where it costs less than a kernel call)."""
    if out.dim() == 2 and out.is_contiguous() and not kernels.torch_runs_alone(out) and kernels.enabled(out, bias):
        return kernels_gemm.add_row_(out, bias)
    return out.add_(bias)


def _dgrad(state: LayerState, dy: torch.Tensor, weight: torch.Tensor, w_q: Operand | None, m: int):
    """dgrad dx[M, K] = dy[M, N] @ w[N, K]: dy quantized along N, w^T[K, N] along N (fprop's w_q transposed
    where its codes are the same). Returns (dx float32, dy_q: wgrad may reuse it)."""
    dy_q = _operand(state, at_least_one_row(dy, m), "grad_output", "dgrad")  # dy[M, N] along N
    wt_q = _operand(state, weight, "weight", "dgrad", reuse=w_q, transpose=True)  # w^T[K, N] along N
    if dy_q is None or isinstance(dy_q, NonFiniteGradient):
        # (the recipe keeps dgrad in high precision, or dy holds an inf or NaN: dy @ w as it is)
        return dy.float().mm(weight.float()), dy_q
    return _mm(state, dy_q, wt_q, "dgrad")[:m], dy_q


def _wgrad(state: LayerState, dy: torch.Tensor, x2: torch.Tensor, dy_q: Operand | None, x_q: Operand | None,
           m: int) -> torch.Tensor:
    """wgrad dw[N, K] = dy^T[N, M] @ x[M, K]: dy^T[N, M] and x^T[K, M] quantized along M (dgrad's dy_q and
    fprop's x_q transposed where their codes are the same). Float32."""
    dyt_q = _operand(state, at_least_one_row(dy, m), "grad_output", "wgrad", reuse=dy_q, transpose=True)
    xt_q = _operand(state, at_least_one_row(x2, m), "input", "wgrad", reuse=x_q, transpose=True)
    if dyt_q is None or xt_q is None or isinstance(dyt_q, NonFiniteGradient):
        return dy.float().t().mm(x2.float())  # high-precision weight gradient
    return _mm(state, dyt_q, xt_q, "wgrad")


def _mm(state: LayerState, a_q: QuantizedTensor, b_q: QuantizedTensor, gemm: str) -> torch.Tensor:
    # the one switch (fp8lab.gemm.GemmBackend): real where the GPU has the kernel for this pair
    return state.backend.mm(a_q, b_q, layer=state.name, gemm=gemm)


# ---- one operand, quantized by its role ------------------------------------------------------------------------


def _operand(state: LayerState, source: torch.Tensor, role: str, gemm: str,
             reuse: Operand | None = None, transpose: bool = False) -> Operand | None:
    """source (or source^T with transpose=True) quantized as `gemm`'s operand [rows, contraction] for `role`, in
    three steps: the recipe's scaling for (role, gemm) (None: that GEMM runs in high precision); `reuse`, the same
    tensor quantized for another GEMM, transposed where its codes are this GEMM's (_reusable); else quantized,
    from source^T without a copy where it can be (_quantize_transposed). A NonFiniteGradient where a gradient
    holds an inf or NaN (and where `reuse` is one that would have been reused)."""
    scaling = state.recipe.scaling(role, gemm)
    if scaling is None:
        return None
    if reuse is not None and _reusable(reuse, scaling):
        return reuse if isinstance(reuse, NonFiniteGradient) else reuse.t()
    if not transpose:  # (quantize takes float32, bfloat16 and float16 as they are: no float32 copy here)
        return _quantize(state, source, role, gemm, scaling)
    return _quantize_transposed(state, source, role, gemm, scaling)


def _reusable(reuse: Operand, scaling: TensorScaling) -> bool:
    """Whether reuse^T is exactly what `scaling` makes: the same numerics, and blocks whose transposes are this
    GEMM's blocks (per tensor, or square blocks like 128x128). TransformerEngine likewise reuses the FP8 copy."""
    return reuse.granularity == scaling.granularity.transposed() and _same_numerics(reuse, scaling)


def _quantize_transposed(state: LayerState, source: torch.Tensor, role: str, gemm: str,
                         scaling: TensorScaling) -> Operand:
    """source^T quantized as `scaling` says. Blocks along source^T's rows are blocks down source's columns (1x32
    of x^T is 32x1 of x; per row of x^T is one block per column of x): source is quantized down its columns and
    the result is the QuantizedTensor of source^T, code for code, as a transposed view (emulated GEMMs take
    strided operands as they are). Per tensor, rounding to nearest, source's own codes transposed are source^T's.
    A copy of source^T is quantized instead where amaxes are reduced across ranks (shaped for the GEMM's own
    layout), under a Hadamard transform (which reads source^T's view and writes that copy), and per tensor with
    stochastic rounding (its draws follow source^T's order)."""
    g = scaling.granularity
    if state.amax_reducer is None and scaling.hadamard is None and not g.whole_tensor:
        # (per column of x is per row of x^T: t() names the blocks as this GEMM does)
        q = _quantize(state, source, role, gemm, scaling.down_columns(source.shape[0]))
        return q if isinstance(q, NonFiniteGradient) else q.t(g)
    if state.amax_reducer is None and scaling.hadamard is None and scaling.rounding == "nearest":
        # (per tensor: one scale, each element cast alone, so source's codes transposed are source^T's)
        q = _quantize(state, source, role, gemm, scaling)
        return q if isinstance(q, NonFiniteGradient) else q.t()
    if state.amax_reducer is None and scaling.hadamard is not None:
        return _quantize(state, source.t(), role, gemm, scaling)  # (the transform's output is the copy)
    return _quantize(state, source.t().contiguous(), role, gemm, scaling)


def _quantize(state: LayerState, t: torch.Tensor, role: str, gemm: str,
              scaling: TensorScaling) -> QuantizedTensor | NonFiniteGradient:
    """Quantize an operand [rows, contraction]; delayed scaling scales with the role's history.

    With an amax reducer, a scale whose region covers the token dim (scale_spans_tokens) uses
    the amax reduced across ranks, and delayed scaling records that reduced amax (as
    TransformerEngine's DelayedScaling(reduce_amax=True) does). Delayed scaling (per tensor: Recipe
    checks) scales with the history as the step found it (fp8lab.training.delayed) and adds a
    training forward's amax to the step's pending max; without a layer's state (layer_gemms) it
    scales as a fresh history does, with the current amax.
    A gradient (grad_output) with an inf or NaN becomes a NonFiniteGradient (not quantized, not recorded: the
    backward pass's gradient amaxes are dropped, fp8lab.training.delayed.gradients_overflowed), found in its
    quantizing pass where it rounds to nearest (quantize_if_finite). Where its amax is reduced across ranks that
    decision is the reduced amax's, so every rank decides alike, and every operand goes through here (and its
    reduction) as in a finite step: every rank makes the same collective calls.
    """
    t = transformed(t, scaling)  # the operand as its GEMM reads it (a recipe's Hadamard transform on wgrad's)
    current = None  # this tensor's amax (per block), reduced across ranks where they share a scale
    if state.amax_reducer is not None and scale_spans_tokens(role, gemm, scaling.granularity):
        current = state.amax_reducer(block_amax(t, scaling.granularity))
    monitoring = state.monitor is not None and state.monitor.active()
    q = None
    if role == "grad_output" and state.passes_nonfinite:
        if current is None and state.recipe.delayed is not None:  # (delayed scaling reads it: one pass for both)
            current = block_amax(t, scaling.granularity)
        if current is None and scaling.rounding == "nearest" and not _known(state, t):  # (checked in its pass)
            q = quantize_if_finite(t, scaling, count=monitoring)
            state.finite_gradient = (t, q is not None)
        if not _finite_gradient(state, t, current):
            return _nonfinite(state, t, role, gemm, scaling, current)
    if q is None:
        draws = state.draws.generator(t.device) if scaling.rounding == "stochastic" and state.draws else None
        past = None if current is not None or state.delayed is None else state.delayed.past_amax(role, t.device)
        if past is not None:  # delayed scaling from a history: this tensor's amax read in the quantizing pass
            q = _quantize_delayed(state, t, role, scaling, past, monitoring)
        else:
            amax = current if state.recipe.delayed is None else _delayed_amax(state, t, role, scaling, current)
            q = quantize_with(t, scaling, amax, count=monitoring, generator=draws)  # (count: the Monitor's)
    if monitoring:
        state.monitor.record(state.name, gemm, role, t, q)
    return q


def _known(state: LayerState, t: torch.Tensor) -> bool:
    """Whether gradient t's finiteness is known already (dgrad's read of dy told it, for wgrad's)."""
    return state.finite_gradient is not None and state.finite_gradient[0] is t


def _finite_gradient(state: LayerState, t: torch.Tensor, current: torch.Tensor | None) -> bool:
    """Whether gradient t holds no inf and no NaN: from `current` (its amax per block: NaN where a NaN is, inf
    where an inf is) where the caller has it, else one pass over t, once for dgrad's and wgrad's reads of the
    same dy (state.finite_gradient keeps the answer for the tensor it was about)."""
    if current is not None:
        return all_finite(current)
    if not _known(state, t):
        state.finite_gradient = (t, all_finite(t))
    return state.finite_gradient[1]


def _delayed_amax(state: LayerState, t: torch.Tensor, role: str, scaling: TensorScaling,
                  current: torch.Tensor | None) -> torch.Tensor | None:
    """The amax delayed scaling scales `role` with: the history's, as the step found it (a fresh history's, the
    current amax, without a layer's state); a training forward's amax joins the step's pending max. One amax pass
    per use (`current`: this tensor's, already reduced across ranks where they share a scale). None where the
    amax is infinite: quantize then refuses it, with the error every recipe gives."""
    if current is None:
        current = block_amax(t, scaling.granularity)
    if math.isinf(float(current.max())):  # quantize refuses it
        return None
    if state.delayed is None:
        return current.reshape(())
    amax = state.delayed.scale_amax(role, current)
    if state.records:
        state.delayed.observe(role, current)
    return amax


def _quantize_delayed(state: LayerState, t: torch.Tensor, role: str, scaling: TensorScaling, past: torch.Tensor,
                      monitoring: bool) -> QuantizedTensor:
    """t scaled with its role's history (`past`), and t's own amax, from the same pass, added to the step's pending
    max: _delayed_amax's numbers without its amax pass. (Delayed scaling is per tensor and rounds to nearest:
    Recipe checks.) An infinity in t is refused by quantize, before anything is recorded, as there."""
    q, own = quantize_observing(t, scaling, past, count=monitoring)
    if state.records:
        state.delayed.observe(role, own)
    return q


def _nonfinite(state: LayerState, t: torch.Tensor, role: str, gemm: str, scaling: TensorScaling,
               current: torch.Tensor | None) -> NonFiniteGradient:
    """A gradient with an inf or NaN: said to delayed scaling (this backward pass records no gradient amax)
    and to the Monitor (a row in its `nonfinite`), and returned unquantized."""
    amax = float((current if current is not None else t.abs()).max())  # (NaN where a NaN is)
    if state.delayed is not None:
        state.delayed.skipped[role] += 1
    delayed_steps.gradients_overflowed()
    if state.monitor is not None:
        state.monitor.record_nonfinite(state.name, gemm, role, amax)
    return NonFiniteGradient(scaling, amax)


def _same_numerics(q: Operand, s: TensorScaling) -> bool:
    """Whether q's codes are what `s` makes of the same values: format, rule, scale format, two levels, margin and
    rounding alike, and no Hadamard transform (a NonFiniteGradient: the codes it would have had)."""
    if isinstance(q, NonFiniteGradient):
        r = q.scaling
        return (r.fmt == s.fmt and r.scale_rule == s.scale_rule and r.scale_fmt == s.scale_fmt
                and r.two_level == s.two_level and r.margin == s.margin and r.rounding == s.rounding
                and r.hadamard is None and s.hadamard is None)
    return (q.fmt == s.fmt and q.scale_rule == s.scale_rule and q.scale_fmt == s.scale_fmt
            and (q.tensor_scale is not None) == s.two_level and q.margin == s.margin
            and q.rounding == s.rounding and s.hadamard is None)


# ---- the layer's state, and the scales that span tokens ------------------------------------------------------


@dataclass
class LayerState:
    """What the autograd function needs to know about its layer, for one forward (and its backward)."""

    name: str
    recipe: Recipe | None  # None: no quantization (IDENTITY)
    delayed: DelayedState | None  # the layer's delayed-scaling state (None: current scaling)
    monitor: Monitor | None
    backend: GemmBackend
    amax_reducer: AmaxReducer | None = None
    records: bool = False  # a training forward: its amaxes (and its backward's) enter the step's pending max
    fprop: tuple[QuantizedTensor, QuantizedTensor] | None = None  # the forward's operands, until setup_context
    draws: RoundingDraws | None = None  # stochastic rounding's generators (None: torch's default generator)
    passes_nonfinite: bool = True  # a non-finite gradient becomes a NonFiniteGradient (False: quantize's error)
    finite_gradient: tuple[torch.Tensor, bool] | None = None  # (dy, whether it is finite), for its second read


@dataclass(frozen=True)
class NonFiniteGradient:
    """What a gradient operand becomes where it holds an inf or NaN: not quantized (a scale needs a finite
    amax), and its GEMM runs in high precision instead (FP8Linear's backward), so that the inf or NaN
    reaches the gradients as in a high-precision layer and a loss scaler sees it. `scaling` is how it
    would have been quantized (the transposed GEMM reuses it where it would reuse the codes), `amax` its
    largest |value| (inf or NaN)."""

    scaling: TensorScaling
    amax: float

    @property
    def granularity(self) -> Granularity:
        return self.scaling.granularity


Operand = QuantizedTensor | NonFiniteGradient


def tokens_per_scale(role: str, gemm: str, granularity: Granularity) -> int | None:
    """How many tokens (rows of the token dim M, which data parallelism splits) one scale of
    `role` in `gemm` covers: None for all of them, 0 for a weight (its scales cover no token).

    M is the rows of input x[M, K] and grad_output dy[M, N] in fprop and dgrad, and their
    contraction in wgrad (x^T[K, M], dy^T[N, M]). Per-tensor scales cover every token; per-row
    scales one token (fprop, dgrad) or all of them (wgrad); a block (r, c) covers r tokens in
    fprop and dgrad and c tokens in wgrad. Weights are whole on every rank once FSDP has
    gathered them.
    """
    if role == "weight":
        return 0
    return granularity.tokens_per_scale(gemm)


def scale_spans_tokens(role: str, gemm: str, granularity: Granularity) -> bool:
    """Whether one scale of `role` in `gemm` covers the whole token dim M (tokens_per_scale is None):
    its amax must then be reduced over data-parallel ranks to be the single-process run's. A block
    (1x128, 1x32, ...) covers one block of tokens, which never straddles two ranks while each rank
    holds a multiple of the block size."""
    return tokens_per_scale(role, gemm, granularity) is None


# ---- the three GEMMs' operands, each pair ready for a @ b.T ------------------------------------------------


def layer_gemms(x: torch.Tensor, weight: torch.Tensor, grad_output: torch.Tensor,
                recipe: Recipe | str) -> dict[str, tuple[QuantizedTensor, QuantizedTensor] | None]:
    """The three GEMMs of a linear layer, operands quantized exactly as FP8Linear builds them.

    x[..., K], weight[N, K], grad_output[..., N] (batch dims are flattened into M) ->
    {"fprop": (x_q[M, K], w_q[N, K]) or None, "dgrad": (dy_q[M, N], wT_q[K, N]) or None,
     "wgrad": (dyT_q[N, M], xT_q[K, M]) or None}: each pair ready for a @ b.T (fp8lab.gemm.emulated_mm(*pair)
    or real_mm(*pair)), None where the recipe runs that GEMM in high precision. Transposed operands are transposed
    views sharing the codes of a quantization down the columns (or reusing the other GEMM's codes where they are
    identical: per tensor, square blocks), as in FP8Linear's backward. A delayed recipe scales as a fresh amax
    history does (the first step calibrates on the current amax). A recipe with a wgrad Hadamard transform gives
    wgrad's operands transformed along M, zero-padded to a multiple of its size; stochastic rounding draws as a
    layer named "" does (RoundingDraws(0)).
    A grad_output with an inf or NaN is quantized as quantize does (NaN propagates to its block, an inf
    raises ValueError); FP8Linear runs the GEMMs that read such a gradient in high precision instead.
    """
    recipe = get_recipe(recipe)
    if weight.dim() != 2:
        raise ValueError(f"weight must be [N, K], got shape {tuple(weight.shape)}")
    n, k = weight.shape
    if x.shape[-1] != k or grad_output.shape[-1] != n or x.shape[:-1] != grad_output.shape[:-1]:
        raise ValueError(
            f"shapes do not make a linear layer: x {tuple(x.shape)} (..., K), weight {tuple(weight.shape)} (N, K), "
            f"grad_output {tuple(grad_output.shape)} (..., N)")
    state = LayerState("", recipe, None, None, default_backend("emulated"), draws=RoundingDraws(0),
                        passes_nonfinite=False)
    x2 = x.detach().reshape(-1, k).float()
    g = grad_output.detach().reshape(-1, n).float()
    w = weight.detach()
    q_x, q_w = _operand(state, x2, "input", "fprop"), _operand(state, w, "weight", "fprop")
    q_g = _operand(state, g, "grad_output", "dgrad")
    q_wt = _operand(state, w, "weight", "dgrad", reuse=q_w, transpose=True)
    q_gt = _operand(state, g, "grad_output", "wgrad", reuse=q_g, transpose=True)
    q_xt = _operand(state, x2, "input", "wgrad", reuse=q_x, transpose=True)
    return {"fprop": None if q_x is None or q_w is None else (q_x, q_w),
            "dgrad": None if q_g is None or q_wt is None else (q_g, q_wt),
            "wgrad": None if q_gt is None or q_xt is None else (q_gt, q_xt)}


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: LayerState) -> torch.Tensor:
    """y[..., N] = x[..., K] @ weight[N, K].T + bias through the layer's three FP8 GEMMs (state: its recipe,
    delayed scaling, monitor, backend). Under torch.autocast the operands are cast as autocast casts
    nn.Linear's (x, weight and bias to its dtype, whose values are then quantized) and the output has
    that dtype; inside, the GEMMs run without autocast (exact emulation)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"FP8Linear takes a floating-point input (float32, bfloat16, float16), got "
                        f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}; "
                        "convert integer data (token ids go through an nn.Embedding first)")
    x, weight, bias, cast = autocast_operands(x, weight, bias)
    if cast:
        with no_autocast(x.device.type):
            return _FP8LinearFunction.apply(x, weight, bias, state)
    return _FP8LinearFunction.apply(x, weight, bias, state)


# ---- the module ------------------------------------------------------------------------------------------------


class FP8Linear(nn.Linear):
    """nn.Linear whose three GEMMs run in FP8 as `recipe` says (emulated, or real on a GPU).

    recipe: a Recipe or its name; IDENTITY ("identity") quantizes nothing (equals nn.Linear).
    backend: "auto" (real scaled_mm where the GPU has the kernel for a GEMM's two operands, else
             emulated), "emulated", or a fp8lab.gemm.GemmBackend (shared by convert's layers; it
             counts which backend each GEMM used: backends_used(), GemmBackend.summary()).
    Delayed recipes keep one AmaxHistory per role (input, weight, grad_output) in `delayed`
    (fp8lab.training.delayed.DelayedState; `histories` is its dict): within a training step the
    scales never change, and the step's amaxes enter the histories once per optimizer step (the
    recipe's DelayedSpec.record says when). state_dict() carries them (as
    "amax_history.<role>": the recorded amaxes, float64, oldest first), so a reloaded layer scales
    its next step as the saved one would (a state dict without them leaves the histories as they
    are). A Monitor, if given, records per-role statistics of every quantization.
    amax_reducer: amax -> amax reduced over data-parallel ranks, applied where one scale
    covers the token dim (see scale_spans_tokens); None keeps every rank's own amax.
    An empty batch (x with 0 rows) gives the empty output nn.Linear gives, and zero gradients;
    it is quantized (amaxes reduced, histories recorded) as one row of zeros would be.
    Under torch.autocast the output has autocast's dtype, as nn.Linear's. A second derivative
    (create_graph=True through this layer) raises RuntimeError instead of dropping terms.
    Infinities: an input or weight with an inf raises ValueError (quantize's: a scale needs a finite
    amax, and an infinite activation is a diverged model, best caught where it starts); a NaN there
    propagates to its block. A gradient dy with an inf or NaN (an fp16 loss scaler's overflow step,
    torch.amp.GradScaler) is passed on instead: each GEMM that reads it (dgrad dy @ w, wgrad dy^T @ x)
    runs in high precision, in float32 from the same dy, w and x, its result cast to the gradient's
    dtype, so grad_input and grad_weight hold inf or NaN where a high-precision layer's do (the scaler
    needs to see one to skip the step; their finite values are then unused). Nothing of that backward
    pass enters a delayed-scaling history, and the Monitor lists it in `nonfinite` (no statistics row).
    fp8lab.nn.convert makes FP8 layers of a model's own linear layers in place (their class becomes
    FP8Linear, or an FP8 subclass of theirs: hooks, parametrizations and attributes stay);
    `calls` counts the forwards since then.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, recipe: Recipe | str = "tensorwise",
                 backend: str | GemmBackend = "auto", monitor: Monitor | None = None, name: str = "", device=None,
                 dtype=None,
                 amax_reducer: AmaxReducer | None = None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.setup_fp8(recipe, backend, monitor, name, amax_reducer)

    def setup_fp8(self, recipe: Recipe | str, backend: str | GemmBackend = "auto", monitor: Monitor | None = None,
                  name: str = "", amax_reducer: AmaxReducer | None = None) -> None:
        """(Re)set what makes this layer FP8: its recipe, backend, monitor, name, amax reducer, and a
        fresh delayed-scaling state where the recipe is delayed."""
        if isinstance(backend, str) and backend not in ("auto", "emulated"):
            raise ValueError(f"FP8Linear backend must be 'auto', 'emulated' or a GemmBackend, got {backend!r}")
        self.recipe = None if recipe == IDENTITY else get_recipe(recipe)
        self.backend = default_backend(backend)
        self.monitor = monitor
        self.layer_name = name
        self.amax_reducer = amax_reducer
        self.calls = 0
        self.draws = RoundingDraws(zlib.crc32(name.encode()))  # stochastic rounding's, seeded by the layer's name
        self.delayed = (DelayedState(self.recipe.delayed, self, name)
                        if self.recipe is not None and self.recipe.delayed is not None else None)

    @property
    def histories(self) -> dict[str, AmaxHistory] | None:
        """Each role's AmaxHistory (delayed recipes; None otherwise)."""
        return self.delayed.histories if self.delayed is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Recipe | str, **kw) -> FP8Linear:
        """A new FP8Linear sharing `linear`'s parameters (so an existing optimizer keeps working);
        `linear` itself is left as it is (fp8lab.nn.convert converts layers in place instead)."""
        new = cls(linear.in_features, linear.out_features, linear.bias is not None, recipe,
                  device="meta", **kw)
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y[..., N] = x[..., K] @ weight.T + bias, in x's dtype (a floating-point input; autocast's dtype
        under torch.autocast)."""
        self.calls += 1
        records = self.delayed.begin_forward() if self.delayed is not None else False
        state = LayerState(self.layer_name, self.recipe, self.delayed, self.monitor, self.backend,
                            self.amax_reducer, records, draws=self.draws)
        return fp8_linear(x, self.weight, self.bias, state)

    def extra_repr(self) -> str:
        name = self.recipe.name if self.recipe is not None else IDENTITY
        return f"{super().extra_repr()}, recipe={name}, backend={self.backend.mode}"

    def backends_used(self) -> list[dict]:
        """Which backend ran each of this layer's GEMMs so far, and why (rows with a calls count)."""
        return [r for r in self.backend.report() if r["layer"] == self.layer_name]

    # -- the amax histories in state_dict -------------------------------------------------------------------------
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        save_histories(self.delayed, destination, prefix)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                              missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        load_histories(self.delayed, state_dict, prefix, strict, unexpected_keys)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # -- an FP8 subclass of another linear class pickles by that class ---------------------------------------------
    def __reduce_ex__(self, protocol):
        base = type(self).__dict__.get("fp8lab_base")
        if base is None:
            return super().__reduce_ex__(protocol)
        return _new_fp8_instance, (base,), self.__dict__


def fp8_class(cls: type[nn.Linear]) -> type[FP8Linear]:
    """The FP8 class of a linear class: FP8Linear for nn.Linear (and FP8 classes themselves), else a
    subclass of FP8Linear and `cls` (made once per class): FP8Linear's forward, everything else of
    `cls` (a parametrization's property, a lazy layer's hooks, its own attributes)."""
    if issubclass(cls, FP8Linear):
        return cls
    if cls is nn.Linear:
        return FP8Linear
    return fp8_subclass(FP8Linear, cls, __name__)


def base_class(cls: type[FP8Linear]) -> type[nn.Linear]:
    """The linear class an FP8 class was made from (nn.Linear for FP8Linear)."""
    return cls.__dict__.get("fp8lab_base", nn.Linear) if cls is not FP8Linear else nn.Linear


def _new_fp8_instance(base: type) -> FP8Linear:
    return object.__new__(fp8_class(base))
