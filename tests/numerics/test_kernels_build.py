"""fp8lab.numerics.kernels_build's cache: private, never loads what others could have written, heals a
corrupt library, tidies killed builds and old ones, and builds where a Mac's compiler would.

Each test loads the kernels afresh (kernels_build.load_uncached, not the process's cached load)
from a cache of its own (XDG_CACHE_HOME in tmp_path). Where only the cache's handling is under
test, the cache is seeded with a copy of this session's library, or a stub stands in for
_kernels.c (a tenth of a second to build); the tests of other compilers build the real source
(~3-6 s each on 2 busy cores). A library is loaded at most once per path in a process (the dynamic
loader would hand back the first copy), so each test makes its state before its one load.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fp8lab.settings
from fp8lab import E2M1, E4M3, E5M2, PerBlock, PerRow, PerTensor, quantize
from fp8lab.numerics import kernels, kernels_build

COMPILER = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(not kernels.status()[0], reason=f"kernels not built here: {kernels.status()[1]}")


def _session_library() -> Path:
    """The library this session loaded (in the default cache, read before any test moves it)."""
    name = re.search(r"kernels-[0-9a-f]{16}\.so", kernels.status()[1])
    return kernels_build.cache_dir() / name[0] if name else Path("/nonexistent")


SESSION_LIBRARY = _session_library()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty kernel cache of this test's own (not yet created)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "fp8lab"


def _load() -> tuple[object, str]:
    return kernels_build.load_uncached()


def _seed(cache: Path, mode: int = 0o700) -> Path:
    """The session's library copied into `cache` under the name a load here looks for."""
    cache.mkdir(parents=True, mode=0o700, exist_ok=True)
    target = cache / SESSION_LIBRARY.name
    shutil.copyfile(SESSION_LIBRARY, target)
    target.chmod(mode)
    digest = SESSION_LIBRARY.with_name(SESSION_LIBRARY.name + ".sha256")
    shutil.copyfile(digest, target.with_name(digest.name))  # the checksum its build recorded
    return target


@pytest.fixture
def stub_source(tmp_path, monkeypatch) -> None:
    """Build a stub instead of _kernels.c (a tenth of a second instead of seconds): every function
    _kernels.c exports, doing nothing. For tests of the cache, where what is built is immaterial."""
    names = sorted(set(re.findall(r"^[A-Za-z][\w \t*]*\b(fp8lab_\w+)\s*\(", kernels_build.SOURCE.read_text(), re.M)))
    assert "fp8lab_openmp" in names and "fp8lab_quantize" in names, names
    stub = tmp_path / "stub_kernels.c"
    stub.write_text("".join(f"int {name}(void) {{ return 0; }}\n" for name in names))
    monkeypatch.setattr(kernels_build, "SOURCE", stub)


def _first_choice() -> Path:
    """The library a load tries first: native code, with torch's OpenMP where it can share it."""
    return kernels_build.library_path(COMPILER, kernels_build.FLAGS + kernels_build.NATIVE
                                      + kernels_build.openmp_flags(COMPILER))


