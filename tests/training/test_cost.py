"""fp8lab.training.cost: scale storage and scale multiplies computed from the recipes, checked against hand
counts from each recipe's definition (block shapes, scale formats)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import get_recipe
from fp8lab.training.cost import (
    PARALLEL,
    answer,
    cost_class,
    cost_table,
    scale_bits_per_element,
    scale_multiplies,
)


@pytest.mark.parametrize("recipe, expected", [
    ("tensorwise", 32 / (256 * 512)),           # one float32 scale
    ("rowwise", 32 / 512),                      # one float32 scale per row of 512
    ("blockwise", 32 / 128),                    # a float32 scale per 1x128 tile
    ("mxfp8", 8 / 32),                          # an E8M0 scale per 32 elements
    ("nvfp4", 8 / 16 + 32 / (256 * 512)),       # an E4M3 scale per 16, plus the float32 tensor scale
])
def test_scale_bits_per_element_by_hand_and_as_a_quantized_tensor_reports(recipe, expected):
    s = get_recipe(recipe).input
    assert scale_bits_per_element(s, 256, 512) == pytest.approx(expected, rel=1e-12)
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
    assert scale_bits_per_element(s, 256, 512) == pytest.approx(quantize(x, s).scale_bits_per_element, rel=1e-12)


def test_a_partial_block_costs_a_whole_scale():
    s = get_recipe("blockwise").weight  # 128x128
    assert scale_bits_per_element(s, 130, 130) == pytest.approx(32 * 4 / (130 * 130))


@pytest.mark.parametrize("recipe, gemm, k, expected", [
    ("tensorwise", "fprop", 4096, 1),
    ("rowwise", "wgrad", 4096, 1),
    ("blockwise", "fprop", 4096, 4096 // 128),
    ("mxfp8", "dgrad", 4096, 4096 // 32),
    ("nvfp4", "fprop", 4096, 4096 // 16 + 1),  # and the tensor scale's multiply
    ("blockwise", "fprop", 100, 1),  # one block covers all of K: the epilogue
    ("rowwise_with_gw_hp", "wgrad", 4096, 0),
])
def test_scale_multiplies_per_output_element(recipe, gemm, k, expected):
    count, where = scale_multiplies(recipe, k, gemm)
    assert count == expected
    assert ("epilogue" in where) == (k == 100 or recipe in ("tensorwise", "rowwise"))


def test_cost_classes_rank_the_recipes_from_their_scalings():
    classes = {name: cost_class(name) for name in ("nvfp4", "tensorwise", "delayed", "rowwise", "blockwise", "mxfp8")}
    assert classes == {"nvfp4": 0, "tensorwise": 1, "delayed": 1, "rowwise": 2, "blockwise": 3, "mxfp8": 3}


def test_cost_table_rows_and_refusals():
    t = cost_table(("tensorwise", "mxfp8"), k=256, m=64)
    assert list(t.index) == ["tensorwise", "mxfp8"]
    assert t.loc["tensorwise", "element bits"] == 8
    assert t.loc["mxfp8", "scale multiplies per output"] == 256 // 32
    assert t.loc["tensorwise", "scale bits/element (x)"] == pytest.approx(32 / (64 * 256))
    assert "read twice" in t.loc["tensorwise", "amax"]
    fsdp = cost_table(("tensorwise", "rowwise"), k=256, m=64, parallel=PARALLEL[2])
    assert "an all-reduce" in fsdp.loc["tensorwise", "amax"] and "no all-reduce" in fsdp.loc["rowwise", "amax"]
    with pytest.raises(ValueError):
        cost_table(k=0)
    with pytest.raises(ValueError, match="parallelism"):
        cost_table(("tensorwise",), parallel="pipeline")


def test_answer_reads_the_cheaper_column():
    comparison = pd.DataFrame({"a": ["1", "2", "3"], "b": ["2", "1", "3"], "cheaper": ["a", "b", "same"]},
                              index=["storage", "multiplies", "amax"])
    assert answer(comparison) == "a is cheaper in: storage. b is cheaper in: multiplies."


def test_quantize_agrees_with_the_per_tensor_storage_formula():
    q = quantize(torch.ones(8, 8))
    assert q.scale_bits_per_element == 32 / 64
