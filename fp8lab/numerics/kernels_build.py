"""Building, caching and loading _kernels.c: the library behind fp8lab.numerics.kernels.

Public: load() -> (library or None, reason) (once per process, whatever the number of threads
asking), load_uncached(), compiler(), build(), EXPORTED (the functions the library must export),
FLAGS / NATIVE, openmp_flags(), openmp_libraries(), library_path(), cache_dir(), KEEP_BUILDS.
kernels.py binds the loaded library's argument types and calls it; this file decides whether
there is a library at all, and says why not.

The library is compiled once per source version with the system C compiler ($CC, a command
line such as "ccache gcc" or "cc -O2", else `cc`) into ~/.cache/fp8lab (or
$XDG_CACHE_HOME/fp8lab) and loaded with ctypes. Without a compiler, with FP8LAB_KERNELS=0, or
where anything below fails, everything runs in torch and the reason says why. The cache is
private (0700); a cached library is loaded only if it is this user's, no one else can write it
and its bytes are the ones its build recorded (a SHA-256 beside it: a library cut short by a
full disk or a killed copy would crash the process inside the dynamic loader, so it is rebuilt,
never loaded). A library that does not load, or lacks one of EXPORTED, is not used. Builds run
in a session of their own, one at a time per cache (a file lock) and per process (a lock), within
BUILD_TIMEOUT_S (90 s; FP8LAB_BUILD_TIMEOUT sets another) for the whole load: a compiler that hangs is
stopped with its children, and quantization runs in torch, the reason in `python -m fp8lab doctor`.
A build says so on stderr when it starts (one short line: the compiler, the bound), and so does any
compiler run still going after NOTICE_S; a build stopped at the bound says that too. Killed builds'
temporaries and builds unused for a month are removed. A compiler that refuses -march=native or -fopenmp (Apple clang)
builds without them. Where torch runs on libgomp (Linux wheels) and the compiler is GCC, the
library is built with -fopenmp and binds to the libgomp torch loaded (a second OpenMP runtime
would fight torch's for the cores, and is refused).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch

from fp8lab import settings

__all__ = [
    "BUILD_TIMEOUT_S",
    "EXPORTED",
    "FLAGS",
    "KEEP_BUILDS",
    "NATIVE",
    "NOTICE_S",
    "build",
    "cache_dir",
    "compiler",
    "library_path",
    "load",
    "load_uncached",
    "openmp_flags",
    "openmp_libraries",
]

SOURCE = Path(__file__).with_name("_kernels.c")
# no fast-math: IEEE rounding of every operation is the point (no FMA contraction either);
# -fno-trapping-math lets the loops vectorize (nothing here reads floating-point flags)
FLAGS = ("-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math")
NATIVE = ("-march=native",)
BUILD_TIMEOUT_S = 90.0  # every compiler run of one load together (FP8LAB_BUILD_TIMEOUT: another bound)
NOTICE_S = 5.0  # a build still running after this says so on stderr


def exported(source: str) -> tuple[str, ...]:
    """The functions a library built from `source` exports: those marked FP8LAB_API in _kernels.c."""
    return tuple(re.findall(r"^FP8LAB_API\b[^(;]*?\b(fp8lab_\w+)\s*\(", source, re.M))


EXPORTED = exported(SOURCE.read_text())


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fp8lab"


# the cache: kernels-KEY.so and kernels-KEY.so.sha256 (its bytes' digest), KEY from the source,
# compiler, flags and CPU; builds write to .build-HOST-PID-XXXXXXXX.so beside it, then rename
TMP_PREFIX = ".build-"
_LEGACY_TMP = "tmp*.so"  # the temporaries' names of earlier versions
_DIGEST = ".sha256"
_STALE_S = 600  # a temporary this old is a dead build's
KEEP_BUILDS = 16  # builds kept: the most recently loaded ...
_KEEP_DAYS = 30  # ... of those loaded in this many days


class _Refused(Exception):
    """The kernel cache is not this user's alone: nothing in it is loaded."""


class _NotLoadable(Exception):
    """A freshly built library does not load."""


