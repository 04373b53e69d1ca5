"""Fused CPU kernels for quantization: the calls into _kernels.c, and the one switch.

Public: engine() (the one switch: C kernels or torch code, decided once per process), disabled() (a context manager:
the torch code in this thread), enabled(), accepts(tensor), status() -> (bool, reason), quantize(x2d, block,
parameters(args), amax) (quantize_with's torch code in one call), the twins amax_per_block, scale_from_amax and cast
(the torch definitions' signatures, by the kernels), hadamard(transform, x) (RandomHadamard.apply's twin),
uniform_draws(shape, generator) where draws_like_torch() (formats.uniform_draws' twin: torch.rand's numbers),
opaque_to_compile (how each entry point meets torch.compile), kernel_times() (the seconds each C function runs,
tallied while it is open); for the GEMM's kernels beside it (kernels_gemm.py): call(name, *args), readable, resolved,
own_memory, pointer, empty_float32, and torch_runs_alone(t) (where torch's own elementwise op stays on the calling
thread: TORCH_GRAIN).

quantize.py and gemm define the numbers in torch; on the CPU they call these kernels, which
compute the same bits in one pass over memory instead of five passes with a fresh temporary
each (tests/numerics/test_kernels.py checks every result against the torch code). Formats and rules
reach C as data, in one parameter block (_Params) filled from FloatFormat and SCALE_RULES;
every call checks the sizes it passes, and the C side checks them again. C reads raw memory, so
a tensor reaches it only as accepts() allows (a plain strided float32 CPU tensor with memory of
its own: no fake, functional or zero tensor, no tensor subclass) and as readable() makes it (no
pending negation or conjugation, contiguous, 4-byte aligned); anything else runs in torch. What C writes
goes into CPU buffers made here (empty_float32, _CODES), whatever torch.set_default_dtype and set_default_device
say. Each entry point is opaque to torch.compile (opaque_to_compile: torch.compiler.disable where traced): a
compiled function calls it with real tensors. kernels_build.py builds, caches and loads the library (status() says how).
Tensors beyond fp8lab.threads.parallel_min's count (by OpenMP's wait policy) are split by rows (the same bits for
any split) over the threads of torch's own OpenMP runtime where the library shares it (as many as
torch.get_num_threads(), which fp8lab.threads sizes to the CPU quota; each calling thread is given torch's count
before its first call), else over POSIX threads for tensors of millions of elements.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import torch

from fp8lab import threads
from fp8lab.numerics import kernels_build
from fp8lab.numerics.formats import E4M3, E5M2, FloatFormat, check_float, get_format
from fp8lab.numerics.hadamard import RandomHadamard
from fp8lab.numerics.scaling import SCALE_RULES, Granularity, Scales, TensorScaling, as_2d

__all__ = ["EAGER_VALUES", "TORCH_GRAIN", "Engine", "accepts", "amax_per_block", "call", "cast", "disabled",
           "draws_like_torch", "empty_float32", "enabled", "engine", "hadamard", "kernel_times", "opaque_to_compile",
           "own_memory", "parameters", "pointer", "quantize", "readable", "resolved", "scale_from_amax", "state_label",
           "status", "torch_runs_alone", "uniform_draws"]

STORAGE = {torch.float8_e4m3fn: E4M3, torch.float8_e5m2: E5M2}  # the code dtypes, and the formats of their bytes
# a parameter block's code dtype, by its storage format's mantissa bits (3: E4M3 bytes, 2: E5M2 bytes)
STORAGE_OF = {fmt.mantissa_bits: dtype for dtype, fmt in STORAGE.items()}
_local = threading.local()


@lru_cache(maxsize=1)
def _load() -> tuple[ctypes.CDLL | None, str]:
    """kernels_build.load()'s library with its functions' argument types bound, and the reason."""
    lib, reason = kernels_build.load()
    return (None if lib is None else _bind(lib)), reason


def opaque_to_compile(fn: Callable) -> Callable:
    """fn, opaque to torch.compile: traced, it is torch.compiler.disable(fn) (a compiled function calls it with
    real tensors); run eagerly, fn itself, without that wrapper's cost (microseconds a call, dozens of calls a
    training step)."""
    disabled = torch.compiler.disable(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return disabled(*args, **kwargs) if torch.compiler.is_compiling() else fn(*args, **kwargs)

    return call


# ---- the parameter block: formats and rules as data (_kernels.c: fp8lab_format, fp8lab_params) ------------


class _Format(ctypes.Structure):
    """A FloatFormat as _kernels.c reads it (fp8lab_format)."""

    _fields_ = [("bits", ctypes.c_int32), ("mantissa_bits", ctypes.c_int32), ("min_exponent", ctypes.c_int32),
                ("max_value", ctypes.c_float), ("nan_code", ctypes.c_uint32)]

    @classmethod
    def of(cls, fmt: FloatFormat) -> _Format:
        return cls(fmt.bits, fmt.mantissa_bits, round(math.log2(fmt.min_normal)), fmt.max_value, fmt.nan_code or 0)


_p, _f32p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)


class _Params(ctypes.Structure):
    """One call's parameters (fp8lab_params in _kernels.c: same fields, same order; the C side
    compares `size` with its own sizeof before reading anything else)."""

    _fields_ = [
        ("size", ctypes.c_int64), ("M", ctypes.c_int64), ("K", ctypes.c_int64), ("r", ctypes.c_int64),
        ("c", ctypes.c_int64), ("blocks", ctypes.c_int64),
        ("element", _Format), ("storage", _Format), ("scale_format", _Format),
        ("rule", ctypes.c_int32), ("round_scales", ctypes.c_int32), ("two_level", ctypes.c_int32),
        ("exponent_min", ctypes.c_int32), ("exponent_max", ctypes.c_int32), ("max_eff", ctypes.c_double),
        ("min_inverse", ctypes.c_float), ("min_tensor_scale", ctypes.c_float), ("scale_floor", ctypes.c_float),
        ("fold", ctypes.c_int32), ("count", ctypes.c_int32), ("clip_limit", ctypes.c_double),
        ("x", _p), ("given_amax", _p), ("amax", _p), ("scale", _p), ("inverse", _p), ("codes", _p), ("values", _p),
        ("tensor_scale", ctypes.c_float), ("scale_range", ctypes.c_float * 2), ("counts", ctypes.c_int64 * 2),
        ("draws", _p),
    ]


_REFUSED = {
    -1: "the parameter block's layout differs between fp8lab/kernels.py and _kernels.c",
    -2: "inconsistent shapes (x[M, K], blocks r x c within it, the number of blocks)",
    -3: "a format the kernels cannot take",
    -4: "an unknown scale rule or exponent range",
}


def parameters(args: TensorScaling) -> bytes | None:
    """The parameter block for quantizing with these scale settings, as bytes (immutable,
    copyable): the element format, the format its codes are
    stored in, the scale rule and its constants, all from FloatFormat and SCALE_RULES. None
    where the kernels do not store the format (their codes are E4M3 or E5M2 bytes)."""
    fmt = args.fmt
    if fmt.storage_dtype not in STORAGE or not (fmt.signed and fmt.has_subnormals):
        return None
    storage = STORAGE[fmt.storage_dtype]
    e4m3 = args.scale_fmt if args.scale_fmt == E4M3 else None
    lo, hi = args.exponent_range
    p = _Params(size=ctypes.sizeof(_Params), element=_Format.of(fmt), storage=_Format.of(storage),
                rule=SCALE_RULES.index(args.scale_rule), round_scales=e4m3 is not None, two_level=args.two_level,
                exponent_min=lo, exponent_max=hi, max_eff=args.max_eff, min_inverse=args.min_inverse,
                min_tensor_scale=args.min_tensor_scale, scale_floor=args.floor, clip_limit=fmt.clip_threshold)
    if e4m3 is not None:
        p.scale_format = _Format.of(e4m3)
    return bytes(p)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The C functions' argument and result types, set on a loaded library."""
    params = ctypes.POINTER(_Params)
    signatures = {
        "fp8lab_quantize": ([params], ctypes.c_int),
        "fp8lab_block_amax": ([params], ctypes.c_int),
        "fp8lab_scales": ([params], ctypes.c_int),
        "fp8lab_cast": ([params], ctypes.c_int),
        "fp8lab_rule_names": ([], ctypes.c_char_p),
        "fp8lab_set_threads": ([ctypes.c_int], None),
        "fp8lab_set_parallel_min": ([ctypes.c_int64], None),
        "fp8lab_parallel_min": ([], ctypes.c_int64),
        "fp8lab_openmp": ([], ctypes.c_int),
        # pointers go in as ints (tensor.data_ptr()): the cheapest call ctypes has
        "fp8lab_scale_outer": ([_p, _p, ctypes.c_int64, ctypes.c_int64, _p, ctypes.c_int64, _p, ctypes.c_int64],
                               None),
        "fp8lab_hadamard": ([_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _p, ctypes.c_int64,
                             ctypes.c_float, _p], ctypes.c_int),
        "fp8lab_widen": ([_p, ctypes.c_int64, _p, _p], None),
        "fp8lab_add_row": ([_p, ctypes.c_int64, ctypes.c_int64, _p], None),
        "fp8lab_uniform": ([_p, ctypes.c_int64, ctypes.c_int64, _p], ctypes.c_int),
        "fp8lab_segment_mm": ([_p, _p, ctypes.c_int64, ctypes.c_int64, _p, ctypes.c_int64, ctypes.c_int64,
                               ctypes.c_int64, ctypes.c_int64, _p, _p, _p], ctypes.c_int),
    }
    for name, (args, res) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    if lib.fp8lab_openmp():  # (the fewest elements it splits over OpenMP's threads, by their wait policy)
        lib.fp8lab_set_parallel_min(threads.parallel_min())
    return lib


