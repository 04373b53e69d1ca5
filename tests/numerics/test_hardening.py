"""Hardening: no input crashes the kernels or gives a silently wrong number.

Each test pins one finding: it fails without the guard it names, or kills one of the mutations
tools/mutate.py keeps (named in the test's docstring).
"""

import ctypes
import math

import pytest
import torch

import fp8lab
import fp8lab.nn
import fp8lab.training.train
from fp8lab import E2M1, E4M3, E5M2, E8M0, AmaxHistory, PerBlock, PerRow, PerTensor, quantize
from fp8lab.gemm import AccumulatorModel, emulated_mm
from fp8lab.numerics import kernels, kernels_gemm
from fp8lab.numerics.metrics import overflow_fraction
from fp8lab.numerics.quantize import QuantizedTensor, quantize_spec
from fp8lab.numerics.quantize_fast import CHUNK_ELEMENTS, kernel_parameters

needs_kernels = pytest.mark.skipif(not kernels.status()[0], reason=f"kernels not built here: {kernels.status()[1]}")
BOTH_PATHS = pytest.mark.parametrize("path", ["kernels", "torch"])


def _on(path: str, fn):
    """fn() on the C kernels or on the torch code (the definition)."""
    if path == "kernels":
        if not kernels.engine().kernels:
            pytest.skip(f"kernels not built here: {kernels.status()[1]}")
        return fn()
    with kernels.disabled():
        return fn()


# ---- 1: block sizes bounded, and clamped to the tensor --------------------------------------------------------


@pytest.mark.parametrize("rows,cols", [(2**64 + 1, 32), (1, 2**64 + 32), (2**63 - 1, 32), (2**31, 1)])
def test_absurd_block_sizes_are_refused_before_any_kernel_sees_them(rows, cols):
    """PerBlock(2**64 + 1, 32) is refused with a clear error before any kernel sees it: unchecked, ctypes
    wraps the size and the C kernel corrupts its heap, killing the kernel process."""
    with pytest.raises(ValueError, match=r"positive integer up to 2\*\*31 - 1"):
        PerBlock(rows, cols)


@BOTH_PATHS
def test_a_block_larger_than_the_tensor_is_clamped_to_it(path):
    """A block larger than the tensor is clamped to it (per-tensor in effect), and says so: unclamped,
    PerBlock(10**6, 10**6) on 64x256 asks for 4 TB in dequantize, and 128x128 on 1 x N pads every block
    to 128 rows."""
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    huge = _on(path, lambda: quantize(x, E4M3, PerBlock(10**6, 10**6)))
    whole = _on(path, lambda: quantize(x, E4M3, PerTensor()))
    assert huge.scale.shape == (1, 1) and huge.block_shape == (64, 256)
    assert torch.equal(huge.scale.reshape(()), whole.scale)
    assert torch.equal(huge.data.view(torch.uint8), whole.data.view(torch.uint8))
    assert torch.equal(huge.dequantize(), whole.dequantize())
    row = torch.randn(1, 4096, generator=torch.Generator().manual_seed(1))
    tall = _on(path, lambda: quantize(row, E4M3, PerBlock(128, 128)))
    assert tall.block_shape == (1, 128) and tall.scale.shape == (1, 32)
    flat = _on(path, lambda: quantize(row, E4M3, PerBlock(1, 128)))
    assert torch.equal(tall.dequantize(), flat.dequantize())


