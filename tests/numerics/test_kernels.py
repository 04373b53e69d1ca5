"""fp8lab.numerics.kernels: the fused C loops give the torch code's numbers bit for bit (and did run), and
fall back cleanly."""

import contextlib
import os
import subprocess
import sys

import pytest
import torch

import fp8lab
from fp8lab import E2M1, E4M3, E5M2, E8M0, PerBlock, PerRow, PerTensor, quantize
from fp8lab.gemm import emulated_mm
from fp8lab.numerics import kernels, kernels_build, kernels_gemm, scaling
from fp8lab.numerics.quantize import quantize_spec, quantize_with
from fp8lab.numerics.recipes import RECIPES, get_recipe
from fp8lab.training.layers import LayerState, _operand
from tests.defaults import OTHER_DEFAULTS, torch_defaults
from tests.numerics import same_bits

pytestmark = pytest.mark.skipif(not kernels.status()[0], reason=f"kernels not built here: {kernels.status()[1]}")

GRANULARITIES = [PerTensor(), PerRow(), PerBlock(1, 16), PerBlock(1, 32), PerBlock(1, 128), PerBlock(128, 128),
                 PerBlock(3, 5), PerBlock(16, 1), PerBlock(32, 1), PerBlock(100, 1)]
SHAPES = [(256, 256), (100, 300), (1, 7), (257, 129)]


