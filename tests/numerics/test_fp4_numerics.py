"""The 4-bit training recipe's numerics (notebook 09): the random Hadamard transform, stochastic rounding,
2-D weight blocks, and the recipe options that put them in FP8Linear's three GEMMs.

Oracles: float64 (the transform's matrix, stochastic rounding decided from the format's list of values),
exact integer arithmetic (the transform and its inverse), and the statistics of many draws with a fixed
seed and a stated tolerance (no bias)."""

import contextlib
import copy
import math

import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

import fp8lab
from fp8lab.nn import FP8Linear, convert, layer_gemms
from fp8lab.numerics import kernels
from fp8lab.numerics.formats import (
    E2M1,
    E4M3,
    E5M2,
    cast,
    cast_reference,
    stochastic_reference,
    uniform_draws,
)
from fp8lab.numerics.hadamard import SIZES, RandomHadamard, hadamard_matrix
from fp8lab.numerics.quantize import quantize, quantize_spec
from fp8lab.numerics.quantize_fast import kernel_parameters
from fp8lab.numerics.recipes import (
    NVFP4_HADAMARD,
    NVFP4_PARTS,
    RECIPES,
    RoundingDraws,
    TensorScaling,
    get_recipe,
    nvfp4_with,
)
from fp8lab.numerics.scaling import PerBlock, PerRow, scale_from_amax

# ---- the random Hadamard transform ----------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_the_transform_is_exactly_orthonormal_and_its_inverse_is_its_transpose(size):
    for seed in (0, 1, 7):
        h = RandomHadamard(size, seed)
        q = h.matrix()
        assert set(q.abs().flatten().tolist()) == {1 / math.sqrt(size)}  # a power of two: exact
        for dtype in (torch.float64, torch.float32):
            qd = q.to(dtype)
            eye = torch.eye(size, dtype=dtype)
            assert torch.equal(qd @ qd.t(), eye) and torch.equal(qd.t() @ qd, eye)  # bit for bit
    assert torch.equal(hadamard_matrix(size) @ hadamard_matrix(size).t(), size * torch.eye(size, dtype=torch.float64))


@pytest.mark.parametrize("size", SIZES)
def test_apply_is_x_times_the_matrix_per_block_and_inverse_undoes_it_exactly(size):
    h = RandomHadamard(size, 3)
    g = torch.Generator().manual_seed(0)
    # integers (and halves): every partial sum of the butterfly is exact, so apply is x @ Q exactly, and inverse
    # gives x back bit for bit
    x = torch.randint(-300, 300, (7, 5 * size), generator=g).float() / 2
    y = h.apply(x)
    ref = (x.double().reshape(-1, size) @ h.matrix()).reshape(7, -1)
    assert torch.equal(y.double(), ref)
    assert torch.equal(h.inverse(y), x)
    # any float32 x: x @ Q to the butterfly's float32 rounding (log2(d) additions per output)
    x = torch.randn(9, 3 * size, generator=g) * 10.0 ** torch.randint(-3, 4, (9, 1), generator=g)
    ref = (x.double().reshape(-1, size) @ h.matrix()).reshape(9, -1)
    bound = math.log2(size) * 2**-24 * (x.double().abs().reshape(-1, size) @ h.matrix().abs()).reshape(9, -1)
    assert ((h.apply(x).double() - ref).abs() <= bound).all()
    back = h.inverse(h.apply(x)).double()
    assert ((back - x.double()).abs() <= 2 * bound.amax(1, keepdim=True) * math.sqrt(size)).all()


