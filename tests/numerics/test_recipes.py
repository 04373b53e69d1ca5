"""fp8lab.numerics.recipes: the named recipes say what their sources say, per GEMM and operand; the 4-bit
recipe's parts compose; quantize_transposed gives x^T's codes without copying; the named scale presets are
valid settings and the panels' choices.

Recipes trained: tests/training/; exported: tests/training/test_export.py.
"""

import pytest
import torch

from fp8lab.lab.panels.base import SCALES
from fp8lab.lab.panels.blocks import BlockPanel
from fp8lab.numerics.formats import E2M1, E4M3, E5M2, E8M0
from fp8lab.numerics.quantize import quantize, quantize_transposed
from fp8lab.numerics.recipes import (
    NVFP4_PARTS,
    RECIPES,
    SCALE_PRESETS,
    VARIANTS,
    Recipe,
    ScalePreset,
    TensorScaling,
    get_recipe,
    nvfp4_with,
)
from fp8lab.numerics.scaling import PerBlock, PerRow, PerTensor


def test_the_named_recipes_settings():
    assert set(RECIPES) == {"tensorwise", "delayed", "rowwise", "blockwise", "mxfp8", "nvfp4"}
    t = RECIPES["tensorwise"]  # HYBRID: E4M3 forward, E5M2 gradients
    assert (t.input.fmt, t.weight.fmt, t.grad_output.fmt) == (E4M3, E4M3, E5M2)
    b = RECIPES["blockwise"]  # DeepSeek-V3: 1x128 activations and gradients, 128x128 weights
    assert (b.input.granularity, b.weight.granularity) == (PerBlock(1, 128), PerBlock(128, 128))
    mx = RECIPES["mxfp8"].input
    assert (mx.granularity, mx.scale_fmt, mx.scale_rule) == (PerBlock(1, 32), E8M0, "rceil")
    nv = RECIPES["nvfp4"].weight
    assert (nv.fmt, nv.granularity, nv.scale_fmt, nv.two_level) == (E2M1, PerBlock(16, 16), E4M3, True)
    assert get_recipe(" Rowwise ") is RECIPES["rowwise"] and get_recipe("nvfp4_training") is VARIANTS["nvfp4_training"]
    with pytest.raises(ValueError, match="unknown recipe"):
        get_recipe("fp6")


def test_scaling_per_gemm_follows_the_exceptions():
    gw = VARIANTS["rowwise_with_gw_hp"]
    assert gw.scaling("input", "wgrad") is None  # wgrad in high precision
    assert gw.scaling("weight", "dgrad").granularity == PerTensor()  # its own weight for dgrad
    assert gw.scaling("weight", "fprop").granularity == PerRow()
    with pytest.raises(ValueError, match="fprop takes"):
        gw.scaling("grad_output", "fprop")
    rows = RECIPES["tensorwise"].table()
    assert [(r["gemm"], r["operand"]) for r in rows] == [
        ("fprop", "input"), ("fprop", "weight"), ("dgrad", "grad_output"), ("dgrad", "weight"),
        ("wgrad", "grad_output"), ("wgrad", "input")]


def test_nvfp4_parts_compose_into_the_training_variant():
    none = nvfp4_with([])
    assert none.name == "nvfp4 1x16" and none.weight.granularity == PerBlock(1, 16)
    full = nvfp4_with(NVFP4_PARTS)
    assert full.name == "nvfp4 2D+RHT+SR+HP"
    assert full.weight.granularity == PerBlock(16, 16)
    assert full.grad_output.rounding == "stochastic" and full.input.rounding == "nearest"
    assert full.scaling("input", "wgrad").hadamard is not None and full.scaling("input", "fprop").hadamard is None
    assert full.high_precision_layers([f"l{i}" for i in range(10)]) == ["l8", "l9"]  # ceil(0.15 * 10) = 2
    assert nvfp4_with(["2d_weights"]).weight == RECIPES["nvfp4"].weight
    with pytest.raises(ValueError, match="unknown NVFP4 parts"):
        nvfp4_with(["fp6"])


def test_invalid_recipes_are_refused():
    t = TensorScaling(E4M3, PerRow())
    with pytest.raises(ValueError, match="delayed scaling"):
        RECIPES["delayed"].replace(input=t)
    with pytest.raises(ValueError, match="high_precision_share"):
        RECIPES["tensorwise"].with_high_precision_layers(1.0)
    with pytest.raises(TypeError):
        Recipe("x", t, t, t, fprop_high_precision=1)
    with pytest.raises(ValueError, match="per row"):
        RECIPES["rowwise"].with_2d_weight()


@pytest.mark.parametrize("g", [PerTensor(), PerRow(), PerBlock(1, 32), PerBlock(4, 8)])
def test_quantize_transposed_is_the_quantization_of_the_transpose(g):
    x = torch.randn(24, 64, generator=torch.Generator().manual_seed(0))
    s = TensorScaling(E4M3, g)
    got = quantize_transposed(x, s)
    want = quantize(x.t().contiguous(), s)
    assert got.shape == (64, 24)
    torch.testing.assert_close(got.dequantize(), want.dequantize(), atol=0, rtol=0)
    assert s.down_columns(24) is s.down_columns(24)  # made once per rows


def test_each_scale_preset_builds_the_tensor_scaling_it_names():
    assert {name: (p.scale_rule, p.scale_fmt, p.two_level) for name, p in SCALE_PRESETS.items()} == {
        "fp32": ("exact", None, False), "fp32_pow2": ("rceil", None, False), "e8m0_rceil": ("rceil", E8M0, False),
        "e8m0_floor": ("floor", E8M0, False), "nvfp4": ("exact", E4M3, True)}
    for preset in SCALE_PRESETS.values():
        for fmt in (E4M3, E5M2, E2M1):
            s = preset.scaling(fmt, "1x32")
            assert isinstance(s, TensorScaling) and s.fmt == fmt and s.granularity == PerBlock(1, 32)
            assert (s.scale_rule, s.scale_fmt, s.two_level) == (preset.scale_rule, preset.scale_fmt, preset.two_level)
    nvfp4 = SCALE_PRESETS["nvfp4"].scaling("e2m1", "1x16")
    assert nvfp4 == TensorScaling(E2M1, PerBlock(1, 16), "exact", E4M3, two_level=True)


def test_the_scale_presets_labels_are_unique():
    labels = [p.label for p in SCALE_PRESETS.values()]
    assert len(set(labels)) == len(labels) == len(SCALE_PRESETS)


def test_a_scale_preset_is_checked_as_a_tensor_scaling_is():
    with pytest.raises(ValueError, match="E8M0 scales are powers of two"):
        ScalePreset("E8M0, exact", "exact", E8M0)
    with pytest.raises(ValueError, match="two_level"):
        ScalePreset("two levels over fp32", two_level=True)


def test_notebook_04s_scales_options_are_the_presets_labels():
    assert list(SCALES) == [p.label for p in SCALE_PRESETS.values()]
    assert all(SCALES[p.label] is p for p in SCALE_PRESETS.values())
    options = BlockPanel().controls["scales"].options
    assert list(options) == list(SCALES) == ["fp32, exact", "fp32, power of two (rceil)",
                                             "E8M0, rceil (MX as cuBLAS/TE)", "E8M0, floor (OCP MX)",
                                             "E4M3 under an fp32 tensor scale (NVFP4)"]