def _nasty(shape, seed):
    """Normal data over many binades, with zeros, -0, tiny, huge (clipping) and NaN values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-30, 30, shape, generator=g).float())
    flat = x.view(-1)
    n = flat.numel()
    idx = torch.randperm(n, generator=g)
    specials = [0.0, -0.0, 1e-30, -1e-38, 3e38, -3e38, 2.0**-140]
    for i, v in zip(idx[: len(specials)].tolist(), specials, strict=False):
        flat[i] = v
    return x


@contextlib.contextmanager
def _c_calls():
    """The names of the C entry points called inside the block (proof that the C path ran, or did not)."""
    calls, run = [], kernels._run

    def counting(name, p):
        calls.append(name)
        return run(name, p)

    kernels._run = counting
    try:
        yield calls
    finally:
        kernels._run = run


def _compare(x, **kw):
    with _c_calls() as calls:
        got = quantize(x, **kw)
    assert calls == ["fp8lab_quantize"], f"the C kernel did not run for {kw}: {calls}"
    with kernels.disabled(), _c_calls() as calls:
        want = quantize(x, **kw)
        want_values = want.values()
        want_dequantized = want.dequantize()
    assert not calls, "kernels.disabled() still ran C"
    assert same_bits(got.data, want.data), f"codes differ for {kw}"
    assert same_bits(got.scale, want.scale), f"scales differ for {kw}"
    assert torch.equal(got.amax.nan_to_num(-1.0), want.amax.nan_to_num(-1.0))  # by value: torch's max gives -0 too
    assert same_bits(got.tensor_scale, want.tensor_scale)
    assert same_bits(got.values(), want_values), f"values differ for {kw}"
    assert same_bits(got.dequantize(), want_dequantized), f"dequantized values differ for {kw}"
    # the kernel's (smallest, largest) scale, as torch.aminmax finds it (NaN if a scale is NaN)
    assert str(got.scale_range()) == str(want.scale_range()), f"scale range differs for {kw}"
    return got


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1])
@pytest.mark.parametrize("granularity", GRANULARITIES, ids=lambda g: g.label)
def test_quantize_matches_the_torch_code_bit_for_bit(fmt, granularity):
    for seed, shape in enumerate(SHAPES):
        if not isinstance(granularity, PerTensor) and len(shape) != 2:
            continue
        x = _nasty(shape, seed)
        for rule in ("exact", "rceil", "floor"):
            _compare(x, fmt=fmt, granularity=granularity, scale_rule=rule)
        _compare(x, fmt=fmt, granularity=granularity, scale_rule="floor", scale_fmt=E8M0)
        _compare(x, fmt=fmt, granularity=granularity, margin=2)
        _compare(x, fmt=fmt, granularity=granularity, scale_fmt=E4M3, two_level=True)
        _compare(x, fmt=fmt, granularity=granularity, scale_fmt=E4M3, two_level=True, scale_floor="min_normal")
        _compare(x, fmt=fmt, granularity=granularity, scale_fmt=E4M3, margin=1)


def test_nan_blocks_and_amax_overrides_match():
    x = _nasty((64, 256), 7)
    x[3, 5] = float("nan")
    x[40, 200] = -float("nan")
    q = _compare(x, fmt=E4M3, granularity=PerBlock(1, 32), scale_rule="rceil", scale_fmt=E8M0)
    assert torch.isnan(q.values()[3, 5]) and torch.isnan(q.scale[3, 0])
    _compare(x, fmt=E5M2, granularity=PerBlock(32, 1))
    y = torch.randn(64, 256)
    _compare(y, fmt=E4M3, amax=torch.tensor(0.5))  # delayed: a stale amax that clips
    _compare(y, fmt=E4M3, granularity=PerRow(), amax=torch.full((64, 1), 2.0))


_AMAXES = torch.cat([
    torch.tensor([0.0, float("nan"), float("inf"), 1e-40, 1e-45, 2.0**-126, 3e38, 448.0, 448.0 * 1.0001]),
    torch.randn(2000, generator=torch.Generator().manual_seed(0)).exp()
    * torch.exp2(torch.randint(-140, 120, (2000,), generator=torch.Generator().manual_seed(1)).float()),  # finite
])


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1], ids=lambda f: f.name)
def test_scale_from_amax_twins_agree_on_every_kind_of_amax(fmt):
    """scaling.scale_from_amax (the definition) and kernels.scale_from_amax (its twin): one signature, same bits."""
    for margin in (0, 3, scaling._largest_margin(fmt)):
        for rule, scale_fmt, two_level, floor in (
                ("exact", None, False, "zero"), ("rceil", None, False, "zero"), ("floor", None, False, "zero"),
                ("rceil", E8M0, False, "zero"), ("floor", E8M0, False, "zero"), ("exact", E4M3, False, "zero"),
                ("exact", E4M3, True, "zero"), ("exact", E4M3, False, "min_normal"),
                ("exact", E4M3, True, "min_normal")):
            # with NaN and inf (NVFP4: tensor scale 1); all finite, normal, tiny; all zero
            for amax in (_AMAXES, _AMAXES[3:], _AMAXES[9:], _AMAXES[9:] * 1e-37, torch.zeros(3)):
                want = scaling.scale_from_amax(amax, fmt, rule, margin, scale_fmt, two_level, floor)
                got = kernels.scale_from_amax(amax, fmt, rule, margin, scale_fmt, two_level, floor)
                assert all(same_bits(a, b) for a, b in zip(got, want, strict=True)), (fmt.name, margin, rule, scale_fmt,
                                                                                 floor)


@pytest.mark.parametrize("granularity", GRANULARITIES, ids=lambda g: g.label)
def test_block_amax_twins_agree(granularity):
    for seed, shape in enumerate(SHAPES):
        x = _nasty(shape, seed)
        x.view(-1)[seed] = float("nan")
        got = kernels.amax_per_block(x, granularity)
        want = scaling.amax_per_block(x, granularity)
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        assert torch.equal(got.nan_to_num(), want.nan_to_num())


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_emulated_gemm_matches_with_and_without_kernels(recipe):
    r = get_recipe(recipe)
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(96, 320, generator=g), torch.randn(80, 320, generator=g)
    sa, sb = r.scaling("input", "fprop"), r.scaling("weight", "fprop")
    got = emulated_mm(quantize(a, sa), quantize(b, sb))
    with kernels.disabled():
        want = emulated_mm(quantize(a, sa), quantize(b, sb))
    assert same_bits(got, want)


def test_matmul_of_transposed_weights_matches_with_and_without_kernels():
    """b[K, N] is quantized down its columns and used as a transposed view: the torch code folds its
    scales in that layout too, as the kernel writes them (a GEMM's summation order follows the layout:
    folded in another, 9 in 200 such products differ in the last bit, as tests/numerics/test_fuzz.py finds)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        m, k, n = torch.randint(1, 60, (3,), generator=g).tolist()
        a = torch.randn(m, k, generator=g).sign()
        b = torch.randn(k, n, generator=g) * torch.exp2(torch.randint(0, 25, (k, n), generator=g).float())
        for recipe in ("mxfp8", "blockwise"):
            got = fp8lab.matmul(a, b, recipe, backend="emulated", verbose=False)
            with kernels.disabled():
                want = fp8lab.matmul(a, b, recipe, backend="emulated", verbose=False)
            assert same_bits(got, want), (m, k, n, recipe)


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("layout", ["b[K, N]", "w.t()"])
def test_gemm_operands_get_their_values_in_the_quantize_pass_at_any_size(monkeypatch, recipe, layout):
    """Beyond kernels.EAGER_VALUES elements plain quantize writes codes only, but a GEMM's operands
    are read next as float32 values (scale-folded where the GEMM folds): quantize_operands has the
    kernel write them in the same pass (widening 1536x3072 activations from their codes in torch takes
    ~15% of the natural matmul's time), and the product is the torch code's, bit for bit."""
    from fp8lab.gemm import quantize_operands

    monkeypatch.setattr(kernels, "EAGER_VALUES", 100)  # every operand below is beyond it
    g = torch.Generator().manual_seed(5)
    a, w = torch.randn(64, 96, generator=g), torch.randn(48, 96, generator=g) * 3
    b = w.t().contiguous() if layout == "b[K, N]" else w.t()
    assert quantize(a).derived.values is None  # plain quantize: codes only, at this size
    with _c_calls() as calls:
        a_q, b_q = quantize_operands(a, b, recipe)
    assert calls == ["fp8lab_quantize"] * 2
    for q in (a_q, b_q):
        assert (q.derived.values is not None) or (q.derived.scaled is not None), (recipe, layout)
    got = emulated_mm(a_q, b_q)
    with kernels.disabled():
        want = emulated_mm(*quantize_operands(a, b, recipe))
    assert same_bits(got, want)


