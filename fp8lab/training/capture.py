"""What fp8lab.inspect measures: every linear GEMM's operands in one high-precision forward and backward.

Public: capture, captures (in passes under a memory budget), Capture, LinearCall, MAX_CAPTURE_MB.
The sites are exactly those fp8lab.nn.convert makes FP8 (fp8lab.training.convert.find_sites): linear
layers (a forward hook keeps x[M, K] and the weight, a tap on the output keeps dy[M, N]) and
MultiheadAttention's in-projections (its forward runs as attention_forward, whose projections are
recorded the same way). The model is left as it was (parameters, .grad, requires_grad, train/eval,
buffers, hooks, RNG). Notebook 08 introduces inspect.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab.training.attention import FP8MultiheadAttention, attention_forward
from fp8lab.training.convert import IN_PROJ, LINEAR, Site, find_sites, stray_matrices
from fp8lab.training.layers import FP8Linear

__all__ = ["MAX_CAPTURE_MB", "MODES", "Capture", "LinearCall", "capture", "captures"]

MODES = ("train", "eval")
# the float32 copies one pass keeps (each call's x and dy): beyond it, the sites are captured over
# several passes (each a forward and backward of the whole model), a group of sites at a time
MAX_CAPTURE_MB = 512.0


@dataclass
class LinearCall:
    """One call of a linear GEMM site in the captured pass: x[M, K], weight[N, K], grad_output[M, N]
    (float32 copies; batch dims flattened into M). An attention in-projection's parts (q, kv) are calls."""

    layer: str
    call: int
    x: torch.Tensor
    weight: torch.Tensor
    grad_output: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return self.x.nbytes + (self.grad_output.nbytes if self.grad_output is not None else 0)


@dataclass
class Capture:
    """What capture() saw: every linear call, what it could not see (and why), and notes."""

    calls: list[LinearCall]
    not_covered: list[dict[str, str]]
    notes: list[str]
    loss: float