class _TimedOut(Exception):
    """A compiler run did not finish before the load's deadline (fp8lab stops it, with its children)."""


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
    cache = cache_dir()
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
                notes.append(f"made {cache} private (its mode had been {st.st_mode & 0o777:o})")
    return cache


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _dead_build(name: str) -> bool:
    """Whether the temporary `name` is from a build on this host whose process is gone."""
    head, pid, _ = name.rsplit("-", 2)
    if head != TMP_PREFIX + _host() or not pid.isdigit() or os.name != "posix":
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
    _STALE_S) and, once `loaded` is marked as just used, builds beyond the KEEP_BUILDS most
    recently loaded or not loaded for _KEEP_DAYS (other source versions, compilers, CPUs), with
    their digests, and digests whose library is gone."""
    now = time.time()
    for tmp in [*cache.glob(TMP_PREFIX + "*"), *cache.glob(_LEGACY_TMP)]:
        with contextlib.suppress(OSError, ValueError):
            if now - tmp.stat().st_mtime > _STALE_S or (tmp.name.startswith(TMP_PREFIX) and _dead_build(tmp.name)):
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
        if path != loaded and (rank >= KEEP_BUILDS or now - mtime > _KEEP_DAYS * 86400):
            with contextlib.suppress(OSError):  # (a process that has it loaded keeps its copy)
                path.unlink()
    for digest in cache.glob("kernels-*.so" + _DIGEST):
        if not digest.with_name(digest.name.removesuffix(_DIGEST)).exists():
            with contextlib.suppress(OSError):
                digest.unlink()


def _cpu_flags() -> str:
    # -march=native code runs only on this kind of CPU: the cache key carries its features
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def openmp_libraries() -> set[str]:
    """The OpenMP runtimes mapped into this process (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            names = {line.split()[-1] for line in f if "/lib" in line}
    except OSError:
        return set()
    return {n for n in names if os.path.basename(n).startswith(("libgomp", "libomp", "libiomp"))}


# ---- running the compiler: in a session of its own, within the load's deadline --------------------------------


class _Compiler:
    """The compiler's command line and the deadline shared by its runs in one load."""

    def __init__(self, argv: list[str], timeout_s: float = BUILD_TIMEOUT_S) -> None:
        self.argv = argv
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.noticed = False

    @property
    def name(self) -> str:
        return " ".join(Path(a).name if i == 0 else a for i, a in enumerate(self.argv))

    def run(self, args: list[str]) -> subprocess.CompletedProcess:
        """argv + args; subprocess.CalledProcessError where it fails, _TimedOut where it outlives the
        deadline (then it and everything it started are killed), OSError where it cannot start."""
        proc = subprocess.Popen([*self.argv, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=os.name == "posix")
        try:
            try:
                out, err = proc.communicate(timeout=max(min(NOTICE_S, self.deadline - time.monotonic()), 0.01))
            except subprocess.TimeoutExpired:
                self.announce()
                try:
                    out, err = proc.communicate(timeout=max(self.deadline - time.monotonic(), 0.01))
                except subprocess.TimeoutExpired:
                    self._stop(proc)
                    with contextlib.suppress(subprocess.TimeoutExpired):  # (a process beyond its group may hold
                        proc.communicate(timeout=5)                     # the pipes: never wait for it)
                    raise _TimedOut(f"the C compiler ({self.name}) did not finish within {self.timeout_s:g} s; "
                                    "it was stopped with its children") from None
        finally:
            self._stop(proc)  # whatever it started and left behind goes with it
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, out, err)
        return subprocess.CompletedProcess(proc.args, 0, out, err)

    def announce(self) -> None:
        """Say on stderr, once per load, that the kernels are being compiled, and for at most how long."""
        if not self.noticed:
            self.noticed = True
            print(f"fp8lab: compiling the CPU kernels with {self.name} (first use; at most {self.timeout_s:g} s, "
                  "then quantization runs in torch; FP8LAB_KERNELS=0 skips it) ...", file=sys.stderr, flush=True)

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        if os.name == "posix":
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                os.killpg(proc.pid, signal.SIGKILL)  # its session's group: children included
        elif proc.poll() is None:
            proc.kill()


def compiler() -> list[str] | None:
    """The C compiler's command line: $CC split as a shell would ("ccache gcc", "cc -O2"), else
    `cc` or `gcc` from PATH; None where there is none. ValueError for a CC that does not parse."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        try:
            argv = shlex.split(cc)
        except ValueError as err:
            raise ValueError(f"CC={cc!r} is not a command line ({err})") from None
        if argv:
            return argv
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else None


def _as_compiler(cc: list[str] | str | _Compiler) -> _Compiler:
    if isinstance(cc, _Compiler):
        return cc
    return _Compiler([cc] if isinstance(cc, str) else list(cc))


def openmp_flags(cc: list[str] | str | _Compiler) -> tuple[str, ...]:
    """("-fopenmp",) where the kernels can share torch's OpenMP runtime, else ()."""
    # -fopenmp code asks the loader for the soname libgomp.so.1: the runtime mapped under that
    # name answers. Copies that wheels vendor under a name of their own (scikit-learn's
    # libgomp-<hash>.so) are not asked, so they do not count.
    answering = {n for n in openmp_libraries() if os.path.basename(n).startswith("libgomp.so")}
    if len(answering) != 1:
        return ()  # torch is not on libgomp here (or not on Linux)
    try:  # GCC links -fopenmp code against libgomp.so.1, the soname torch's copy answers to
        found = _as_compiler(cc).run(["-print-file-name=libgomp.so"]).stdout.strip()
    except (OSError, subprocess.SubprocessError, _TimedOut):
        return ()
    return ("-fopenmp",) if os.path.isabs(found) else ()


def library_path(cc: list[str] | str | _Compiler, flags: tuple[str, ...]) -> Path:
    """Where the library for (source, compiler command line, flags, CPU) lives in the cache."""
    key = " ".join((*_as_compiler(cc).argv, *flags, platform.machine(), _cpu_flags()))
    key = hashlib.sha256(SOURCE.read_bytes() + key.encode()).hexdigest()[:16]
    return cache_dir() / f"kernels-{key}.so"


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + _DIGEST)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _intact(path: Path) -> str:
    """Why the cached `path` must not be loaded ("" where it may): not this user's alone, or its
    bytes are not those its build recorded (cut short, garbled, or never recorded)."""
    why = _untrusted(path)
    if why:
        return why
    digest = _digest_path(path)
    try:
        if _untrusted(digest):
            return f"its checksum file {digest.name} is not yours alone"
        recorded = digest.read_text().strip()
    except OSError:
        return "no checksum was recorded for it"
    return "" if recorded == _sha256(path) else "its bytes are not those its build wrote (cut short or changed)"


