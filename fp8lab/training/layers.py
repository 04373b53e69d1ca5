"""FP8 training layers: FP8Linear (autograd), convert(model, recipe), a bridge to torchao.

Public: FP8Linear, convert, layer_gemms (the three GEMMs' operands), Monitor, IDENTITY (no quantization).
FP8Linear runs the three GEMMs of a linear layer through fp8lab's GEMM, each operand
quantized along its own contraction dim, from the high-precision tensor:
    fprop  y[M, N]  = x[M, K] @ w[N, K]^T     x: input scaling along K,  w: weight along K
    dgrad  dx[M, K] = dy[M, N] @ w[N, K]      dy: grad along N,         w^T[K, N] along N
    wgrad  dw[N, K] = dy^T[N, M] @ x[M, K]    dy^T[N, M] along M,       x^T[K, M] along M
(TransformerEngine likewise quantizes row-wise and column-wise copies from the
high-precision tensor; per-tensor scaling gives the same codes either way.)
An optional amax reducer (convert(..., amax_reducer=...)) makes the scales whose region
covers the token dim M use an amax reduced across data-parallel ranks (fp8lab.training.distributed).
Notebook 06 trains with these layers; 07 swaps in torchao's and trains on several processes.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab.extras import require
from fp8lab.gemm import GemmBackend, default_backend
from fp8lab.numerics.metrics import overflow_underflow
from fp8lab.numerics.quantize import QuantizedTensor
from fp8lab.numerics.recipes import TORCHAO_RECIPES, Recipe, RoundingDraws, TensorScaling, get_recipe
from fp8lab.numerics.scaling import AmaxHistory, Granularity, PerBlock, PerRow, PerTensor, amax_per_block

__all__ = [
    "IDENTITY",
    "AmaxReducer",
    "FP8Linear",
    "Monitor",
    "convert",
    "fp8_layers",
    "layer_gemms",
    "scale_spans_tokens",
    "tokens_per_scale",
    "unwrap",
]

# A recipe that quantizes nothing: FP8Linear(recipe=IDENTITY) must equal nn.Linear exactly.
IDENTITY = "identity"
ENGINES = ("fp8lab", "torchao")

# amax[...] -> the same amax reduced (max) over data-parallel ranks; see scale_spans_tokens
AmaxReducer = Callable[[torch.Tensor], torch.Tensor]


# ---- monitoring ----------------------------------------------------------------------------------------------


class Monitor:
    """Per layer and tensor role, each step: amax, scale, overflow and underflow fractions.

    Rows are recorded as the GEMMs run; `frame()` returns a tidy pandas DataFrame with
    columns step, layer, gemm, role, amax, scale_max, scale_min, overflow, underflow.
    `every` records one step in `every` (1: all) to keep the cost down.
    """

    def __init__(self, every: int = 1) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        self.every = every
        self.step = 0
        self.rows: list[dict] = []

    def active(self) -> bool:
        return self.step % self.every == 0

    def record(self, layer: str, gemm: str, role: str, x: torch.Tensor, q: QuantizedTensor) -> None:
        scale = q.scale if q.tensor_scale is None else q.scale * q.tensor_scale
        overflow, underflow = overflow_underflow(x, q)
        scale_min, scale_max = (float(v) for v in torch.aminmax(scale))
        self.rows.append({
            "step": self.step, "layer": layer, "gemm": gemm, "role": role,
            "amax": float(q.amax.max()) if q.amax is not None else float(x.abs().max()),
            "scale_max": scale_max, "scale_min": scale_min, "overflow": overflow, "underflow": underflow,
        })

    def frame(self):
        import pandas as pd

        cols = ["step", "layer", "gemm", "role", "amax", "scale_max", "scale_min", "overflow", "underflow"]
        return pd.DataFrame(self.rows, columns=cols)

    def clear(self) -> None:
        self.rows.clear()


# ---- the autograd function -------------------------------------------------------------------------------


@dataclass
class _LayerState:
    """What the autograd function needs to know about its layer."""

    name: str
    recipe: Recipe | None  # None: no quantization (IDENTITY)
    histories: dict[str, AmaxHistory] | None
    monitor: Monitor | None
    backend: GemmBackend
    amax_reducer: AmaxReducer | None = None
    recorded: set[str] = field(default_factory=set)  # roles whose amax this step has recorded
    draws: RoundingDraws | None = None  # stochastic rounding's generators (None: torch's default generator)


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
    if isinstance(granularity, PerTensor):
        return None
    if isinstance(granularity, PerRow):
        return None if gemm == "wgrad" else 1
    return granularity.cols if gemm == "wgrad" else granularity.rows


def scale_spans_tokens(role: str, gemm: str, granularity: Granularity) -> bool:
    """Whether one scale of `role` in `gemm` covers the whole token dim M (tokens_per_scale is None):
    its amax must then be reduced over data-parallel ranks to be the single-process run's. A block
    (1x128, 1x32, ...) covers one block of tokens, which never straddles two ranks while each rank
    holds a multiple of the block size."""
    return tokens_per_scale(role, gemm, granularity) is None


def _quantize(state: _LayerState, t: torch.Tensor, role: str, gemm: str, scaling: TensorScaling) -> QuantizedTensor:
    """Quantize an operand [rows, contraction]; delayed scaling reads and updates the role's history.

    With an amax reducer, a scale whose region covers the token dim (scale_spans_tokens) uses
    the amax reduced across ranks, and delayed scaling records that reduced amax (as
    TransformerEngine's DelayedScaling(reduce_amax=True) does).
    """
    t = scaling.transform(t)  # the operand as its GEMM reads it (a recipe's Hadamard transform on wgrad's)
    current = None  # this tensor's amax (per block), reduced across ranks where they share a scale
    if state.amax_reducer is not None and scale_spans_tokens(role, gemm, scaling.granularity):
        current = state.amax_reducer(amax_per_block(t, scaling.granularity))
    amax = current
    history = state.histories[role] if state.histories is not None else None
    if history is not None:  # delayed scaling is per tensor (Recipe checks): one amax pass per use
        if current is None:
            current = amax_per_block(t, scaling.granularity)
        past = history.amax()
        amax = current.reshape(()) if past is None else torch.tensor(past, dtype=torch.float32, device=t.device)
    monitoring = state.monitor is not None and state.monitor.active()
    draws = state.draws.generator(t.device) if scaling.rounding == "stochastic" and state.draws else None
    q = scaling.quantize(t, amax=amax, count=monitoring, generator=draws, transformed=True)  # (count: the Monitor's)
    if history is not None and role not in state.recorded:
        state.recorded.add(role)  # once per step, at the role's first GEMM
        history.record(float(current.max()))
    if monitoring:
        state.monitor.record(state.name, gemm, role, t, q)
    return q


def _operand(state: _LayerState, source: torch.Tensor, role: str, gemm: str,
             reuse: QuantizedTensor | None = None, transpose: bool = False) -> QuantizedTensor | None:
    """Quantize source (or source^T with transpose=True) as `gemm`'s operand [rows, contraction].

    `reuse` is the same tensor quantized for another GEMM, transposed: it is used when its
    transpose is exactly what this GEMM asks for (same format and rule, and the transposed
    blocks are this GEMM's blocks: per-tensor, or square blocks like 128x128). Then the
    codes are identical, and TransformerEngine likewise reuses the FP8 copy.
    A transposed operand is quantized without copying source^T: blocks along source^T's
    rows are blocks down source's columns (1x32 of x^T is 32x1 of x; per row of x^T is
    one block per column of x), so the result is the QuantizedTensor of source^T, code for
    code, as a transposed view (emulated GEMMs take strided operands as they are).
    Returns None where the recipe runs this GEMM in high precision.
    """
    scaling = state.recipe.scaling(role, gemm)
    if scaling is None:
        return None
    if (reuse is not None and isinstance(reuse.granularity, PerTensor | PerBlock)
            and reuse.granularity == _transposed(scaling.granularity) and _same_numerics(reuse, scaling)):
        return reuse.t()
    if not transpose:  # (quantize takes float32, bfloat16 and float16 as they are: no float32 copy here)
        return _quantize(state, source, role, gemm, scaling)
    g = scaling.granularity
    # amaxes reduced across ranks are shaped for the GEMM's own layout: with a reducer (and
    # per tensor, where nothing is re-quantized unless the numerics differ) copy source^T
    if state.amax_reducer is None and scaling.hadamard is None and isinstance(g, PerRow | PerBlock):
        # (per column of x is per row of x^T: t() names the blocks as this GEMM does)
        return _quantize(state, source, role, gemm, scaling.down_columns(source.shape[0])).t(g)
    return _quantize(state, source.t().contiguous(), role, gemm, scaling)


def _transposed(g):
    return PerBlock(g.cols, g.rows) if isinstance(g, PerBlock) else g


def _same_numerics(q: QuantizedTensor, s: TensorScaling) -> bool:
    return (q.fmt == s.fmt and q.scale_rule == s.scale_rule and q.scale_fmt == s.scale_fmt
            and (q.tensor_scale is not None) == s.two_level and q.margin == s.margin
            and q.rounding == s.rounding and s.hadamard is None)


# ---- the three GEMMs' operands, each pair ready for a @ b.T ------------------------------------------------


def _fprop_operands(state: _LayerState, x2: torch.Tensor, weight: torch.Tensor):
    """fprop y[M, N] = x[M, K] @ w[N, K]^T: x and w both quantized along K."""
    return _operand(state, x2, "input", "fprop"), _operand(state, weight, "weight", "fprop")


def _dgrad_operands(state: _LayerState, g: torch.Tensor, weight: torch.Tensor, q_w: QuantizedTensor | None):
    """dgrad dx[M, K] = dy[M, N] @ w[N, K]: contraction N; dy along N, w^T[K, N] along N."""
    q_g = _operand(state, g, "grad_output", "dgrad")
    return q_g, _operand(state, weight, "weight", "dgrad", reuse=q_w, transpose=True)


def _wgrad_operands(state: _LayerState, g: torch.Tensor, x2: torch.Tensor, q_g: QuantizedTensor | None,
                    q_x: QuantizedTensor | None):
    """wgrad dw[N, K] = dy^T[N, M] @ x[M, K]: contraction M; dy^T[N, M] and x^T[K, M] along M
    (None, None where the recipe keeps this GEMM in high precision)."""
    q_gt = _operand(state, g, "grad_output", "wgrad", reuse=q_g, transpose=True)
    q_xt = _operand(state, x2, "input", "wgrad", reuse=q_x, transpose=True)
    return q_gt, q_xt


def layer_gemms(x: torch.Tensor, weight: torch.Tensor, grad_output: torch.Tensor,
                recipe: Recipe | str) -> dict[str, tuple[QuantizedTensor, QuantizedTensor] | None]:
    """The three GEMMs of a linear layer, operands quantized exactly as FP8Linear builds them.

    x[..., K], weight[N, K], grad_output[..., N] (batch dims are flattened into M) ->
    {"fprop": (x_q[M, K], w_q[N, K]), "dgrad": (dy_q[M, N], wT_q[K, N]),
     "wgrad": (dyT_q[N, M], xT_q[K, M]) or None}: each pair is ready for a @ b.T (so
    fp8lab.gemm.emulated_mm(*pair) or real_mm(*pair)); None where the recipe runs that GEMM
    in high precision. Transposed operands are transposed views sharing the codes of a
    quantization down the columns (or reusing the other GEMM's codes where they are
    identical: per tensor, square blocks), as in FP8Linear's backward. A delayed recipe
    starts from a fresh amax history (the first step calibrates on the current amax).
    """
    recipe = get_recipe(recipe)
    if weight.dim() != 2:
        raise ValueError(f"weight must be [N, K], got shape {tuple(weight.shape)}")
    n, k = weight.shape
    if x.shape[-1] != k or grad_output.shape[-1] != n or x.shape[:-1] != grad_output.shape[:-1]:
        raise ValueError(
            f"shapes do not make a linear layer: x {tuple(x.shape)} (..., K), weight {tuple(weight.shape)} (N, K), "
            f"grad_output {tuple(grad_output.shape)} (..., N)")
    histories = ({role: recipe.delayed.new_history() for role in ("input", "weight", "grad_output")}
                 if recipe.delayed is not None else None)
    state = _LayerState("", recipe, histories, None, default_backend("emulated"), draws=RoundingDraws(0))
    x2 = x.detach().reshape(-1, k).float()
    g = grad_output.detach().reshape(-1, n).float()
    w = weight.detach()
    q_x, q_w = _fprop_operands(state, x2, w)
    q_g, q_wt = _dgrad_operands(state, g, w, q_w)
    q_gt, q_xt = _wgrad_operands(state, g, x2, q_g, q_x)
    return {"fprop": (q_x, q_w), "dgrad": (q_g, q_wt), "wgrad": None if q_gt is None or q_xt is None else (q_gt, q_xt)}


def _mm(state: _LayerState, a_q: QuantizedTensor, b_q: QuantizedTensor, gemm: str) -> torch.Tensor:
    # the one switch (fp8lab.gemm.GemmBackend): real where the GPU has the kernel for this pair
    return state.backend.mm(a_q, b_q, layer=state.name, gemm=gemm)


def _rows(t: torch.Tensor, m: int) -> torch.Tensor:
    """t[M, C], or one row of zeros where M is 0: an empty batch is quantized (and its amaxes reduced
    across ranks, and recorded) as an all-zero row would be, and gives the empty result."""
    return t if m else t.new_zeros(1, t.shape[1])


class _FP8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: _LayerState):
        x2 = x.reshape(-1, x.shape[-1])  # (M, K)
        m = x2.shape[0]
        ctx.state = state
        ctx.has_bias = bias is not None
        ctx.q_x = ctx.q_w = None
        ctx.m = m
        if state.recipe is None or weight.numel() == 0:  # (N or K of 0: nothing to quantize, nothing to sum)
            out = F.linear(x2, weight, bias)
        else:
            ctx.q_x, ctx.q_w = _fprop_operands(state, _rows(x2, m), weight)
            out = _mm(state, ctx.q_x, ctx.q_w, "fprop")[:m].to(x.dtype)
            if bias is not None:  # (in the input's dtype: a float16 input gives a float16 output)
                out = out.add_(bias.to(out.dtype))
        ctx.save_for_backward(x2, weight)
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x2, weight = ctx.saved_tensors
        state: _LayerState = ctx.state
        g = grad_out.reshape(-1, grad_out.shape[-1])  # (M, N)
        m = ctx.m
        grad_x = grad_w = grad_b = None
        if state.recipe is None or weight.numel() == 0:  # the ops nn.Linear's backward runs, in its order
            if ctx.needs_input_grad[0]:
                grad_x = g.mm(weight)
            if ctx.needs_input_grad[1]:
                grad_w = g.t().mm(x2)
        else:
            gq, xq = _rows(g, m), _rows(x2, m)  # (quantized as they are: float32, bfloat16 or float16)
            q_g = None
            if ctx.needs_input_grad[0]:
                q_g, q_wt = _dgrad_operands(state, gq, weight, ctx.q_w)
                grad_x = _mm(state, q_g, q_wt, "dgrad")[:m].to(x2.dtype)
            if ctx.needs_input_grad[1]:
                q_gt, q_xt = _wgrad_operands(state, gq, xq, q_g, ctx.q_x)
                if q_gt is None or q_xt is None:  # high-precision weight gradient
                    grad_w = g.float().t().mm(x2.float())
                else:
                    grad_w = _mm(state, q_gt, q_xt, "wgrad")
                grad_w = grad_w.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0)
        if grad_x is not None:
            grad_x = grad_x.reshape(*grad_out.shape[:-1], x2.shape[-1])
        ctx.q_x = ctx.q_w = None
        return grad_x, grad_w, grad_b, None


# ---- the module ------------------------------------------------------------------------------------------------


class FP8Linear(nn.Linear):
    """nn.Linear whose three GEMMs run in FP8 as `recipe` says (emulated, or real on a GPU).

    recipe: a Recipe or its name; IDENTITY ("identity") quantizes nothing (equals nn.Linear).
    backend: "auto" (real scaled_mm where the GPU has the kernel for a GEMM's two operands, else
             emulated), "emulated", or a fp8lab.gemm.GemmBackend (shared by convert's layers; it
             counts which backend each GEMM used: backends_used(), GemmBackend.summary()).
    Delayed recipes keep one AmaxHistory per role (input, weight, grad_output), updated
    every step; state_dict() carries them (as "amax_history.<role>": the recorded amaxes,
    float64, oldest first), so a reloaded layer scales its next step as the saved one would
    (a state dict without them leaves the histories as they are). A Monitor, if given, records
    per-role statistics of every quantization.
    amax_reducer: amax -> amax reduced over data-parallel ranks, applied where one scale
    covers the token dim (see scale_spans_tokens); None keeps every rank's own amax.
    An empty batch (x with 0 rows) gives the empty output nn.Linear gives, and zero gradients;
    it is quantized (amaxes reduced, histories recorded) as one row of zeros would be.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, recipe: Recipe | str = "tensorwise",
                 backend: str | GemmBackend = "auto", monitor: Monitor | None = None, name: str = "", device=None,
                 dtype=None,
                 amax_reducer: AmaxReducer | None = None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.amax_reducer = amax_reducer
        self.recipe = None if recipe == IDENTITY else get_recipe(recipe)
        if isinstance(backend, str) and backend not in ("auto", "emulated"):
            raise ValueError(f"FP8Linear backend must be 'auto', 'emulated' or a GemmBackend, got {backend!r}")
        self.backend = default_backend(backend)
        self.monitor = monitor
        self.layer_name = name
        self.draws = RoundingDraws(zlib.crc32(name.encode()))  # stochastic rounding's, seeded by the layer's name
        self.histories = (
            {role: self.recipe.delayed.new_history() for role in ("input", "weight", "grad_output")}
            if self.recipe is not None and self.recipe.delayed is not None else None
        )
        self.register_state_dict_post_hook(_save_histories)
        self.register_load_state_dict_pre_hook(_load_histories)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Recipe | str, **kw) -> FP8Linear:
        """An FP8Linear sharing `linear`'s parameters (so an existing optimizer keeps working)."""
        new = cls(linear.in_features, linear.out_features, linear.bias is not None, recipe,
                  device="meta", **kw)
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y[..., N] = x[..., K] @ weight.T + bias, in x's dtype (a floating-point input)."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"FP8Linear takes a floating-point input (float32, bfloat16, float16), got "
                            f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}; "
                            "convert integer data (token ids go through an nn.Embedding first)")
        state = _LayerState(self.layer_name, self.recipe, self.histories, self.monitor, self.backend,
                            self.amax_reducer, draws=self.draws)
        return _FP8LinearFunction.apply(x, self.weight, self.bias, state)

    def extra_repr(self) -> str:
        name = self.recipe.name if self.recipe is not None else IDENTITY
        return f"{super().extra_repr()}, recipe={name}, backend={self.backend.mode}"

    def backends_used(self) -> list[dict]:
        """Which backend ran each of this layer's GEMMs so far, and why (rows with a calls count)."""
        return [r for r in self.backend.report() if r["layer"] == self.layer_name]