def status() -> tuple[bool, str]:
    """(are the fused CPU kernels in use, a one-line reason)."""
    lib, reason = _load()
    return lib is not None, reason


def state_label() -> str:
    """"fused CPU kernels on" or "... off": what a measurement's machine line says of them."""
    return "fused CPU kernels on" if status()[0] else "fused CPU kernels off"


# ---- the one switch --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    """What computes quantization (and an emulated GEMM's output scales and bias) on CPU tensors: fp8lab's C kernels,
    or the torch code that defines every number. Decided once per process (engine()), said by `python -m fp8lab
    doctor`, `bench` and notebook 00. The two give the same bits (tests/numerics/test_kernels.py)."""

    kernels: bool
    reason: str

    def __str__(self) -> str:
        return self.reason


_TORCH = Engine(False, "torch code (fp8lab.numerics.kernels.disabled() in this thread)")


@lru_cache(maxsize=1)
def _process_engine() -> Engine:
    lib, reason = _load()
    if lib is None:
        return Engine(False, reason)
    names = tuple(lib.fp8lab_rule_names().decode().split())
    if names != SCALE_RULES:  # the C enum and SCALE_RULES must name the same rules in the same order
        return Engine(False, f"_kernels.c's scale rules {names} are not SCALE_RULES {SCALE_RULES}: torch code")
    return Engine(True, reason)


def engine() -> Engine:
    """The engine of this process (decided once), or the torch code inside `with disabled():`."""
    return _TORCH if getattr(_local, "off", False) else _process_engine()


@contextlib.contextmanager
def disabled():
    """Run the torch code in this thread (tests compare the two; a learner can time both)."""
    old = getattr(_local, "off", False)
    _local.off = True
    try:
        yield
    finally:
        _local.off = old


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # the tensor types whose memory is their values


def accepts(t: torch.Tensor) -> bool:
    """Whether the C code may read `t`'s memory: a plain strided float32 CPU tensor (or parameter) with memory of its
    own. Other tensor subclasses (FakeTensor and the like), functorch and functional wrappers, zero tensors and meta
    tensors have no such memory, or memory that does not hold their values: they run in torch. (A pending negation
    or conjugation, a layout that is not contiguous and an address that is not 4-byte aligned are made readable by a
    copy: readable.)"""
    return t.dtype == torch.float32 and own_memory(t)


def own_memory(t: torch.Tensor) -> bool:
    """Whether `t`'s memory holds its values for the C code to read, whatever its dtype: a plain strided CPU tensor
    (or parameter), not nested, not a zero tensor, not wrapped, with storage to point at (or no elements)."""
    if type(t) not in _PLAIN or t.layout != torch.strided or not t.is_cpu:
        return False
    if t.is_nested or t._is_zerotensor() or _wrapped(t):  # (a CPU tensor is not a meta one)
        return False
    try:
        return t.numel() == 0 or t.data_ptr() != 0
    except RuntimeError:  # no storage to point at
        return False


_FUNCTORCH = getattr(torch._C, "_functorch", None)


def _wrapped(t: torch.Tensor) -> bool:
    """A functorch (vmap, grad) or functionalization wrapper: its data pointer is not its values'."""
    if _FUNCTORCH is not None and _FUNCTORCH.is_functorch_wrapped_tensor(t):
        return True
    return bool(torch._is_functional_tensor(t))