def _script(path: Path, body: str) -> str:
    """A fake compiler: a shell script that runs the real one unless `body` decides otherwise."""
    path.write_text(f"#!/bin/sh\n{body}\nexec {COMPILER} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def _agrees_with_torch(lib, monkeypatch) -> None:
    """The library computes the torch code's codes and scales, bit for bit."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 256, generator=g) * torch.exp2(torch.randint(-20, 20, (300, 256), generator=g).float())
    with monkeypatch.context() as m:
        m.setattr(kernels, "_load", lambda: (kernels._bind(lib), "the library under test"))
        assert kernels.enabled(x)
        for granularity in (PerTensor(), PerRow(), PerBlock(1, 32), PerBlock(128, 128)):
            for kw in ({"fmt": E4M3}, {"fmt": E5M2, "scale_rule": "rceil"}, {"fmt": E2M1, "scale_fmt": E4M3}):
                got = quantize(x, granularity=granularity, **kw)
                with kernels.disabled():
                    want = quantize(x, granularity=granularity, **kw)
                assert torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8)), (granularity, kw)
                assert torch.equal(got.scale.view(torch.int32), want.scale.view(torch.int32)), (granularity, kw)


# ---- a private cache ---------------------------------------------------------------------------------------


def test_a_new_cache_is_private_whatever_the_umask(cache, stub_source):
    old = os.umask(0o002)  # a shared lab PC's: new files group-writable
    try:
        lib, why = _load()
    finally:
        os.umask(old)
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert "private" not in why, "created open, then closed: others could enter it in between"
    (library,) = cache.glob("kernels-*.so")
    assert stat.S_IMODE(library.stat().st_mode) & 0o077 == 0, oct(library.stat().st_mode)


def test_an_open_cache_of_ours_is_made_private(cache):
    _seed(cache)
    cache.chmod(0o777)
    lib, why = _load()
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert f"made {cache} private (its mode had been 777)" in why


def test_a_cache_of_another_users_is_refused(cache, monkeypatch):
    _seed(cache)
    if os.geteuid() == 0:
        os.chown(cache, 65534, 65534)
        owner = 65534
    else:  # (not root: the cache is ours, so this process pretends to be someone else)
        me = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: me + 1)
        owner = me
    lib, why = _load()
    assert lib is None
    assert f"the kernel cache {cache} belongs to uid {owner}, not to you" in why
    assert "quantization runs in torch" in why and "XDG_CACHE_HOME" in why


@pytest.mark.parametrize("who", ["group-writable", "another user's"])
def test_a_cached_library_others_could_have_written_is_never_loaded(cache, tmp_path, stub_source, who):
    """A library that runs code when loaded (a constructor), planted where the build would be:
    it must be replaced by a fresh build, never loaded."""
    if who == "another user's" and os.geteuid() != 0:
        pytest.skip("making a file another user's needs root (chown)")
    marker = tmp_path / "planted-library-ran"
    source = tmp_path / "planted.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void planted(void) '
                      f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
                      "int fp8lab_openmp(void) { return 0; }\n")
    cache.mkdir(parents=True, mode=0o700)
    planted = _first_choice()
    subprocess.run([COMPILER, "-shared", "-fPIC", str(source), "-o", str(planted)], check=True, timeout=60)
    if who == "group-writable":
        planted.chmod(0o775)
        reason = "is writable by group (mode 775)"
    else:
        planted.chmod(0o755)
        os.chown(planted, 65534, 65534)
        reason = "belongs to uid 65534, not to you"
    lib, why = _load()
    assert not marker.exists(), "the planted library was loaded"
    assert lib is not None and f"rebuilt {planted.name}, not loaded: {planted} {reason}" in why, why
    st = planted.stat()
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o022 == 0
    assert hasattr(lib, "fp8lab_quantize")


def test_without_posix_owners_the_checks_stand_aside(cache, monkeypatch):
    """Windows has no geteuid (nor meaningful mode bits): the cache loads without the checks."""
    _seed(cache)
    monkeypatch.delattr(os, "geteuid")
    lib, why = _load()
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel


# ---- a corrupt library, a failed load ----------------------------------------------------------------------


def test_a_library_that_does_not_load_is_rebuilt_once(cache, stub_source):
    """A library whose recorded checksum matches but which the loader refuses (garbled before its
    checksum was taken) must not mean a permanent fallback to torch under a message about building."""
    cache.mkdir(parents=True, mode=0o700)
    corrupt = _first_choice()
    corrupt.write_bytes(b"\x7fELF" + bytes(100))
    corrupt.chmod(0o700)
    digest = corrupt.with_name(corrupt.name + ".sha256")
    digest.write_text(hashlib.sha256(corrupt.read_bytes()).hexdigest() + "\n")
    digest.chmod(0o600)
    lib, why = _load()
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel
    assert f"rebuilt {corrupt.name}: the cached one did not load" in why
    assert corrupt.read_bytes()[:4] == b"\x7fELF" and corrupt.stat().st_size > 104


def test_a_library_that_never_loads_is_reported_as_such(cache, tmp_path, monkeypatch):
    """A compiler whose output never loads: the reason names the load, not the build."""
    garbage = _script(tmp_path / "cc", 'for a in "$@"; do if [ "$prev" = -o ]; then echo junk > "$a"; exit 0; fi; '
                                       'prev="$a"; done')
    monkeypatch.setenv("CC", garbage)
    lib, why = _load()
    assert lib is None
    assert why.startswith("loading the CPU kernels failed (loading the freshly built kernels-"), why
    assert "quantization runs in torch" in why


# ---- killed builds and old builds --------------------------------------------------------------------------


def test_a_killed_build_leaves_no_temporary_behind(cache, tmp_path):
    """A process killed while compiling leaves its temporary; the next load removes it."""
    slow = _script(tmp_path / "cc", 'case " $* " in *" -o "*) sleep 60;; esac')
    proc = subprocess.Popen([sys.executable, "-c", "from fp8lab.numerics import kernels; kernels.status()"],
                            env={**os.environ, "CC": slow, "XDG_CACHE_HOME": str(cache.parent)},
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list(cache.glob(".build-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert list(cache.glob(".build-*")), "the build never started"
    _seed(cache)
    lib, why = _load()
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel
    assert list(cache.glob(".build-*")) == []


def test_temporaries_of_builds_still_running_stay(cache):
    _seed(cache)
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())
    live = cache / f".build-{host}-{os.getpid()}-abcdefgh.so"  # this process: a build in progress
    elsewhere = cache / ".build-another-machine-1-abcdefgh.so"  # a shared home: can't tell, keep
    fresh_legacy, old_legacy = cache / "tmpabcdefgh.so", cache / "tmpzyxwvuts.so"  # (names before 2026-12)
    for path in (live, elsewhere, fresh_legacy, old_legacy):
        path.write_bytes(b"")
    hour_ago = time.time() - 3600
    os.utime(old_legacy, (hour_ago, hour_ago))
    lib, why = _load()
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel
    assert live.exists() and elsewhere.exists() and fresh_legacy.exists()
    assert not old_legacy.exists()


def test_a_vendored_openmp_copy_leaves_torchs_in_use(monkeypatch):
    """scikit-learn's wheel maps a libgomp of its own (libgomp-<hash>.so, a name -fopenmp code never
    asks for): the kernels still share torch's runtime. (The hazard: once a notebook or test imports
    scikit-learn, a second load builds another library, without OpenMP.)"""
    mapped = {n for n in kernels_build.openmp_libraries() if os.path.basename(n).startswith("libgomp.so")}
    monkeypatch.setattr(kernels_build, "openmp_libraries", lambda: mapped)
    if not kernels_build.openmp_flags(COMPILER):
        pytest.skip(f"torch's OpenMP is not shared here (mapped: {sorted(mapped)})")
    vendored = "/site-packages/scikit_learn.libs/libgomp-e985bcbb.so.1.0.0"
    monkeypatch.setattr(kernels_build, "openmp_libraries", lambda: mapped | {vendored})
    assert kernels_build.openmp_flags(COMPILER) == ("-fopenmp",)
    monkeypatch.setattr(kernels_build, "openmp_libraries", lambda: mapped | {"/opt/other/libgomp.so.1"})
    assert kernels_build.openmp_flags(COMPILER) == ()  # two runtimes answer to the soname: can't tell which


def test_old_builds_are_pruned(cache):
    loaded = _seed(cache)
    now = time.time()
    recent = [cache / f"kernels-{i:016x}.so" for i in range(20)]
    ancient = [cache / f"kernels-{i:016x}.so" for i in range(100, 103)]
    for age, path in [*((60.0 * (i + 1), p) for i, p in enumerate(recent)), *((40 * 86400.0, p) for p in ancient)]:
        path.write_bytes(b"")
        os.utime(path, (now - age, now - age))
    lib, why = _load()
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel
    kept = sorted(cache.glob("kernels-*.so"))
    assert len(kept) == kernels_build.KEEP_BUILDS
    assert set(kept) == {loaded, *recent[: kernels_build.KEEP_BUILDS - 1]}


# ---- compilers other than this machine's gcc ---------------------------------------------------------------


def test_a_compiler_that_refuses_native_code_and_openmp_still_builds(cache, tmp_path, monkeypatch):
    """Apple clang on arm64: no OpenMP without Homebrew's libomp, and some versions refuse
    -march=native. The kernels build without both and status() says why."""
    mac = _script(tmp_path / "cc", 'for a in "$@"; do case "$a" in\n'
                  "  -march=native) echo \"clang: error: the clang compiler does not support '-march=native'\" >&2;"
                  " exit 1;;\n"
                  "  -fopenmp) echo \"clang: error: unsupported option '-fopenmp'\" >&2; exit 1;;\n"
                  "esac; done")
    monkeypatch.setenv("CC", mac)
    lib, why = _load()
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel
    assert "without -march=native (clang: error: the clang compiler does not support '-march=native')" in why
    if kernels_build.openmp_flags(COMPILER):  # where the real compiler would have shared torch's OpenMP
        assert "without OpenMP (clang: error: unsupported option '-fopenmp')" in why
    assert lib.fp8lab_openmp() == 0 and "POSIX threads" in why
    _agrees_with_torch(lib, monkeypatch)


def test_clang_builds_the_same_kernels(cache, monkeypatch):
    """Debian's clang stands in for a Mac's (.ci/run installs it; skipped where it is missing)."""
    clang = shutil.which("clang")
    if clang is None:
        pytest.skip("clang is not installed (Debian: apt-get install clang; .ci/run installs it)")
    monkeypatch.setenv("CC", clang)
    lib, why = _load()
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel
    assert "built with clang" in why
    _agrees_with_torch(lib, monkeypatch)


# ---- what a user's machine does to a library and a compiler --------------------------------------------------


TRUNCATED = """
import sys
from pathlib import Path
from fp8lab.numerics import kernels, kernels_build
target = kernels_build.library_path(kernels_build.compiler(), kernels_build.FLAGS + kernels_build.NATIVE
                                    + kernels_build.openmp_flags(kernels_build.compiler()))