def test_per_row_scales_of_both_operands_match_with_and_without_kernels():
    """The kernel's epilogue out *= a[m] * b[n] rounds the factor first, as torch's outer product:
    float32 (not power-of-two) per-row scales make any other order visible."""
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(64, 96, generator=g) * 3, torch.randn(48, 96, generator=g) / 7
    a_q, b_q = quantize(a, E4M3, PerRow()), quantize(b, E5M2, PerRow())
    got = emulated_mm(a_q, b_q)
    with kernels.disabled():
        want = emulated_mm(a_q, b_q)
    assert same_bits(got, want)


@pytest.mark.parametrize("recipe", [*RECIPES, "rowwise_with_gw_hp"])
def test_transposed_operands_equal_quantizing_the_transposed_copy(recipe):
    """wgrad and dgrad operands are quantized down source's columns, not from a copy of source^T."""
    r = get_recipe(recipe)
    state = LayerState("fc", r, None, None, "emulated")
    x = _nasty((160, 96), 3)
    for role, gemm in (("input", "wgrad"), ("grad_output", "wgrad"), ("weight", "dgrad")):
        scaling = r.scaling(role, gemm)
        got = _operand(state, x, role, gemm, transpose=True)
        if scaling is None:
            assert got is None
            continue
        want = quantize(x.t().contiguous(), scaling)
        assert got.granularity == want.granularity and got.shape == want.shape
        assert same_bits(got.data, want.data) and same_bits(got.scale, want.scale), (role, gemm)
        assert same_bits(got.values(), want.values()) and same_bits(got.dequantize(), want.dequantize())


