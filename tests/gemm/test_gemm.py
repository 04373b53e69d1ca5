"""FP8 GEMM: emulation against float64 references, fast against reference, the
accumulation model, backend resolution without a GPU and with a failing kernel."""

import math

import numpy as np
import pytest
import torch

import fp8lab
from fp8lab import E4M3, E8M0, RECIPES, PerBlock, PerRow, PerTensor, quantize
from fp8lab.gemm import (
    AccumulatorModel,
    BackendChoice,
    GemmBackend,
    KernelUnavailable,
    accumulation_error,
    accumulation_errors,
    agrees_with_emulation,
    emulated_mm,
    matmul,
    plan_gemm,
    quantize_operands,
    real_mm,
    resolve_backend,
    swizzle_scales,
)
from tests.conftest import gpu

U = 2.0**-24
SHAPES = [(64, 256, 96), (50, 300, 70), (130, 129, 17), (1, 32, 1)]  # divide / don't divide the blocks


def _higham_bound(a_q, b_q):
    """|fl(sum) - sum| <= gamma_n * sum |terms|, gamma_n = n u / (1 - n u), n = K + 3 roundings
    (K - 1 additions, the product's rounding, two scale multiplications, one fold)."""
    a, b = a_q.dequantize().double().abs(), b_q.dequantize().double().abs()
    n = a_q.shape[1] + 4
    gamma = n * U / (1 - n * U)
    return gamma * (a @ b.t())


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("emulation", ["reference", "fast"])
def test_emulated_equals_dequantized_product_to_fp32_rounding(recipe, shape, emulation):
    m, k, n = shape
    g = torch.Generator().manual_seed(m * k + n)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g) * 3
    a_q, b_q = quantize_operands(a, b, recipe)
    exact = a_q.dequantize().double() @ b_q.dequantize().double().t()
    out = emulated_mm(a_q, b_q, emulation=emulation)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert ((out.double() - exact).abs() <= _higham_bound(a_q, b_q)).all()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "mxfp8", "nvfp4"])
def test_fast_equals_reference_bit_exactly_when_the_order_cannot_matter(recipe):
    # small integers times power-of-two scales: every partial sum is exact in fp32, so any
    # order of additions gives the same bits
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-6, 7, (48, 256), generator=g).float()
    b = torch.randint(-6, 7, (256, 40), generator=g).float()
    a_q, b_q = quantize_operands(a, b, recipe)
    ref = emulated_mm(a_q, b_q, emulation="reference")
    fast = emulated_mm(a_q, b_q, emulation="fast")
    assert torch.equal(ref, fast)


def test_fast_and_reference_differ_only_within_the_bound_on_hard_data():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(256, 1024, generator=g) * torch.logspace(-3, 3, 1024)
    b = torch.randn(1024, 128, generator=g)
    for recipe in ("blockwise", "mxfp8"):
        a_q, b_q = quantize_operands(a, b, recipe)
        ref = emulated_mm(a_q, b_q, emulation="reference")
        fast = emulated_mm(a_q, b_q, emulation="fast")
        assert ((ref.double() - fast.double()).abs() <= 2 * _higham_bound(a_q, b_q)).all()


def test_matmul_accepts_quantized_tensors_and_checks_layouts():
    a, b = torch.randn(16, 64), torch.randn(64, 8)
    a_q, b_q = quantize_operands(a, b, "blockwise")
    out = matmul(a_q, b_q, "blockwise", verbose=False)
    torch.testing.assert_close(out, matmul(a, b, "blockwise", verbose=False), rtol=0, atol=0)
    with pytest.raises(ValueError, match="share K"):
        matmul(a_q, quantize(b, E4M3), verbose=False)  # b quantized in [K, N], not [N, K]
    with pytest.raises(ValueError, match=r"a\.shape\[1\] == b\.shape\[0\]"):
        matmul(a, torch.randn(63, 8), verbose=False)
    with pytest.raises(TypeError, match="both"):
        matmul(a_q, b, verbose=False)
    with pytest.raises(ValueError, match="valid: auto, emulated, scaled_mm"):
        matmul(a, b, backend="cuda")
    with pytest.raises(ValueError, match="valid recipes"):
        matmul(a, b, recipe="fp8")


