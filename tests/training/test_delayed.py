"""fp8lab.training.delayed: when a layer's amax histories take an entry (one per optimizer step, the step's max),
driven directly through DelayedState. FP8Linear's use of it is tested with the layer (tests of training.layers)."""

from __future__ import annotations

import pickle
import warnings
import weakref

import pytest
import torch
from torch import nn

from fp8lab.numerics.recipes import DelayedSpec
from fp8lab.training import delayed
from fp8lab.training.delayed import DelayedState, end_step, gradients_overflowed, in_recompute, watching


def _state(record: str = "step", length: int = 4) -> tuple[nn.Module, DelayedState]:
    module = nn.Linear(2, 2)
    module.delayed = DelayedState(DelayedSpec(length, "max", record), module, "toy")
    return module, module.delayed


def test_a_step_takes_the_max_of_its_forwards_and_scales_with_the_history_as_it_found_it():
    module, s = _state()
    assert s.begin_forward()  # training, grad enabled
    assert float(s.scale_amax("input", torch.tensor(2.0))) == 2.0  # empty history: the current amax
    s.observe("input", torch.tensor(2.0))
    s.observe("input", torch.tensor(5.0))
    s.observe("input", torch.tensor(3.0))
    assert s.histories["input"].history == []  # nothing enters within the step
    assert end_step(module) == 1
    assert s.histories["input"].history == [5.0]
    assert float(s.scale_amax("input", torch.tensor(100.0))) == 5.0  # the history's, not the current amax
    assert end_step(module) == 0  # nothing pending: no entry


def test_an_optimizer_step_over_the_layers_weight_ends_its_step_and_another_does_not():
    module, s = _state()
    other = nn.Linear(2, 2)
    s.observe("weight", torch.tensor(1.5))
    torch.optim.SGD(other.parameters(), lr=0.1).step()
    assert s.histories["weight"].history == []
    torch.optim.SGD(module.parameters(), lr=0.1).step()
    assert s.histories["weight"].history == [1.5]


def test_record_forward_takes_one_entry_per_training_forward():
    _, s = _state("forward")
    for amax in (1.0, 4.0, 2.0):
        s.begin_forward()  # ends the previous forward's step
        s.observe("input", torch.tensor(amax))
    assert s.histories["input"].history == [1.0, 4.0]
    s.commit()
    assert s.histories["input"].history == [1.0, 4.0, 2.0]


def test_fp8_backwards_watch_for_overflows_while_a_delayed_layers_step_may_still_take_gradient_amaxes(monkeypatch):
    """watching(): after a delayed layer's training forward, until its step ends (its gradients may still come in
    this backward pass); an evaluation forward and a finished step leave every other FP8 layer's backward unwatched."""
    monkeypatch.setattr(delayed, "_STATES", weakref.WeakSet())  # (only this test's state: others' stay out)
    module, s = _state()
    module.eval()
    s.begin_forward()
    assert not watching()
    module.train()
    s.begin_forward()
    assert watching()
    torch.optim.SGD(module.parameters(), lr=0.1).step()  # the step ends
    assert not watching()
    s.pending_gradients[-1] = 1.0  # a gradient amax taken from this pass (-1: outside any backward pass)
    assert watching()
    s.commit()
    assert not watching() and s.histories["grad_output"].history == [1.0]


def test_evaluation_forwards_record_nothing():
    module, s = _state()
    module.eval()
    assert not s.begin_forward()
    module.train()
    with torch.no_grad():
        assert not s.begin_forward()


def test_a_nan_amax_is_skipped_counted_and_warned_once_and_skipped_steps_drop_their_entry():
    _, s = _state()
    with pytest.warns(RuntimeWarning, match="NaN"):
        s.observe("input", torch.tensor(float("nan")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.observe("input", torch.tensor(float("nan")))  # counted, not warned again
    assert s.skipped["input"] == 2 and s.pending == {}
    s.observe("input", torch.tensor(7.0))
    assert s.commit(skipped=True) and s.histories["input"].history == []


def test_gradient_amaxes_outside_a_backward_pass_count_and_an_overflow_there_does_nothing():
    _, s = _state()
    gradients_overflowed()  # outside a backward pass: nothing to drop
    s.observe("grad_output", torch.tensor(3.0))
    s.commit()
    assert s.histories["grad_output"].history == [3.0]


def test_in_recompute_is_true_only_inside_a_backward_pass():
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append(in_recompute())
            return g

    assert not in_recompute()
    Probe.apply(torch.ones(2, requires_grad=True)).sum().backward()
    assert seen == [True]


def test_a_copy_and_a_pickle_keep_the_history_and_follow_their_module():
    import copy

    module, s = _state()
    s.observe("input", torch.tensor(6.0))
    s.commit()
    clone = copy.deepcopy(module)
    assert clone.delayed.histories["input"].history == [6.0] and clone.delayed.module() is clone
    loaded = pickle.loads(pickle.dumps(module))
    assert loaded.delayed.histories["input"].history == [6.0] and loaded.delayed.module() is loaded
    clone.delayed.observe("input", torch.tensor(9.0))
    clone.delayed.commit()
    assert s.histories["input"].history == [6.0]  # independent histories