target.parent.mkdir(parents=True, mode=0o700)
target.write_bytes(Path(sys.argv[1]).read_bytes()[:int(sys.argv[2])])
target.chmod(0o700)
digest = Path(sys.argv[1] + ".sha256")
target.with_name(target.name + ".sha256").write_bytes(digest.read_bytes())  # the whole library's checksum
target.with_name(target.name + ".sha256").chmod(0o600)
import torch, fp8lab
ok, why = kernels.status()
q = fp8lab.quantize(torch.randn(64, 64), granularity="1x32")
print(ok, "|", why)
"""


@pytest.mark.parametrize("size", [1024, 16 * 1024])
def test_a_truncated_cached_library_is_rebuilt_never_loaded(cache, size):
    """A cached library is loaded only if its bytes are the ones its build recorded: loaded, a real prefix
    (1-20 KB) of a built library kills the first quantize with SIGBUS inside ctypes.CDLL (the loader maps
    what the headers promise), on every start. In a process of its own."""
    proc = subprocess.run([sys.executable, "-c", TRUNCATED, str(SESSION_LIBRARY), str(size)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "XDG_CACHE_HOME": str(cache.parent)})
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    ok, why = proc.stdout.strip().rsplit("\n", 1)[-1].split(" | ", 1)
    assert ok == "True" and "not loaded: its bytes are not those its build wrote" in why, why


def test_truncated_or_unrecorded_libraries_are_never_intact(cache):
    """Every prefix is refused before the loader sees it, and so is a library whose checksum is missing."""
    library = _seed(cache)
    whole = library.read_bytes()
    assert kernels_build._intact(library) == ""
    for size in (64, 1024, 4096, 20 * 1024, len(whole) - 1):
        library.write_bytes(whole[:size])
        assert "not those its build wrote" in kernels_build._intact(library), size
    library.write_bytes(whole)
    library.with_name(library.name + ".sha256").unlink()
    assert "no checksum" in kernels_build._intact(library)


def test_a_compiler_that_hides_symbols_still_exports_the_kernels(cache, tmp_path, monkeypatch):
    """A compiler wrapper adding -fvisibility=hidden: the entry points are marked for export in the source."""
    hidden = _script(tmp_path / "cc", 'set -- -fvisibility=hidden "$@"')
    monkeypatch.setenv("CC", hidden)
    lib, why = _load()
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel
    for name in kernels_build.EXPORTED:
        assert hasattr(lib, name), name
    assert set(kernels_build.EXPORTED) >= {"fp8lab_quantize", "fp8lab_scale_outer", "fp8lab_rule_names"}
    source = kernels_build.SOURCE.read_text()
    defined = set(re.findall(r"^[A-Za-z][\w \t*]*\b(fp8lab_\w+)\s*\(", source, re.M))
    assert defined == set(kernels_build.EXPORTED)  # every fp8lab_ function defined is marked for export


def test_a_library_without_fp8labs_functions_falls_back_to_torch(cache, tmp_path, monkeypatch, stub_source):
    """A library that loads but lacks fp8lab's symbols turns the kernels off, with the reason: used, it
    makes every quantize raise AttributeError and doctor crash."""
    renaming = _script(tmp_path / "cc", 'set -- -Dfp8lab_quantize=fp8lab_quantize_elsewhere "$@"')
    monkeypatch.setenv("CC", renaming)
    lib, why = _load()
    assert lib is None
    assert "lacks fp8lab_quantize" in why and "quantization runs in torch" in why


def test_a_library_without_fp8labs_functions_leaves_quantize_and_doctor_working(cache, tmp_path):
    """The same, as a user meets it: a fresh process, quantize and the doctor's report."""
    renaming = _script(tmp_path / "cc", 'set -- -Dfp8lab_scale_outer=fp8lab_scale_outer_elsewhere "$@"')
    code = ("import torch, fp8lab; from fp8lab.lab import doctor; "
            "q = fp8lab.quantize(torch.randn(64, 64), granularity='1x32'); "
            "print([line for line in doctor.report(probe=False).splitlines() if 'quantize' in line][0])")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CC": renaming, "XDG_CACHE_HOME": str(cache.parent)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "lacks fp8lab_scale_outer" in proc.stdout