_HISTORY_KEY = "amax_history."


def _save_histories(module: FP8Linear, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """state_dict hook: each role's recorded amaxes (float64, oldest first) under prefix + amax_history.<role>."""
    for role, history in (module.histories or {}).items():
        state_dict[prefix + _HISTORY_KEY + role] = torch.tensor(history.history, dtype=torch.float64)


def _load_histories(module: FP8Linear, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                    missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    """load_state_dict pre-hook: the saved amaxes replace each history's (keys absent: histories kept)."""
    for key in [k for k in state_dict if k.startswith(prefix + _HISTORY_KEY)]:
        role = key[len(prefix + _HISTORY_KEY):]
        saved = state_dict.pop(key)
        if module.histories is None or role not in module.histories:
            if strict:
                unexpected_keys.append(key)
            continue
        history = module.histories[role]
        history.reset()
        for amax in saved.tolist():
            history.record(amax)


# ---- convert ------------------------------------------------------------------------------------------------------


def _linears(model: nn.Module, engine: str) -> list[tuple[str, nn.Linear]]:
    """The layers convert swaps: exact nn.Linear, and (engine fp8lab) FP8Linear layers of an earlier convert."""
    return [(n, m) for n, m in model.named_modules()
            if type(m) is nn.Linear or (engine == "fp8lab" and type(m) is FP8Linear)]


def _no_linears(model: nn.Module) -> str:
    """Why convert finds nothing to swap: the message names what the model has instead."""
    subclasses = [f"{n or '(model)'} ({type(m).__name__})" for n, m in model.named_modules()
                  if isinstance(m, nn.Linear) and type(m) is not nn.Linear]
    if not subclasses:
        return "the model has no nn.Linear layers to convert"
    return (f"the model has no nn.Linear layers to convert: its linear layers are subclasses of nn.Linear "
            f"({', '.join(subclasses[:6])}{', ...' if len(subclasses) > 6 else ''}), whose forward may differ "
            "from nn.Linear's, so convert leaves them alone: build those layers as nn.Linear to convert them")


def convert(
    model: nn.Module,
    recipe: Recipe | str,
    skip: Iterable[str] | Callable[[str, nn.Linear], bool] | None = None,
    keep_first_last: bool = False,
    engine: str = "fp8lab",
    backend: str | GemmBackend = "auto",
    monitor: Monitor | None = None,
    inplace: bool = False,
    amax_reducer: AmaxReducer | None = None,
) -> nn.Module:
    """Swap the nn.Linear layers of `model` for FP8 ones; returns the converted model.

    skip: names of linears to keep (or a predicate (name, module) -> keep in high precision).
    keep_first_last: keep the first and last nn.Linear in high precision, as practitioners do.
    A recipe with a high_precision_share (nvfp4_training: 15%) keeps its last linears too.
    engine: "fp8lab" (FP8Linear, every recipe, emulated or real) or "torchao"
            (torchao.float8.convert_to_float8_training: tensorwise, rowwise,
            rowwise_with_gw_hp; emulate=True on the CPU, real kernels on a GPU).
    amax_reducer: engine "fp8lab" only; see FP8Linear (fp8lab.training.distributed passes an
            all-reduce MAX over ranks).
    The model is deep-copied unless inplace=True. Parameters are shared with the copy's
    Linear layers, so build the optimizer after converting. Converting a converted model again
    (engine "fp8lab") gives its FP8Linear layers the new recipe (kept layers go back to
    nn.Linear); subclasses of nn.Linear other than FP8Linear are left alone.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert takes a torch.nn.Module, got {type(model).__name__}")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
    if amax_reducer is not None and engine != "fp8lab":
        raise ValueError("amax_reducer needs engine='fp8lab': torchao computes its activation scales per rank")
    if engine == "torchao" and fp8_layers(model):
        raise ValueError(f"the model holds fp8lab FP8Linear layers ({', '.join(n for n, _ in fp8_layers(model))}): "
                         "convert the original model with engine='torchao', or fp8lab.nn.unwrap(model) first")
    if not inplace:
        model = copy.deepcopy(model)
    linears = _linears(model, engine)
    if not linears:
        raise ValueError(_no_linears(model))
    keep = set(get_recipe(recipe).high_precision_layers([n for n, _ in linears]) if recipe != IDENTITY else ())
    if keep_first_last:
        keep |= {linears[0][0], linears[-1][0]}
    if callable(skip):
        keep |= {n for n, m in linears if skip(n, m)}
    elif skip is not None:
        skip = set(skip)
        unknown = skip - {n for n, _ in linears}
        if unknown:
            raise ValueError(f"skip names no nn.Linear: {sorted(unknown)}; linears are {[n for n, _ in linears]}")
        keep |= skip

    if engine == "torchao":
        return _convert_torchao(model, recipe, keep)

    for name, lin in linears:
        if name in keep:
            if type(lin) is FP8Linear:  # kept in high precision: back to the plain layer
                _swap(model, name, _plain_linear(lin))
            continue
        _swap(model, name, FP8Linear.from_linear(lin, recipe, backend=backend, monitor=monitor, name=name,
                                                 amax_reducer=amax_reducer))
    return model


def _swap(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)


def _plain_linear(lin: nn.Linear) -> nn.Linear:
    """An nn.Linear sharing lin's parameters."""
    plain = nn.Linear(lin.in_features, lin.out_features, lin.bias is not None, device="meta")
    plain.weight, plain.bias = lin.weight, lin.bias
    return plain


def _convert_torchao(model: nn.Module, recipe: Recipe | str, keep: set[str]) -> nn.Module:
    name = recipe if isinstance(recipe, str) else recipe.name
    if name not in TORCHAO_RECIPES:
        raise ValueError(
            f"torchao's float8 training has recipes {', '.join(TORCHAO_RECIPES)}, not {name!r}; "
            "use engine='fp8lab' for it (torchao removed delayed scaling in 2025; its MX and "
            "blockwise training paths need a GPU)"
        )
    require("torchao", "convert(engine='torchao')")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(name)
    if not torch.cuda.is_available():
        import dataclasses

        config = dataclasses.replace(config, emulate=True)  # no FP8 kernels: torchao's emulation

    def module_filter(mod: nn.Module, fqn: str) -> bool:
        # torchao's float8 kernels need both dims divisible by 16
        return fqn not in keep and mod.in_features % 16 == 0 and mod.out_features % 16 == 0

    return convert_to_float8_training(model, config=config, module_filter_fn=module_filter)


def fp8_layers(model: nn.Module) -> list[tuple[str, FP8Linear]]:
    """The FP8Linear layers of a model, with their names."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, FP8Linear)]


def unwrap(model: nn.Module) -> nn.Module:
    """A copy of the model with every FP8Linear back to a plain nn.Linear (same weights)."""
    model = copy.deepcopy(model)
    for name, lin in fp8_layers(model):
        _swap(model, name, _plain_linear(lin))
    return model
