"""What lets FP8Linear stand in for nn.Linear in a user's model: the compatibility armour around its GEMMs.

Public: autocast_operands and no_autocast (torch.autocast), refuse_double_backward and VMAP_REFUSAL
(torch.func and create_graph=True), apply_positional (an autograd.Function's apply without torch's per-call
signature binding), at_least_one_row (empty batches), all_finite (a loss scaler's
overflow, found in one cheap pass), quantize_if_finite (a gradient quantized where it is finite, found in that
pass), save_histories and load_histories (delayed scaling's state_dict),
fp8_subclass (the FP8 class of another linear class). fp8lab.training.layers uses them; none of this
changes a number FP8Linear computes.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn
from torch._functorch.utils import unwrap_dead_wrappers

from fp8lab.numerics import kernels
from fp8lab.numerics.quantize import QuantizedTensor, quantize_with
from fp8lab.numerics.scaling import PerTensor, TensorScaling
from fp8lab.training.delayed import DelayedState

__all__ = ["VMAP_REFUSAL", "all_finite", "apply_positional", "at_least_one_row", "autocast_operands", "fp8_subclass",
           "load_histories", "no_autocast", "quantize_if_finite", "refuse_double_backward", "save_histories"]


# ---- torch.autocast: the operands cast as nn.Linear's, the GEMMs exact -------------------------------------------


def autocast_operands(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
    """(x, weight, bias) cast as autocast casts nn.Linear's (to autocast's dtype, where it is on for x's
    device), and whether it was on: the caller then runs the layer with autocast off (no_autocast)."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        x, weight = x.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
        return x, weight, bias, True
    return x, weight, bias, False


def no_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """autocast off for `device_type` where it is on (a backward called inside autocast: the GEMMs stay exact)."""
    return torch.autocast(device_type, enabled=False) if torch.is_autocast_enabled(device_type) \
        else contextlib.nullcontext()


# ---- torch.func and second derivatives: refused with the reason ----------------------------------------------------

VMAP_REFUSAL = ("torch.func.vmap over an FP8 layer is not supported: a scale's amax spans the whole batch (per "
                "tensor) or rows of it, so the layer cannot be split into independent per-sample calls; run the "
                "batch as one call (torch.func.grad and functional_call work)")

_NO_DOUBLE_BACKWARD = (
    "{name}: a second derivative through an FP8 layer is not computed (autograd.grad(..., create_graph=True), "
    "a gradient penalty, double backward): its backward quantizes dy and runs FP8 GEMMs, which have no "
    "derivative of their own, and building no graph would drop those terms silently. Keep the layers the "
    "penalty differentiates through in high precision (convert(..., skip=[...]) or overrides={{name: None}}), "
    "or take that gradient on fp8lab.nn.unwrap(model)")


def _differentiating_backward() -> bool:
    """Whether a derivative of the backward pass itself is asked for: autograd's create_graph=True (grad
    mode on inside backward), or torch.func.grad nested in another transform. One torch.func.grad level
    runs backward with grad mode on as well, and asks for nothing more."""
    if not torch.is_grad_enabled():
        return False
    level = torch._C._functorch.maybe_current_level()
    return level is None or level > 1


def refuse_double_backward(name: str) -> None:
    """RuntimeError inside a backward pass that is itself differentiated (see _differentiating_backward)."""
    if _differentiating_backward():
        raise RuntimeError(_NO_DOUBLE_BACKWARD.format(name=name or "an FP8Linear"))


def apply_positional(function: type[torch.autograd.Function], args: tuple):
    """function.apply(*args) for an autograd.Function whose forward takes every argument positionally, with no
    defaults: the same call without torch's binding of the arguments to forward's signature (inspect.signature on
    every call, which only fills defaults); under a torch.func transform, torch's own apply."""
    if torch._C._are_functorch_transforms_active():
        return torch.autograd.Function.apply.__func__(function, *args)
    return super(torch.autograd.Function, function).apply(*unwrap_dead_wrappers(args))


