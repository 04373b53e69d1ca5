"""fp8lab.numerics.quantize_fast: the fast twins give quantize_definition's bits (codes and scales, atol=0)."""

import math

import pytest
import torch

from fp8lab.numerics import kernels, quantize_fast
from fp8lab.numerics.formats import E2M1, E4M3, E5M2, cast
from fp8lab.numerics.granularity import padded_blocks
from fp8lab.numerics.quantize import quantize_definition, quantize_spec, quantize_with


def _same_floats(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit where a number, NaN where NaN (the kernel's NaN payload may differ from torch's)."""
    nan = torch.isnan(a)
    return (a.shape == b.shape and torch.equal(nan, torch.isnan(b))
            and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32)))


def _x(shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(shape[0] * 1000 + shape[1])
    x = torch.randn(shape, generator=g) * torch.rand(shape[0], 1, generator=g) * 30
    x[0, :3] = 0.0  # a zero block at the start (per row, per small block)
    x[-1, -1] = math.nan  # a NaN block at the end
    return x


SETTINGS = [dict(fmt="e4m3"), dict(fmt="e5m2", scale_rule="rceil"), dict(fmt="e4m3", scale_rule="floor",
            scale_fmt="e8m0"), dict(fmt="e2m1", scale_fmt="e4m3", two_level=True)]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
def test_the_twins_give_the_definitions_codes_and_scales(settings, kernel):
    """Over formats x granularities x scale rules, odd shapes, zeros and a NaN block: the kernel where it runs,
    the chunked torch code inside kernels.disabled(), each against the torch definition."""
    for granularity in ("per-tensor", "per-row", "1x32", "7x5", "128x128"):
        spec = quantize_spec(granularity=granularity, **settings)
        for shape in ((33, 70), (1, 257)):
            x = _x(shape)
            if kernel:
                fast = quantize_with(x, spec)
            else:
                with kernels.disabled():
                    fast = quantize_with(x, spec)
            want = quantize_definition(x, spec)
            assert torch.equal(fast.data.view(torch.uint8), want.data.view(torch.uint8)), (granularity, shape)
            assert _same_floats(fast.scale, want.scale), (granularity, shape)
            assert _same_floats(fast.amax, want.amax), (granularity, shape)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_the_kernels_stochastic_rounding_gives_the_definitions_codes(settings):
    """Stochastic rounding, the kernel against the torch definition from the same generator's draws: codes,
    scales and the folded values a GEMM reads, bit for bit, over granularities, odd shapes, zeros, a NaN block,
    values that saturate and values far below the smallest subnormal."""
    for granularity in ("per-tensor", "per-row", "1x16", "16x1", "7x5"):
        spec = quantize_spec(granularity=granularity, rounding="stochastic", **settings)
        for shape in ((33, 70), (1, 257), (64, 48)):
            x = _x(shape)
            x[shape[0] // 2, :5] = torch.tensor([1e-30, -1e-30, 3e-8, -0.0, 1e4])[:min(5, shape[1])]
            amax = None if granularity != "per-tensor" else torch.tensor(float(x.nan_to_num(0).abs().max()) / 4)
            fast = quantize_with(x, spec, amax, values=True, generator=torch.Generator().manual_seed(shape[1]))
            want = quantize_definition(x, spec, amax, generator=torch.Generator().manual_seed(shape[1]))
            assert torch.equal(fast.data.view(torch.uint8), want.data.view(torch.uint8)), (granularity, shape)
            assert _same_floats(fast.scale, want.scale), (granularity, shape)
            assert _same_floats(fast.dequantize(), want.dequantize()), (granularity, shape)
            with kernels.disabled():
                torch_code = quantize_with(x, spec, amax, generator=torch.Generator().manual_seed(shape[1]))
            assert _same_floats(fast.scaled_values(), torch_code.scaled_values()), (granularity, shape)


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1], ids=lambda f: f.name)
@pytest.mark.parametrize("block", [(1, 1024), (3, 8), (1, 7), (40, 300)])
def test_the_chunked_cast_equals_the_unchunked_one(monkeypatch, fmt, block):
    """scale_and_cast, a few block rows at a time (CHUNK_ELEMENTS made small), is cast(x * inverse) in one go."""
    monkeypatch.setattr(quantize_fast, "CHUNK_ELEMENTS", 64)
    x = _x((37, 300)).nan_to_num(0.0)
    mb, kb = math.ceil(37 / block[0]), math.ceil(300 / block[1])
    inverse = torch.rand(mb, kb, generator=torch.Generator().manual_seed(3)) * 4 + 0.01
    one_go = cast(padded_blocks(x, block) * inverse[:, None, :, None], fmt, fmt.storage_dtype)
    want = one_go.reshape(mb * block[0], -1)[:37, :300]
    got = quantize_fast.scale_and_cast(x, block, inverse, fmt)
    assert got.dtype == fmt.storage_dtype and got.shape == (37, 300) and got.is_contiguous()
    assert torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8))
    # one scale: rows of 1024 or of K, whatever divides; bfloat16 widened a chunk at a time
    inv = torch.tensor(0.37)
    got = quantize_fast.scale_and_cast(x.to(torch.bfloat16), (37, 300), inv, fmt)
    want = cast(x.to(torch.bfloat16).float() * inv, fmt, fmt.storage_dtype)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_folds_where_a_gemm_reads_the_scales_varying_along_its_contraction():
    exact, pow2 = quantize_spec("e4m3", "per-row"), quantize_spec("e4m3", "per-row", scale_rule="rceil")
    assert quantize_fast.folds((1, 32), (64, 256), exact) and quantize_fast.folds((32, 1), (64, 256), exact)
    assert quantize_fast.folds((1, 32), (1, 256), exact)  # one row of 1x32 blocks: read along K
    assert not quantize_fast.folds((1, 256), (64, 256), exact)  # per row: one scale a row, applied to the output
    assert not quantize_fast.folds((64, 1), (64, 256), exact)  # one scale a column (read transposed: a row)
    assert quantize_fast.folds((32, 1), (64, 1), exact)  # one column of 32x1 blocks: read transposed, along M
    assert not quantize_fast.folds((64, 256), (64, 256), exact)
    # a weight's 2-D blocks, read along K (fprop) and along N (dgrad): folded where they split either dim
    assert quantize_fast.folds((128, 128), (128, 384), exact) and quantize_fast.folds((128, 128), (384, 128), exact)
    assert not quantize_fast.folds((128, 128), (128, 128), exact)
    for block in ((1, 256), (64, 1), (64, 256)):  # a power of two moves into the values exactly (gemm.emulation)
        assert quantize_fast.folds(block, (64, 256), pow2)


def test_the_kernel_runs_only_where_it_stores_the_settings():
    nearest, stochastic = quantize_spec("e4m3", "1x32"), quantize_spec("e4m3", "1x32", rounding="stochastic")
    # either rounding: the parameters are the formats and the rule; stochastic draws come with each call
    assert quantize_fast.kernel_parameters(stochastic) == quantize_fast.kernel_parameters(nearest)
    assert quantize_fast.kernel_parameters(quantize_spec("bf16")) is None  # a format the kernels do not store
    with kernels.disabled():
        assert quantize_fast.kernel_input(torch.ones(4, 64), nearest, None) is None
    # kept on the spec, shared by every spec with the same settings
    assert quantize_fast.kernel_parameters(nearest) is quantize_fast.kernel_parameters(quantize_spec("e4m3", "1x32"))
    if kernels.engine().kernels:
        x = torch.ones(4, 64, dtype=torch.bfloat16)
        x32 = quantize_fast.kernel_input(x, nearest, None)
        assert x32 is not None and x32.dtype == torch.float32 and torch.equal(x32, x.float())


def test_the_kernels_draws_come_from_torchs_generator_in_c_where_it_gives_torchs_numbers(monkeypatch):
    """quantize_fast.draws (stochastic rounding's draws for the kernel's pass): kernels.uniform_draws for a CPU
    generator given, torch.rand for torch's default generator and wherever draws_like_torch() is False; the
    same numbers and the same generator state after either way, and None for rounding to nearest."""
    x = torch.randn(40, 48)
    spec = quantize_spec("e2m1", "1x16", scale_fmt="e4m3", two_level=True, rounding="stochastic")
    assert quantize_fast.draws(x, quantize_spec("e2m1", "1x16", scale_fmt="e4m3"), None) is None
    assert kernels.draws_like_torch()  # (its one check done here, with the twin itself: the spy counts x's draws)
    calls, twin = [], kernels.uniform_draws
    monkeypatch.setattr(kernels, "uniform_draws", lambda *args: calls.append(args[0]) or twin(*args))
    ours, theirs = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    got = quantize_fast.draws(x, spec, ours)
    assert calls == [(40, 48)] == [tuple(got.shape)] and torch.equal(got, torch.rand(40, 48, generator=theirs))
    assert torch.equal(ours.get_state(), theirs.get_state())
    quantize_fast.draws(x, spec, None)  # (torch's default generator: torch.rand)
    monkeypatch.setattr(kernels, "draws_like_torch", lambda: False)
    assert torch.equal(quantize_fast.draws(x, spec, ours), torch.rand(40, 48, generator=theirs)) and len(calls) == 1
