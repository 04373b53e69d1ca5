"""Fused CPU kernels for quantization, built from _kernels.c on first use.

Public: engine() (the one switch: C kernels or torch code, decided once per process),
disabled() (a context manager: the torch code in this thread), enabled(), status() -> (bool, reason),
quantize(x2d, block, parameters(args), amax) (quantize_with's torch code in one call), the twins
amax_per_block, scale_from_amax and cast (the torch definitions' signatures, by the kernels),
scale_outer_(out, a, b) (per-row scales of both operands applied to a GEMM's output),
keep_freed_memory() (the allocator setting fp8lab.setup() and the benchmarks make).

quantize.py and gemm.py define the numbers in torch; on the CPU they call these kernels,
which compute the same bits in one pass over memory instead of five passes with a fresh
temporary each (tests/test_kernels.py checks every result against the torch code). Formats
and rules reach C as data, in one parameter block (_Params) filled from FloatFormat and
SCALE_RULES; every call checks the sizes it passes, and the C side checks them again. The
library is compiled once per source version with the system C compiler (`cc`, ~1 s) into
~/.cache/fp8lab (or $XDG_CACHE_HOME/fp8lab) and loaded with ctypes. Without a compiler,
or with FP8LAB_KERNELS=0, everything runs in torch and status() says why. The cache is
private (0700); a cached library is loaded only if it is this user's and no one else can
write it (else it is rebuilt, and status() says why), one that does not load is rebuilt
once, and killed builds' temporaries and builds unused for a month are removed. A compiler
that refuses -march=native or -fopenmp (Apple clang) builds without them; status() says so.
Tensors beyond 32768 elements are split by rows (the same bits for any split) over
the threads of torch's own OpenMP runtime: where torch runs on libgomp (Linux wheels) and
the compiler is GCC, the library is built with -fopenmp and binds to the libgomp torch
loaded, so it shares torch's waiting workers and torch.set_num_threads (a second runtime
would fight torch's for the cores, and is refused). Elsewhere, POSIX threads split tensors
of millions of elements only.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import torch

from fp8lab import settings
from fp8lab.numerics.formats import E4M3, E5M2, FloatFormat, _check_float, get_format
from fp8lab.numerics.scaling import SCALE_RULES, Granularity, ScaleArgs, Scales, as_2d, check_scale_args

__all__ = [
    "EAGER_VALUES",
    "Engine",
    "amax_per_block",
    "cast",
    "disabled",
    "enabled",
    "engine",
    "keep_freed_memory",
    "parameters",
    "quantize",
    "scale_from_amax",
    "scale_outer_",
    "state_label",
    "status",
]

_SOURCE = Path(__file__).with_name("_kernels.c")
# no fast-math: IEEE rounding of every operation is the point (no FMA contraction either);
# -fno-trapping-math lets the loops vectorize (nothing here reads floating-point flags)
_FLAGS = ("-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math")
_NATIVE = ("-march=native",)
STORAGE = {torch.float8_e4m3fn: E4M3, torch.float8_e5m2: E5M2}  # the code dtypes, and the formats of their bytes
# a parameter block's code dtype, by its storage format's mantissa bits (3: E4M3 bytes, 2: E5M2 bytes)
STORAGE_OF = {fmt.mantissa_bits: dtype for dtype, fmt in STORAGE.items()}
_local = threading.local()



def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fp8lab"


# the cache: kernels-KEY.so, KEY from the source, compiler, flags and CPU; builds write to
# .build-HOST-PID-XXXXXXXX.so beside it, then rename (tmpXXXXXXXX.so before 2026-12)
_TMP_PREFIX = ".build-"
_STALE_S = 600  # a temporary this old is a dead build's (a build times out after 120 s)
_KEEP_BUILDS = 16  # builds kept: the most recently loaded ...
_KEEP_DAYS = 30  # ... of those loaded in this many days


class _Refused(Exception):
    """The kernel cache is not this user's alone: nothing in it is loaded."""


class _NotLoadable(Exception):
    """A freshly built library does not load."""


def _untrusted(path: Path) -> str:
    """Why `path` must not be loaded ("" where it is this user's alone): another owner, or
    writable by group or others (anyone who could write it could run code as this user)."""
    if not hasattr(os, "geteuid"):  # Windows: no POSIX owners or mode bits
        return ""
    st = path.stat()
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
    writers = " and ".join(who for who, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit)
    return f"{path} is writable by {writers} (mode {st.st_mode & 0o777:o})" if writers else ""