def test_fold_of_a_transposed_operand_matches():
    x = _nasty((128, 96), 4)
    q = quantize(x, fmt=E4M3, granularity=PerBlock(32, 1), scale_rule="rceil", scale_fmt=E8M0).t()
    w = quantize(torch.randn(40, 128), fmt=E4M3, granularity=PerBlock(1, 32), scale_rule="rceil", scale_fmt=E8M0)
    got = emulated_mm(q, w)
    with kernels.disabled():
        want = emulated_mm(q, w)
    assert same_bits(got, want)


def _python(code: str, **env) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **env}, check=True)
    return out.stdout.strip()


def test_switched_off_or_unbuildable_kernels_fall_back_to_torch_with_a_reason(tmp_path):
    code = ("import torch; from fp8lab import quantize; from fp8lab.numerics import kernels; "
            "ok, why = kernels.status(); "
            "q = quantize(torch.randn(64, 64)); print(ok, '|', why, '|', q.values().abs().max().item())")
    off = _python(code, FP8LAB_KERNELS="0")
    assert off.startswith("False | off (FP8LAB_KERNELS=0)") and off.endswith("448.0")
    broken = _python(code, CC=str(tmp_path / "no-such-cc"), XDG_CACHE_HOME=str(tmp_path))
    assert broken.startswith("False | building the CPU kernels failed") and broken.endswith("448.0")
    fresh = _python(code, XDG_CACHE_HOME=str(tmp_path))  # an empty cache: builds, then uses them
    assert fresh.startswith("True | fused CPU kernels") and list((tmp_path / "fp8lab").glob("kernels-*.so"))


@pytest.mark.parametrize("granularity", [PerTensor(), PerRow(), PerBlock(1, 32), PerBlock(128, 128), PerBlock(32, 1)],
                         ids=lambda g: g.label)
def test_large_tensors_split_over_threads_give_the_same_bits(granularity):
    """Millions of elements run on several threads, and beyond EAGER_VALUES values come lazily."""
    for shape in ((1500, 1500), (2304, 2048)):  # threaded with eager values; threaded, lazy values
        x = _nasty(shape, 11)
        x[777, 5] = float("nan")
        q = quantize(x, fmt=E4M3, granularity=granularity)
        assert (q.derived.values is None and q.derived.scaled is None) == (x.numel() > kernels.EAGER_VALUES)
        _compare(x, fmt=E4M3, granularity=granularity, scale_rule="rceil")
        _compare(x, fmt=E5M2, granularity=granularity)


@pytest.mark.parametrize("granularity", [PerBlock(32, 1), PerBlock(128, 128), PerBlock(3, 5), PerBlock(1000, 1),
                                         PerRow(), PerTensor()], ids=lambda g: g.label)
def test_parts_may_split_a_block_row_and_any_thread_count_gives_the_same_bits(granularity):
    """Beyond 32768 elements the casts split by rows (torch's OpenMP threads); 1000 rows over 2
    or 3 threads cut through a block row of 32, 128 or 3 rows, whose scale both parts use."""
    x = _nasty((1000, 96), 3)
    for kw in ({"fmt": E4M3}, {"fmt": E5M2, "scale_rule": "rceil"}, {"fmt": E2M1, "scale_fmt": E4M3}):
        got = _compare(x, granularity=granularity, **kw)
        threads = torch.get_num_threads()
        try:
            for n in (1, 3):
                torch.set_num_threads(n)
                again = quantize(x, granularity=granularity, **kw)
                assert same_bits(again.data, got.data) and same_bits(again.values(), got.values()), (n, kw)
        finally:
            torch.set_num_threads(threads)


@pytest.mark.parametrize("granularity", [PerTensor(), PerRow(), PerBlock(1, 32), PerBlock(128, 128), PerBlock(32, 1)],
                         ids=lambda g: g.label)
