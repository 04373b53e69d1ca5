"""Quantization against torchao on the CPU: the same codes and the same scales.

Conventions: torchao's float8 `_scale` is the quantization multiplier (x * s -> fp8); fp8lab's
`scale` is the dequantization multiplier, so fp8lab.scale == torchao._scale.reciprocal().
MX scales are E8M0 codes in both. Blocks that are all zero are left out of the scale
comparison: torchao gives them the smallest E8M0 scale, fp8lab gives them scale 1 (both
store zeros).
"""

import pytest
import torch

pytest.importorskip("torchao")
from torchao.float8.config import ScalingGranularity
from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8
from torchao.float8.float8_utils import tensor_to_scale
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
from torchao.prototype.mx_formats.mx_tensor import MXTensor
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

import fp8lab
from fp8lab import E2M1, E4M3, E5M2, E8M0, PerBlock, PerRow, PerTensor

TORCH_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 512, generator=g)
    x[3] *= 1000  # an outlier row
    x[:, 7] *= 1e-4  # a quiet channel
    x[5, 9] = 0.0
    x[200:] = x[200:] * torch.logspace(-6, 6, 56)[:, None]  # rows over 12 decades
    return x


def _torchao_codes(x, scale, dtype):
    return hp_tensor_and_scale_to_float8(x, scale, dtype)._data.view(torch.uint8)


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tensorwise_matches_torchao(fmt, seed):
    x = _inputs(seed)
    dtype = TORCH_DTYPE[fmt.name]
    ao_scale = tensor_to_scale(x, dtype)
    q = fp8lab.quantize(x, fmt, PerTensor(), "exact")
    assert torch.equal(q.codes(), _torchao_codes(x, ao_scale, dtype))
    assert torch.equal(q.scale, ao_scale.reciprocal())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("pow2", [True, False], ids=["pow2", "exact"])
def test_rowwise_matches_torchao(seed, pow2):
    x = _inputs(seed)
    dtype = torch.float8_e4m3fn
    ao_scale = tensor_to_scale(
        x, dtype, scaling_granularity=ScalingGranularity.AXISWISE, axiswise_dim=-1, round_scales_to_power_of_2=pow2
    )  # (M, 1)
    q = fp8lab.quantize(x, E4M3, PerRow(), "rceil" if pow2 else "exact")
    assert q.scale.shape == (256, 1) == ao_scale.shape
    assert torch.equal(q.codes(), _torchao_codes(x, ao_scale, dtype))
    assert torch.equal(q.scale, ao_scale.reciprocal())


@pytest.mark.parametrize("mode", ["floor", "rceil"])
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mx_matches_torchao_mxtensor(mode, fmt, seed):
    x = _inputs(seed)
    ao = MXTensor.to_mx(x, TORCH_DTYPE[fmt.name], 32, ScaleCalculationMode[mode.upper()])
    q = fp8lab.quantize(x, fmt, PerBlock(1, 32), mode, scale_fmt=E8M0)
    assert q.scale.shape == (256, 16)
    assert torch.equal(q.codes(), ao.qdata.view(torch.uint8))
    nonzero = q.amax > 0
    assert torch.equal(q.scale_codes()[nonzero], ao.scale.view(torch.uint8)[nonzero])
    assert torch.equal(q.scale[nonzero], ao.scale.float()[nonzero])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nvfp4_matches_torchao(seed):
    x = _inputs(seed)[:, :256] / 1e3
    amax = x.abs().max()
    ts = per_tensor_amax_to_scale(amax)
    ao_scales, ao_packed = nvfp4_quantize(x, 16, ts)
    ao_values = f4_unpacked_to_f32(unpack_uint4(ao_packed)).reshape(x.shape)
    # torchao's NVFP4Tensor (inference) clamps block scales at E4M3's smallest normal: fp8lab's "min_normal" floor
    q = fp8lab.quantize(x, E2M1, PerBlock(1, 16), "exact", scale_fmt=E4M3, two_level=True, scale_floor="min_normal")
    assert torch.equal(q.tensor_scale, ts)
    assert torch.equal(q.scale, ao_scales.float())
    assert torch.equal(q.data.float(), ao_values)
    assert torch.equal(q.packed().view(torch.uint8), ao_packed.view(torch.uint8))