@contextlib.contextmanager
def _cache_lock(cache: Path, deadline: float):
    """One build at a time per cache (processes starting together: torchrun ranks, pytest workers),
    waiting at most until `deadline`; then the build goes ahead unlocked (the rename keeps it whole)."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock
        yield
        return
    fd = os.open(cache / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def build(cc: list[str] | str | _Compiler, flags: tuple[str, ...], notes: list[str] | None = None) -> Path:
    """The library for (compiler, flags) in the cache: the cached one if it may be loaded (_intact),
    else built (one that may not is replaced, never loaded; said in notes)."""
    cc = _as_compiler(cc)
    cache = _private_cache(notes)
    target = library_path(cc, flags)
    with _cache_lock(cache, cc.deadline):
        if target.exists():
            why = _intact(target)
            if not why:
                return target
            if notes is not None:
                notes.append(f"rebuilt {target.name}, not loaded: {why}")
        # build beside the target, then rename: a library appears whole or not at all
        fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{_host()}-{os.getpid()}-", suffix=".so", dir=cache)
        os.close(fd)
        digest_tmp = tmp + _DIGEST
        try:
            cc.announce()
            cc.run([*flags, str(SOURCE), "-o", tmp, "-lm", "-lpthread"])
            os.chmod(tmp, 0o700)  # the linker's mode follows the umask
            digest = os.open(digest_tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(digest, "w") as f:
                f.write(_sha256(Path(tmp)) + "\n")
            os.replace(tmp, target)
            os.replace(digest_tmp, _digest_path(target))
        finally:
            for left in (tmp, digest_tmp):
                if os.path.exists(left):
                    os.unlink(left)
    return target


def _open(cc: _Compiler, flags: tuple[str, ...], notes: list[str]) -> tuple[ctypes.CDLL, Path]:
    """Build (or find) and load the library; one that does not load is built again, once.
    _NotLoadable if the fresh build does not load either."""
    path = build(cc, flags, notes)
    try:
        return ctypes.CDLL(str(path)), path
    except OSError as err:
        notes.append(f"rebuilt {path.name}: the cached one did not load ({_first_line(str(err))})")
    path.unlink(missing_ok=True)
    path = build(cc, flags, notes)
    try:
        return ctypes.CDLL(str(path)), path
    except OSError as err:
        raise _NotLoadable(f"loading the freshly built {path.name} failed: {_first_line(str(err))}") from None


def _first_line(text: str, limit: int = 200) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return ((errors or lines or [""])[0])[:limit]


def load_uncached(timeout_s: float | None = None) -> tuple[ctypes.CDLL | None, str]:
    """Build (or find) and load the library now: (library, reason) or (None, why not). timeout_s: the bound on
    the compiler's runs (None: FP8LAB_BUILD_TIMEOUT, else BUILD_TIMEOUT_S)."""
    try:
        if not settings.kernels_requested():
            return None, "off (FP8LAB_KERNELS=0): quantization runs in torch"
        if timeout_s is None:
            timeout_s = settings.build_timeout(BUILD_TIMEOUT_S)
        argv = compiler()
    except ValueError as err:  # an FP8LAB_KERNELS, FP8LAB_BUILD_TIMEOUT or CC that means nothing
        warnings.warn(f"fp8lab: {err}; quantization runs in torch", stacklevel=2)
        return None, f"{err}: quantization runs in torch"
    if argv is None:
        return None, "no C compiler (cc) found: quantization runs in torch (slower on the CPU, same numbers)"
    cc = _Compiler(argv, timeout_s)
    notes: list[str] = []
    try:
        cache = _private_cache(notes)
    except _Refused as err:
        return None, (f"{err}: nothing is loaded from it, quantization runs in torch (remove it, or set "
                      "XDG_CACHE_HOME to a folder of your own)")
    except OSError as err:
        return None, f"no kernel cache ({_first_line(str(err))}): quantization runs in torch"
    _tidy(cache)
    openmp = openmp_flags(cc)
    before = openmp_libraries()
    lib, path, failures = None, None, {}
    # with torch's OpenMP where it can be shared, -march=native where the compiler has it
    for flags in dict.fromkeys((FLAGS + NATIVE + openmp, FLAGS + NATIVE, FLAGS + openmp, FLAGS)):
        try:
            lib, path = _open(cc, flags, notes)
        except subprocess.CalledProcessError as err:
            failures[flags] = _first_line(err.stderr or str(err))
            continue
        except _NotLoadable as err:
            return None, f"loading the CPU kernels failed ({err}): quantization runs in torch"
        except _TimedOut as err:
            why = f"building the CPU kernels failed ({err}): quantization runs in torch"
            print(f"fp8lab: {why}", file=sys.stderr, flush=True)
            return None, why
        except (OSError, subprocess.SubprocessError) as err:  # no such compiler, a full disk
            return None, f"building the CPU kernels failed ({_first_line(str(err))}): quantization runs in torch"
        if "-fopenmp" in flags and openmp_libraries() != before:
            lib = None  # it brought a runtime of its own: take the build without OpenMP (never called)
            failures[flags] = "the build brought an OpenMP runtime other than torch's"
            continue
        break
    if lib is None:
        return None, f"building the CPU kernels failed ({failures.get(FLAGS, '')}): quantization runs in torch"
    missing = [name for name in EXPORTED if not hasattr(lib, name)]
    if missing:
        return None, (f"the library {path.name} built with {cc.name} lacks {', '.join(missing)} (a compiler or "
                      "linker that hides or renames symbols?): quantization runs in torch")
    _tidy(cache, loaded=path)
    if lib.fp8lab_openmp():
        threads = "threads: torch's OpenMP"
    else:
        lib.fp8lab_set_threads(torch.get_num_threads())
        threads = "POSIX threads for tensors of millions of elements"
    built = f"built with {cc.name}"
    if FLAGS + NATIVE in failures:  # what a Mac's clang may say
        built += f" without -march=native ({failures[FLAGS + NATIVE]})"
    if openmp and FLAGS + openmp in failures:
        built += f" without OpenMP ({failures[FLAGS + openmp]})"
    return lib, f"fused CPU kernels ({path.name}, {built}; {threads})" + "".join(f"; {n}" for n in notes)


_LOCK = threading.Lock()
_LOADED: list[tuple[ctypes.CDLL | None, str]] = []


def load() -> tuple[ctypes.CDLL | None, str]:
    """The library of this process and the reason: built or loaded by the first caller, while
    every other thread asking at the same time waits for that one answer."""
    if not _LOADED:
        with _LOCK:
            if not _LOADED:
                _LOADED.append(load_uncached())
    return _LOADED[0]