def test_accuracy_against_fp32_and_outlier_channels():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(256, 1024, generator=g), torch.randn(1024, 256, generator=g)
    true = a.double() @ b.double()

    def err(x, recipe):
        out = matmul(x, b, recipe, verbose=False).double()
        t = x.double() @ b.double()
        return (torch.linalg.norm(out - t) / torch.linalg.norm(t)).item()

    # E4M3 keeps ~3.6% rms relative error per element; a dot product of two such operands ~5%
    for recipe in ("tensorwise", "rowwise", "blockwise", "mxfp8"):
        assert 0.02 < err(a, recipe) < 0.06, recipe
    assert 0.08 < err(a, "nvfp4") < 0.25  # E2M1: one mantissa bit
    assert true.abs().max() > 0


def _ordinary_channel_error(factor, recipe):
    """Relative error that outlier channels inflict on the *other* channels' contribution:
    a few activation channels scaled by `factor` set the scales; measure x_ord @ b_ord."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(256, 1024, generator=g), torch.randn(1024, 256, generator=g)
    outliers = [5, 300, 700]
    a[:, outliers] *= factor
    ordinary = torch.ones(1024, dtype=torch.bool)
    ordinary[outliers] = False
    a_q, _ = quantize_operands(a, b, recipe)
    got = a_q.dequantize().double()[:, ordinary] @ b.double()[ordinary]
    want = a.double()[:, ordinary] @ b.double()[ordinary]
    return (torch.linalg.norm(got - want) / torch.linalg.norm(want)).item()


def test_outlier_channels_per_block_beats_per_tensor():
    # 100x outliers: E4M3's 18 binades absorb them; every E4M3 recipe loses the same ~2.6%
    at_100 = {r: _ordinary_channel_error(100, r) for r in ("tensorwise", "rowwise", "blockwise", "mxfp8")}
    assert max(at_100.values()) < 1.1 * min(at_100.values())
    # 1e5x outliers (massive activations): the per-tensor scale pushes the other channels into
    # subnormals and zero; blocks along K confine the damage to the outliers' own blocks
    tensorwise = _ordinary_channel_error(1e5, "tensorwise")
    assert tensorwise > 0.2
    assert _ordinary_channel_error(1e5, "blockwise") < tensorwise / 3
    assert _ordinary_channel_error(1e5, "mxfp8") < tensorwise / 3
    # FP4's 3.6 binades feel even 100x, although its blocks are only 16 wide
    assert _ordinary_channel_error(100, "nvfp4") > 0.15


# ---- the accumulation model ---------------------------------------------------------------------


def _acc_errors(dist, ks, model):
    return [accumulation_error(k, model, dist, size=24) for k in ks]


def test_limited_accumulator_error_grows_with_k_and_promotion_fixes_it():
    ks = [256, 1024, 4096]
    no_promo = _acc_errors("uniform", ks, AccumulatorModel(promote_every=None))
    promo = _acc_errors("uniform", ks, AccumulatorModel(promote_every=128))
    fp32 = _acc_errors("uniform", ks, None)
    assert no_promo[0] < no_promo[1] < no_promo[2]  # grows with K
    assert 0.01 < no_promo[2] < 0.10  # DeepSeek-V3: ~2% at K = 4096 on H800 (same-sign data: worse)
    assert promo[2] < no_promo[2] / 10  # promotion every 128 (N_C)
    assert promo[2] < 2 * promo[0]  # ... and stops the growth
    assert max(fp32) < 1e-6
    # mixed-sign data grows the sum like sqrt(K): smaller, but still growing
    mixed = _acc_errors("normal", ks, AccumulatorModel(promote_every=None))
    assert mixed[0] < mixed[2] and 5e-4 < mixed[2] < 0.01


@pytest.mark.parametrize("model", [
    AccumulatorModel(promote_every=None), AccumulatorModel(promote_every=128), AccumulatorModel(promote_every=32),
    AccumulatorModel(mantissa_bits=7, promote_every=512), AccumulatorModel(mantissa_bits=22, promote_every=256),
    AccumulatorModel(mantissa_bits=9, group=16, promote_every=64), AccumulatorModel(promote_every=None,
                                                                                    alignment="group"),
    AccumulatorModel(promote_every=128, alignment="group"), None])
@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_all_k_at_once_is_each_k_alone_bit_for_bit(model, dist):
    """accumulation_errors walks every K in one padded pass: the same floats as one K at a time,
    also for K that are not powers of two (walked alone) and promotions longer than some K."""
    ks = [128, 256, 512, 1024, 2048, 4096, 96, 160, 1000]
    assert accumulation_errors(ks, model, dist, size=8) == [accumulation_error(k, model, dist, size=8) for k in ks]


def _accumulate_one_product_at_a_time(products, model: AccumulatorModel) -> float:
    """The accumulator model for one output element, written out: exact rationals, one group and one product at a
    time, a reading of DeepSeek-V3's sentence per `model.alignment`, promotions as float32 adds."""
    import math
    from fractions import Fraction

    def trunc_to(v: Fraction, ulp: Fraction) -> Fraction:
        return Fraction(math.trunc(v / ulp)) * ulp

    def ulp_of(top: Fraction) -> Fraction:  # 2^(floor(log2 top) - mantissa_bits); top 0 truncates nothing
        e = math.floor(math.log2(top)) if top else -1
        while top and Fraction(2) ** e > top:  # log2 of a rational rounds: settle the exponent exactly
            e -= 1
        while top and Fraction(2) ** (e + 1) <= top:
            e += 1
        return Fraction(2) ** (e - model.mantissa_bits)

    ps = [Fraction(float(p)) for p in products]
    total, acc = np.float32(0), Fraction(0)
    interval = model.promote_every or len(ps)
    for start in range(0, len(ps), model.group):
        grp = ps[start : start + model.group]
        gmax = max(abs(p) for p in grp)
        if model.alignment == "running":
            ulp = ulp_of(max(gmax, abs(acc)))
            acc = trunc_to(acc, ulp) + sum(trunc_to(p, ulp) for p in grp)
        else:
            ulp = ulp_of(gmax)
            acc = acc + sum(trunc_to(p, ulp) for p in grp)
            acc = trunc_to(acc, ulp_of(abs(acc)))
        end = start + model.group
        if end % interval == 0 or end >= len(ps):
            total = np.float32(total + np.float32(float(acc)))
            acc = Fraction(0)
    return float(total)