@needs_kernels
def test_every_kernel_call_checks_its_sizes_and_the_c_side_checks_the_block():
    """A block outside the tensor, or a parameter block of another layout, raises instead of
    reading past a buffer (mutation: the C size check removed)."""
    x = torch.randn(8, 64)
    template = kernel_parameters(quantize_spec())
    with pytest.raises(ValueError, match="blocks must lie within x"):
        kernels.quantize(x, (9, 64), template)
    with pytest.raises(ValueError, match="2-D float32"):
        kernels.quantize(x.reshape(-1), (1, 8), template)
    with pytest.raises(ValueError, match="one per block"):
        kernels.quantize(x, (1, 32), template, torch.ones(3))
    p, _ = kernels._block_params(template, x, (1, 32))
    p.size = ctypes.sizeof(p) - 8  # a layout Python and C disagree on
    with pytest.raises(RuntimeError, match="layout differs"):
        kernels._run("fp8lab_quantize", p)
    p, _ = kernels._block_params(template, x, (1, 32))
    p.blocks = 3  # a count that does not match M, K, r, c
    with pytest.raises(RuntimeError, match="inconsistent shapes"):
        kernels._run("fp8lab_quantize", p)
    with pytest.raises(ValueError, match="out"):
        kernels_gemm.scale_outer_(torch.ones(4, 3), torch.ones(5), torch.ones(3))
    with pytest.raises(ValueError, match=r"part None or \[M, N\]: got \(4, 3\), 4, 3, \(3, 4\)"):
        kernels_gemm.scale_outer_(torch.ones(4, 3), torch.ones(4), torch.ones(3), torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"S = ceil\(K / seg\).*got \(4, 32\), \(3, 32\), \(1, 4\), \(2, 3\), seg 16"):
        kernels_gemm.segment_mm(torch.ones(4, 32), torch.ones(3, 32), torch.ones(1, 4), torch.ones(2, 3), 16)
    with pytest.raises(ValueError, match="seg 0"):
        kernels_gemm.segment_mm(torch.ones(4, 32), torch.ones(3, 32), torch.ones(1, 4), torch.ones(1, 3), 0)
    with pytest.raises(ValueError, match=r"got \(4, 32\), \(3, 31\)"):
        kernels_gemm.segment_mm(torch.ones(4, 32), torch.ones(3, 31), torch.ones(2, 4), torch.ones(2, 3), 16)
    # the C side checks its sizes again, whatever Python passes (a segment of no columns, a negative stride)
    out = torch.empty(4, 64)
    a = torch.ones(4, 16)
    panels, sa, sb = torch.ones(16, 64), torch.ones(4), torch.ones(64)
    assert kernels._load()[0].fp8lab_segment_mm(a.data_ptr(), None, 16, 1, panels.data_ptr(), 4, 64, 16, 0,
                                                sa.data_ptr(), sb.data_ptr(), out.data_ptr()) == -2
    assert kernels._load()[0].fp8lab_segment_mm(a.data_ptr(), None, 16, -1, panels.data_ptr(), 4, 64, 16, 16,
                                                sa.data_ptr(), sb.data_ptr(), out.data_ptr()) == -2  # (a stride < 0)


# ---- 2: QuantizedTensor checks what it is built from ------------------------------------------------------------


def test_a_hand_built_quantized_tensor_with_wrong_scales_is_refused():
    """Too few or transposed scales are refused: accepted, they have matmul and the overflow metrics read
    past the scale buffer (NaN or garbage) with the kernels on."""
    x = torch.randn(64, 96)
    q = quantize(x, E4M3, PerBlock(1, 32))  # scale (64, 3)
    fields = dict(fmt=E4M3, granularity=PerBlock(1, 32))
    for bad, why in ((q.scale[:2], "shaped \\(64, 3\\)"), (q.scale.t().contiguous(), "shaped \\(64, 3\\)"),
                     (q.scale.double(), "must be float32")):
        with pytest.raises(ValueError, match=why):
            QuantizedTensor(q.data, bad, **fields)
    with pytest.raises(ValueError, match=r"stored as torch\.float8_e4m3fn"):
        QuantizedTensor(q.data.view(torch.uint8), q.scale, **fields)
    with pytest.raises(ValueError, match="tensor_scale must be a 0-d float32"):
        QuantizedTensor(q.data, q.scale, E4M3, PerBlock(1, 32), scale_fmt=E4M3, tensor_scale=torch.ones(2))
    with pytest.raises(ValueError, match="'rceil' or 'floor'"):
        QuantizedTensor(q.data, q.scale, E4M3, PerBlock(1, 32), scale_fmt=E8M0)
    ok = QuantizedTensor(q.data, q.scale, **fields)  # well formed: accepted, and the same numbers
    assert torch.equal(ok.dequantize(), q.dequantize())


