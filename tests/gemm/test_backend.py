"""fp8lab.gemm.backend: the one switch between torch's scaled matmul and the emulation, decided from the
two operands and the GPU generation (as DESIGN's kernel table says), counted with its reason.

The real path under a stand-in with torch's checks, per architecture: tests/gemm/test_real.py.
"""

import pytest
import torch

from fp8lab.gemm.backend import GemmBackend, agrees_with_emulation, default_backend, matmul
from fp8lab.gemm.emulation import emulated_mm, quantize_operands


def _pair(recipe, m=32, k=256, n=32):
    g = torch.Generator().manual_seed(0)
    return quantize_operands(torch.randn(m, k, generator=g), torch.randn(k, n, generator=g), recipe)


@pytest.mark.parametrize(("arch", "cuda", "recipe", "backend"), [
    ((8, 0), "12.9", "tensorwise", "emulated"),   # FP8 needs sm_89
    ((8, 9), "12.9", "tensorwise", "scaled_mm"),
    ((8, 9), "12.9", "blockwise", "emulated"),    # 1x128 x 128x128: sm_90 only
    ((9, 0), "12.9", "blockwise", "scaled_mm"),
    ((9, 0), "12.4", "blockwise", "emulated"),    # ... with cuBLAS >= 12.9
    ((9, 0), "12.9", "mxfp8", "emulated"),        # MX: sm_100
])
def test_the_choice_follows_the_architecture_and_the_operands(arch, cuda, recipe, backend):
    choice = GemmBackend("auto", arch=arch, cuda=cuda).choose(*_pair(recipe))
    assert choice.backend == backend
    assert (choice.plan is not None) == (backend == "scaled_mm")
    assert choice.reason.startswith("real: " if backend == "scaled_mm" else "emulated: ")


def test_emulated_mode_counts_each_call_with_its_reason():
    engine = GemmBackend("emulated", verbose=False)
    a_q, b_q = _pair("rowwise", 8, 64, 4)
    out = engine.mm(a_q, b_q, layer="fc1", gemm="fprop")
    engine.mm(a_q, b_q, layer="fc1", gemm="fprop")
    assert torch.equal(out, emulated_mm(a_q, b_q))
    assert engine.report() == [{"layer": "fc1", "gemm": "fprop", "kernel": "emulated fast (fp32)",
                                "backend": "emulated", "reason": "emulated: asked for", "calls": 2}]
    assert engine.fallbacks() == 0 and "2 calls emulated" in engine.summary()
    engine.reset()
    assert engine.summary() == "no FP8 GEMMs ran"


def test_matmul_is_the_emulation_of_the_recipes_operands():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(8, 64, generator=g), torch.randn(64, 16, generator=g)
    out = matmul(a, b, "blockwise", backend="emulated", verbose=False)
    assert torch.equal(out, emulated_mm(*quantize_operands(a, b, "blockwise")))
    assert torch.equal(matmul(torch.ones(0, 4), torch.ones(4, 3), verbose=False), torch.zeros(0, 3))
    a_q, _ = quantize_operands(a, b)
    with pytest.raises(TypeError, match="both operands"):
        matmul(a_q, b)


def test_agrees_with_emulation_accepts_the_emulation_and_refuses_a_wrong_answer():
    a_q, b_q = _pair("tensorwise", 16, 128, 8)
    exact = emulated_mm(a_q, b_q)
    assert agrees_with_emulation(exact, a_q, b_q, torch.float32)[0]
    wrong = exact.clone()
    wrong[0, 0] += 1.0
    ok, worst = agrees_with_emulation(wrong, a_q, b_q, torch.float32)
    assert not ok and worst > 1


def test_bad_modes_are_refused_and_the_default_is_made_once():
    with pytest.raises(ValueError, match="unknown backend"):
        GemmBackend("tpu")
    with pytest.raises(ValueError, match="compute capability"):
        GemmBackend(arch="sm_90")
    assert default_backend("emulated") is default_backend("emulated")