@pytest.mark.parametrize("alignment", ["running", "group"])
@pytest.mark.parametrize("promote", [None, 64])
def test_both_readings_of_the_accumulator_are_the_written_out_model_bit_for_bit(alignment, promote):
    """AccumulatorModel.accumulate against the model written out one product at a time in exact rationals, for both
    readings of DeepSeek-V3's sentence (the running sum aligned with each group, or each group alone then a 14-bit
    register), on same-sign and mixed-sign products whose exponents spread over many binades."""
    g = torch.Generator().manual_seed(7)
    products = torch.cat([torch.rand(3, 256, generator=g, dtype=torch.float64),
                          torch.randn(3, 256, generator=g, dtype=torch.float64)
                          * torch.exp2(torch.randint(-12, 12, (3, 256), generator=g).double())])
    model = AccumulatorModel(13, 32, promote, alignment)
    got = model.accumulate(products)
    want = [_accumulate_one_product_at_a_time(row.tolist(), model) for row in products]
    assert got.tolist() == want


def test_the_two_readings_differ_and_the_alignment_is_checked():
    # 32 ones, then 32 products below the running sum's last kept bit (32's ulp is 2^-8): aligned with the running
    # sum each of them truncates to 0; aligned alone they add up to 2^-4, which the 14-bit register keeps
    products = torch.cat([torch.ones(32), torch.full((32,), 2.0**-9)]).double()[None]
    running, group = (AccumulatorModel(13, 32, None, a).accumulate(products).item() for a in ("running", "group"))
    assert (running, group) == (32.0, 32.0625)
    with pytest.raises(ValueError, match="unknown alignment 'sum'; valid: running, group"):
        AccumulatorModel(alignment="sum")


def test_more_accumulator_bits_less_error():
    errs = [_acc_errors("uniform", [1024], AccumulatorModel(mantissa_bits=b, promote_every=None))[0]
            for b in (10, 13, 16, 22)]
    assert errs[0] > errs[1] > errs[2] > errs[3]


def test_accumulator_model_validates():
    with pytest.raises(ValueError, match="multiple of group"):
        AccumulatorModel(group=32, promote_every=100)
    with pytest.raises(ValueError, match="mantissa_bits"):
        AccumulatorModel(mantissa_bits=0)


