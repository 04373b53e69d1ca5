"""Delayed scaling inside a training loop: when an FP8 layer's amax histories take a new entry.

Public: RECORD_POLICIES, end_step(model=None, skipped=False), in_recompute(), gradients_overflowed() and
watching() (what an FP8 layer's backward calls on an inf or NaN in a gradient). DelayedState (one per FP8
layer with a delayed recipe) holds the layer's AmaxHistory per role and this step's pending amaxes.
Within a step a layer's scales never change: every training forward of the step (micro-batches, and
the recompute of activation checkpointing) scales with the history as the step found it, and each
role's amaxes of the step are reduced (max) to one pending value. When the step ends the pending
values enter the histories: with record="step" (the default) when an optimizer holding the layer's
weight steps (torch.optim's step hook; fp8lab.nn.end_step for other optimizers), with record="forward"
at every training forward (one entry per micro-batch, as TransformerEngine records).
Only training forwards record: module.training and grad enabled; activation checkpointing's recompute
(a forward inside a backward pass) sees the same tensors, so it scales and observes as the first forward
did. Evaluation (eval mode, or no grad) records nothing.
A backward pass in which an FP8 layer meets an inf or NaN gradient (a loss scaler's overflow: GradScaler then
skips optimizer.step(), so the step hook does not fire and the step's pending amaxes wait for the next step)
records no gradient amax at all, in any layer: the gradients of that pass were scaled by a loss scale that
overflowed, and their amaxes would make every later step's gradient scales too coarse for the history's length.
Its forward amaxes (inputs and weights, which the skipped step does not change) join the next step's max.
Notebook 03 teaches the history; 06 trains with it.
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections import deque
from collections.abc import Iterator

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from fp8lab.numerics.recipes import RECORD_POLICIES, ROLES, DelayedSpec
from fp8lab.numerics.scaling import AmaxHistory

__all__ = ["RECORD_POLICIES", "DelayedState", "end_step", "gradients_overflowed", "in_recompute", "watching"]

_STATES: weakref.WeakSet[DelayedState] = weakref.WeakSet()  # every live layer's state, for the step hook
_HOOKED = False
# training forwards without an optimizer step after which a layer says that its history takes no entries
# (a custom optimizer: torch.optim's hook never fires); longer gradient accumulations than this are rare
UNSTEPPED_WARNING = 256
# the backward passes (autograd graph tasks) in which a gradient held an inf or NaN: their gradient amaxes
# are left out (a pass's observations all happen while it runs, so the last few passes are enough to keep)
_OVERFLOWED: deque[int] = deque(maxlen=64)


def in_recompute() -> bool:
    """Whether this forward runs inside a backward pass: activation checkpointing's recompute
    (torch.utils.checkpoint, reentrant or not), which must not end a step. Outside any backward pass
    autograd's current graph task is -1."""
    return torch._C._current_graph_task_id() != -1


def _graph_task() -> int:
    """The autograd graph task (backward pass) this code runs in, -1 outside any."""
    return torch._C._current_graph_task_id()


def watching() -> bool:
    """Whether a delayed-scaling layer may take gradient amaxes from this backward pass (an FP8 layer's backward
    then reports overflows): one had a training forward in its step so far, or took one from this pass already."""
    if not _STATES:
        return False
    task = _graph_task()
    return any(state.forwarded or task in state.pending_gradients for state in list(_STATES))


def gradients_overflowed() -> None:
    """An FP8 layer met an inf or NaN in a gradient of this backward pass (a loss scaler's overflow step):
    every delayed-scaling layer drops the gradient amaxes it took from this pass and takes none more
    from it. Called inside the backward pass; outside one it does nothing."""
    task = _graph_task()
    if task == -1 or task in _OVERFLOWED:
        return
    _OVERFLOWED.append(task)
    for state in list(_STATES):
        state.drop_gradients(task)