def test_threads_asking_together_build_once(tmp_path):
    """A first use from 8 threads runs the compiler exactly as often as one thread does (one build), not
    once per thread (8 builds of _kernels.c, each thread loading its own)."""
    runs = {}
    for threads in (1, 8):
        log = tmp_path / f"compiler-{threads}.log"
        counting = _script(tmp_path / f"cc{threads}", f'echo "$*" >> {log}')
        code = ("import threading; from fp8lab.numerics import kernels; "
                f"ts = [threading.Thread(target=kernels.status) for _ in range({threads})]; "
                "[t.start() for t in ts]; [t.join() for t in ts]; print(kernels.status()[0])")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "CC": counting, "XDG_CACHE_HOME": str(tmp_path / f"xdg{threads}")})
        assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr[-2000:]
        runs[threads] = log.read_text().splitlines()
    assert len(runs[8]) == len(runs[1]) and sum(" -o " in line for line in runs[8]) == 1, runs


@pytest.mark.parametrize("how", ["with an option", "behind a launcher"])
def test_cc_is_a_command_line(cache, monkeypatch, stub_source, how):
    """CC is a command line: CC="ccache gcc" or CC="cc -O2" builds the kernels (taken as one file name, it
    turns them off)."""
    cc = f"{COMPILER} -O2" if how == "with an option" else f"env FP8LAB_UNUSED=1 {COMPILER}"
    monkeypatch.setenv("CC", cc)
    lib, why = _load()
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel
    assert kernels_build.compiler() == cc.split()
    assert kernels_build.library_path(cc.split(), kernels_build.FLAGS) != kernels_build.library_path(
        [COMPILER], kernels_build.FLAGS)  # another command line, another build
    monkeypatch.setenv("CC", "cc 'unbalanced")
    with pytest.warns(UserWarning, match="not a command line"):
        lib, why = _load()
    assert lib is None and "quantization runs in torch" in why