def enabled(*tensors: torch.Tensor) -> bool:
    """Whether the kernels apply: the engine's choice here, and tensors the C code may read (accepts)."""
    return engine().kernels and all(accepts(t) for t in tensors)


# torch runs an elementwise op on the calling thread below this many elements (ATen's at::internal::GRAIN_SIZE)
TORCH_GRAIN = 32768


def torch_runs_alone(t: torch.Tensor) -> bool:
    """Whether torch runs an elementwise op over t on the calling thread: one intra-op thread, or fewer elements
    than its grain (TORCH_GRAIN). There torch's own op costs a microsecond or two beside a kernel call's 7-20 (its
    checks in Python), so the kernels' twins that exist to keep torch's threads asleep (a GEMM's one-value output
    scale, a bias) leave that work to torch: the same bits."""
    return t.numel() < TORCH_GRAIN or torch.get_num_threads() == 1


# ---- the calls: each checks what it passes, and the C side checks it again --------------------------------------


def pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


# Empty CPU tensors of each dtype C writes: the buffers for C are their new_empty, which keeps their dtype and device
# whatever torch.set_default_dtype and set_default_device say (a float16 default gave half the bytes C writes, a
# float64 one values read as other numbers, a meta or CUDA one memory C cannot write), as fast as torch.empty(m, n)
_FLOAT32 = torch.empty(0, dtype=torch.float32, device="cpu")
_CODES = {dtype: torch.empty(0, dtype=dtype, device="cpu") for dtype in STORAGE}