def _on_optimizer_step(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    """torch.optim's global step post-hook: the step of every layer ends whose parameters this optimizer
    holds (any of them), or that has no trainable parameter (a frozen layer steps with any optimizer)."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for state in list(_STATES):
        module = state.module()
        if module is None or state.policy != "step":
            continue
        params = list(module.parameters())
        if any(id(p) in held for p in params) or not any(p.requires_grad for p in params):
            state.commit()


def _hook_optimizers() -> None:
    global _HOOKED
    if not _HOOKED:
        register_optimizer_step_post_hook(_on_optimizer_step)
        _HOOKED = True


def end_step(model: nn.Module | None = None, skipped: bool = False) -> int:
    """End the training step of every delayed-scaling layer of `model` (None: of every model): its
    pending amaxes enter its histories. torch.optim optimizers do this when they step (for the layers
    whose parameters they hold); call it after the step of any other optimizer. skipped=True drops the
    pending amaxes instead (a step your loop skipped because of an overflow no FP8 layer saw, e.g. an
    inf only in a high-precision module's gradients: `if scaler.get_scale() < before: end_step(model,
    skipped=True)`). Returns how many layers took an entry (or dropped one)."""
    states = list(_STATES) if model is None else [
        s for m in model.modules() for s in _states_of(m)]
    return sum(s.commit(skipped) for s in states)


def _states_of(module: nn.Module) -> Iterator[DelayedState]:
    for value in vars(module).values():
        if isinstance(value, DelayedState):
            yield value
        elif isinstance(value, dict):
            yield from (v for v in value.values() if isinstance(v, DelayedState))


class DelayedState:
    """One FP8 GEMM site's delayed scaling: an AmaxHistory per role, this step's pending amax per role.

    module: the module that owns it (its `training` flag; an optimizer step over its parameters ends the
    step); name: for messages.

    scale_amax(role, current) -> the amax this role is scaled with in this step (the history's, or the
    current amax while the history is empty); observe(role, current) adds a training forward's (or its
    backward's) amax to the step's pending max; commit() ends the step. A NaN amax of an input or weight
    (a NaN in the tensor) is left out of the history, counted in `skipped` and warned about once: that
    step's output holds the NaN, as with every recipe, and the next steps scale as if the batch had not
    come (TransformerEngine likewise keeps its last finite scale); an infinite one raises ValueError. A
    gradient with an inf or NaN never reaches observe: the layer runs that GEMM in high precision and
    calls gradients_overflowed(), which drops the whole backward pass's gradient amaxes in every layer
    (drop_gradients); the layer that met it counts it in skipped["grad_output"] (not warned: a loss
    scaler overflows on purpose).
    Gradient amaxes are kept per backward pass (pending_gradients: graph task -> max) until the step ends.
    """

    def __init__(self, spec: DelayedSpec, module: nn.Module, name: str = "") -> None:
        self.policy = spec.record
        self.histories: dict[str, AmaxHistory] = {role: spec.new_history() for role in ROLES}
        self.pending: dict[str, float] = {}  # input, weight: this step's max
        self.pending_gradients: dict[int, float] = {}  # grad_output: this step's max per backward pass
        self.skipped: dict[str, int] = dict.fromkeys(ROLES, 0)
        self.unstepped = 0  # training forwards since the last entry
        self.forwarded = False  # a training forward since the step began: its backward may observe gradients
        self.name = name
        self.module = weakref.ref(module)
        _STATES.add(self)
        _hook_optimizers()

    def __deepcopy__(self, memo: dict) -> DelayedState:
        new = DelayedState.__new__(DelayedState)
        memo[id(self)] = new
        new.policy, new.name = self.policy, self.name
        new.histories = {role: _copy_history(h) for role, h in self.histories.items()}
        new.pending, new.skipped, new.unstepped = dict(self.pending), dict(self.skipped), self.unstepped
        new.forwarded = self.forwarded
        new.pending_gradients = dict(self.pending_gradients)
        owner = memo.get(id(self.module()))  # the module's copy, made before its attributes are copied
        new.module = weakref.ref(owner) if owner is not None else self.module
        _STATES.add(new)
        return new

    def __getstate__(self) -> dict:
        state = dict(vars(self))
        state["module"] = self.module()  # a weak reference does not pickle: the module does (it owns self)
        return state

    def __setstate__(self, state: dict) -> None:
        module = state.pop("module")
        state.setdefault("pending_gradients", {})  # (a pickle that holds none)
        state.setdefault("forwarded", True)  # (a pickle that does not say: its backward may observe)
        vars(self).update(state)
        self.module = weakref.ref(module) if module is not None else (lambda: None)
        _STATES.add(self)
        _hook_optimizers()

    def begin_forward(self) -> bool:
        """Called at the start of each forward: whether its amaxes (and its backward's) join the step's
        pending max: a forward in training mode with grad enabled. That includes a checkpointing
        recompute (it sees the same tensors: the max does not change; the reentrant kind's first
        forward runs without grad, so its recompute is the one that counts). Under record="forward" a
        forward in training mode that is not a recompute first ends the previous forward's step."""
        module = self.module()
        training = bool(module is None or module.training)
        if training and self.policy == "forward" and not in_recompute():
            self.commit()
        records = training and torch.is_grad_enabled()
        self.forwarded = self.forwarded or records
        if records and self.policy == "step" and not in_recompute():
            self.unstepped += 1
            if self.unstepped == UNSTEPPED_WARNING:
                warnings.warn(f"{self.name or 'FP8Linear'}: {UNSTEPPED_WARNING} training forwards and no optimizer "
                              "step: delayed scaling records one amax per optimizer step, and torch.optim's step "
                              "hook has not fired for this layer's weight, so its history takes no entry and every "
                              "step scales with the current amax. With another optimizer call "
                              "fp8lab.nn.end_step(model) after each step (or use DelayedSpec(record='forward'))",
                              RuntimeWarning, stacklevel=4)
        return records

    def scale_amax(self, role: str, current: torch.Tensor) -> torch.Tensor:
        """The amax `role` is scaled with in this step: the history's, or `current` (shape ()) while
        the history is empty."""
        past = self.past_amax(role, current.device)
        return current.reshape(()) if past is None else past

    def past_amax(self, role: str, device: torch.device) -> torch.Tensor | None:
        """The history's amax for `role` (shape (), float32), or None while the history is empty."""
        past = self.histories[role].amax()
        return None if past is None else torch.tensor(past, dtype=torch.float32, device=device)

    def observe(self, role: str, current: torch.Tensor) -> None:
        """Add this amax to the step's pending max for `role` (a NaN is skipped, counted and warned; a
        gradient's is kept per backward pass, and none is taken from a pass that overflowed)."""
        value = float(current.max())
        if role == "grad_output" and not math.isnan(value):
            task = _graph_task()
            if task not in _OVERFLOWED:
                self.pending_gradients[task] = max(self.pending_gradients.get(task, value), value)
            return
        if math.isnan(value):
            self.skipped[role] += 1
            if self.skipped[role] == 1:
                warnings.warn(f"{self.name or 'FP8Linear'}: a NaN in its {role} (an amax of NaN) is left out of "
                              "the delayed-scaling history; this step's output holds the NaN, the next steps "
                              "scale from the finite amaxes (counted in DelayedState.skipped)", RuntimeWarning,
                              stacklevel=4)
            return
        self.pending[role] = max(self.pending.get(role, value), value)

    def drop_gradients(self, task: int) -> None:
        """Leave out the gradient amaxes of backward pass `task` (it overflowed: gradients_overflowed)."""
        self.pending_gradients.pop(task, None)

    def commit(self, skipped: bool = False) -> bool:
        """End this step: each role's pending amax enters its history (skipped=True: is dropped). Whether
        anything was pending."""
        self.forwarded = False
        if self.pending_gradients:
            self.pending["grad_output"] = max(self.pending_gradients.values())
            self.pending_gradients.clear()
        if not self.pending:
            return False
        if not skipped:
            for role, amax in self.pending.items():
                self.histories[role].record(amax)
        self.pending.clear()
        self.unstepped = 0
        return True

    def reset(self) -> None:
        for h in self.histories.values():
            h.reset()
        self.pending.clear()
        self.pending_gradients.clear()


def _copy_history(h: AmaxHistory) -> AmaxHistory:
    new = AmaxHistory(h.length, h.algo)
    for a in h.history:
        new.record(a)
    return new