def _private_cache(notes: list[str] | None = None) -> Path:
    """The cache directory, created 0700 (whatever the umask). An existing one of this user's
    that others could enter is made 0700 (said in notes); one of another user's raises _Refused."""
    cache = _cache_dir()
    cache.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        cache.mkdir(mode=0o700)
    if hasattr(os, "geteuid"):
        st = cache.stat()
        if st.st_uid != os.geteuid():
            raise _Refused(f"the kernel cache {cache} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})")
        if st.st_mode & 0o077:
            os.chmod(cache, 0o700)
            if notes is not None:
                notes.append(f"made {cache} private (it was mode {st.st_mode & 0o777:o})")
    return cache


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _dead_build(name: str) -> bool:
    """Whether the temporary `name` is from a build on this host whose process is gone."""
    head, pid, _ = name.rsplit("-", 2)
    if head != _TMP_PREFIX + _host() or not pid.isdigit() or os.name != "posix":
        return False  # another machine's (a shared home), or no cheap liveness check here
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def _tidy(cache: Path, loaded: Path | None = None) -> None:
    """Remove temporaries of builds that were killed (their process is gone, or older than
    _STALE_S) and, once `loaded` is marked as just used, builds beyond the _KEEP_BUILDS most
    recently loaded or not loaded for _KEEP_DAYS (other source versions, compilers, CPUs)."""
    now = time.time()
    for tmp in [*cache.glob(_TMP_PREFIX + "*"), *cache.glob("tmp*.so")]:
        with contextlib.suppress(OSError, ValueError):
            if now - tmp.stat().st_mtime > _STALE_S or (tmp.name.startswith(_TMP_PREFIX) and _dead_build(tmp.name)):
                tmp.unlink()
    if loaded is None:
        return
    with contextlib.suppress(OSError):
        os.utime(loaded)  # modified = last loaded, so that the newest is the one in use
    builds = []
    for path in cache.glob("kernels-*.so"):
        with contextlib.suppress(OSError):
            builds.append((path.stat().st_mtime, path))
    builds.sort(reverse=True)
    for rank, (mtime, path) in enumerate(builds):
        if path != loaded and (rank >= _KEEP_BUILDS or now - mtime > _KEEP_DAYS * 86400):
            with contextlib.suppress(OSError):  # (a process that has it loaded keeps its copy)
                path.unlink()


