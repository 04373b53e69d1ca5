"""fp8lab.numerics.granularity: what each granularity means for a tensor's blocks, its scales and a GEMM."""

import pytest
import torch

from fp8lab.numerics.granularity import (
    MAX_BLOCK,
    PerBlock,
    PerRow,
    PerTensor,
    as_2d,
    padded_blocks,
    parse_granularity,
)


@pytest.mark.parametrize("g, shape, block, scale", [
    (PerTensor(), (64, 256), (64, 256), ()),
    (PerRow(), (64, 256), (1, 256), (64, 1)),
    (PerBlock(1, 128), (64, 256), (1, 128), (64, 2)),
    (PerBlock(128, 128), (1, 300), (1, 128), (1, 3)),  # clamped to the one row, 300 cols: 3 blocks
    (PerBlock(10**6, 10**6), (64, 256), (64, 256), (1, 1)),  # one block, per-tensor in effect
    (PerBlock(7, 5), (33, 250), (7, 5), (5, 50)),  # shapes that do not divide: ceil
])
def test_blocks_are_clamped_to_the_tensor_and_the_scales_cover_it(g, shape, block, scale):
    assert g.block_shape(shape) == block
    assert g.scale_shape(shape) == scale


def test_the_other_gemms_layout_and_the_tokens_a_scale_covers():
    assert PerTensor().transposed() == PerTensor() and PerRow().transposed() is None
    assert PerBlock(1, 128).transposed() == PerBlock(128, 1)
    # x[rows, cols] quantized so that x^T has these blocks
    assert PerRow().down_columns(64) == PerBlock(64, 1)
    assert PerBlock(1, 32).down_columns(64) == PerBlock(32, 1)
    assert PerTensor().down_columns(64) == PerTensor()
    assert [PerRow().tokens_per_scale(g) for g in ("fprop", "dgrad", "wgrad")] == [1, 1, None]
    assert [PerBlock(2, 32).tokens_per_scale(g) for g in ("fprop", "dgrad", "wgrad")] == [2, 2, 32]
    assert PerTensor().tokens_per_scale("fprop") is None


def test_row_scales_give_each_row_its_blocks_scales_and_the_width_along_k():
    scale = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # PerBlock(2, 4) on x[3, 10]: (2, 3)
    rows, width = PerBlock(2, 4).row_scales(scale, (3, 10))
    assert width == 4
    assert torch.equal(rows, torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    rows, width = PerRow().row_scales(torch.tensor([[1.0], [2.0]]), (2, 10))
    assert width == 10 and torch.equal(rows, torch.tensor([[1.0], [2.0]]))
    rows, width = PerTensor().row_scales(torch.tensor(7.0), (3, 10))
    assert width == 10 and torch.equal(rows, torch.full((3, 1), 7.0))


def test_labels_parse_back_and_bad_ones_name_the_choices():
    for g in (PerTensor(), PerRow(), PerBlock(1, 128), PerBlock(128, 128), PerBlock(1, 32)):
        assert parse_granularity(g.label) == g and parse_granularity(g) is g and str(g) == g.label
    assert parse_granularity(" Per_Row ") == PerRow() and parse_granularity("TensorWise") == PerTensor()
    assert [g.scaled_mm_name for g in (PerTensor(), PerRow(), PerBlock(1, 128))] == [
        "TensorWise", "RowWise", "BlockWise1x128"]
    for bad in ("per-col", "1x", "x128", "1x2x3", 128):
        with pytest.raises(ValueError, match="'per-tensor', 'per-row', 'ROWSxCOLS'"):
            parse_granularity(bad)
    for rows, cols in ((0, 1), (1, MAX_BLOCK + 1), (True, 1), (1.0, 1)):
        with pytest.raises(ValueError, match=r"PerBlock (rows|cols) must be a positive integer"):
            PerBlock(rows, cols)


def test_as_2d_and_padded_blocks():
    x = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    assert as_2d(x, PerTensor()).shape == (6, 4)
    with pytest.raises(ValueError, match=r"reshape\(-1, 4\)"):
        as_2d(x, PerRow())
    with pytest.raises(ValueError, match=r"reshape\(1, -1\)"):
        as_2d(torch.ones(5), PerBlock(1, 2))
    blocks = padded_blocks(torch.ones(3, 5), (2, 4))  # zero-padded to 4 x 8
    assert blocks.shape == (2, 2, 2, 4)
    assert blocks.sum() == 15 and blocks[1, 1].sum() == 0 and blocks[0, 1, 0].sum() == 4