class _Tap(torch.autograd.Function):
    """Identity in the forward pass; keeps the gradient that reaches it in the backward pass.

    The output is a copy, so that in-place operations on it downstream modify the copy and
    autograd still hands this node the gradient of its own output."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, call: LinearCall) -> torch.Tensor:
        ctx.call = call
        return y.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.call.grad_output = grad.detach().reshape(-1, grad.shape[-1]).float()
        return grad, None


def _to_device(batch: Any, device: torch.device) -> Any:
    """Every tensor in batch (nested tuples, lists, dicts) moved to device; everything else as is. A tensor
    made under torch.inference_mode() is copied into an ordinary one (autograd cannot save an inference
    tensor for the backward pass)."""
    if isinstance(batch, torch.Tensor):
        return batch.clone().to(device) if batch.is_inference() else batch.to(device)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _run(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, tuple | list):
        return model(*batch)
    return model(batch)


def _weights(site: Site) -> list[torch.Tensor]:
    m = site.module
    if site.kind == LINEAR:
        return [m.weight]
    return [m.in_proj_weight] if m._qkv_same_embed_dim else [m.q_proj_weight, m.k_proj_weight, m.v_proj_weight]


def _check_inspectable(model: nn.Module, sites: list[Site], not_covered: list[dict]) -> None:
    """ValueError, saying why, for a model inspect cannot measure: converted already, no linear GEMM, or
    no values (meta)."""
    converted = [n or "(model)" for n, m in model.named_modules() if isinstance(m, FP8Linear | FP8MultiheadAttention)]
    if converted:
        raise ValueError(f"the model is converted already (FP8 layers: {', '.join(converted[:6])}"
                         f"{', ...' if len(converted) > 6 else ''}): inspect measures a model in high precision to "
                         "say which recipe each layer can take. Inspect the original model, or "
                         "fp8lab.nn.unwrap(model) (a copy with every layer back in high precision)")
    if not sites:
        found = "; ".join(f"{d['module'] or '(model)'} ({d['type']}): {d['reason']}" for d in not_covered)
        raise ValueError("the model has no linear layers, so there is nothing to inspect: fp8lab's FP8 recipes "
                         "cover linear GEMMs (fp8lab.nn.convert)" + (f". Found instead: {found}" if found else ""))
    made = [n for n, p in model.named_parameters() if p.is_inference()]
    if made:
        raise ValueError(f"the model's {', '.join(made[:4])}{', ...' if len(made) > 4 else ''} were made under "
                         "torch.inference_mode(): autograd cannot differentiate inference tensors, and inspect "
                         "needs the gradients. Build (or load) the model outside inference mode")
    meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if meta:
        raise ValueError(f"the model's {', '.join(meta[:4])}{', ...' if len(meta) > 4 else ''} are on the meta device: "
                         "they have shapes but no values, and inspect needs values. Materialize the model first "
                         "(model.to_empty(device='cpu'), then load its weights or reset_parameters())")


def capture(model: nn.Module, batch: Any, loss_fn: Callable[[Any], torch.Tensor] | None = None,
            mode: str | None = None) -> Capture:
    """One high-precision forward and backward of `model` on `batch`, keeping every site's operands.

    batch: a tensor (model(batch)), a tuple or list (model(*batch)) or a dict (model(**batch));
        its tensors are moved to the device of the model's parameters.
    loss_fn: output -> scalar loss (close over your targets). None: the output itself if it is a
        scalar, else 0.5 * mean(output^2), a stand-in whose gradients are not your training's.
    mode: "train" or "eval" for this pass (None: the model's own); restored afterwards.
    Returns a Capture: per call x[M, K], weight[N, K], grad_output[M, N], the modules it could not cover
    with the reason, and notes. A call with no rows (an empty batch) is listed as not covered. A
    converted model, or one on the meta device, is refused with ValueError.
    """
    return next(captures(model, batch, loss_fn, mode, max_capture_mb=None))


def captures(model: nn.Module, batch: Any, loss_fn: Callable[[Any], torch.Tensor] | None = None,
             mode: str | None = None, max_capture_mb: float | None = MAX_CAPTURE_MB) -> Iterator[Capture]:
    """capture() in passes: each pass keeps the operands of the sites not captured yet, in the order the
    forward calls them, while their float32 copies stay within max_capture_mb (a site is kept whole:
    at least one per pass); the next pass picks up the rest. Every pass runs the same forward (the
    same RNG state, the buffers as they were). None: one pass, no bound. Each Capture holds its pass's
    calls; the not-covered list and notes come with the last."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)} (or None: the model's own)")
    if torch.is_inference_mode_enabled():
        raise ValueError("inspect is called inside torch.inference_mode(): it runs a forward and a backward pass "
                         "to measure the gradients, and inference mode allows no backward pass (torch.enable_grad "
                         "does not leave it). Call fp8lab.inspect outside the `with torch.inference_mode():` block "
                         "(torch.no_grad() around your own evaluation instead leaves inspect free)")
    if max_capture_mb is not None and not max_capture_mb > 0:
        raise ValueError(f"max_capture_mb must be > 0 (or None: no bound), got {max_capture_mb!r}")
    sites, left, other = find_sites(model)
    not_covered = [*left, *other]
    _check_inspectable(model, sites, not_covered)
    device = next(model.parameters()).device
    batch = _to_device(batch, device)
    budget = None if max_capture_mb is None else max_capture_mb * 2**20
    rng = [device.index or 0] if device.type == "cuda" else []
    cpu_state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state(rng[0]) if rng else None
    done: set[str] = set()
    called: set[str] = set()
    while True:
        notes: list[str] = []
        calls: list[LinearCall] = []
        taken: set[str] = set()
        with torch.random.fork_rng(devices=rng), _left_as_it_is(model), _tapped(sites, calls, done, budget, taken,
                                                                                  called):
            torch.set_rng_state(cpu_state)
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, rng[0])
            if mode is not None:
                model.train(mode == "train")
            weights = [w for s in sites for w in _weights(s)]
            for w in weights:
                w.requires_grad_(True)  # so that every site's output is part of the graph
            with torch.enable_grad():
                loss = _loss(_run(model, batch), loss_fn, notes)
                # gradients without touching any .grad: autograd.grad returns them instead of accumulating
                torch.autograd.grad(loss, weights, allow_unused=True)
        done |= taken
        last = not taken or done >= {s.name for s in sites} or budget is None
        kept = [c for c in calls if c.grad_output is not None and c.x.shape[0] > 0]
        _check_finite(kept)
        if last:
            not_covered += _uncovered_calls(sites, called, calls)
            stray = stray_matrices(model, sites)
            if stray:
                notes.append("2-D parameters outside the linear layers: " + ", ".join(stray) + ". If the forward "
                             "pass multiplies by them (a tied output head, a projection written as F.linear or @), "
                             "that GEMM is not inspected here and convert leaves it in high precision.")
            yield Capture(kept, not_covered, notes, float(loss.detach()))
            return
        yield Capture(kept, [], [], float(loss.detach()))