# ---- 3: silently wrong numbers ------------------------------------------------------------------------------------


@BOTH_PATHS
def test_an_amax_must_be_an_amax(path):
    """A negative or infinite amax is refused: amax=-1 gives negative scales (overflow_fraction 0 while 62%
    clip), amax=inf all zeros."""
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(2))
    for amax in (-1.0, math.inf, -math.inf, torch.tensor(-0.5)):
        with pytest.raises(ValueError, match="finite and >= 0"):
            _on(path, lambda a=amax: quantize(x, E4M3, amax=a))
    with pytest.raises(ValueError, match="finite and >= 0"):
        _on(path, lambda: quantize(x, E4M3, PerRow(), amax=torch.full((32, 1), -2.0)))
    q = _on(path, lambda: quantize(x, E4M3, amax=1.0))  # a stale amax that clips: said by the metric
    assert overflow_fraction(x, q) > 0.25  # (|x| > 1 for ~32% of a normal sample)
    nan = _on(path, lambda: quantize(x, E4M3, amax=math.nan))  # NaN: allowed, and it propagates
    assert torch.isnan(nan.dequantize()).all()


@pytest.mark.parametrize("fmt,largest", [(E4M3, 17), (E5M2, 31), (E2M1, 3)], ids=lambda v: getattr(v, "name", v))
def test_a_margin_beyond_the_formats_range_is_refused(fmt, largest):
    """A margin beyond the format's range is refused: margin=130 gives all zeros and margin=200 all NaN,
    silently."""
    x = torch.randn(16, 32)
    quantize(x, fmt, margin=largest)  # the largest that leaves the block max representable
    for margin in (largest + 1, 130, 200):
        with pytest.raises(ValueError, match=f"use a margin of 0 to {largest} for {fmt.name}"):
            quantize(x, fmt, margin=margin)


@BOTH_PATHS
def test_huge_margins_or_amaxes_never_make_infinite_scales(path):
    """The exact rule's inverse stays within float32's normal range: no inf scale, no NaN values."""
    x = torch.tensor([[3e38, -1.0, 0.0, 2e-38]])
    for fmt, margin in ((E4M3, 17), (E5M2, 31)):
        q = _on(path, lambda f=fmt, m=margin: quantize(x, f, margin=m))
        assert torch.isfinite(q.scale).all() and torch.isfinite(q.dequantize()).all()


def test_an_amax_history_propagates_nan_whatever_its_place():
    """A NaN anywhere in the history makes its amax NaN: Python's max() keeps a NaN that comes first and
    drops one that comes later (order-dependent)."""
    for amaxes in ([1.0, math.nan, 2.0], [math.nan, 1.0, 2.0], [1.0, 2.0, math.nan]):
        hist = AmaxHistory(8, "max")
        for a in amaxes:
            hist.record(a)
        assert math.isnan(hist.amax()), amaxes
    recent = AmaxHistory(8, "most_recent")
    for a in (math.nan, 3.0):
        recent.record(a)
    assert recent.amax() == 3.0  # most_recent: NaN on the step after it only
    assert [math.isnan(v) for v in AmaxHistory(2).replay([1.0, math.nan, 2.0, 3.0, 4.0])] == [
        False, False, True, True, False]  # it ages out after `length` steps
    with pytest.raises(ValueError, match="finite and >= 0"):
        AmaxHistory().record(-1.0)
    with pytest.raises(ValueError, match="nan_to_num"):
        AmaxHistory().record(torch.tensor([1.0, math.inf]))