def _cpu_flags() -> str:
    # -march=native code runs only on this kind of CPU: the cache key carries its features
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _openmp_libraries() -> set[str]:
    """The OpenMP runtimes mapped into this process (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            names = {line.split()[-1] for line in f if "/lib" in line}
    except OSError:
        return set()
    return {n for n in names if os.path.basename(n).startswith(("libgomp", "libomp", "libiomp"))}


def _openmp_flags(compiler: str) -> tuple[str, ...]:
    """("-fopenmp",) where the kernels can share torch's OpenMP runtime, else ()."""
    # -fopenmp code asks the loader for the soname libgomp.so.1: the runtime mapped under that
    # name answers. Copies that wheels vendor under a name of their own (scikit-learn's
    # libgomp-<hash>.so) are not asked, so they do not count.
    answering = {n for n in _openmp_libraries() if os.path.basename(n).startswith("libgomp.so")}
    if len(answering) != 1:
        return ()  # torch is not on libgomp here (or not on Linux)
    try:  # GCC links -fopenmp code against libgomp.so.1, the soname torch's copy answers to
        found = subprocess.run([compiler, "-print-file-name=libgomp.so"], capture_output=True, text=True,
                               timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ()
    return ("-fopenmp",) if os.path.isabs(found) else ()


def _library_path(compiler: str, flags: tuple[str, ...]) -> Path:
    """Where the library for (source, compiler, flags, CPU) lives in the cache."""
    key = " ".join((compiler, *flags, platform.machine(), _cpu_flags()))
    key = hashlib.sha256(_SOURCE.read_bytes() + key.encode()).hexdigest()[:16]
    return _cache_dir() / f"kernels-{key}.so"


def _build(compiler: str, flags: tuple[str, ...], notes: list[str] | None = None) -> Path:
    """The library for (compiler, flags) in the cache: the cached one if it is this user's
    alone, else built (an untrusted cached one is replaced, never loaded; said in notes)."""
    cache = _private_cache(notes)
    target = _library_path(compiler, flags)
    if target.exists():
        why = _untrusted(target)
        if not why:
            return target
        if notes is not None:
            notes.append(f"rebuilt {target.name}, not loaded: {why}")
    # build beside the target, then rename: processes starting together (torchrun ranks,
    # pytest workers) each build their own and the last rename wins, atomically
    fd, tmp = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}{_host()}-{os.getpid()}-", suffix=".so", dir=cache)
    os.close(fd)
    try:
        subprocess.run([compiler, *flags, str(_SOURCE), "-o", tmp, "-lm", "-lpthread"], check=True, capture_output=True,
                       text=True, timeout=120)
        os.chmod(tmp, 0o700)  # the linker's mode follows the umask
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _open(compiler: str, flags: tuple[str, ...], notes: list[str]) -> tuple[ctypes.CDLL, Path]:
    """Build (or find) and load the library; one that does not load (corrupt, cut short) is
    built again, once. _NotLoadable if the fresh build does not load either."""
    path = _build(compiler, flags, notes)
    try:
        return ctypes.CDLL(str(path)), path
    except OSError as err:
        notes.append(f"rebuilt {path.name}: the cached one did not load ({_first_line(str(err))})")
    path.unlink(missing_ok=True)
    path = _build(compiler, flags, notes)
    try:
        return ctypes.CDLL(str(path)), path
    except OSError as err:
        raise _NotLoadable(f"loading the freshly built {path.name} failed: {_first_line(str(err))}") from None


def _first_line(text: str, limit: int = 200) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return ((errors or lines or [""])[0])[:limit]


@lru_cache(maxsize=1)
def _load() -> tuple[ctypes.CDLL | None, str]:
    if not settings.kernels_requested():
        return None, "off (FP8LAB_KERNELS=0): quantization runs in torch"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler (cc) found: quantization runs in torch (slower on the CPU, same numbers)"
    notes: list[str] = []
    try:
        cache = _private_cache(notes)
    except _Refused as err:
        return None, (f"{err}: nothing is loaded from it, quantization runs in torch (remove it, or set "
                      "XDG_CACHE_HOME to a folder of your own)")
    except OSError as err:
        return None, f"no kernel cache ({_first_line(str(err))}): quantization runs in torch"
    _tidy(cache)
    openmp = _openmp_flags(compiler)
    before = _openmp_libraries()
    lib, path, failures = None, None, {}
    # with torch's OpenMP where it can be shared, -march=native where the compiler has it
    for flags in dict.fromkeys((_FLAGS + _NATIVE + openmp, _FLAGS + _NATIVE, _FLAGS + openmp, _FLAGS)):
        try:
            lib, path = _open(compiler, flags, notes)
        except subprocess.CalledProcessError as err:
            failures[flags] = _first_line(err.stderr or str(err))
            continue
        except _NotLoadable as err:
            return None, f"loading the CPU kernels failed ({err}): quantization runs in torch"
        except (OSError, subprocess.SubprocessError) as err:  # no such compiler, a full disk, a timeout
            return None, f"building the CPU kernels failed ({_first_line(str(err))}): quantization runs in torch"
        if "-fopenmp" in flags and _openmp_libraries() != before:
            lib = None  # it brought a runtime of its own: take the build without OpenMP (never called)
            failures[flags] = "the build brought an OpenMP runtime other than torch's"
            continue
        break
    if lib is None:
        return None, f"building the CPU kernels failed ({failures.get(_FLAGS, '')}): quantization runs in torch"
    _tidy(cache, loaded=path)
    _bind(lib)
    if lib.fp8lab_openmp():
        threads = "threads: torch's OpenMP"
    else:
        lib.fp8lab_set_threads(torch.get_num_threads())
        threads = "POSIX threads for tensors of millions of elements"
    built = f"built with {Path(compiler).name}"
    if _FLAGS + _NATIVE in failures:  # what a Mac's clang may say
        built += f" without -march=native ({failures[_FLAGS + _NATIVE]})"
    if openmp and _FLAGS + openmp in failures:
        built += f" without OpenMP ({failures[_FLAGS + openmp]})"
    return lib, f"fused CPU kernels ({path.name}, {built}; {threads})" + "".join(f"; {n}" for n in notes)


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
        ("min_inverse", ctypes.c_float), ("min_tensor_scale", ctypes.c_float),
        ("fold", ctypes.c_int32), ("count", ctypes.c_int32), ("clip_limit", ctypes.c_double),
        ("x", _p), ("given_amax", _p), ("amax", _p), ("scale", _p), ("inverse", _p), ("codes", _p), ("values", _p),
        ("tensor_scale", ctypes.c_float), ("scale_range", ctypes.c_float * 2), ("counts", ctypes.c_int64 * 2),
    ]


