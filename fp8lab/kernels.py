"""Fused CPU kernels for quantization, built from _kernels.c on first use.

Public: status() -> (bool, reason), enabled(), disabled() (a context manager),
block_amax(x2d, block), scales(amax, rule, max_eff, exponent_range),
scale_cast(x2d, block, inverse, fmt), block_mul(v, block, s), quantize(...) (the three at once),
clip_flush_counts(x2d, block, scale, codes, limit) (the monitor's overflow and underflow),
scale_outer_(out, a, b) (per-row scales of both operands applied to a GEMM's output),
keep_freed_memory() (the allocator setting fp8lab.setup() and the benchmarks make).

quantize.py and gemm.py define the numbers in torch; on the CPU they call these kernels,
which compute the same bits in one pass over memory instead of five passes with a fresh
temporary each (tests/test_kernels.py checks every result against the torch code). The
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
import os
import platform
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path

import torch

from fp8lab import settings

__all__ = [
    "block_amax",
    "block_mul",
    "clip_flush_counts",
    "disabled",
    "enabled",
    "keep_freed_memory",
    "quantize",
    "scale_cast",
    "scale_outer_",
    "scales",
    "status",
]

_SOURCE = Path(__file__).with_name("_kernels.c")
# no fast-math: IEEE rounding of every operation is the point (no FMA contraction either);
# -fno-trapping-math lets the loops vectorize (nothing here reads floating-point flags)
_FLAGS = ("-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math")
_NATIVE = ("-march=native",)
STORAGE = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}  # the code dtypes scale_cast writes
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
    if not settings.KERNELS:
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


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The C functions' argument and result types, set on a loaded library."""
    # pointers go in as ints (tensor.data_ptr()): the cheapest call ctypes has
    p, i64, i32, f32, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_double
    signatures = {
        "fp8lab_block_amax": ([p, i64, i64, i64, i64, p], None),
        "fp8lab_scales": ([p, i64, i32, f64, i32, i32, p, p], None),
        "fp8lab_scale_cast": ([p, i64, i64, i64, i64, p, i64, p, i32, i32, f32, i32, p, p], None),
        "fp8lab_block_mul": ([p, i64, i64, i64, i64, p, p], None),
        "fp8lab_quantize": ([p, i64, i64, i64, i64, i32, f64, i32, i32, i32, i32, f32, i32, p, p, p, p, p, i32,
                             p, p], i32),
        "fp8lab_set_threads": ([i32], None),
        "fp8lab_openmp": ([], i32),
        "fp8lab_clip_flush_counts": ([p, i64, i64, i64, i64, p, i64, p, f64, p], None),
        "fp8lab_scale_outer": ([p, i64, i64, p, p], None),
    }
    for name, (args, res) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def status() -> tuple[bool, str]:
    """(are the fused CPU kernels in use, a one-line reason)."""
    lib, reason = _load()
    return lib is not None, reason


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
    """Whether the kernels apply: built, not disabled here, CPU float32 contiguous inputs."""
    if getattr(_local, "off", False) or _load()[0] is None:
        return False
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def block_amax(x2d: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """max|x| per (r, c) block of x[M, K] -> [ceil(M/r), ceil(K/c)] float32 (NaN propagates)."""
    m, k = x2d.shape
    r, c = block
    out = torch.empty(-(-m // r), -(-k // c), dtype=torch.float32)
    _load()[0].fp8lab_block_amax(x2d.data_ptr(), m, k, r, c, out.data_ptr())
    return out


# values (float32) are written alongside the codes up to this size, where a GEMM will soon
# want them and writing them costs little; beyond it (16M elements are 64 MB of fresh
# pages) QuantizedTensor.values() widens the codes when asked
EAGER_VALUES = 1 << 22


def _values_buffer(m: int, k: int) -> torch.Tensor | None:
    return torch.empty(m, k) if m * k <= EAGER_VALUES else None  # (float32, the default)


def scale_cast(x2d: torch.Tensor, block: tuple[int, int], inverse: torch.Tensor, fmt,
               storage: torch.dtype, fold: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(codes, values) of cast(x * inverse[block], fmt): codes in `storage`, values float32
    (times fold[block] if given: the scales folded in; None beyond EAGER_VALUES elements).

    inverse: one float32 per block ([ceil(M/r), ceil(K/c)]) or a single one (any shape).
    fmt: the element FloatFormat (E4M3, E5M2, or E2M1 stored as E4M3 bytes).
    """
    m, k = x2d.shape
    r, c = block
    inv = inverse.to(torch.float32).contiguous()
    codes = torch.empty(m, k, dtype=storage)
    vals = _values_buffer(m, k)
    emin = 1 - fmt.bias
    fold = fold.to(torch.float32).contiguous() if fold is not None else None
    _load()[0].fp8lab_scale_cast(
        x2d.data_ptr(), m, k, r, c, inv.data_ptr(), inv.numel(), fold.data_ptr() if fold is not None else None,
        fmt.mantissa_bits, emin, fmt.max_value, STORAGE[storage], codes.data_ptr(),
        vals.data_ptr() if vals is not None else None,
    )
    return codes, vals


_RULE_CODES = {"exact": 0, "rceil": 1, "floor": 2, "e4m3": 3, "e4m3 two-level": 4}  # as _kernels.c numbers them


def scales(amax: torch.Tensor, rule: str, max_eff: float, exponent_range: tuple[int, int]):
    """(scale, inverse) like amax from scaling.scale_from_amax's arithmetic, in one pass."""
    a = amax.to(torch.float32).contiguous()
    scale, inverse = torch.empty_like(a), torch.empty_like(a)
    _load()[0].fp8lab_scales(a.data_ptr(), a.numel(), _RULE_CODES[rule], max_eff, *exponent_range,
                             scale.data_ptr(), inverse.data_ptr())
    return scale, inverse


def block_mul(v: torch.Tensor, block: tuple[int, int], s: torch.Tensor) -> torch.Tensor:
    """v[M, K] * s[block] (s: [ceil(M/r), ceil(K/c)] float32) -> float32 [M, K]."""
    m, k = v.shape
    r, c = block
    s = s.to(torch.float32).contiguous()
    out = torch.empty(m, k, dtype=torch.float32)
    _load()[0].fp8lab_block_mul(v.data_ptr(), m, k, r, c, s.data_ptr(), out.data_ptr())
    return out


def quantize(x2d: torch.Tensor, block: tuple[int, int], fmt, rule: str, max_eff: float,
             exponent_range: tuple[int, int] = (-126, 127), fold: bool = False):
    """quantize() from x's own amaxes in one call: (codes, values, scale, inverse, amax,
    tensor_scale, (smallest scale, largest scale)), or None if an amax is infinite (the
    caller explains). rule: a scale rule (scales as scales()), or "e4m3" / "e4m3 two-level"
    for NVFP4's E4M3 block scales (the latter under a per-tensor scale, else tensor_scale is
    None). Codes and values as scale_cast() (with fold: values times their block's scale)."""
    m, k = x2d.shape
    r, c = block
    mb, kb = -(-m // r), -(-k // c)
    # (torch.empty's float32 default is cheaper than naming it: this runs per GEMM operand)
    amax, scale, inverse = torch.empty(mb, kb), torch.empty(mb, kb), torch.empty(mb, kb)
    tensor_scale = torch.empty(()) if rule == "e4m3 two-level" else None
    storage = fmt.storage_dtype
    codes = torch.empty(m, k, dtype=storage)
    vals = _values_buffer(m, k)
    scale_range = (ctypes.c_float * 2)()
    bad = _load()[0].fp8lab_quantize(
        x2d.data_ptr(), m, k, r, c, _RULE_CODES[rule], max_eff, *exponent_range, fmt.mantissa_bits, 1 - fmt.bias,
        fmt.max_value, STORAGE[storage], amax.data_ptr(), scale.data_ptr(), inverse.data_ptr(),
        codes.data_ptr(), vals.data_ptr() if vals is not None else None, int(fold),
        tensor_scale.data_ptr() if tensor_scale is not None else None, scale_range,
    )
    return None if bad else (codes, vals, scale, inverse, amax, tensor_scale, (scale_range[0], scale_range[1]))


def scale_outer_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out *= outer(a, b), in place, without making the [M, N] factor matrix (same bits)."""
    a, b = a.to(torch.float32).contiguous(), b.to(torch.float32).contiguous()
    _load()[0].fp8lab_scale_outer(out.data_ptr(), out.shape[0], out.shape[1], a.data_ptr(), b.data_ptr())
    return out


def clip_flush_counts(x2d: torch.Tensor, block: tuple[int, int], scale: torch.Tensor, codes: torch.Tensor,
                      limit: float) -> tuple[int, int]:
    """(elements that clipped, nonzero elements that flushed to zero): metrics' overflow and
    underflow counts in one pass. scale: float32 per block (tensor scale folded in)."""
    m, k = x2d.shape
    r, c = block
    s = scale.to(torch.float32).contiguous()
    counts = torch.zeros(2, dtype=torch.int64)
    _load()[0].fp8lab_clip_flush_counts(x2d.data_ptr(), m, k, r, c, s.data_ptr(), s.numel(),
                                        codes.contiguous().data_ptr(), limit, counts.data_ptr())
    clipped, flushed = counts.tolist()
    return clipped, flushed


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
