"""Hardening: what users do with models keeps working. torch.compile with the C kernels on,
torch.save / torch.load, copy.deepcopy, empty batches: each case as a user would write it.

Crash-prone cases run in a process of their own (a dead process fails the test, not the suite).
"""

import copy
import dataclasses
import io
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import fp8lab
from fp8lab import E2M1, E4M3, PerBlock
from fp8lab.gemm import GemmBackend, plan_gemm
from fp8lab.nn import FP8Linear, convert, layer_gemms
from fp8lab.numerics import kernels
from fp8lab.numerics.quantize import QuantizedTensor
from fp8lab.numerics.recipes import RECIPES, VARIANTS
from fp8lab.training.models import TeacherTask, make_model
from fp8lab.training.train import train_step
from tests.scaled_mm_standin import StandIn

ROOT = Path(__file__).resolve().parents[2]
needs_kernels = pytest.mark.skipif(not kernels.status()[0], reason=f"kernels not built here: {kernels.status()[1]}")


def _python(code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """code in a fresh Python (the repository on its path); the timeout is a hang guard only."""
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


# ---- torch.compile with the C kernels on ---------------------------------------------------------------------

COMPILED = """
import sys, torch, fp8lab
from fp8lab.numerics import kernels
from fp8lab.numerics.quantize import QuantizedTensor
from fp8lab.nn import convert
from fp8lab.training.models import TeacherTask, make_model
from fp8lab.training.train import train_step
assert kernels.status()[0], kernels.status()[1]
backend = sys.argv[1]
f = torch.compile(lambda x: fp8lab.quantize(x, granularity="1x32").dequantize(), backend=backend)
x = torch.randn(16, 64)
for _ in range(3):
    y = f(x)
assert torch.equal(y, fp8lab.quantize(x, granularity="1x32").dequantize())
task = TeacherTask()
for recipe in ("tensorwise", "mxfp8"):
    base = make_model("mlp", 0, hidden=64)
    eager, compiled = convert(base, recipe, backend="emulated"), convert(base, recipe, backend="emulated")
    step = torch.compile(compiled, backend=backend)
    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-3)
    opt_c = torch.optim.Adam(compiled.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        xb, yb = task.batch(g, 32)
        le = train_step(eager, opt_e, task.loss, xb, yb)
        lc = train_step(step, opt_c, task.loss, xb, yb)
        print("LOSS", recipe, le, lc)
    worst = max(float((a - b).abs().max()) for a, b in zip(eager.parameters(), compiled.parameters()))
    print("WEIGHTS", recipe, worst)
print("DONE")
"""


def _compiled_run(backend: str) -> None:
    proc = _python(COMPILED.replace("sys.argv[1]", repr(backend)))
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert proc.stdout.rstrip().endswith("DONE"), proc.stdout[-2000:]
    for line in proc.stdout.splitlines():
        if line.startswith("LOSS"):
            _, _, eager, compiled = line.split()
            # the same GEMMs on the same codes: equal up to the fp32 summation order a compiler may change
            assert abs(float(eager) - float(compiled)) <= 1e-5 * abs(float(eager)), line
        if line.startswith("WEIGHTS"):
            assert float(line.split()[2]) <= 1e-6, line  # Adam's steps of 1e-3 agree to their last bits


@needs_kernels
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_runs_with_the_c_kernels_on(backend):
    """quantize under torch.compile, and a compiled converted model, run with the C kernels on: their
    entry points are opaque to the compiler (traced through, they die with SIGABRT "malloc(): unaligned
    tcache chunk", SIGSEGV or SIGBUS), and a compiled training step equals the eager one."""
    _compiled_run(backend)


@needs_kernels
@pytest.mark.slow
def test_torch_compile_with_inductor_trains_like_eager():
    """torch.compile's default backend (inductor, which compiles C++ for the CPU: slow to start)."""
    _compiled_run("inductor")


# ---- save, reload, copy ------------------------------------------------------------------------------------------


def _reloaded(model: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_copied_or_reloaded_formats_are_the_formats(how):
    """A format after copy.deepcopy or torch.save / torch.load is the format: compared by identity, a copy
    makes plan_gemm refuse the real kernel ("needs E4M3 operands, got e4m3 and e4m3"), and E2M1 codes()
    return E4M3 bytes while packed() refuses."""
    copy_of = copy.deepcopy if how == "deepcopy" else _reloaded
    g = torch.Generator().manual_seed(0)
    x, w, dy = torch.randn(64, 256, generator=g), torch.randn(128, 256, generator=g), torch.randn(64, 128, generator=g)
    for recipe in ("blockwise", "mxfp8", "nvfp4"):
        pairs = layer_gemms(x, w, dy, recipe)
        arch = (9, 0) if recipe == "blockwise" else (10, 0)
        for pair in pairs.values():
            again = copy_of(pair)
            assert plan_gemm(*again, arch, "12.9") == plan_gemm(*pair, arch, "12.9"), recipe
    q = fp8lab.quantize(x, E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True)
    c = copy_of(q)
    assert torch.equal(c.codes(), q.codes()) and int(c.codes().max()) <= 15
    assert torch.equal(c.packed().view(torch.uint8), q.packed().view(torch.uint8))
    assert copy.deepcopy(E4M3) is E4M3 and copy_of(fp8lab.get_recipe("nvfp4")).input.fmt is E2M1


def test_formats_equal_to_the_constants_are_treated_as_them():
    """A format is its fields: an equal object that is not the constant (built by hand, or unpickled
    from another version's file) plans, codes and packs as the constant does."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(64, 256, generator=g), torch.randn(128, 256, generator=g)
    e4m3, e2m1 = dataclasses.replace(E4M3), dataclasses.replace(E2M1)
    assert e4m3 == E4M3 and e4m3 is not E4M3 and fp8lab.get_format(e4m3) is E4M3
    a, b = fp8lab.quantize(x, E4M3, PerBlock(1, 128)), fp8lab.quantize(w, E4M3, PerBlock(128, 128))
    twin = QuantizedTensor(a.data, a.scale, e4m3, a.granularity)
    assert plan_gemm(twin, b, (9, 0), "12.9") == plan_gemm(a, b, (9, 0), "12.9")
    q = fp8lab.quantize(x, E2M1, PerBlock(1, 16), scale_fmt=E4M3)
    hand = QuantizedTensor(q.data, q.scale, e2m1, q.granularity, scale_fmt=dataclasses.replace(E4M3))
    assert torch.equal(hand.codes(), q.codes()) and torch.equal(hand.packed().view(torch.uint8),
                                                                 q.packed().view(torch.uint8))


@pytest.mark.parametrize("recipe", ["delayed", "blockwise"])
@pytest.mark.parametrize("how", ["deepcopy", "torch.save", "state_dict"])
def test_a_converted_model_round_trips_with_identical_outputs_and_kernels(monkeypatch, how, recipe):
    """A model after some steps, copied, saved whole or saved as a state dict: the copy's next step
    gives the same outputs and gradients (delayed histories included: left out of state_dict, a reloaded
    model recalibrates and its next output differs), and its GEMMs run the same kernels (through a
    stand-in of sm_90's scaled matmuls): a blockwise copy never runs emulated where the original runs real."""
    stand = StandIn((9, 0))
    task = TeacherTask()
    with stand.installed(monkeypatch):
        backend = GemmBackend("auto", (9, 0), "12.9", verbose=False)
        model = convert(make_model("mlp", 0, hidden=128), recipe, backend=backend)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(3)
        for step in range(4):
            xb, yb = task.batch(g, 32)
            train_step(model, opt, task.loss, xb * (8 if step == 2 else 1), yb)  # a spike the histories keep
        if how == "deepcopy":
            other = copy.deepcopy(model)
        elif how == "torch.save":
            other = _reloaded(model)
        else:
            other = convert(make_model("mlp", 1, hidden=128), recipe, backend=backend)
            assert any(k.endswith("amax_history.input") for k in model.state_dict()) == (recipe == "delayed")
            buffer = io.BytesIO()
            torch.save(model.state_dict(), buffer)
            buffer.seek(0)
            other.load_state_dict(torch.load(buffer))  # (weights_only: histories are plain tensors)
        for (_, a), (_, b) in zip(fp8lab.nn.fp8_layers(model), fp8lab.nn.fp8_layers(other), strict=True):
            assert (a.histories is None and b.histories is None) or a.histories["input"].history == \
                b.histories["input"].history
        xb, _ = task.batch(g, 32)
        outs, kernels_run = [], []
        for m in (model, other):
            m.zero_grad()
            before = len(stand.calls)
            outs.append(m(xb))
            outs[-1].square().sum().backward()
            kernels_run.append(stand.calls[before:])
        assert torch.equal(outs[0], outs[1])
        for p, q in zip(model.parameters(), other.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad)
        # the copy's GEMMs ran the same real kernels as the original's: 3 fprop, 2 dgrad (fc1 needs no
        # input gradient), 3 wgrad; none emulated (the stand-in computes in float64: an emulated GEMM
        # would also have changed the outputs)
        assert kernels_run[0] == kernels_run[1] and len(kernels_run[1]) == 8
        for layer in (*fp8lab.nn.fp8_layers(model), *fp8lab.nn.fp8_layers(other)):
            assert {r["backend"] for r in layer[1].backends_used()} == {"scaled_mm"}


def test_a_reloaded_state_dict_without_histories_leaves_them_and_plain_checkpoints_still_load():
    plain = make_model("mlp", 0, hidden=64)
    converted = convert(make_model("mlp", 1, hidden=64), "tensorwise", backend="emulated")
    converted.load_state_dict(plain.state_dict())  # a tensorwise model has no histories: nothing missing
    delayed = convert(make_model("mlp", 1, hidden=64), "delayed", backend="emulated")
    delayed(torch.randn(8, 256))
    fp8lab.nn.end_step(delayed)
    delayed.load_state_dict(plain.state_dict())  # no histories in it: the model's own are kept
    assert len(delayed.fc1.histories["input"]) == 1
    with pytest.raises(RuntimeError, match="amax_history"):
        converted.load_state_dict(delayed.state_dict())  # histories a tensorwise layer does not have


# ---- empty batches -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", [*RECIPES, *VARIANTS])
def test_an_empty_batch_gives_what_nn_linear_gives(recipe):
    """FP8Linear(16, 4)(torch.randn(0, 16)) returns [0, 4] as nn.Linear does, not "cannot quantize an
    empty tensor" (an MoE expert with no tokens, the last batch of a sharded loader)."""
    torch.manual_seed(0)
    ref = nn.Linear(16, 4)
    layer = FP8Linear.from_linear(copy.deepcopy(ref), recipe, backend="emulated")
    for shape in ((0, 16), (2, 0, 16)):
        x = torch.randn(*shape, requires_grad=True)
        y, want = layer(x), ref(x)
        assert y.shape == want.shape and y.dtype == want.dtype
        y.sum().backward()
        assert x.grad.shape == x.shape
        assert torch.equal(layer.weight.grad, torch.zeros(4, 16)) and torch.equal(layer.bias.grad, torch.zeros(4))
        layer.zero_grad()
    x = torch.randn(5, 16)
    assert torch.isfinite(layer(x)).all()  # a later, ordinary batch is scaled as usual
    assert fp8lab.matmul(torch.randn(0, 16), torch.randn(16, 4), recipe).shape == (0, 4)
    assert torch.equal(fp8lab.matmul(torch.randn(3, 0), torch.randn(0, 4), recipe), torch.zeros(3, 4))


def test_an_empty_batch_takes_part_in_the_amax_reduction():
    """A rank whose batch is empty still calls the reducer for every scale that spans the token dim
    (the other ranks wait in that all-reduce), as a rank whose batch is all zeros would."""
    calls = []

    def reducer(amax):
        calls.append(tuple(amax.shape))
        return amax

    full = FP8Linear(16, 4, recipe="tensorwise", backend="emulated", amax_reducer=reducer)
    full(torch.randn(8, 16, requires_grad=True)).sum().backward()
    seen, calls[:] = list(calls), []
    full(torch.randn(0, 16, requires_grad=True)).sum().backward()
    assert calls == seen and seen


def test_inspect_skips_a_call_with_no_rows():
    """inspect skips a layer called with 0 rows, and says why, rather than failing on it."""

    class Routed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.expert = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            h = self.a(x)
            return h + self.expert(h[h[:, 0] > 1e9]).sum()  # an expert no token is routed to

    report = fp8lab.inspect(Routed(), torch.randn(32, 16), recipes=("tensorwise",))
    assert report.layers == ["a"]
    reasons = report.not_covered.set_index("module")["reason"].to_dict()
    assert "no rows" in reasons["expert"]
    assert math.isfinite(report.worst().loc["a", "tensorwise"])