_REFUSED = {
    -1: "the parameter block's layout differs between fp8lab/kernels.py and _kernels.c",
    -2: "inconsistent shapes (x[M, K], blocks r x c within it, the number of blocks)",
    -3: "a format the kernels cannot take",
    -4: "an unknown scale rule or exponent range",
}


def parameters(args: ScaleArgs) -> bytes | None:
    """The parameter block for quantizing with these (checked) scale settings, as bytes (a
    QuantizeSpec keeps them: immutable, copyable): the element format, the format its codes are
    stored in, the scale rule and its constants, all from FloatFormat and SCALE_RULES. None
    where the kernels do not store the format (their codes are E4M3 or E5M2 bytes)."""
    fmt = args.fmt
    if fmt.storage_dtype not in STORAGE or not (fmt.signed and fmt.has_subnormals):
        return None
    storage = STORAGE[fmt.storage_dtype]
    e4m3 = args.scale_fmt if args.scale_fmt is not None and args.scale_fmt.name == "e4m3" else None
    lo, hi = args.exponent_range
    p = _Params(size=ctypes.sizeof(_Params), element=_Format.of(fmt), storage=_Format.of(storage),
                rule=SCALE_RULES.index(args.scale_rule), round_scales=e4m3 is not None, two_level=args.two_level,
                exponent_min=lo, exponent_max=hi, max_eff=args.max_eff, min_inverse=args.min_inverse,
                min_tensor_scale=args.min_tensor_scale, clip_limit=fmt.clip_threshold)
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
        "fp8lab_openmp": ([], ctypes.c_int),
        # pointers go in as ints (tensor.data_ptr()): the cheapest call ctypes has
        "fp8lab_scale_outer": ([_p, ctypes.c_int64, ctypes.c_int64, _p, _p], None),
    }
    for name, (args, res) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
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
    """What computes quantization (and the per-row epilogue of emulated GEMMs) on CPU tensors:
    fp8lab's C kernels, or the torch code that defines every number. Decided once per process
    (engine()), said by `python -m fp8lab doctor`, `bench` and notebook 00; quantize_with and
    emulated_mm each ask it in one place. The two give the same bits (tests/test_kernels.py)."""

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


def enabled(*tensors: torch.Tensor) -> bool:
    """Whether the kernels apply: the engine's choice here, and CPU float32 contiguous inputs."""
    return engine().kernels and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


# ---- the calls: each checks what it passes, and the C side checks it again --------------------------------------


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _input(x2d: torch.Tensor) -> torch.Tensor:
    if not (isinstance(x2d, torch.Tensor) and x2d.dim() == 2 and x2d.dtype == torch.float32
            and x2d.device.type == "cpu" and x2d.is_contiguous()):
        raise ValueError("fp8lab.numerics.kernels takes a contiguous 2-D float32 CPU tensor")
    return x2d


