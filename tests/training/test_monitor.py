"""The Monitor (fp8lab/training/monitor.py): what each quantization of a training step did, and the gradients
a loss scaler's overflow step leaves unquantized, listed apart instead of recorded as statistics."""

import math

import torch
from torch import nn

from fp8lab.nn import Monitor, convert


def test_every_steps_a_monitor_records_one_step_in_every():
    monitor = Monitor(every=2)
    model = convert(nn.Linear(8, 4), "tensorwise", monitor=monitor)
    for step in range(4):
        monitor.step = step
        model(torch.randn(4, 8)).sum().backward()
    assert sorted(set(monitor.frame().step)) == [0, 2]


def test_the_monitor_lists_a_non_finite_gradient_apart_and_records_no_statistics_of_it():
    monitor = Monitor()
    model = convert(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)), "tensorwise", monitor=monitor)
    x = torch.randn(8, 16)
    model(x).backward(torch.randn(8, 4))
    rows = len(monitor.rows)
    monitor.step = 1
    dy = torch.randn(8, 4)
    dy[0, 0] = math.inf
    model(x).backward(dy)
    frame = monitor.frame()
    assert set(frame[frame.step == 1].role) == {"input", "weight"}  # the forward's two operands, per layer
    assert len(monitor.rows) == rows + 4
    assert bool(frame[["amax", "scale_max", "scale_min", "overflow", "underflow"]].map(math.isfinite).all().all())
    listed = monitor.nonfinite_frame()
    # fc2's dgrad met it (its wgrad reuses that operand); fc0 has no dgrad (x needs no gradient)
    assert list(zip(listed.layer, listed.gemm, strict=True)) == [("2", "dgrad"), ("0", "wgrad")]
    assert (listed.step == 1).all() and listed.role.eq("grad_output").all()
    assert not listed.amax.map(math.isfinite).any()