def test_the_accumulation_model_has_a_size_limit_and_works_in_chunks(monkeypatch):
    """A problem beyond MAX_ACCUMULATED_PRODUCTS is refused before anything is allocated, and rows of a are
    walked a chunk at a time, with the same numbers: every product at once takes ~17 bytes per M*N*K
    (1024 x 4096 x 1024 would need ~68 GiB)."""
    from fp8lab.gemm import emulation
    from tests.numerics.test_hardening import _Largest

    model = AccumulatorModel()
    g = torch.Generator().manual_seed(5)
    a_q, b_q = quantize(torch.rand(40, 320, generator=g)), quantize(torch.rand(24, 320, generator=g), E4M3, PerRow())
    whole = emulation.scale_output(model.accumulate(emulation.scaled_products(a_q, b_q)), a_q, b_q)
    monkeypatch.setattr(emulation, "MAX_ACCUMULATED_PRODUCTS", 40 * 24 * 320 - 1)
    with pytest.raises(ValueError, match="products is beyond"):  # (the limit is checked before any work)
        emulated_mm(a_q, b_q, accumulation=model)
    monkeypatch.setattr(emulation, "MAX_ACCUMULATED_PRODUCTS", 40 * 24 * 320)
    monkeypatch.setattr(emulation, "_PRODUCTS_PER_CHUNK", 3 * 24 * 320)  # chunks of 3 rows
    with _Largest() as seen:
        got = emulated_mm(a_q, b_q, accumulation=model)
    assert torch.equal(got, whole)
    assert seen.largest[torch.float64] <= 3 * 24 * 320  # no tensor of every product at once
    monkeypatch.undo()
    big_a, big_b = quantize(torch.randn(1024, 4096)), quantize(torch.randn(1024, 4096))
    with pytest.raises(ValueError, match=r"M\*N\*K = 1024\*1024\*4096 = 4.29e\+09 products is beyond"):
        emulated_mm(big_a, big_b, accumulation=model)


def test_the_emulation_stays_ieee_float32_whatever_the_matmul_precision():
    """The emulation pins IEEE float32 for its matmuls (on every backend) and restores the process's
    settings: fp32 matmuls that inherit set_float32_matmul_precision("high" / "medium") (TF32 on a GPU;
    on the CPU "medium" is bf16 through oneDNN) lose exactness once block scales are folded in."""
    precision = "medium"  # (what lowers float32 matmuls on a CPU; "high" is TF32, a GPU's)
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(256, 512, generator=g), torch.randn(128, 512, generator=g)
    pairs = [(quantize(a, E4M3, PerBlock(1, 32), "rceil", scale_fmt=E8M0), quantize(b, E4M3, PerBlock(1, 32), "rceil",
                                                                                  scale_fmt=E8M0)),
             (quantize(a, E4M3, PerBlock(1, 128)), quantize(b, E4M3, PerBlock(128, 128))),
             (quantize(a), quantize(b))]
    want = [emulated_mm(*pair) for pair in pairs]
    reference = [emulated_mm(*pair, emulation="reference") for pair in pairs]
    old = torch.get_float32_matmul_precision()
    # the per-backend settings torch has (oneDNN's from torch 2.9): where the CPU has them, "high"/"medium" lower it
    backends = [m for m in (torch.backends.cuda.matmul, getattr(torch.backends.mkldnn, "matmul", None))
                if m is not None and hasattr(m, "fp32_precision")]
    try:
        torch.set_float32_matmul_precision(precision)
        settings = [m.fp32_precision for m in backends]
        # a CPU with bf16 units (AVX512-BF16, AMX) lowers fp32 matmuls now; an AVX2 CPU has none and
        # computes them in float32 anyway: there the pin is proven by the test below instead
        lowered = a.matmul(b.t()).sub(a.double().matmul(b.double().t())).abs().max() > 1e-3
        print(f"this CPU lowers float32 matmuls under 'medium': {bool(lowered)}")
        for pair, w, r in zip(pairs, want, reference, strict=True):
            assert torch.equal(emulated_mm(*pair), w)
            assert torch.equal(emulated_mm(*pair, emulation="reference"), r)
        assert [m.fp32_precision for m in backends] == settings  # restored
        assert torch.get_float32_matmul_precision() == precision
    finally:
        torch.set_float32_matmul_precision(old)