def test_monitor_counts_match_the_metrics(granularity):
    """quantize(count=True) counts clipped and flushed elements in the kernel's pass: the metrics' numbers."""
    from fp8lab.numerics.metrics import overflow_fraction, overflow_underflow, underflow_fraction

    clean = _nasty((300, 256), 5)
    with_nan = clean.clone()
    with_nan[7, 9] = float("nan")
    for x in (clean, with_nan):
        for kw in ({"fmt": E4M3}, {"fmt": E5M2, "margin": 3}, {"fmt": E2M1, "scale_fmt": E4M3, "two_level": True},
                   {"fmt": E2M1, "scale_fmt": E4M3, "two_level": True, "scale_floor": "min_normal"},
                   {"fmt": E4M3, "scale_rule": "floor", "scale_fmt": E8M0}):
            spec = quantize_spec(granularity=granularity, **kw)
            q = quantize_with(x, spec, count=True)
            want = (overflow_fraction(x, q), underflow_fraction(x, q))
            assert q.counts is not None and overflow_underflow(x, q) == want, kw
            assert want[1] > 0 or x is with_nan  # values 2^30 below a block's amax flush
            delayed = quantize_with(x, spec, amax=q.amax * 0.01, count=True)  # a stale amax: most values clip
            assert overflow_underflow(x, delayed) == (overflow_fraction(x, delayed), underflow_fraction(x, delayed))
            with kernels.disabled():
                assert quantize_with(x, spec, count=True).counts is None  # the torch code leaves them to metrics


def test_the_portable_build_without_openmp_or_native_code_gives_the_same_bits(tmp_path, monkeypatch):
    """What a machine without torch's libgomp (or without -march=native) runs: the plain C
    loops, large tensors split over POSIX threads. Built here into an empty cache."""
    import ctypes

    monkeypatch.setattr(kernels_build, "cache_dir", lambda: tmp_path)
    portable = kernels._bind(ctypes.CDLL(str(kernels_build.build(kernels_build.compiler(), kernels_build.FLAGS))))
    assert portable.fp8lab_openmp() == 0
    portable.fp8lab_set_threads(2)
    ours = kernels._load()
    monkeypatch.setattr(kernels, "_load", lambda: (portable, "portable build"))
    for shape, granularity in (((300, 256), PerBlock(1, 32)), ((257, 129), PerBlock(3, 5)),
                               ((300, 256), PerBlock(32, 1)), ((1500, 1500), PerTensor()),
                               ((1500, 1500), PerBlock(32, 1))):  # the last two: split over 2 threads
        x = _nasty(shape, 4)
        for kw in ({"fmt": E4M3}, {"fmt": E5M2, "scale_rule": "rceil"}, {"fmt": E2M1, "scale_fmt": E4M3}):
            got = _compare(x, granularity=granularity, **kw)
            monkeypatch.setattr(kernels, "_load", lambda: ours)
            native = quantize(x, granularity=granularity, **kw)
            monkeypatch.setattr(kernels, "_load", lambda: (portable, "portable build"))
            assert same_bits(got.data, native.data) and same_bits(got.values(), native.values()), (shape, kw)
    # the reference GEMM's exact segments in one call (segment_mm): plain multiply-adds here, no FMA or 512-bit vectors
    g = torch.Generator().manual_seed(6)
    qa = quantize(torch.randn(130, 200, generator=g), E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True)
    qb = quantize(torch.randn(70, 200, generator=g), E2M1, PerBlock(1, 32), scale_fmt=E4M3, two_level=True)
    got = emulated_mm(qa, qb, emulation="reference")
    # torch.rand's draws (kernels.uniform_draws) and the 1 x 16 and 16 x 1 blocks' stochastic rounding
    ours_g, torch_g = torch.Generator().manual_seed(8), torch.Generator().manual_seed(8)
    assert same_bits(kernels.uniform_draws((2000,), ours_g), torch.rand(2000, generator=torch_g))
    x = _nasty((64, 96), 5).nan_to_num(0.0)
    stochastic = [quantize(x, E2M1, g, scale_fmt=E4M3, two_level=True, rounding="stochastic",
                           generator=torch.Generator().manual_seed(3)) for g in (PerBlock(1, 16), PerBlock(16, 1))]
    monkeypatch.setattr(kernels, "_load", lambda: ours)
    assert same_bits(got, emulated_mm(qa, qb, emulation="reference"))
    for q, g in zip(stochastic, (PerBlock(1, 16), PerBlock(16, 1)), strict=True):
        native = quantize(x, E2M1, g, scale_fmt=E4M3, two_level=True, rounding="stochastic",
                          generator=torch.Generator().manual_seed(3))
        assert same_bits(q.data, native.data) and same_bits(q.values(), native.values()), g