def _block_params(template: bytes, x2d: torch.Tensor, block: tuple[int, int]) -> _Params:
    """template (formats and rule) with x[M, K] and its r x c blocks, checked: 1 <= r <= M, 1 <= c <= K."""
    m, k = _input(x2d).shape
    r, c = block
    if not (isinstance(r, int) and isinstance(c, int) and 1 <= r <= max(m, 1) and 1 <= c <= max(k, 1)):
        raise ValueError(f"blocks must lie within x[{m}, {k}]: got {r} x {c} (clamp them: Granularity.block_shape)")
    p = _Params.from_buffer_copy(template)
    p.M, p.K, p.r, p.c, p.blocks, p.x = m, k, r, c, -(-m // r) * -(-k // c), x2d.data_ptr()
    return p


def _run(name: str, p: _Params) -> int:
    code = getattr(_load()[0], name)(ctypes.byref(p))
    if code < 0:
        raise RuntimeError(f"fp8lab kernel {name} refused the call: {_REFUSED.get(code, code)}")
    return code


def _per_block(p: _Params, t: torch.Tensor | None) -> torch.Tensor | None:
    if t is not None and not (t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()
                              and t.numel() == p.blocks):
        raise ValueError(f"expected {p.blocks} float32 values, one per block, got {t.numel()} {t.dtype}")
    return t


# values (float32) are written alongside the codes up to this size, where a GEMM will soon
# want them and writing them costs little; beyond it (16M elements are 64 MB of fresh
# pages) QuantizedTensor.values() widens the codes when asked
EAGER_VALUES = 1 << 22


class Fused(NamedTuple):
    """What one quantize call returns: codes [M, K] (storage dtype); values [M, K] float32 (times
    their block scale if folded; None beyond EAGER_VALUES elements); scale and amax (the amax the
    scales came from: given, or x's own) [ceil(M/r), ceil(K/c)]; tensor_scale (0-d, two-level,
    else None); scale_range (smallest, largest scale); counts (clipped, flushed) or None."""

    codes: torch.Tensor
    values: torch.Tensor | None
    scale: torch.Tensor
    amax: torch.Tensor
    tensor_scale: torch.Tensor | None
    scale_range: tuple[float, float]
    counts: tuple[int, int] | None


def quantize(x2d: torch.Tensor, block: tuple[int, int], template: bytes, amax: torch.Tensor | None = None, *,
             fold: bool = False, count: bool = False, values: bool | None = None) -> Fused | None:
    """quantize_with's torch code in one call (template: parameters(...) for its settings): x's
    block amaxes, scales from them (or from `amax`, one per block), the cast, the scale range,
    and with count=True the clipped and flushed counts. values: write the float32 values (folded
    if `fold`) in the same pass: True always (a GEMM operand, which reads them next), False
    never, None up to EAGER_VALUES elements. None if x holds an infinity (the caller explains)."""
    p = _block_params(template, x2d, block)
    mb, kb = -(-p.M // p.r), -(-p.K // p.c)
    own, scale, inverse = torch.empty(mb, kb), torch.empty(mb, kb), torch.empty(mb, kb)  # (float32: the default)
    codes = torch.empty(p.M, p.K, dtype=STORAGE_OF[p.storage.mantissa_bits])
    eager = p.M * p.K <= EAGER_VALUES if values is None else values
    out = torch.empty(p.M, p.K) if eager else None
    given = _per_block(p, None if amax is None else amax.contiguous())
    p.given_amax, p.amax, p.scale, p.inverse = _ptr(given), own.data_ptr(), scale.data_ptr(), inverse.data_ptr()
    p.codes, p.values, p.fold, p.count = codes.data_ptr(), _ptr(out), fold, count
    if _run("fp8lab_quantize", p):
        return None
    tensor_scale = torch.tensor(p.tensor_scale) if p.two_level else None
    return Fused(codes, out, scale, own if given is None else given, tensor_scale,
                 (p.scale_range[0], p.scale_range[1]), (p.counts[0], p.counts[1]) if count else None)


# ---- the twins: the torch definitions' signatures, computed by the kernels (tests compare each pair) -----------


def _template(fmt: FloatFormat | str, scale_rule: str = "exact", margin: int = 0,
              scale_fmt: FloatFormat | str | None = None, two_level: bool = False) -> bytes:
    p = parameters(check_scale_args(fmt, scale_rule, margin, scale_fmt, two_level))
    if p is None:
        raise ValueError(f"the kernels store e4m3, e5m2 and e2m1 codes, not {get_format(fmt).name}")
    return p


def amax_per_block(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """scaling.amax_per_block, by the kernel: max|x| per block, [ceil(M/rows), ceil(K/cols)] float32."""
    x2d = as_2d(x, granularity).to(torch.float32).contiguous()
    if x2d.numel() == 0:
        raise ValueError("cannot scale an empty tensor")
    p = _block_params(_template("e4m3"), x2d, granularity.block_shape(tuple(x2d.shape)))
    out = torch.empty(-(-p.M // p.r), -(-p.K // p.c))
    p.amax = out.data_ptr()
    _run("fp8lab_block_amax", p)
    return out


def scale_from_amax(amax: torch.Tensor, fmt: FloatFormat | str = "e4m3", scale_rule: str = "exact", margin: int = 0,
                    scale_fmt: FloatFormat | str | None = None, two_level: bool = False) -> Scales:
    """scaling.scale_from_amax, by the kernel: Scales(scale, inverse, tensor_scale), shaped like amax."""
    a = amax.to(torch.float32).contiguous()
    flat = a.reshape(1, -1)
    p = _block_params(_template(fmt, scale_rule, margin, scale_fmt, two_level), flat, (1, 1))
    scale, inverse = torch.empty_like(a), torch.empty_like(a)
    p.given_amax, p.scale, p.inverse = flat.data_ptr(), scale.data_ptr(), inverse.data_ptr()
    _run("fp8lab_scales", p)
    return Scales(scale, inverse, torch.tensor(p.tensor_scale) if p.two_level else None)


def cast(x: torch.Tensor, fmt: FloatFormat | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """formats.cast, by the kernel's cast (the one quantize runs), for e4m3, e5m2 and e2m1."""
    fmt = get_format(fmt)
    _check_float(x)
    if dtype not in (torch.float32, fmt.storage_dtype):
        raise ValueError(f"cast returns float32 values or {fmt.name}'s storage dtype {fmt.storage_dtype}, not {dtype}")
    flat = x.to(torch.float32).contiguous().reshape(1, -1)
    one = torch.ones(1)
    p = _block_params(_template(fmt), flat, (1, max(flat.shape[1], 1)))
    codes, values = torch.empty(flat.shape, dtype=fmt.storage_dtype), torch.empty(flat.shape)
    p.inverse, p.codes, p.values = one.data_ptr(), codes.data_ptr(), values.data_ptr()
    if flat.numel():
        _run("fp8lab_cast", p)
    return (values if dtype == torch.float32 else codes).reshape(x.shape)


def scale_outer_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out[M, N] *= outer(a[M], b[N]), in place, without making the [M, N] factor matrix: the same
    bits as out.mul_(a[:, None] * b[None, :]) (its torch twin, in fp8lab.gemm)."""
    a, b = a.to(torch.float32).contiguous(), b.to(torch.float32).contiguous()
    if not (out.dim() == 2 and out.dtype == torch.float32 and out.is_contiguous() and out.device.type == "cpu"
            and a.numel() == out.shape[0] and b.numel() == out.shape[1]):
        raise ValueError(f"scale_outer_ takes out[M, N] float32 contiguous, a[M], b[N]: got {tuple(out.shape)}, "
                         f"{a.numel()}, {b.numel()}")
    _load()[0].fp8lab_scale_outer(out.data_ptr(), out.shape[0], out.shape[1], a.data_ptr(), b.data_ptr())
    return out


@lru_cache(maxsize=1)
def keep_freed_memory() -> str:
    """Let glibc reuse freed blocks of up to 32 MiB instead of returning them to the OS.

    Emulated FP8 makes many short-lived tensors of a few MiB (codes, values, scaled
    products). By default glibc serves each from fresh mmap'd pages and unmaps it when
    freed, so every step pays the page faults of touching new memory again: measured on the
    toy MLP (2 cores), mxfp8 steps take 17.6 ms without this and 15.0 ms with it; fp32 and
    tensorwise steps do not change measurably. Raising the mmap
    threshold to its maximum (32 MiB) and the trim threshold keeps those pages in the
    heap for the next step, as jemalloc or tcmalloc would. Process-wide and harmless
    (the memory stays with the process for reuse). Returns what was done, once.
    """
    if platform.system() != "Linux":
        return "allocator unchanged (not Linux/glibc)"
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "allocator unchanged (no glibc mallopt)"
    m_trim_threshold, m_mmap_threshold = -1, -3
    ok = mallopt(m_mmap_threshold, 32 << 20) == 1 and mallopt(m_trim_threshold, 256 << 20) == 1
    return "glibc keeps freed blocks up to 32 MiB for reuse" if ok else "allocator unchanged (mallopt refused)"
