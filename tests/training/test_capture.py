"""fp8lab.training.capture: one high-precision forward and backward keeping every linear GEMM's operands, checked
against autograd by hand; the model left as it was (fp8lab.inspect's report is tested with training.readiness)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fp8lab.training.capture import capture, captures


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_each_call_keeps_x_the_weight_and_dy_as_autograd_computes_them():
    model = _model()
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    cap = capture(model, x, lambda out: out.square().sum())
    assert [(c.layer, c.call) for c in cap.calls] == [("0", 0), ("2", 0)]
    h = model[1](model[0](x)).detach().requires_grad_(True)  # by hand: fc2's input and its output gradient
    out = model[2](h)
    dy = 2 * out.detach()  # d(sum out^2)/d out
    second = cap.calls[1]
    assert torch.equal(second.x, h.detach()) and torch.equal(second.weight, model[2].weight.detach())
    torch.testing.assert_close(second.grad_output, dy)
    assert cap.loss == pytest.approx(float(out.detach().square().sum()), rel=1e-6)
    assert second.nbytes == second.x.nbytes + second.grad_output.nbytes


def test_the_model_is_left_as_it_was():
    model = _model().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    before = [p.clone() for p in model.parameters()]
    capture(model, torch.randn(3, 8), mode="train")
    assert not model.training and all(not p.requires_grad and p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_budget_splits_the_sites_over_passes_and_bad_arguments_are_refused():
    model = _model()
    x = torch.randn(4, 8)
    passes = list(captures(model, x, max_capture_mb=1e-9))  # every site alone
    assert [[c.layer for c in p.calls] for p in passes] == [["0"], ["2"]]
    with pytest.raises(ValueError, match="unknown mode"):
        capture(model, x, mode="test")
    with pytest.raises(ValueError, match="max_capture_mb"):
        list(captures(model, x, max_capture_mb=0))
    with torch.inference_mode(), pytest.raises(ValueError, match="inference_mode"):
        capture(model, x)