@contextlib.contextmanager
def _left_as_it_is(model: nn.Module) -> Iterator[None]:
    """Within the block the model may change; after it, its parameters' requires_grad, its modules'
    train/eval flags and its buffers (the tensor objects and their values: a forward may write into a
    buffer, as BatchNorm's statistics, or put a new tensor in its place) are as they were."""
    params = list(model.parameters())
    requires = [p.requires_grad for p in params]
    flags = {m: m.training for m in model.modules()}
    buffers = {m: (dict(m._buffers), {k: b.detach().clone() for k, b in m._buffers.items() if b is not None})
               for m in model.modules()}
    try:
        yield
    finally:
        for p, flag in zip(params, requires, strict=True):
            p.requires_grad_(flag)
        for m, flag in flags.items():
            m.training = flag
        with torch.no_grad():
            for m, (objects, values) in buffers.items():
                m._buffers.clear()
                m._buffers.update(objects)
                for k, v in values.items():
                    objects[k].copy_(v)


@contextlib.contextmanager
def _tapped(sites: list[Site], calls: list[LinearCall], done: set[str], budget: float | None, taken: set[str],
            called: set[str]) -> Iterator[None]:
    """For the block, every site not in `done` records its calls into `calls` (x and weight in the
    forward, dy through a tap on its output) while the recorded bytes stay within `budget` (a site whose
    first call would pass it is left to the next pass, unless nothing is recorded yet). Adds the sites
    this pass records to `taken`, and every site called to `called`."""
    counts: dict[str, int] = {}
    skipped: set[str] = set()
    used = [0]

    def record(name: str, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        called.add(name)
        if name in done or name in skipped:
            return y
        if name not in taken:
            size = 4 * (x.numel() + y.numel())  # (float32 copies of x and dy)
            if budget is not None and taken and used[0] + size > budget:
                skipped.add(name)
                return y
            taken.add(name)
        call = LinearCall(name, counts.get(name, 0), x.detach().reshape(-1, x.shape[-1]).float().clone(),
                          weight.detach())
        counts[name] = call.call + 1
        used[0] += 4 * (x.numel() + y.numel())
        calls.append(call)
        return _Tap.apply(y, call)

    def hook_for(name: str):
        def hook(module: nn.Linear, args: tuple, output: torch.Tensor) -> torch.Tensor:
            return record(name, args[0], module.weight, output)
        return hook

    def attention_for(site: Site):
        mha = site.module

        def project(part: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            return record(site.name, x, weight, F.linear(x, weight, bias))

        def forward(*args, **kwargs):
            return attention_forward(mha, *args, **kwargs, project=project)
        return forward

    handles = [s.module.register_forward_hook(hook_for(s.name)) for s in sites if s.kind == LINEAR]
    attentions = [s for s in sites if s.kind == IN_PROJ]
    for s in attentions:
        s.module.forward = attention_for(s)  # (an instance attribute: the class's forward comes back after)
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for s in attentions:
            del s.module.forward


def _check_finite(calls: list[LinearCall]) -> None:
    """ValueError naming the first call (in forward order) whose input or weight, or the last (the nearest
    the loss: where a gradient's NaN starts) whose output gradient, holds a NaN or an inf: the model's own
    numbers, which no FP8 recipe can be judged on."""
    checks = [(c, what, t) for c in calls for what, t in (("input x", c.x), ("weight", c.weight))]
    checks += [(c, "output gradient dy", c.grad_output) for c in reversed(calls)]
    for c, what, t in checks:
        bad = _non_finite(t)
        if bad:
            raise ValueError(f"{c.layer} (call {c.call}): its {what} holds {bad} in high precision, before "
                             "any FP8: inspect measures what FP8 would lose of finite values, so it cannot "
                             "judge this pass. Find where they come from (the batch, the model's own "
                             "arithmetic, the loss), then inspect")


def _uncovered_calls(sites: list[Site], called: set[str], calls: list[LinearCall]) -> list[dict]:
    """The sites the passes did not call, and the calls with nothing to measure (no rows, no gradient)."""
    out = [{"module": s.name, "type": s.type, "reason": "not called in this forward pass"}
           for s in sites if s.name not in called]
    types = {s.name: s.type for s in sites}
    for c in calls:
        if c.x.shape[0] == 0:
            out.append({"module": c.layer, "type": types[c.layer],
                        "reason": f"call {c.call}: it had no rows (an empty batch): nothing to measure"})
        elif c.grad_output is None:
            out.append({"module": c.layer, "type": types[c.layer],
                        "reason": f"call {c.call}: its output does not reach the loss (no gradient)"})
    return out


def _loss(output: Any, loss_fn: Callable[[Any], torch.Tensor] | None, notes: list[str]) -> torch.Tensor:
    if loss_fn is not None:
        loss = loss_fn(output)
    elif isinstance(output, torch.Tensor) and output.numel() == 1:
        loss = output
    elif isinstance(output, torch.Tensor):
        loss = 0.5 * output.float().square().mean()
        notes.append("no loss_fn: gradients come from the stand-in loss 0.5 * mean(output^2); pass "
                     "loss_fn=lambda out: your_loss(out, targets) for your training's gradients.")
    else:
        raise ValueError(f"the model returned a {type(output).__name__}, not a tensor: pass loss_fn=... that turns "
                         "it into a scalar loss")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError(f"loss_fn must return a scalar tensor, got {type(loss).__name__} "
                         f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
    if not bool(torch.isfinite(loss.detach()).all()):
        source = "loss_fn returned" if loss_fn is not None else "the loss is"
        bad = _non_finite(output)
        where = f"; the model's output itself holds {bad}, so the forward pass made it" if bad else ""
        raise ValueError(f"{source} {float(loss.detach().reshape(()))}{where}: every gradient inspect measures "
                         "would be NaN or infinite, and its report would blame FP8 for every layer. Fix the loss "
                         "or the batch first (a log of 0, a 0/0, a NaN in the inputs or targets), then inspect")
    if not loss.requires_grad:
        raise ValueError("the loss does not depend on the model's linear layers (it has no gradient)")
    return loss.reshape(())


def _non_finite(t: Any) -> str:
    """"3 NaN and 1 infinite value(s)" for a tensor holding them, else ""."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return ""
    nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    return " and ".join(part for part in (f"{nan} NaN" if nan else "", f"{inf} infinite" if inf else "")
                        if part) + " value(s)" if nan or inf else ""