def empty_float32(*size: int) -> torch.Tensor:
    """An uninitialized float32 CPU tensor of this size for C to write, whatever torch's defaults."""
    return _FLOAT32.new_empty(size)


def _float(value: float) -> torch.Tensor:
    """A float32 0-d CPU tensor of a float the C code wrote (its float32 value exactly), whatever the defaults."""
    return torch.full((), value, dtype=torch.float32, device="cpu")


def readable(t: torch.Tensor, what: str) -> torch.Tensor:
    """t as C reads it: its bits are its values (a pending negation or conjugation resolved), row-major
    contiguous and 4-byte aligned (copied where not), after accepts() has allowed it."""
    if not accepts(t):
        raise ValueError(f"fp8lab.numerics.kernels takes plain float32 CPU tensors with memory of their own ({what}): "
                         f"got a {type(t).__name__} of {t.dtype} on {t.device}; run it under kernels.disabled()")
    t = t.resolve_conj().resolve_neg().contiguous()
    return t if t.data_ptr() % 4 == 0 else t.clone()


def resolved(t: torch.Tensor, what: str) -> torch.Tensor:
    """A 2-D t as a C loop that takes strides reads it: as readable makes it, but in t's own layout (a transposed
    view is read as it lies); readable's copy (or error) for anything else."""
    plain = accepts(t) and t.dim() == 2 and not (t.is_neg() or t.is_conj()) and t.data_ptr() % 4 == 0
    return t if plain else readable(t, what)


def _input(x2d: torch.Tensor) -> torch.Tensor:
    if not (isinstance(x2d, torch.Tensor) and x2d.dim() == 2):
        raise ValueError("fp8lab.numerics.kernels takes a 2-D float32 CPU tensor x[M, K]")
    return readable(x2d, "x")


