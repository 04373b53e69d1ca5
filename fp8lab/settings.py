"""Run-wide settings, read from the environment each time they are asked for (never at import).

Public: smoke(), kernels_requested(), build_timeout(default), size(workshop, smoke), keep_freed_memory().
FP8LAB_DRAW=sync|thread chooses how panels redraw (auto: fp8lab.lab.panels.base.draw_mode).
FP8LAB_SMOKE=1 shrinks sizes and steps so every notebook runs in seconds in CI; without
it, everything is workshop-sized. FP8LAB_KERNELS=0 turns off the fused CPU kernels
(fp8lab.numerics.kernels): same numbers, computed in torch; kernels.engine() asks once per process,
when quantize first needs it, and says what it decided (python -m fp8lab doctor). FP8LAB_BUILD_TIMEOUT
bounds the seconds the C compiler may take to build them (kernels_build.BUILD_TIMEOUT_S by default). Nothing
else in fp8lab reads the environment (but kernels.py honours CC and XDG_CACHE_HOME to
build them, and fp8lab.threads reads the OpenMP variables a user may have set). Settings written
once, when fp8lab is imported: pin_blas_reproducibility() asks MKL for GEMMs whose bits do not
depend on the thread count (MKL_CBWR, unless already set); fp8lab.threads sets OpenMP's wait
policy and, under a CPU quota, its thread count (unless already set). docs/internals.md ("What importing fp8lab
changes") lists every process-wide effect of `import fp8lab` with its reason; tests/test_threads.py checks them.
Written by fp8lab.setup() and the benchmarks: keep_freed_memory() (glibc keeps freed blocks for reuse).
"""

from __future__ import annotations

import ctypes
import os
import platform
from functools import lru_cache

__all__ = ["BLAS_REPRODUCIBLE", "DRAW_MODES", "build_timeout", "draw_requested", "keep_freed_memory",
           "kernels_requested", "pin_blas_reproducibility", "size", "smoke"]

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def smoke() -> bool:
    """FP8LAB_SMOKE is set to 1 (true, yes, on): small sizes and few steps, for CI."""
    return os.environ.get("FP8LAB_SMOKE", "").strip().lower() in _ON


def kernels_requested() -> bool:
    """FP8LAB_KERNELS is unset, empty or 1 (true, yes, on): the fused CPU kernels may be built and
    used; 0 (false, no, off): not. Any other value raises ValueError naming these."""
    value = os.environ.get("FP8LAB_KERNELS", "").strip().lower() or "1"
    if value not in _ON + _OFF:
        raise ValueError(f"FP8LAB_KERNELS={os.environ['FP8LAB_KERNELS']!r} means neither on nor off; valid: "
                         f"{', '.join(_ON)} (on) or {', '.join(_OFF)} (off)")
    return value in _ON


def build_timeout(default: float) -> float:
    """FP8LAB_BUILD_TIMEOUT: the seconds every C compiler run of one kernel build may take together (a
    compiler that hangs is stopped then, and quantization runs in torch); unset or empty: `default`. A value
    that is not a number of seconds above 0 raises ValueError naming what it takes."""
    text = os.environ.get("FP8LAB_BUILD_TIMEOUT", "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"FP8LAB_BUILD_TIMEOUT={os.environ['FP8LAB_BUILD_TIMEOUT']!r} is not a number of seconds "
                         f"above 0 (e.g. 30; unset: {default:g})")
    return value


DRAW_MODES = ("auto", "thread", "sync")


def draw_requested() -> str:
    """FP8LAB_DRAW: how panels redraw (fp8lab.lab.panels.base.draw_mode decides "auto" once per process)."""
    value = os.environ.get("FP8LAB_DRAW", "auto").strip().lower() or "auto"
    if value not in DRAW_MODES:
        raise ValueError(f"FP8LAB_DRAW={value!r} is not a drawing mode; valid: {', '.join(DRAW_MODES)}")
    return value


def size(workshop: int, smoke_size: int) -> int:
    """`workshop` normally, `smoke_size` under FP8LAB_SMOKE=1 (read now)."""
    return smoke_size if smoke() else workshop


# MKL's conditional numerical reproducibility (x86 builds of torch use MKL for fp32 GEMMs): STRICT
# gives the same bits with any number of threads; AUTO keeps the fastest code path for this CPU.
BLAS_REPRODUCIBLE = "AUTO,STRICT"


def pin_blas_reproducibility() -> str:
    """Set MKL_CBWR to BLAS_REPRODUCIBLE unless the user set it; return the value in force.

    MKL reads the variable at its first call, so this runs when fp8lab is imported: in a process
    that has multiplied matrices before importing fp8lab, MKL keeps what it read then. Without it
    MKL splits a GEMM's sums differently with 1 and 2 threads, and a last-bit difference that fp32
    training shrugs off moves an FP8 run: a value near a rounding boundary of E4M3 takes the other
    code (a 2^-4 relative step), and the runs drift apart."""
    return os.environ.setdefault("MKL_CBWR", BLAS_REPRODUCIBLE)


@lru_cache(maxsize=1)
def keep_freed_memory() -> str:
    """Let glibc reuse freed blocks of up to 32 MiB instead of returning them to the OS. Emulated FP8 makes many
    short-lived tensors of a few MiB (codes, values, scaled products), which glibc serves from fresh mmap'd pages by
    default, so every step pays the page faults of touching new memory again (the toy MLP's mxfp8 step, 2 cores:
    17.6 ms without this, 15.0 ms with it; fp32 and tensorwise unchanged). Raising the mmap threshold to its maximum
    (32 MiB) and the trim threshold keeps those pages in the heap for the next step, as jemalloc or tcmalloc would.
    Process-wide and harmless (the memory stays with the process for reuse). Returns what was done, once."""
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
