"""The C kernels' tests under AddressSanitizer (`make asan`; not part of `make test`).

Builds _kernels.c with -fsanitize=address (the production flags otherwise: -O3, -march=native,
torch's OpenMP where it can be shared), loads it in place of the normal build, and runs the
kernel, hardening, format and fuzz tests against it in a Python started with libasan preloaded
(a ctypes-loaded library cannot bring its own ASan runtime). Any out-of-bounds read or write
aborts the run with ASan's report; a clean run prints the number of tests and the time.

    python tools/asan.py                       # FP8LAB_FUZZ_EXAMPLES defaults to 200 here
    python tools/asan.py -k monitor            # extra pytest arguments
    python tools/asan.py --canary              # proof that it can fail: a one-element overrun planted
                                               # in the amax loop must stop the run with ASan's report
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = [f"tests/numerics/test_{name}.py" for name in ("kernels", "hardening", "formats", "fuzz")]
# the two tests that build or load other libraries (no compiler, the portable build): not this one's business
SKIP = "not unbuildable and not portable_build"
ASAN = ("-fsanitize=address", "-fno-omit-frame-pointer", "-g")


def _compiler() -> list[str]:
    cc = os.environ.get("CC", "").strip()
    argv = shlex.split(cc) if cc else [c for c in (shutil.which("cc") or shutil.which("gcc"),) if c]
    if not argv:
        sys.exit("asan: no C compiler (cc)")
    return argv


def _libasan(cc: list[str]) -> str:
    found = subprocess.run([*cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(found):
        sys.exit(f"asan: {' '.join(cc)} has no libasan (gcc's -fsanitize=address needs it; Debian: libasan8)")
    return found


CANARY = ("for (int64_t i = 0; i < MB * KB; i++) out[i] = 0u;", "for (int64_t i = 0; i <= MB * KB; i++) out[i] = 0u;")


def child(pytest_args: list[str]) -> int:
    """In the process with libasan preloaded: build, load, run the tests."""
    import pytest

    from fp8lab.numerics import kernels, kernels_build

    if os.environ.get("FP8LAB_ASAN_CANARY"):
        import tempfile

        planted = Path(tempfile.mkdtemp()) / "_kernels.c"
        source = kernels_build.SOURCE.read_text()
        assert source.count(CANARY[0]) == 1, "the canary's line is gone from _kernels.c"
        planted.write_text(source.replace(*CANARY))
        kernels_build.SOURCE = planted
        pytest_args = [*pytest_args, "-k", "block_amax_twins"]
    cc = _compiler()
    flags = kernels_build.FLAGS + kernels_build.NATIVE + kernels_build.openmp_flags(cc) + ASAN
    path = kernels_build.build(cc, flags)
    import ctypes
    import functools

    reason = f"AddressSanitizer build ({path.name}: {' '.join(flags)})"

    @functools.lru_cache(maxsize=1)
    def load() -> tuple[ctypes.CDLL, str]:  # (cached like kernels._load: a test that clears it binds it again)
        lib = kernels._bind(ctypes.CDLL(str(path)))
        if not lib.fp8lab_openmp():
            lib.fp8lab_set_threads(2)  # (POSIX threads: split the large tensors too)
        return lib, reason

    kernels._load = load
    kernels._process_engine.cache_clear()
    kernels_build._LOADED[:] = [load()]  # (tests that ask the build module see this library too)
    print(f"asan: {kernels.engine()}", flush=True)
    start = time.perf_counter()
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-k", SKIP, *TESTS, *pytest_args])
    print(f"asan: pytest exit {int(code)} after {time.perf_counter() - start:.0f} s", flush=True)
    return int(code)


def main(argv: list[str]) -> int:
    if os.environ.get("FP8LAB_ASAN_CHILD"):
        return child(argv)
    import tempfile

    canary = "--canary" in argv
    argv = [a for a in argv if a != "--canary"]
    cc = _compiler()
    logs = Path(tempfile.mkdtemp(prefix="fp8lab-asan-"))  # ASan's reports (pytest captures stderr)
    env = {**os.environ, "FP8LAB_ASAN_CHILD": "1", "LD_PRELOAD": _libasan(cc),
           "FP8LAB_ASAN_CANARY": "1" if canary else "",
           # Python's own allocations are never freed at exit: leaks are not the question here
           "ASAN_OPTIONS": f"detect_leaks=0:halt_on_error=1:exitcode=99:log_path={logs / 'asan'}",
           "FP8LAB_FUZZ_EXAMPLES": os.environ.get("FP8LAB_FUZZ_EXAMPLES", "200"), "PYTHONPATH": str(ROOT),
           # the child binds the library before tests/conftest.py runs: give it the split threshold conftest sets
           "FP8LAB_PARALLEL_MIN": os.environ.get("FP8LAB_PARALLEL_MIN", "32768")}
    code = subprocess.run([sys.executable, __file__, *argv], cwd=ROOT, env=env).returncode
    reports = sorted(logs.glob("asan*"))
    for report in reports:
        print(report.read_text()[:6000])
    print(f"asan: {len(reports)} AddressSanitizer report(s)")
    if canary:
        print("asan: canary " + ("caught (ASan stopped the run), as it must be" if code == 99 else
                                 f"NOT caught (exit {code}): this ASan run would not see an overrun"))
        return 0 if code == 99 and reports else 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