# ---- empty batches and non-finite gradients ------------------------------------------------------------------------


def at_least_one_row(t: torch.Tensor, m: int) -> torch.Tensor:
    """t[M, C], or one row of zeros where M is 0: an empty batch is quantized (and its amaxes reduced
    across ranks, and recorded) as an all-zero row would be, and gives the empty result."""
    return t if m else t.new_zeros(1, t.shape[1])


def all_finite(t: torch.Tensor) -> bool:
    """Whether t holds no inf and no NaN: its max and min are finite (both propagate NaN), two vectorized
    reductions instead of torch.isfinite's boolean copy (about 15x faster on the CPU); where the C kernels
    run and may read t, its amax (NaN where a NaN is, else inf where an inf is) in one pass; one value (a per-tensor
    amax) read as a number."""
    if t.numel() <= 1:
        return t.numel() == 0 or math.isfinite(float(t))
    t = t.detach()  # a check, not a step of the graph: no warning when t needs its gradient
    if kernels.enabled(t):
        return math.isfinite(float(kernels.amax_per_block(t, PerTensor())))
    return math.isfinite(float(t.amax())) and math.isfinite(float(t.amin()))


def quantize_if_finite(t: torch.Tensor, scaling: TensorScaling, count: bool = False) -> QuantizedTensor | None:
    """quantize_with(t, scaling, count=count), or None where t holds an inf or NaN, read from the quantizing pass
    (its block amaxes are NaN where a NaN is; quantize refuses an infinity): a gradient that must be checked before
    its GEMM is read once instead of twice. Rounding to nearest only: stochastic rounding would have drawn before it
    could see an infinity (a gradient rounded so is checked first, with all_finite)."""
    if scaling.rounding != "nearest":
        raise ValueError(f"quantize_if_finite rounds to nearest; got rounding={scaling.rounding!r} (check first)")
    try:
        q = quantize_with(t, scaling, count=count)
    except ValueError:
        if all_finite(t):
            raise  # (a refusal other than an infinity's)
        return None
    return q if all_finite(q.amax) else None


# ---- delayed scaling's histories in state_dict ---------------------------------------------------------------------

_HISTORY_KEY = "amax_history."


def save_histories(delayed: DelayedState | None, destination: dict, prefix: str) -> None:
    """Each role's recorded amaxes (float64, oldest first) under prefix + amax_history.<role>."""
    for role, history in (delayed.histories if delayed is not None else {}).items():
        destination[prefix + _HISTORY_KEY + role] = torch.tensor(history.history, dtype=torch.float64, device="cpu")


def load_histories(delayed: DelayedState | None, state_dict: dict, prefix: str, strict: bool,
                   unexpected_keys: list) -> None:
    """The saved amaxes replace each history's (keys absent: histories kept); the keys are taken out."""
    for key in [k for k in state_dict if k.startswith(prefix + _HISTORY_KEY)]:
        role = key[len(prefix + _HISTORY_KEY):]
        saved = state_dict.pop(key)
        if delayed is None or role not in delayed.histories:
            if strict:
                unexpected_keys.append(key)
            continue
        history = delayed.histories[role]
        history.reset()
        for amax in saved.tolist():
            history.record(amax)


# ---- FP8 subclasses of other linear classes ------------------------------------------------------------------------

_FP8_CLASSES: dict[tuple[type, type], type] = {}


def fp8_subclass(fp8: type[nn.Linear], cls: type[nn.Linear], module: str) -> type[nn.Linear]:
    """A subclass of `fp8` (FP8Linear) and `cls`, made once per pair, named FP8<cls> in `module`; it keeps `cls`
    as fp8lab_base (an instance pickles as an instance of the FP8 class of that base)."""
    if (fp8, cls) not in _FP8_CLASSES:
        name = f"FP8{cls.__name__}"
        _FP8_CLASSES[(fp8, cls)] = type(name, (fp8, cls), {"fp8lab_base": cls, "__module__": module,
                                                           "__qualname__": name})
    return _FP8_CLASSES[(fp8, cls)]
