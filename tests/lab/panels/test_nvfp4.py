"""fp8lab.lab.panels.nvfp4: NVFP4's block scales under its tensor scale, against E4M3's floors."""

from __future__ import annotations

import pytest
import torch

from fp8lab.lab.panels.nvfp4 import nvfp4_blocks_of
from fp8lab.numerics.formats import E4M3


def test_the_tensor_scale_puts_the_largest_block_at_e4m3s_max():
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    d = nvfp4_blocks_of(x, [])
    assert d["tensor_scale"] == pytest.approx(float(x.abs().max()) / (448 * 6), rel=1e-6)
    assert float(d["ideal"].max()) == pytest.approx(448.0, rel=1e-5)
    assert d["ideal"].shape == (8, 4) and d["clean"].all()
    assert d["at_floor"] == 0.0 and d["clean_flushed"] < 0.2


def test_an_outlier_pushes_clean_blocks_below_e4m3s_normals_and_the_floors_differ():
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) * 1e-3
    x[:, 3] = 1e4  # one outlier channel, in every row's first block
    d = nvfp4_blocks_of(x, [3])
    assert not d["clean"][:, 0].any() and d["clean"][:, 1:].all()
    ideal_clean = d["ideal"][:, 1:]
    assert d["at_floor"] == pytest.approx(float((ideal_clean < E4M3.min_normal).float().mean()))
    assert d["at_floor"] == 1.0 and d["below_subnormals"] == 1.0  # 1e-3 / 1e4 * 448: ~4e-5 < 2^-10
    assert d["clean_flushed"] == 1.0  # under the training engines' floor every clean value flushes
    x[:, [i for i in range(64) if i != 3]] *= 100  # clean blocks' amax ~0.3: a scale of ~0.013, under 2^-6 only
    d = nvfp4_blocks_of(x, [3])
    assert d["at_floor"] > 0.9 and d["below_subnormals"] == 0.0
    assert float(d["stored_min_normal"][:, 1:].min()) == E4M3.min_normal  # torchao's inference floor: clamped up
