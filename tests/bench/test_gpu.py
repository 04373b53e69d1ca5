"""fp8lab.bench.gpu: the device check's backend table follows DESIGN's kernel table per architecture, and a
CPU run without an architecture to act as is refused. The dry run on every generation with torch's checks
(tests/scaled_mm_standin.py): tests/gemm/test_real.py; on a GPU: `python -m fp8lab bench gpu`."""

import pytest
import torch

import fp8lab.bench.table
from fp8lab.bench import gpu
from fp8lab.gemm import GemmBackend
from fp8lab.numerics.recipes import RECIPES, VARIANTS


@pytest.fixture(autouse=True)
def _no_reference_matmul(monkeypatch):
    monkeypatch.setattr(fp8lab.bench.table, "reference_speed", lambda: "not measured")


def _table(arch):
    check = gpu._Check(torch.device("cpu"), GemmBackend("auto", arch, "12.9", probe=False, verbose=False),
                       ((32, 256, 32),), [*RECIPES, *VARIANTS])
    rows = {(r["recipe"], r["gemm"]): r["backend"] for r in gpu._backend_table(check)}
    return rows, check


def test_backend_table_per_architecture():
    rows, check = _table((8, 9))
    assert len(rows) == 3 * (len(RECIPES) + len(VARIANTS)) and check.failures == []
    assert rows["tensorwise", "fprop"] == rows["rowwise", "dgrad"] == "scaled_mm"
    assert rows["blockwise", "fprop"] == "emulated" and rows["mxfp8", "fprop"] == "emulated"  # sm_90, sm_100
    assert rows["rowwise_with_gw_hp", "wgrad"] == "high precision"
    assert check.real_gemms["tensorwise", "fprop"] and not check.real_gemms["mxfp8", "wgrad"]
    hopper, _ = _table((9, 0))
    assert hopper["blockwise", "fprop"] == "scaled_mm" and hopper["nvfp4", "fprop"] == "emulated"
    ampere, _ = _table((8, 0))
    assert set(ampere.values()) == {"emulated", "high precision"}  # FP8 needs sm_89


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs the real check")
def test_a_cpu_run_needs_an_architecture_to_act_as():
    with pytest.raises(ValueError, match="dry run"):
        gpu.bench_gpu(device="cpu")