def _block_params(template: bytes, x2d: torch.Tensor, block: tuple[int, int]) -> tuple[_Params, torch.Tensor]:
    """template (formats and rule) with x[M, K] and its r x c blocks, checked: 1 <= r <= M, 1 <= c <= K;
    and x as the parameter block points at it (keep it alive for the call)."""
    x2d = _input(x2d)
    m, k = x2d.shape
    r, c = block
    if not (isinstance(r, int) and isinstance(c, int) and 1 <= r <= max(m, 1) and 1 <= c <= max(k, 1)):
        raise ValueError(f"blocks must lie within x[{m}, {k}]: got {r} x {c} (clamp them: Granularity.block_shape)")
    p = _Params.from_buffer_copy(template)
    p.M, p.K, p.r, p.c, p.blocks, p.x = m, k, r, c, -(-m // r) * -(-k // c), x2d.data_ptr()
    return p, x2d


def _torch_threads_here() -> None:
    """Before this thread's first C call: torch.get_num_threads() gives its OpenMP torch's thread count (OpenMP keeps
    it per thread, and a thread that has run no torch operation has OpenMP's process default, OMP_NUM_THREADS or the
    CPUs, not torch.set_num_threads's: fp8lab.threads', or the user's)."""
    if not getattr(_local, "threads_set", False):
        torch.get_num_threads()
        _local.threads_set = True


def _run(name: str, p: _Params) -> int:
    return call(name, ctypes.byref(p))


def call(name: str, *args) -> int | None:
    """The library's function `name` called with args on this thread (given torch's thread count first): its
    answer (None from a function that answers nothing); RuntimeError naming its reason where it refused the call."""
    _torch_threads_here()
    function = getattr(_load()[0], name)
    if _tally is None:
        answer = function(*args)
    else:  # (kernel_times is open)
        start = time.perf_counter()
        answer = function(*args)
        _tally[name] += time.perf_counter() - start
    return answer if answer is None else _answered(name, answer)


_tally: Counter | None = None  # kernel_times' seconds by function name, while it is open


@contextlib.contextmanager
def kernel_times() -> Iterator[Counter]:
    """Inside, the seconds each C function runs (every call's wall time, whichever thread makes it) add up in the
    Counter it yields, under the function's name: how much of a step is the kernels' own work (`bench train
    --parts`). One at a time: RuntimeError inside another."""
    global _tally
    if _tally is not None:
        raise RuntimeError("kernel_times is already open: one tally at a time")
    _tally = tally = Counter()
    try:
        yield tally
    finally:
        _tally = None


def _answered(name: str, code: int) -> int:
    """A kernel's answer; RuntimeError naming its reason where it refused the call (a negative code)."""
    if code < 0:
        raise RuntimeError(f"fp8lab kernel {name} refused the call: {_REFUSED.get(code, code)}")
    return code


def _per_block(p: _Params, t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    if not (t.dtype == torch.float32 and t.device.type == "cpu" and t.numel() == p.blocks):
        raise ValueError(f"expected {p.blocks} float32 values, one per block, got {t.numel()} {t.dtype}")
    return readable(t, "amax")


_INFINITE_AMAX, _NAN_AMAX = 1, 2  # fp8lab_quantize's answers beside OK (0): x holds an infinity, a NaN


# values (float32) are written alongside the codes up to this size, where a GEMM will soon
# want them and writing them costs little; beyond it (16M elements are 64 MB of fresh
# pages) QuantizedTensor.values() widens the codes when asked
EAGER_VALUES = 1 << 22


class Fused(NamedTuple):
    """What one quantize call returns: codes [M, K] (storage dtype); values [M, K] float32 (times
    their block scale if folded; None beyond EAGER_VALUES elements); scale, and amax (x's own block
    amaxes, also where the scales came from given ones) [ceil(M/r), ceil(K/c)]; tensor_scale (0-d, two-level,
    else None); scale_range (smallest, largest scale); counts (clipped, flushed) or None; nan:
    whether one of x's own block amaxes is NaN (a block holds a NaN)."""

    codes: torch.Tensor
    values: torch.Tensor | None
    scale: torch.Tensor
    amax: torch.Tensor
    tensor_scale: torch.Tensor | None
    scale_range: tuple[float, float]
    counts: tuple[int, int] | None
    nan: bool


@opaque_to_compile
def quantize(x2d: torch.Tensor, block: tuple[int, int], template: bytes, amax: torch.Tensor | None = None, *,
             fold: bool = False, count: bool = False, values: bool | None = None,
             draws: torch.Tensor | None = None) -> Fused | None:
    """quantize_with's torch code in one call (template: parameters(...) for its settings): x's
    block amaxes, scales from them (or from `amax`, one per block), the cast, the scale range,
    and with count=True the clipped and flushed counts. values: write the float32 values (folded
    if `fold`) in the same pass: True always (a GEMM operand, which reads them next), False
    never, None up to EAGER_VALUES elements. draws: None (round to nearest) or [M, K] uniform
    draws (formats.uniform_draws) for stochastic rounding (formats.round_stochastic's twin). None
    if x holds an infinity (the caller explains)."""
    p, x2d = _block_params(template, x2d, block)
    mb, kb = -(-p.M // p.r), -(-p.K // p.c)
    own, scale, inverse = _FLOAT32.new_empty(mb, kb), _FLOAT32.new_empty(mb, kb), _FLOAT32.new_empty(mb, kb)
    codes = _CODES[STORAGE_OF[p.storage.mantissa_bits]].new_empty(p.M, p.K)
    eager = p.M * p.K <= EAGER_VALUES if values is None else values
    out = _FLOAT32.new_empty(p.M, p.K) if eager else None
    given = _per_block(p, amax)
    if draws is not None:
        if tuple(draws.shape) != (p.M, p.K):
            raise ValueError(f"draws must be one per element of x[{p.M}, {p.K}], got shape {tuple(draws.shape)}")
        draws = readable(draws, "draws")
    p.given_amax, p.amax, p.scale, p.inverse = pointer(given), own.data_ptr(), scale.data_ptr(), inverse.data_ptr()
    p.codes, p.values, p.fold, p.count, p.draws = codes.data_ptr(), pointer(out), fold, count, pointer(draws)
    code = _run("fp8lab_quantize", p)
    if code == _INFINITE_AMAX:
        return None
    tensor_scale = _float(p.tensor_scale) if p.two_level else None
    return Fused(codes, out, scale, own, tensor_scale,
                 (p.scale_range[0], p.scale_range[1]), (p.counts[0], p.counts[1]) if count else None,
                 code == _NAN_AMAX)


# ---- the twins: the torch definitions' signatures, computed by the kernels (tests compare each pair) -----------


@lru_cache(maxsize=64)
def _template(fmt: FloatFormat | str, scale_rule: str = "exact", margin: int = 0,
              scale_fmt: FloatFormat | str | None = None, two_level: bool = False, scale_floor: str = "zero") -> bytes:
    p = parameters(TensorScaling(fmt, scale_rule=scale_rule, scale_fmt=scale_fmt, two_level=two_level, margin=margin,
                                 scale_floor=scale_floor))
    if p is None:
        raise ValueError(f"the kernels store e4m3, e5m2 and e2m1 codes, not {get_format(fmt).name}")
    return p


@opaque_to_compile
def amax_per_block(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """scaling.amax_per_block, by the kernel: max|x| per block, [ceil(M/rows), ceil(K/cols)] float32."""
    x2d = as_2d(x, granularity).to(torch.float32)
    if x2d.numel() == 0:
        raise ValueError("cannot scale an empty tensor")
    p, x2d = _block_params(_template("e4m3"), x2d, granularity.block_shape(tuple(x2d.shape)))
    out = _FLOAT32.new_empty(-(-p.M // p.r), -(-p.K // p.c))
    p.amax = out.data_ptr()
    _run("fp8lab_block_amax", p)
    return out


@opaque_to_compile
def scale_from_amax(amax: torch.Tensor, fmt: FloatFormat | str = "e4m3", scale_rule: str = "exact", margin: int = 0,
                    scale_fmt: FloatFormat | str | None = None, two_level: bool = False,
                    scale_floor: str = "zero") -> Scales:
    """scaling.scale_from_amax, by the kernel: Scales(scale, inverse, tensor_scale), shaped like amax."""
    a = amax.to(torch.float32)
    p, flat = _block_params(_template(fmt, scale_rule, margin, scale_fmt, two_level, scale_floor), a.reshape(1, -1),
                            (1, 1))
    scale, inverse = _FLOAT32.new_empty(a.shape), _FLOAT32.new_empty(a.shape)
    p.given_amax, p.scale, p.inverse = flat.data_ptr(), scale.data_ptr(), inverse.data_ptr()
    _run("fp8lab_scales", p)
    return Scales(scale, inverse, _float(p.tensor_scale) if p.two_level else None)


@opaque_to_compile
def cast(x: torch.Tensor, fmt: FloatFormat | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """formats.cast, by the kernel's cast (the one quantize runs), for e4m3, e5m2 and e2m1."""
    fmt = get_format(fmt)
    check_float(x)
    if dtype not in (torch.float32, fmt.storage_dtype):
        raise ValueError(f"cast returns float32 values or {fmt.name}'s storage dtype {fmt.storage_dtype}, not {dtype}")
    flat = x.to(torch.float32).reshape(1, -1)
    one = _float(1.0).reshape(1)
    p, flat = _block_params(_template(fmt), flat, (1, max(flat.shape[1], 1)))
    codes, values = _CODES[fmt.storage_dtype].new_empty(flat.shape), _FLOAT32.new_empty(flat.shape)
    p.inverse, p.codes, p.values = one.data_ptr(), codes.data_ptr(), values.data_ptr()
    if flat.numel():
        _run("fp8lab_cast", p)
    return (values if dtype == torch.float32 else codes).reshape(x.shape)


@opaque_to_compile
def hadamard(transform: RandomHadamard, x: torch.Tensor) -> torch.Tensor:
    """transform.apply(x), by the kernel: x[..., C] @ Q per block of d along the last dim (zero-padded), float32
    [..., ceil(C/d) * d], the torch code's operations in its order (the same bits). x: a float32 CPU tensor
    the C code may read (accepts), read in its own layout (x^T as a view)."""
    d = transform.size
    x2 = resolved(x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x, "x")  # (R, C), in its layout (x^T's view)
    out = _FLOAT32.new_empty(x2.shape[0], -(-x2.shape[1] // d) * d)  # (R, ceil(C/d) * d)
    signs = readable(transform.signs, "signs")
    call("fp8lab_hadamard", x2.data_ptr(), x2.shape[0], x2.shape[1], x2.stride(0), x2.stride(1), signs.data_ptr(), d,
         1.0 / math.sqrt(d), out.data_ptr())
    return out.reshape(*x.shape[:-1], -1)


@opaque_to_compile
def uniform_draws(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """formats.uniform_draws's numbers for a tensor of this shape from a CPU generator, by the kernel: torch.rand's
    float32 draws, in order, from the generator's state (get_state()), which the kernel advances as torch.rand
    would and set_state() puts back. Where draws_like_torch() (its one check against torch.rand here). Unlike
    torch.rand it holds no lock on the generator: one generator drawn from by two threads at once is not for it."""
    state = generator.get_state()
    out = _FLOAT32.new_empty(shape)
    call("fp8lab_uniform", state.data_ptr(), state.numel(), out.numel(), out.data_ptr())
    generator.set_state(state)
    return out


@lru_cache(maxsize=1)
def draws_like_torch() -> bool:
    """Whether uniform_draws gives torch.rand's numbers and leaves the generator where torch.rand leaves it, checked
    once: 1500 draws from a seeded generator after 100 (across a refill of its 624 words), and 3 more. False
    (formats.uniform_draws runs: torch.rand itself) where they differ or the state is not the one it reads."""
    if not _process_engine().kernels:  # (the library's, whatever kernels.disabled() says in this thread)
        return False
    ours, theirs = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    try:
        drawn = [(uniform_draws((n,), ours), torch.rand(n, generator=theirs, dtype=torch.float32, device="cpu"))
                 for n in (100, 1500, 3)]
    except RuntimeError:  # (a state of another layout: the kernel refuses it)
        return False
    return all(a.view(torch.int32).equal(b.view(torch.int32)) for a, b in drawn) and ours.get_state().equal(
        theirs.get_state())