def test_the_emulation_sets_ieee_float32_for_its_matmuls_and_gives_the_setting_back(monkeypatch):
    """On any machine: every matmul precision setting torch has is set to IEEE float32 while the
    emulation runs, and given back after; a stand-in setting records what it is told."""
    from fp8lab.gemm import emulation

    class Setting:  # stands in for torch.backends.cuda.matmul / torch.backends.mkldnn.matmul
        def __init__(self):
            self.told, self._value = [], "tf32"

        @property
        def fp32_precision(self):
            return self._value

        @fp32_precision.setter
        def fp32_precision(self, value):
            self.told.append(value)
            self._value = value

    setting = Setting()
    monkeypatch.setattr(emulation, "_precision_settings", lambda: [setting])
    a, b = torch.randn(64, 256), torch.randn(256, 32)
    for how in ("fast", "reference"):
        emulated_mm(*quantize_operands(a, b, "blockwise"), emulation=how)
    assert setting.told == ["ieee", "tf32", "ieee", "tf32"] and setting.fp32_precision == "tf32"


# ---- backends (the real path itself: tests/gemm/test_real.py) ------------------------------------------


def test_without_a_gpu_everything_is_emulated_with_the_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fp8lab.gemm.backend._cpu_choice.cache_clear()
    choice = resolve_backend("blockwise", "cpu")
    assert choice.backend == "emulated" and "no CUDA device" in choice.reason
    with pytest.raises(KernelUnavailable, match="no CUDA device"):
        resolve_backend("tensorwise", "cpu", backend="scaled_mm")
    with pytest.raises(KernelUnavailable, match="no CUDA device"):
        real_mm(*quantize_operands(torch.randn(16, 32), torch.randn(32, 16)))
    fp8lab.gemm.backend._cpu_choice.cache_clear()


def test_the_choice_is_printed_once(capsys):
    a, b = torch.randn(8, 64), torch.randn(64, 5)
    matmul(a, b, "mxfp8")
    matmul(a, b, "mxfp8")
    printed = capsys.readouterr().out
    assert printed.count("fp8lab.matmul mxfp8 [8x64] @ [64x5]") == 1
    assert isinstance(resolve_backend("mxfp8"), BackendChoice)


def test_swizzle_matches_the_cublas_layout_as_torchao_builds_it():
    to_blocked = pytest.importorskip("torchao.prototype.mx_formats.utils").to_blocked
    for shape in [(128, 4), (256, 8), (130, 9), (1, 1), (300, 17)]:
        s = torch.randint(0, 255, shape, dtype=torch.uint8)
        assert torch.equal(swizzle_scales(s), to_blocked(s))


def test_swizzle_is_a_permutation():
    s = torch.arange(256 * 8).reshape(256, 8)
    assert torch.equal(swizzle_scales(s).sort().values, torch.arange(256 * 8))


# ---- on a GPU (skipped without one) ---------------------------------------------------------------


@gpu
@pytest.mark.parametrize("recipe", [*RECIPES, "rowwise_with_gw_hp"])
def test_real_kernel_matches_emulation(recipe):
    """Every GEMM fp8lab plans to run real on this GPU runs (a failing probe fails the test) and
    agrees with the emulation at the precision of its output."""
    from fp8lab.nn import layer_gemms

    backend = GemmBackend("auto", verbose=False)
    g = torch.Generator().manual_seed(0)
    x, w, dy = torch.randn(200, 328, generator=g), torch.randn(72, 328, generator=g), torch.randn(200, 72, generator=g)
    arch = torch.cuda.get_device_capability()
    for gemm, pair in layer_gemms(x.cuda(), w.cuda(), dy.cuda(), recipe).items():
        if pair is None:
            continue
        try:
            plan = plan_gemm(*pair, arch, torch.version.cuda)
        except KernelUnavailable:
            continue  # this generation has no kernel for the pair: emulated by design
        choice = backend.choose(*pair)
        assert choice.backend == "scaled_mm", f"{recipe} {gemm}: {choice.reason}"
        out = real_mm(*pair)
        ok, worst = agrees_with_emulation(out, *pair, plan.out_dtype)
        assert ok, f"{recipe} {gemm}: {worst:.3g}x the allowed difference"


def test_mx_operand_scales_are_e8m0_on_the_k_axis():
    a_q, b_q = quantize_operands(torch.randn(4, 64), torch.randn(64, 3), "mxfp8")
    assert a_q.scale.shape == (4, 2) and b_q.scale.shape == (3, 2) and a_q.scale_fmt is E8M0
    assert isinstance(RECIPES["rowwise"].input.granularity, PerRow)
    assert isinstance(RECIPES["tensorwise"].input.granularity, PerTensor)
    assert RECIPES["blockwise"].weight.granularity == PerBlock(128, 128)
    assert math.isfinite(float(a_q.scale.max()))