def test_the_transform_cancels_in_a_gemm_whatever_the_contraction_length():
    """(a Q)(b Q)^T = a b^T: padding with zeros to a multiple of d leaves the product as it is."""
    h = NVFP4_HADAMARD
    g = torch.Generator().manual_seed(1)
    for k in (16, 48, 50, 7, 1):
        a, b = torch.randn(12, k, generator=g), torch.randn(9, k, generator=g)
        at, bt = h.apply(a), h.apply(b)
        assert at.shape == (12, -(-k // 16) * 16)
        torch.testing.assert_close(at.double() @ bt.double().t(), a.double() @ b.double().t(), rtol=1e-6, atol=1e-5)


def test_the_signs_spread_a_constant_block_that_plain_hadamard_concentrates():
    """Without its random signs the transform maps a constant block onto one coefficient (H 1 = [d, 0, ...]): an
    outlier that fills its block would stay one outlier. With the signs it is spread over the block."""
    ones = torch.ones(1, 16)
    plain = ones @ hadamard_matrix(16).float() / 4
    assert int((plain != 0).sum()) == 1
    spread = NVFP4_HADAMARD.apply(ones)
    assert int((spread != 0).sum()) > 1
    s = NVFP4_HADAMARD.signs
    assert set(s.tolist()) == {-1.0, 1.0}
    assert torch.equal(spread.double(), ones.double() @ NVFP4_HADAMARD.matrix())


def test_the_signs_are_reproducible_from_the_seed():
    assert torch.equal(RandomHadamard(16, 5).signs, RandomHadamard(16, 5).signs)
    assert not torch.equal(RandomHadamard(16, 5).signs, RandomHadamard(16, 6).signs)
    # torch's CPU generator is the same on every machine: the default transform's signs, pinned
    assert NVFP4_HADAMARD.signs.tolist() == [-1, 1, 1, -1, 1, 1, 1, 1, 1, 1, 1, -1, -1, 1, -1, -1]


def test_bad_sizes_and_seeds_are_refused_with_the_valid_choices():
    with pytest.raises(ValueError, match="4, 16, 64, 256"):
        RandomHadamard(32)
    with pytest.raises(ValueError, match="seed"):
        RandomHadamard(16, -1)
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard_matrix(12)


@pytest.mark.parametrize(("args", "match"), [((16.0,), r"one of the integers 4, 16, 64, 256.*got 16.0"),
                                             (("16",), r"got '16'"), ((True,), "got True"),
                                             ((16, 2**64), r"from 0 to 2\*\*64 - 1.*got 18446744073709551616"),
                                             ((16, 2.0), "got 2.0"), ((16, None), "got None")])
def test_a_float_size_or_a_seed_beyond_64_bits_is_refused_at_construction(args, match):
    """Left to the first backward, a float size (16.0 == 16) or a seed beyond torch's 64 bits fails there, 14
    frames deep (a reshape by 16.0, the generator's seed): both are refused at construction instead."""
    with pytest.raises(ValueError, match=match):
        RandomHadamard(*args)
    assert RandomHadamard(16, 2**64 - 1).signs.shape == (16,)  # the largest seed torch's generator takes


# ---- stochastic rounding: bit for bit against float64, unbiased over draws ---------------------------------------


def _awkward(fmt, n: int = 20000, seed: int = 0) -> torch.Tensor:
    """Values everywhere a format has them: subnormals, every binade, its grid points and midpoints, beyond
    max, +-0, NaN, infinities."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = math.log2(fmt.min_subnormal) - 2, math.log2(fmt.max_value) + 2
    mags = torch.exp2(torch.empty(n).uniform_(lo, hi, generator=g))
    signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    grid = fmt.values().float()
    mids = (grid[1:] + grid[:-1]) / 2
    special = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, fmt.max_value * 1.01, -fmt.min_subnormal / 3])
    return torch.cat([mags * signs, grid, mids, special])


@pytest.mark.parametrize("fmt", [E2M1, E4M3, E5M2], ids=lambda f: f.name)
def test_stochastic_rounding_is_bit_exact_against_the_float64_reference_for_each_seed(fmt):
    x = _awkward(fmt)
    for seed in range(4):
        fast = cast(x, fmt, rounding="stochastic", generator=torch.Generator().manual_seed(seed))
        ref = cast_reference(x, fmt, rounding="stochastic", generator=torch.Generator().manual_seed(seed))
        assert torch.equal(fast.view(torch.int32), ref.view(torch.int32)), seed  # -0, NaN: the same bits
        again = cast(x, fmt, rounding="stochastic", generator=torch.Generator().manual_seed(seed))
        assert torch.equal(fast.view(torch.int32), again.view(torch.int32))  # reproducible
    other = cast(x, fmt, rounding="stochastic", generator=torch.Generator().manual_seed(99))
    assert not torch.equal(fast.view(torch.int32), other.view(torch.int32))  # the draws decide
    finite = x.isfinite() & (x.abs() <= fmt.max_value)
    grid = fmt.values().float()
    lo = torch.searchsorted(grid, x.abs()[finite].contiguous(), right=True) - 1
    assert ((fast.abs()[finite] == grid[lo].abs()) | (fast.abs()[finite] == grid[(lo + 1).clamp(max=len(grid) - 1)])
            ).all()  # one of the two neighbours, always
    assert (fast[~x.isnan() & ~finite].abs() == fmt.max_value).all()  # beyond max: saturated, no draw lifts it back
    assert fast[x.isnan()].isnan().all()


# Tolerance of the no-bias test: the mean of N draws of a value p of the way from lo to hi is lo + step * p-hat,
# p-hat a binomial share with standard deviation sqrt(p (1 - p) / N); it must lie within 5 of those of x. With
# N = 2^20 one standard deviation is at most step / 2048: a bias of step / 256 (a rounding that goes up 2^-8 more
# often than it should) is 8 of them and fails; a fair coin lands within 5 with probability 1 - 6e-7.
DRAWS = 2**20
SIGMAS = 5.0


@pytest.mark.parametrize("fmt,values", [
    (E2M1, [0.1, 0.26, 0.7, 1.3, 1.74, 2.2, 2.9, 3.3, 5.5, -4.7, -0.33]),
    (E4M3, [2.0**-8.3, 0.011, 1.03, 1.0 + 1 / 16, -3.3, 250.0, 447.0]),
    (E5M2, [2.0**-15.5, 0.3, -1.1, 1000.0, 50000.0]),
], ids=lambda v: v.name if hasattr(v, "name") else "")
def test_stochastic_rounding_is_unbiased_over_draws_and_round_to_nearest_is_not(fmt, values):
    g = torch.Generator().manual_seed(2024)
    for v in values:
        x = torch.full((DRAWS,), v)
        x32 = float(x[0])
        out = cast(x, fmt, rounding="stochastic", generator=g).double()
        grid = fmt.values()
        i = int(torch.searchsorted(grid, torch.tensor([abs(x32)], dtype=torch.float64), right=True)) - 1
        step = float(grid[i + 1] - grid[i])
        p = (abs(x32) - float(grid[i])) / step
        sigma = step * math.sqrt(p * (1 - p) / DRAWS)
        assert abs(float(out.mean()) - x32) <= SIGMAS * sigma, (fmt.name, v, float(out.mean()) - x32, sigma)
        nearest = float(cast(x[:1], fmt)[0])
        assert abs(nearest - x32) > 100 * sigma  # rounding to nearest keeps its whole error, every time


def _reference_quantize(x: torch.Tensor, fmt, block, scale_fmt, two_level, seed: int) -> tuple[torch.Tensor, ...]:
    """quantize's definition in float64 where rounding decides: the scales from scale_from_amax, each value times
    its block's inverse in float32 (as the hardware multiplies), then rounded up or down from the format's list of
    values with the same draws."""
    g = PerBlock(*block)
    amax = fp8lab.numerics.scaling.amax_per_block(x, g)
    scale, inverse, tensor_scale = scale_from_amax(amax, fmt, "exact", 0, scale_fmt, two_level)
    full = inverse.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[: x.shape[0], : x.shape[1]]
    draws = uniform_draws(x, torch.Generator().manual_seed(seed))
    return stochastic_reference(x * full, fmt, draws), scale, tensor_scale


@pytest.mark.parametrize("fmt,block,scale_fmt,two_level", [
    (E2M1, (1, 16), "e4m3", True), (E2M1, (16, 16), "e4m3", True), (E4M3, (1, 128), None, False),
    (E5M2, (64, 256), None, False), (E4M3, (1, 32), None, False)])
def test_quantize_with_stochastic_rounding_is_bit_exact_per_seed(fmt, block, scale_fmt, two_level):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 256, generator=g) * torch.exp2(torch.randint(-6, 6, (64, 1), generator=g).float())
    x[5, 7] = 0.0
    for seed in (0, 1):
        q = quantize(x, fmt, PerBlock(*block), scale_fmt=scale_fmt, two_level=two_level, rounding="stochastic",
                     generator=torch.Generator().manual_seed(seed))
        values, scale, tensor_scale = _reference_quantize(x, fmt, block, scale_fmt, two_level, seed)
        assert torch.equal(q.values().view(torch.int32), values.view(torch.int32))
        assert torch.equal(q.scale, scale)  # stochastic rounding leaves the scales as they are
        assert (q.tensor_scale is None) == (tensor_scale is None) or torch.equal(q.tensor_scale, tensor_scale)
        assert q.rounding == "stochastic" and "stochastic rounding" in repr(q)
        nearest = quantize(x, fmt, PerBlock(*block), scale_fmt=scale_fmt, two_level=two_level)
        assert torch.equal(nearest.scale, q.scale) and not torch.equal(nearest.codes(), q.codes())


def test_stochastic_rounding_gives_the_same_bits_with_the_kernels_on_and_off():
    """The C kernel rounds stochastically from the same draws as the torch code: a stochastic spec carries the
    kernels' parameters as a nearest one does, and turning the kernels off changes no bit."""
    spec = quantize_spec("e2m1", "1x16", scale_fmt="e4m3", two_level=True, rounding="stochastic")
    if kernels.engine().kernels:
        assert kernel_parameters(spec) is not None
        assert kernel_parameters(spec) == kernel_parameters(quantize_spec("e2m1", "1x16", scale_fmt="e4m3",
                                                                          two_level=True))
    x = torch.randn(32, 64)
    on = quantize(x, "e2m1", "1x16", scale_fmt="e4m3", two_level=True, rounding="stochastic",
                  generator=torch.Generator().manual_seed(4))
    with kernels.disabled():
        off = quantize(x, "e2m1", "1x16", scale_fmt="e4m3", two_level=True, rounding="stochastic",
                       generator=torch.Generator().manual_seed(4))
    assert torch.equal(on.codes(), off.codes()) and torch.equal(on.scale, off.scale)
    assert torch.equal(on.values().view(torch.int32), off.values().view(torch.int32))


def test_quantized_blocks_are_unbiased_over_draws():
    """NVFP4 with stochastic rounding, averaged over many seeds: each element's mean code is its scaled value
    x * inverse (as quantize multiplies it, in float32), within SIGMAS of its binomial standard deviation; so the
    mean dequantized tensor is x (to the float32 rounding of the inverse). Round to nearest is far from it."""
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(5))
    n = 4000
    codes = torch.zeros_like(x, dtype=torch.float64)
    deq = torch.zeros_like(x, dtype=torch.float64)
    for seed in range(n):
        q = quantize(x, "e2m1", "1x16", scale_fmt="e4m3", two_level=True, rounding="stochastic",
                     generator=torch.Generator().manual_seed(seed))
        codes += q.values().double()
        deq += q.dequantize().double()
    amax = fp8lab.numerics.scaling.amax_per_block(x, PerBlock(1, 16))
    inverse = scale_from_amax(amax, E2M1, "exact", 0, E4M3, True).inverse.repeat_interleave(16, 1)
    v = (x * inverse).double()  # the scaled values the cast rounds (float32 products)
    grid = E2M1.values()
    a = v.abs().clamp(max=6.0)
    i = torch.searchsorted(grid, a.contiguous(), right=True) - 1
    step = grid[(i + 1).clamp(max=len(grid) - 1)] - grid[i]
    p = (a - grid[i]) / torch.where(step > 0, step, 1.0)
    sigma = step * torch.sqrt(p * (1 - p) / n)
    assert ((codes / n - torch.copysign(a, v)).abs() <= SIGMAS * sigma).all()
    # a block's largest value can land just beyond 6 (its E4M3 scale rounded down) and saturate: the one bias left
    kept = v.abs() <= 6.0
    assert kept.float().mean() > 0.95
    err = (deq / n - x.double()).abs()
    assert (err[kept] <= (SIGMAS * sigma * (x.double() / v).abs() + 1e-6 * x.double().abs())[kept]).all()
    nearest = quantize(x, "e2m1", "1x16", scale_fmt="e4m3", two_level=True)
    assert (nearest.dequantize().double() - x.double()).abs().mean() > 10 * err.mean()


def test_bad_roundings_are_refused_with_the_valid_choices():
    with pytest.raises(ValueError, match="nearest, stochastic"):
        quantize(torch.randn(4, 4), rounding="up")
    with pytest.raises(ValueError, match="element formats"):
        cast(torch.rand(4) + 0.1, "e8m0", rounding="stochastic")
    with pytest.raises(ValueError, match="nearest, stochastic"):
        TensorScaling(E4M3, rounding="sometimes")


# ---- the recipe's parts as options, and FP8Linear training with them ---------------------------------------------


def _weight_operands(recipe):
    g = torch.Generator().manual_seed(0)
    x, w, dy = torch.randn(48, 96, generator=g), torch.randn(64, 96, generator=g), torch.randn(48, 64, generator=g)
    pairs = layer_gemms(x, w, dy, recipe)
    return pairs["fprop"][1], pairs["dgrad"][1]


@pytest.mark.parametrize("name", ["nvfp4", "mxfp8", "blockwise", "nvfp4_training"])
def test_2d_weight_blocks_give_fprop_and_dgrad_identical_weight_codes(name):
    """Square weight blocks: the weight w[N, K] fprop reads and the w^T[K, N] dgrad reads are one set of codes and
    scales (what FP8Linear computes, through layer_gemms). 1 x c blocks quantize w twice, along K and along N:
    two sets of codes for one tensor."""
    two_d = get_recipe(name).with_2d_weight(True)
    fw, dw = _weight_operands(two_d)
    assert torch.equal(fw.codes(), dw.codes().t()) and torch.equal(fw.scale, dw.scale.t())
    assert fw.tensor_scale is None or torch.equal(fw.tensor_scale, dw.tensor_scale)
    fw, dw = _weight_operands(get_recipe(name).with_2d_weight(False))
    assert not torch.equal(fw.codes(), dw.codes().t())
    if name != "mxfp8":  # power-of-two scales and E4M3: a value rounds alike under either scale, bar subnormals
        assert not torch.equal(fw.dequantize(), dw.dequantize().t())


def test_the_2d_option_on_every_kind_of_weight():
    assert get_recipe("tensorwise").with_2d_weight() is get_recipe("tensorwise")  # one scale is one block
    with pytest.raises(ValueError, match="per row"):
        get_recipe("rowwise").with_2d_weight()
    assert get_recipe("mxfp8").with_2d_weight().weight.granularity == PerBlock(32, 32)
    assert nvfp4_with(["2d_weights"]).weight == RECIPES["nvfp4"].weight  # fp8lab's nvfp4 has 16x16 weights
    assert nvfp4_with([]).weight.granularity == PerBlock(1, 16)


def test_nvfp4_with_names_its_parts_and_the_full_recipe_is_a_variant():
    full = get_recipe("nvfp4_training")
    assert full.weight.granularity == PerBlock(16, 16)
    assert full.wgrad_hadamard == RandomHadamard(16, 0) and full.high_precision_share == 0.15
    assert full.grad_output.rounding == "stochastic" and full.input.rounding == full.weight.rounding == "nearest"
    assert full.scaling("input", "wgrad").hadamard == full.scaling("grad_output", "wgrad").hadamard == NVFP4_HADAMARD
    assert full.scaling("input", "fprop").hadamard is None and full.scaling("grad_output", "dgrad").hadamard is None
    assert nvfp4_with(NVFP4_PARTS, name="nvfp4_training").replace(description=full.description) == full
    assert nvfp4_with([]).name == "nvfp4 1x16" and nvfp4_with(["hadamard", "high_precision"]).name == "nvfp4 RHT+HP"
    with pytest.raises(ValueError, match="valid: 2d_weights"):
        nvfp4_with(["rht"])
    with pytest.raises(ValueError, match="high_precision_share"):
        full.replace(high_precision_share=1.5)
    with pytest.raises(ValueError, match="needs that GEMM quantized"):
        full.replace(wgrad_high_precision=True)


def test_convert_keeps_the_recipes_last_linears_in_high_precision():
    from fp8lab.training.models import make_model

    mlp = convert(make_model("mlp"), "nvfp4_training")
    assert [type(m).__name__ for m in (mlp.fc1, mlp.fc2, mlp.fc3)] == ["FP8Linear", "FP8Linear", "Linear"]
    tf = convert(make_model("transformer"), "nvfp4_training")
    kept = [n for n, m in tf.named_modules() if type(m) is nn.Linear]
    assert kept == ["blocks.1.down", "head"]  # ceil(15% of 9 linears) = 2: the last two
    assert all(type(m) is not nn.Linear for m in convert(make_model("mlp"), "nvfp4").modules()
               if isinstance(m, nn.Linear))


def test_fp8linear_uses_the_transformed_operands_and_its_weight_gradient_is_the_product():
    """nvfp4_training's wgrad GEMM reads both operands transformed along the tokens (padded to a multiple of 16):
    the weight gradient equals, to fp32 rounding, the float64 product of those dequantized operands, and stays
    near dy^T x (the transform cancels)."""
    r = get_recipe("nvfp4_training")
    g = torch.Generator().manual_seed(2)
    lin = nn.Linear(64, 32, bias=False)
    x = torch.randn(40, 64, generator=g, requires_grad=True)  # 40 tokens: padded to 48 in wgrad
    dy = torch.randn(40, 32, generator=g)
    layer = FP8Linear.from_linear(lin, r, name="fc")
    draws = RoundingDraws(layer.draws.seed)
    layer(x).backward(dy)
    s_g, s_x = r.scaling("grad_output", "wgrad"), r.scaling("input", "wgrad")
    draws.generator()  # dgrad's dy came first
    a = quantize(dy.t().contiguous(), s_g, generator=draws.generator()).dequantize().double()
    b = quantize(x.detach().t().contiguous(), s_x).dequantize().double()
    assert a.shape == (32, 48) and b.shape == (64, 48)
    exact = a @ b.t()
    bound = 52 * 2**-24 * (a.abs() @ b.abs().t())
    assert ((lin.weight.grad.double() - exact).abs() <= bound).all()
    assert fp8lab.relative_error(dy.t() @ x.detach(), lin.weight.grad) < 0.3


def test_stochastic_rounding_in_training_is_reproducible_and_each_runs_draws_are_its_own():
    """A layer's draws come from its own seed and calls: the same run twice gives the same losses, and a run
    trained beside another ends where it ends alone."""
    from fp8lab.training.train import train

    kw = {"steps": 4, "batch": 32, "progress": False, "monitor_every": None}
    alone = train(("nvfp4_training",), **kw).history["loss"].tolist()
    again = train(("nvfp4_training",), **kw).history["loss"].tolist()
    beside = train(("nvfp4", "nvfp4_training"), **kw).history
    assert alone == again == beside[beside.run == "nvfp4_training"]["loss"].tolist()


def test_rounding_draws_are_fresh_generators_from_the_seed_and_the_count():
    a, b = RoundingDraws(3), RoundingDraws(3)
    first = torch.rand(5, generator=a.generator())
    assert torch.equal(first, torch.rand(5, generator=b.generator()))
    assert not torch.equal(first, torch.rand(5, generator=a.generator()))  # the next call draws anew
    import copy
    import pickle

    c = copy.deepcopy(a)
    assert c.calls == a.calls == 2 and pickle.loads(pickle.dumps(a)).calls == 2


def test_a_per_row_weight_with_2d_blocks_names_what_to_use():
    with pytest.raises(ValueError, match="PerBlock"):
        RECIPES["rowwise"].replace(weight=TensorScaling(E4M3, PerRow(), "rceil")).with_2d_weight()


# ---- the real path: sm_100 plans the recipe's GEMMs, torch's own meta kernels accept them ------------------------


@pytest.mark.parametrize("shape", [(128, 384, 256), (200, 328, 72)], ids=["aligned", "odd"])
def test_nvfp4_training_plans_its_three_gemms_on_sm100_and_torchs_meta_kernels_accept_them(shape):
    """The transform and stochastic rounding come before the scaling: what reaches torch's NVFP4 kernel is an NVFP4
    operand pair like any other (1x16 E2M1 blocks, E4M3 scales, two tensor scales). On sm_100 each GEMM is planned
    real and torch's meta registration of the scaled matmul (its shape, layout and scale checks) takes the call;
    on sm_90 each is emulated, with the reason."""
    from fp8lab.gemm.real import KernelUnavailable, plan_gemm, prepare_real_mm

    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    pairs = layer_gemms(torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(m, n, generator=g),
                        "nvfp4_training")
    for gemm, (a_q, b_q) in pairs.items():
        plan = plan_gemm(a_q, b_q, (10, 0), "12.9")
        assert plan.kind == "BlockWise1x16" and plan.two_level, gemm
        out = prepare_real_mm(a_q, b_q, plan, torch.device("meta")).run()
        assert out.device.type == "meta" and out.shape[0] >= a_q.shape[0] and out.shape[1] >= b_q.shape[0]
        with pytest.raises(KernelUnavailable, match="sm_100"):
            plan_gemm(a_q, b_q, (9, 0), "12.9")
    # the meta kernel checks something: a mat_b in the wrong layout is refused
    a_q, b_q = pairs["fprop"]
    prep = prepare_real_mm(a_q, b_q, plan_gemm(a_q, b_q, (10, 0), "12.9"), torch.device("meta"))
    args = list(prep.args)
    args[1] = args[1].contiguous()  # row-major [K/2, N]: not the column-major operand the kernel takes
    with pytest.raises(RuntimeError):
        prep.fn(*args, **prep.kwargs)


# ---- NVFP4's block-scale floor: the training engines' (none) and torchao's inference tensor's (2^-6) ---------


def _nvfp4_reference(x: torch.Tensor, floor: float) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """NVFP4 1x16 (scale, values, tensor scale) in numpy float32 with ml_dtypes' E4M3 and E2M1 rounding
    (no torch, no fp8lab): tensor scale amax / (448 * 6); block scale e4m3(clamp(amax_b / 6 / tensor scale,
    floor, 448)); values e2m1(clip(x * ((1 / tensor scale) / scale), +-6)), 0 where the scale is 0."""
    a = x.numpy().astype(np.float32)
    amax = np.abs(a.reshape(a.shape[0], -1, 16)).max(axis=2)  # (M, K/16)
    ts = np.float32(amax.max()) / np.float32(448 * 6)
    ideal = (amax / np.float32(6)) / ts
    scale = np.clip(ideal, np.float32(floor), np.float32(448)).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    with np.errstate(divide="ignore"):
        inverse = np.where(scale == 0, np.float32(0), (np.float32(1) / ts) / scale).astype(np.float32)
    scaled = np.clip(a * np.repeat(inverse, 16, axis=1), -6, 6)
    return scale, scaled.astype(ml_dtypes.float4_e2m1fn).astype(np.float32), ts


def _decades(seed: int) -> torch.Tensor:
    """Rows over 9 decades below one large row: block scales normal, subnormal and below every E4M3 scale."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(72, 256, generator=g) * torch.logspace(0, -9, 72)[:, None]
    x[0] *= 30
    x[5, :16] = 0.0  # an all-zero block
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("floor", ["zero", "min_normal"])
@pytest.mark.parametrize("path", ["kernels", "torch"])
def test_nvfp4_block_scale_floors_are_bit_exact_against_a_numpy_ml_dtypes_reference(seed, floor, path):
    x = _decades(seed)
    want_scale, want_values, want_ts = _nvfp4_reference(x, E4M3.min_normal if floor == "min_normal" else 0.0)
    with contextlib.nullcontext() if path == "kernels" else kernels.disabled():
        q = quantize(x, E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True, scale_floor=floor)
    assert float(q.tensor_scale) == float(want_ts)
    assert np.array_equal(q.scale.numpy(), want_scale)
    assert np.array_equal(q.values().numpy(), want_values)
    assert torch.equal(q.scale_range()[0] * torch.ones(()), q.scale.min())
    if floor == "min_normal":  # torchao's NVFP4Tensor: nothing below 2^-6
        assert q.scale.min() == E4M3.min_normal
    else:  # the training engines: subnormal scales, and 0 below half the smallest one (the zero block too)
        assert ((q.scale > 0) & (q.scale < E4M3.min_normal)).any() and (q.scale == 0).any()
        assert q.scale[5, 0] == 0 and (q.dequantize()[q.expanded_scale() == 0] == 0).all()


def test_the_floors_differ_only_where_a_block_needs_a_scale_below_2_to_the_minus_6():
    x = _decades(0)
    zero = quantize(x, E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True)  # the default: the training floor
    normal = quantize(x, E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True, scale_floor="min_normal")
    below = zero.scale < E4M3.min_normal
    assert below.any() and torch.equal(zero.scale[~below], normal.scale[~below])
    assert torch.equal(zero.values().reshape(72, -1, 16)[~below], normal.values().reshape(72, -1, 16)[~below])
    # where the block needs a subnormal scale the training floor keeps more of it: the error is smaller
    sub = (zero.scale > 0) & below
    err = [(q.dequantize() - x).reshape(72, -1, 16)[sub].norm() for q in (zero, normal)]
    assert err[0] < err[1]


def test_the_scale_floor_is_a_setting_of_the_recipe_and_bad_floors_are_refused():
    assert RECIPES["nvfp4"].input.scale_floor == "zero"
    assert get_recipe("nvfp4_training").grad_output.scale_floor == "zero"
    ts = TensorScaling(E2M1, PerBlock(1, 16), "exact", E4M3, two_level=True, scale_floor="min_normal")
    assert ts.scale_floor == "min_normal" and "floor 2^-6" in ts.label
    x = _decades(1)
    direct = quantize(x, E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True, scale_floor="min_normal")
    assert torch.equal(quantize(x, ts).scale, direct.scale)
    with pytest.raises(ValueError, match=r"unknown scale_floor 'subnormal'; valid: 'zero'.*'min_normal'"):
        quantize(x, E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True, scale_floor="subnormal")
    with pytest.raises(ValueError, match="is for E4M3 block scales"):
        quantize(x, E4M3, PerBlock(1, 32), scale_floor="min_normal")
    with pytest.raises(ValueError, match="unknown scale_floor"):
        TensorScaling(E2M1, PerBlock(1, 16), "exact", E4M3, two_level=True, scale_floor=["zero"])


# ---- one GEMM of one layer in high precision (notebook 09's fc1 split) -------------------------------------------


def test_a_layer_with_its_forward_in_high_precision_computes_fp32_forward_and_the_recipes_backward():
    from fp8lab.training.layers import FP8Linear

    g = torch.Generator().manual_seed(3)
    base = nn.Linear(64, 48)
    x = torch.randn(32, 64, generator=g)
    dy = torch.randn(32, 48, generator=g)
    plain = nvfp4_with([])
    outs = {}
    for name, recipe in (("plain", plain), ("fprop", plain.with_gemm_in_high_precision("fprop")),
                         ("wgrad", plain.with_gemm_in_high_precision("wgrad"))):
        layer = FP8Linear.from_linear(copy.deepcopy(base), recipe)  # (its own weight: no gradient accumulates)
        xi = x.clone().requires_grad_(True)
        y = layer(xi)
        y.backward(dy)
        outs[name] = (y.detach(), xi.grad, layer.weight.grad)
    exact = nn.functional.linear(x, base.weight, base.bias)
    assert torch.equal(outs["fprop"][0], exact) and not torch.equal(outs["plain"][0], exact)
    # the forward's precision changes no backward operand: dgrad and wgrad are the plain recipe's, bit for bit
    assert torch.equal(outs["fprop"][1], outs["plain"][1]) and torch.equal(outs["fprop"][2], outs["plain"][2])
    # wgrad in high precision: the plain forward and dgrad, the exact weight gradient
    assert torch.equal(outs["wgrad"][0], outs["plain"][0]) and torch.equal(outs["wgrad"][1], outs["plain"][1])
    assert torch.allclose(outs["wgrad"][2], dy.t() @ x, rtol=1e-5, atol=1e-5)
    assert layer_gemms(x, base.weight, dy, plain.with_gemm_in_high_precision("fprop"))["fprop"] is None
    table = {r["gemm"]: r["scaling"] for r in plain.with_gemm_in_high_precision("fprop").table()}
    assert table["fprop"] == "high precision" and table["wgrad"] != "high precision"


def test_one_gemm_in_high_precision_is_refused_where_it_cannot_be():
    with pytest.raises(ValueError, match="takes 'fprop' or 'wgrad', not 'dgrad'"):
        nvfp4_with([]).with_gemm_in_high_precision("dgrad")
    with pytest.raises(ValueError, match="delayed scaling records the input's amax in the fprop GEMM"):
        get_recipe("delayed").replace(fprop_high_precision=True)
    with pytest.raises(TypeError, match="fprop_high_precision is True or False"):
        get_recipe("tensorwise").replace(fprop_high_precision=1)
    # the Hadamard transform belongs to a quantized wgrad: keeping wgrad in high precision drops it
    r = get_recipe("nvfp4_training").with_gemm_in_high_precision("wgrad")
    assert r.scaling("input", "wgrad") is None and r.wgrad_hadamard is None