@BOTH_PATHS
def test_nvfp4_of_a_tiny_tensor_has_no_nan_blocks(path):
    """NVFP4 of a tensor whose amax is below ~8e-36 has no NaN blocks: there 1 / tensor_scale overflows
    and, unguarded, makes every all-zero block NaN."""
    x = torch.zeros(4, 64)
    x[0, :16] = torch.linspace(-3e-38, 3e-38, 16)
    x[1, 16:32] = 1e-40
    for scale in (1.0, 1e-3, 1e3):
        q = _on(path, lambda s=scale: quantize(x * s, E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True))
        deq = q.dequantize()
        assert torch.isfinite(deq).all() and torch.isfinite(q.scale).all()
        assert deq[2:].eq(0).all()  # zero blocks stay zero
        # the largest survives down to amax ~2688 * 2^-121 / 8 (below, the tensor scale is held at 2^-121)
        assert (deq[0].abs().max() > 0) == (scale >= 1)


@BOTH_PATHS
def test_a_float64_beyond_float32_is_not_called_infinite(path):
    """A float64 1e300 is reported as beyond float32's range, not as "x has 1 infinite value" (what it
    becomes once converted)."""
    x = torch.tensor([[1e300, 1.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"1 value\(s\) beyond float32's range") as err:
        _on(path, lambda: quantize(x))
    assert "infinite" not in str(err.value)
    with pytest.raises(ValueError, match=r"1 infinite value\(s\)"):  # a real infinity still says so
        _on(path, lambda: quantize(torch.tensor([[math.inf, 1.0]], dtype=torch.float64)))


# ---- 4: unclear errors and surprising dtypes ---------------------------------------------------------------------


def test_meta_tensors_get_a_clear_error():
    """A meta tensor gets a clear error, not torch's "Tensor.item() cannot be called on meta tensors"."""
    x = torch.empty(4, 4, device="meta")
    for fn in (lambda: quantize(x), lambda: fp8lab.cast(x, E4M3)):
        with pytest.raises(ValueError, match=r"meta tensor .* no values"):
            fn()


def test_quantize_detaches_and_says_so():
    x = torch.randn(8, 8, requires_grad=True)
    q = quantize(x)
    assert not q.data.requires_grad and not q.dequantize().requires_grad
    assert "detached" in fp8lab.quantize.__doc__


def test_fp8_linear_keeps_the_input_dtype_and_refuses_integers():
    """FP8Linear returns the input's dtype (a float16 input gives float16, not float32) and refuses an
    int64 input."""
    lin = fp8lab.nn.FP8Linear(32, 16, recipe="tensorwise", backend="emulated")
    x = torch.randn(4, 32)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        y = lin(x.to(dtype))
        assert y.dtype == dtype
    y = lin(x.half().requires_grad_())
    y.float().sum().backward()  # gradients flow back in the parameters' dtype
    assert lin.weight.grad.dtype == torch.float32 and lin.bias.grad.dtype == torch.float32
    with pytest.raises(TypeError, match=r"floating-point input .* torch\.int64"):
        lin(torch.ones(4, 32, dtype=torch.int64))


def test_convert_none_and_train_with_one_recipe_name():
    """convert(None) raises a TypeError that says what convert takes (not an AttributeError), and
    train(recipes="tensorwise") runs that one recipe (not "unknown recipe 't'")."""
    with pytest.raises(TypeError, match=r"convert takes a torch\.nn\.Module, got NoneType"):
        fp8lab.nn.convert(None, "tensorwise")
    res = fp8lab.training.train.train(recipes="tensorwise", steps=2, batch=8, progress=False, monitor_every=None)
    assert set(res.history["run"]) == {"tensorwise"}


# ---- 13: what the mutation check found the suite missing -------------------------------------------------------


@BOTH_PATHS
def test_the_cast_saturates_a_product_that_overflows_float32(path):
    """Survivor: the C cast turning an overflowing x * inverse (1e38 * 448 = inf) into NaN, not 448."""
    q = _on(path, lambda: quantize(torch.tensor([[1e38, 1.0]]), E4M3, PerTensor(), amax=1.0))
    assert q.codes().tolist() == [[0x7E, 0x7E]]  # 448, 448 before the scale


def test_replay_scales_each_step_with_the_past_only():
    """Survivor: replay counting the current amax (notebook 03's spike then never clips)."""
    assert AmaxHistory(4, "max").replay([1, 1, 50, 1]) == [1, 1, 1, 50]


@pytest.mark.parametrize("emulation", ["fast", "reference"])
def test_each_operand_is_scaled_with_its_own_block_width(emulation):
    """Survivor: the emulated GEMM indexing b's block scales with a's block width."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(8, 64, generator=g), torch.randn(6, 64, generator=g)
    b[:, 16:32] *= 1000  # one block of b (1x16) far larger than the rest
    a_q = quantize(a, E4M3, PerBlock(1, 32))
    b_q = quantize(b, E4M3, PerBlock(1, 16))
    got = emulated_mm(a_q, b_q, emulation=emulation).double()
    want = a_q.dequantize().double() @ b_q.dequantize().double().t()
    bound = 2.0**-20 * (a_q.dequantize().double().abs() @ b_q.dequantize().double().abs().t())
    assert ((got - want).abs() <= bound).all()


@pytest.mark.parametrize("pair", [(PerTensor(), PerBlock(1, 32)), (PerBlock(1, 32), PerRow()),
                                  (PerRow(), PerBlock(128, 128)), (PerBlock(32, 32), PerTensor())],
                         ids=lambda p: f"{p[0].label} @ {p[1].label}")
def test_mixed_granularities_multiply_like_their_dequantized_values(pair):
    """One operand's scales folded into its values, the other's applied to the output (mutation: the
    fast path dropping a per-row or per-tensor scale of one side)."""
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(40, 160, generator=g) * 3, torch.randn(24, 160, generator=g) / 7
    a_q, b_q = quantize(a, E4M3, pair[0]), quantize(b, E5M2, pair[1], "rceil")
    want = a_q.dequantize().double() @ b_q.dequantize().double().t()
    bound = 2.0**-20 * (a_q.dequantize().double().abs() @ b_q.dequantize().double().abs().t())
    for emulation in ("fast", "reference"):
        assert ((emulated_mm(a_q, b_q, emulation=emulation).double() - want).abs() <= bound).all(), emulation


def test_the_accumulator_promotes_the_last_partial_interval():
    """Survivor: the accumulation model dropping the last partial promotion interval (160 ones -> 128)."""
    ones = torch.ones(1, 160)
    assert AccumulatorModel(promote_every=128).accumulate(ones).item() == 160
    assert AccumulatorModel(promote_every=None).accumulate(ones).item() == 160


def test_delayed_fp8_linear_scales_with_the_history_and_records_this_steps_amax():
    """Survivors: FP8Linear's delayed recipe using the current amax, and its history recording the
    amax it used instead of this step's: 5 steps, a 10x spike at step 3."""
    torch.manual_seed(0)
    monitor = fp8lab.nn.Monitor()
    lin = fp8lab.nn.FP8Linear(64, 32, recipe="delayed", backend="emulated", monitor=monitor, name="fc")
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(16, 64, generator=g) * (10 if step == 3 else 1) for step in range(5)]
    own = [float(x.abs().max()) for x in xs]
    for step, x in enumerate(xs):
        monitor.step = step
        lin(x).sum().backward()
        fp8lab.nn.end_step(lin)  # (no optimizer here: the step ends by hand)
    used = monitor.frame().query("gemm == 'fprop' and role == 'input'")["amax"].tolist()
    assert used == pytest.approx([own[0], *[max(own[:t]) for t in range(1, 5)]], rel=0)
    assert lin.histories["input"].history == pytest.approx(own, rel=0)
    fprop = monitor.frame().query("gemm == 'fprop' and role == 'input'")["overflow"].tolist()
    assert fprop[3] > 0.3 and fprop[4] == 0  # the spike clips on its step, and only then


def test_check_scale_refuses_the_reciprocal():
    """Survivor: check_scale refused the reciprocal only by accident (a division by zero)."""
    from fp8lab.lab.exercises import check_scale

    def reciprocal(x):
        amax = x.abs().max().item()
        return 448 / amax if amax > 0 else 1.0

    fb = check_scale(reciprocal)
    assert not fb.ok and "reciprocal" in fb.message


# ---- tensors whose memory is not their values: the C code reads memory, so it must see values ---------------------


def _views(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """x's values behind memory that does not hold them as a plain row-major float32 array."""
    buffer = bytearray(x.numel() * 4 + 1)
    misaligned = torch.frombuffer(buffer, dtype=torch.float32, offset=1, count=x.numel()).view(x.shape)
    misaligned.copy_(x)
    return {"pending negation": torch._neg_view(-x), "misaligned": misaligned,
            "conjugate's imaginary part": torch.complex(torch.zeros_like(x), -x).conj().imag}


@BOTH_PATHS
def test_views_the_c_code_cannot_read_as_memory_give_the_values(path):
    """Every input the kernel reads is made readable first (resolved, contiguous, aligned): read as
    memory, a view with a pending negation (torch._neg_view, x.conj().imag) quantizes with the wrong sign
    on the C path (4.0 instead of -4.0), and an amax given as such a view scales with the wrong sign."""
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(21)) * 3
    x[0, 0] = -4.0
    with kernels.disabled():
        want = quantize(x, E4M3, PerBlock(1, 32)).dequantize()
    for name, view in _views(x).items():
        assert torch.equal(view, x), name
        got = _on(path, lambda v=view: quantize(v, E4M3, PerBlock(1, 32)).dequantize())
        assert torch.equal(got, want), name
    amax = torch._neg_view(torch.tensor(-8.0))  # the value 8.0, stored as -8.0
    q = _on(path, lambda: quantize(x, E4M3, amax=amax))
    assert q.scale.item() == pytest.approx(8.0 / 448, rel=1e-6)
    sa, sb = torch._neg_view(-torch.rand(8) - 1), torch.rand(16) + 1
    out = torch.randn(8, 16)
    with kernels.disabled():
        twin = emulated_mm(quantize(x, E4M3, PerRow()), quantize(torch.randn(16, 64), E4M3, PerRow()))
    if path == "kernels" and kernels.engine().kernels:
        assert torch.equal(kernels_gemm.scale_outer_(out.clone(), sa, sb), out * (sa[:, None] * sb[None, :]))
        part = torch._neg_view(-torch.randn(8, 16))  # a pending negation in the partial sums too
        want = out + part * (sa[:, None] * sb[None, :])
        assert torch.equal(kernels_gemm.scale_outer_(out.clone(), sa, sb, part), want)
    assert twin.shape == (8, 16)


FAKE_AND_ZERO = """
import torch, fp8lab
from fp8lab.numerics import kernels
assert kernels.status()[0], kernels.status()[1]
z = torch._efficientzerotensor((4, 64))
q = fp8lab.quantize(z, granularity="1x32")
assert torch.equal(q.dequantize(), torch.zeros(4, 64))
from torch._subclasses.fake_tensor import FakeTensorMode
try:
    with FakeTensorMode():
        fp8lab.quantize(torch.randn(4, 64), granularity="1x32")
except Exception as err:  # no values to quantize: an exception, never the C code reading nothing
    print(type(err).__name__)
print("DONE")
"""


@needs_kernels
def test_tensors_without_memory_of_their_own_run_in_torch():
    """A zero tensor (torch._efficientzerotensor, which autograd makes) and a FakeTensor (what
    torch.compile traces with) run in torch: handed to the C code, they make it read address 0
    (SIGSEGV). In a process of its own."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # (a plain process, also under tools/asan.py)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", FAKE_AND_ZERO], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.rstrip().endswith("DONE")


def test_layouts_without_values_in_memory_get_a_clear_error():
    for x in (torch.randn(4, 64).to_sparse(), torch.randn(4, 64).to_mkldnn()):
        with pytest.raises(ValueError, match=r"dense \(strided\) tensor.*to_dense"):
            quantize(x)


# ---- a NaN must not hide an infinity ---------------------------------------------------------------------------


@BOTH_PATHS
@pytest.mark.parametrize("granularity", [PerTensor(), PerRow(), PerBlock(1, 32)], ids=lambda g: g.label)
def test_an_infinity_beside_a_nan_is_refused(path, granularity):
    """An infinity beside a NaN in the same block raises as an infinity alone does: the NaN makes the
    block's amax NaN, which would let the infinity through (quantized as NaN)."""
    x = torch.randn(4, 64)
    x[1, 3], x[1, 5] = math.nan, math.inf
    with pytest.raises(ValueError, match=r"1 infinite value\(s\)"):
        _on(path, lambda: quantize(x, E4M3, granularity))
    with pytest.raises(ValueError, match=r"1 infinite value\(s\)"):
        _on(path, lambda: quantize(x, E4M3, granularity, amax=torch.ones(granularity.scale_shape((4, 64)))))
    x[1, 5] = 1.0  # the NaN alone still propagates to its block
    assert torch.isnan(_on(path, lambda: quantize(x, E4M3, granularity)).dequantize()).any()
    with pytest.raises(ValueError, match="infinite"):
        AmaxHistory().record(torch.tensor([math.nan, -math.inf]))


# ---- memory: no full-size float32 or int64 temporaries of a GEMM operand -----------------------------------------


class _Largest(torch.utils._python_dispatch.TorchDispatchMode):
    """Records, per dtype, the most elements of a tensor any op allocates while active (views of
    memory that already exists are not allocations)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        known = {t.untyped_storage().data_ptr() for t in inputs}
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in known:
                self.largest[t.dtype] = max(self.largest.get(t.dtype, 0), t.numel())
        return out


def test_quantizing_a_bf16_operand_makes_no_full_size_float32_copy():
    """The torch code (what runs on a GPU) widens a bf16 operand to float32 a bounded chunk at a time:
    a full-size float32 copy (and more float32 temporaries of its size) before the cast takes 1-2 GB
    for one 8192^2 operand on a GPU."""
    x = torch.randn(1024, 1024).to(torch.bfloat16)
    for granularity in (PerTensor(), PerBlock(1, 128), PerBlock(128, 128)):
        with kernels.disabled(), _Largest() as seen:
            q = quantize(x, E4M3, granularity)
        with kernels.disabled():
            want = quantize(x.float(), E4M3, granularity)
        assert torch.equal(q.data.view(torch.uint8), want.data.view(torch.uint8)) and torch.equal(q.scale, want.scale)
        assert seen.largest.get(torch.float32, 0) <= CHUNK_ELEMENTS, granularity  # (CPU's chunk)


def test_e2m1_codes_make_no_int64_index_per_element():
    """QuantizedTensor.codes() of E2M1 data builds no int64 index tensor: at 8 bytes per element, on
    every NVFP4 call, that is ~0.5 GB for one 8192^2 operand."""
    from fp8lab.numerics import quantize as quantize_module

    q = quantize(torch.randn(512, 1024), E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True)
    with _Largest() as seen:
        codes = q.codes()
    assert seen.largest.get(torch.int64, 0) == 0
    assert seen.largest.get(torch.int32, 0) <= quantize_module._LOOKUP_CHUNK
    table = quantize_module._e2m1_codes(torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]))
    assert torch.equal(codes, quantize_module._e2m1_codes(q.values())) and table.tolist() == list(range(8))