def test_a_hanging_compiler_is_stopped_with_its_children_and_said(cache, tmp_path, monkeypatch, stub_source, capfd):
    """Every compiler run of a load shares one deadline, a run in progress says so on stderr, and a run
    past the deadline is stopped with everything it started: a hanging compiler otherwise blocks the
    first quantize (150 s, without a word) and leaves its children running."""
    pids = tmp_path / "children"
    hanging = tmp_path / "cc"
    # a child holding the compiler's output pipes, and one that does not (a daemon it started)
    hanging.write_text(f"#!/bin/sh\nsleep 600 &\necho $! >> {pids}\nsleep 600 </dev/null >/dev/null 2>&1 &\n"
                       f"echo $! >> {pids}\nwait\n")
    hanging.chmod(0o755)
    monkeypatch.setenv("CC", str(hanging))
    monkeypatch.setattr(kernels_build, "NOTICE_S", 0.2)
    lib, why = kernels_build.load_uncached(timeout_s=2.0)
    assert lib is None
    assert "did not finish within 2 s" in why and "quantization runs in torch" in why
    assert "fp8lab: compiling the CPU kernels with cc" in capfd.readouterr().err
    children = [int(p) for p in pids.read_text().split()]
    assert children
    deadline = time.monotonic() + 30  # (a hang guard: they are killed at once)
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in children)