def _every_kernels_answer() -> list:
    """One answer of each C entry point that allocates what C writes: quantize (every recipe's input, values
    written; NVFP4's tensor scale), amax_per_block, scale_from_amax (two-level), cast, segment_mm (the
    reference GEMM of E2M1 operands), widen_codes and hadamard; inputs made as float32 CPU tensors whatever the
    defaults."""
    from fp8lab.numerics.hadamard import RandomHadamard

    g = torch.Generator().manual_seed(9)
    x = torch.randn(96, 256, generator=g, dtype=torch.float32, device="cpu")
    w = torch.randn(64, 256, generator=g, dtype=torch.float32, device="cpu")
    answers = []
    for name in RECIPES:
        q = quantize_with(x, get_recipe(name).input, values=True)
        answers += [q.data, q.values(), q.scale, q.tensor_scale]
    a, b = (quantize(t, E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True) for t in (x, w))
    amax = kernels.amax_per_block(x, PerBlock(1, 32))
    answers += [amax, *kernels.scale_from_amax(amax, E2M1, scale_fmt=E4M3, two_level=True),
                kernels.cast(x, E4M3), emulated_mm(a, b, emulation="reference"),
                kernels_gemm.widen_codes(quantize(x, E4M3, PerRow()).data), kernels.hadamard(RandomHadamard(16, 0), x)]
    return answers


@pytest.mark.parametrize(("dtype", "device"), OTHER_DEFAULTS, ids=str)
def test_every_kernel_writes_cpu_float32_whatever_the_defaults(dtype, device):
    """A notebook that called torch.set_default_dtype (float64 for a reference, a half type by mistake) or
    set_default_device ("meta" to size a model, "cuda"): every buffer C writes is a CPU buffer of C's dtype still,
    so every kernel's answer is the defaults' answer, dtype, device and bits (a float64 buffer read back other
    numbers; a half one had half the bytes C wrote; a meta one had no memory at all)."""
    want = _every_kernels_answer()
    with torch_defaults(dtype, device):
        got = _every_kernels_answer()
    assert len(got) == len(want) and all(same_bits(a, b) for a, b in zip(got, want, strict=True))
    assert all(t is None or t.device.type == "cpu" for t in got)


@pytest.mark.parametrize("size", [4, 16, 64, 256])
def test_the_hadamard_twin_gives_the_torch_codes_bits(size):
    """kernels.hadamard against RandomHadamard.apply: bit for bit (NaN where NaN), rows narrower than d, widths d
    does not divide (zero padding), -0, tiny, huge and NaN values, a tensor split over threads, and x as a
    transposed view."""
    from fp8lab.numerics.hadamard import RandomHadamard

    for seed, shape in ((0, (33, 70)), (1, (5, 3)), (2, (17, size * 4)), (3, (600, 130))):
        transform = RandomHadamard(size, seed)
        x = _nasty(shape, seed).clamp(-1e30, 1e30)  # (sums of huge values would overflow in both alike; kept finite)
        x[shape[0] // 2, 0] = float("nan")
        assert same_bits(kernels.hadamard(transform, x), transform.apply(x)), (seed, shape)
        view = x.t().contiguous().t()  # x's values transposed in memory (wgrad's x^T is such a view): read as it lies
        assert view.stride() == (1, shape[0]) and same_bits(kernels.hadamard(transform, view), transform.apply(x))


@pytest.mark.parametrize("granularity", [PerTensor(), PerBlock(1, 16), PerBlock(16, 1), PerBlock(3, 5)],
                         ids=lambda g: g.label)
def test_stochastic_rounding_split_over_threads_gives_the_same_bits(granularity):
    """The kernel's stochastic rounding, on a tensor split by rows over 1, 2 or 3 threads, reads each element's own
    draw: the torch code's codes and values."""
    x = _nasty((1000, 96), 6).nan_to_num(0.0)
    for kw in ({"fmt": E4M3}, {"fmt": E5M2, "scale_rule": "rceil"},
               {"fmt": E2M1, "scale_fmt": E4M3, "two_level": True}):
        spec = quantize_spec(granularity=granularity, rounding="stochastic", **kw)
        with kernels.disabled():
            want = quantize_with(x, spec, generator=torch.Generator().manual_seed(9))
        threads = torch.get_num_threads()
        try:
            for n in (1, 2, 3):
                torch.set_num_threads(n)
                got = quantize_with(x, spec, generator=torch.Generator().manual_seed(9))
                assert same_bits(got.data, want.data) and same_bits(got.values(), want.values()), (n, kw)
                assert same_bits(got.scaled_values(), want.scaled_values()), (n, kw)
        finally:
            torch.set_num_threads(threads)


def test_the_kernels_split_a_tensor_over_threads_from_a_size_the_wait_policy_sets():
    """Waiting passively, OpenMP's threads sleep after each parallel region and the next wakes them: the kernels
    split from 2^18 elements there, from 32768 where the threads spin; FP8LAB_PARALLEL_MIN sets it (a positive
    integer, else ValueError naming it), and the loaded library splits from what parallel_min says."""
    import os

    from fp8lab import threads

    assert threads.parallel_min(threads.PASSIVE, {}) == threads.PARALLEL_MIN_PASSIVE == 1 << 18
    for policy in ("ACTIVE", "libgomp's default"):
        assert threads.parallel_min(policy, {}) == threads.PARALLEL_MIN_SPINNING == 1 << 15
    assert threads.parallel_min(threads.PASSIVE, {"FP8LAB_PARALLEL_MIN": "4096"}) == 4096
    for bad in ("0", "-5", "many", ""):
        with pytest.raises(ValueError, match="FP8LAB_PARALLEL_MIN"):
            threads.parallel_min(threads.PASSIVE, {"FP8LAB_PARALLEL_MIN": bad})
    lib = kernels._load()[0]
    if lib is None or not lib.fp8lab_openmp():
        return  # (POSIX threads split from millions of elements, whatever the policy)
    assert lib.fp8lab_parallel_min() == threads.parallel_min() == threads.parallel_min(
        threads.decision().wait_policy, os.environ)
    before = os.environ["FP8LAB_PARALLEL_MIN"]
    try:  # loaded again with another setting, the library splits from it
        os.environ["FP8LAB_PARALLEL_MIN"] = "12345"
        kernels._load.cache_clear()
        assert kernels._load()[0].fp8lab_parallel_min() == 12345
    finally:
        os.environ["FP8LAB_PARALLEL_MIN"] = before
        kernels._load.cache_clear()
        assert kernels._load()[0].fp8lab_parallel_min() == int(before)


def test_the_draws_twin_gives_torch_rands_numbers_and_moves_the_generator_as_torch_rand_does():
    """kernels.uniform_draws against torch.rand from generators at every kind of point in their stream (fresh,
    one draw in, at and around a refill of the 624 words, far in): the same float32 bits, and the generator's
    state afterwards the same bytes, so the draws that follow are torch's too; any shape. The C side refuses a
    state whose counters would read outside the words; draws_like_torch() (the check the lab relies on) holds,
    also where a thread that runs the torch code (kernels.disabled()) asks first."""
    kernels.draws_like_torch.cache_clear()
    with kernels.disabled():
        assert kernels.draws_like_torch()
    for dtype, device in OTHER_DEFAULTS:  # (asked first under a notebook's float64 default, say: the check holds)
        kernels.draws_like_torch.cache_clear()
        with torch_defaults(dtype, device):
            assert kernels.draws_like_torch(), (dtype, device)
    for advanced in (0, 1, 623, 624, 625, 1000):
        for n in (0, 1, 623, 624, 625, 5000, 100003):
            ours, theirs = torch.Generator().manual_seed(advanced), torch.Generator().manual_seed(advanced)
            torch.rand(advanced, generator=ours), torch.rand(advanced, generator=theirs)
            assert same_bits(kernels.uniform_draws((n,), ours), torch.rand(n, generator=theirs)), (advanced, n)
            assert torch.equal(ours.get_state(), theirs.get_state()), (advanced, n)
    ours, theirs = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert same_bits(kernels.uniform_draws((3, 5, 7), ours), torch.rand(3, 5, 7, generator=theirs))
    out = torch.empty(4)
    for offset, value in ((8, 0), (8, 625), (16, 625)):  # left 0 or beyond the words, next beyond them
        state = ours.get_state()
        state[offset:offset + 4] = torch.tensor([value], dtype=torch.int32).view(torch.uint8)
        with pytest.raises(RuntimeError, match="refused"):
            kernels.call("fp8lab_uniform", state.data_ptr(), state.numel(), 4, out.data_ptr())
    with pytest.raises(RuntimeError, match="refused"):  # (a state of another size)
        kernels.call("fp8lab_uniform", state.data_ptr(), state.numel() - 8, 4, out.data_ptr())


def test_torch_runs_an_elementwise_op_alone_below_its_grain_or_on_one_thread():
    """kernels.torch_runs_alone(t): where torch's elementwise ops over t stay on the calling thread (ATen's
    TensorIterator splits from at::internal::GRAIN_SIZE elements, 32768, over more than one thread)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert kernels.torch_runs_alone(torch.empty(kernels.TORCH_GRAIN - 1))
        assert kernels.torch_runs_alone(torch.empty(0))
        assert not kernels.torch_runs_alone(torch.empty(kernels.TORCH_GRAIN))
        assert not kernels.torch_runs_alone(torch.empty(256, 512))
        torch.set_num_threads(1)
        assert kernels.torch_runs_alone(torch.empty(256, 512))
    finally:
        torch.set_num_threads(threads)


def test_kernel_times_tallies_each_c_function_by_name_while_open_and_one_at_a_time():
    """kernels.kernel_times(): the seconds each C function runs add up under its name inside the context (bench
    train --parts reads them); nothing is tallied outside it, and a second one inside the first is refused."""
    x = torch.randn(64, 64)
    with kernels.kernel_times() as tally:
        quantize(x, "e4m3", PerBlock(1, 32))
        kernels_gemm.widen_codes(quantize(x, "e4m3").data)
        assert set(tally) == {"fp8lab_quantize", "fp8lab_widen"} and all(s >= 0 for s in tally.values())
        with pytest.raises(RuntimeError, match="one tally at a time"), kernels.kernel_times():
            pass
        calls = dict(tally)
    quantize(x, "e4m3", PerBlock(1, 32))
    assert dict(tally) == calls  # (closed: the call above is not counted)
    with kernels.kernel_times() as again:  # (closed, a new one opens)
        quantize(x, "e5m2")
    assert set(again) == {"fp8lab_quantize"}