SLEEPING = """
import torch, fp8lab
from fp8lab.numerics import kernels
x = torch.randn(64, 64)
q = fp8lab.quantize(x, granularity="1x32")  # the first quantize: the build starts here
assert torch.equal(q.dequantize(), fp8lab.quantize(x, granularity="1x32").dequantize())
print(*kernels.status(), sep=" | ")
"""


def test_a_hung_compiler_is_announced_given_up_on_within_the_stated_bound_and_doctor_says_why(tmp_path):
    """A compiler that sleeps (CC), with FP8LAB_BUILD_TIMEOUT=2: the first quantize says on stderr that the
    kernels are being compiled and for at most how long, gives up at that bound, quantizes in torch, and says
    so; a new process's doctor gives the reason. (The subprocesses' own timeouts are the hang guard.)"""
    sleeper = tmp_path / "bin" / "cc"
    sleeper.parent.mkdir()
    sleeper.write_text("#!/bin/sh\nsleep 600\n")
    sleeper.chmod(0o755)
    env = {**os.environ, "CC": str(sleeper), "FP8LAB_BUILD_TIMEOUT": "2", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    proc = subprocess.run([sys.executable, "-c", SLEEPING], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ok, why = proc.stdout.strip().splitlines()[-1].split(" | ", 1)
    assert ok == "False" and "the C compiler (cc) did not finish within 2 s" in why, why
    assert why.endswith("quantization runs in torch")
    notices = [line for line in proc.stderr.splitlines() if line.startswith("fp8lab: ")]
    assert notices[0] == ("fp8lab: compiling the CPU kernels with cc (first use; at most 2 s, then quantization runs "
                          "in torch; FP8LAB_KERNELS=0 skips it) ...")
    assert notices[1:] == [f"fp8lab: {why}"]  # once each: the start, the outcome
    doctor = subprocess.run([sys.executable, "-m", "fp8lab", "doctor"], capture_output=True, text=True,
                            timeout=300, env=env)
    assert doctor.returncode == 0, doctor.stderr[-2000:]
    assert f"  quantize    {why}" in doctor.stdout.splitlines()


def test_a_normal_build_says_once_that_it_compiles(cache, stub_source, capfd):
    lib, why = kernels_build.load_uncached(timeout_s=60)
    assert lib is not None and hasattr(lib, "fp8lab_quantize"), why  # a library that exports the kernel
    err = capfd.readouterr().err
    assert err.count("fp8lab: compiling the CPU kernels with") == 1 and "at most 60 s" in err, err
    lib, why = kernels_build.load_uncached(timeout_s=60)  # cached now: nothing to say
    assert lib is not None and "compiling" not in capfd.readouterr().err


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf"])
def test_a_build_timeout_that_is_not_a_number_of_seconds_is_said(monkeypatch, value):
    monkeypatch.setenv("FP8LAB_BUILD_TIMEOUT", value)
    with pytest.warns(UserWarning, match="FP8LAB_BUILD_TIMEOUT=.* is not a number of seconds above 0"):
        lib, why = _load()
    assert lib is None and "quantization runs in torch" in why
    monkeypatch.setenv("FP8LAB_BUILD_TIMEOUT", "30")
    assert fp8lab.settings.build_timeout(90.0) == 30.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.parametrize("value", ["maybe", "2", "of"])
def test_an_fp8lab_kernels_value_that_means_nothing_is_said(monkeypatch, value):
    """An unrecognised FP8LAB_KERNELS value warns and turns the kernels off, rather than silently meaning on."""
    monkeypatch.setenv("FP8LAB_KERNELS", value)
    with pytest.warns(UserWarning, match="FP8LAB_KERNELS"):
        lib, why = _load()
    assert lib is None
    assert f"FP8LAB_KERNELS={value!r}" in why and "1, true, yes, on" in why and "0, false, no, off" in why
    for on in ("", "1", "on", " Yes "):
        monkeypatch.setenv("FP8LAB_KERNELS", on)
        assert fp8lab.settings.kernels_requested()
