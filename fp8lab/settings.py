"""Run-wide settings, read from the environment each time they are asked for (never at import).

Public: smoke(), kernels_requested(), size(workshop, smoke).
FP8LAB_SMOKE=1 shrinks sizes and steps so every notebook runs in seconds in CI; without
it, everything is workshop-sized. FP8LAB_KERNELS=0 turns off the fused CPU kernels
(fp8lab.numerics.kernels): same numbers, computed in torch; kernels.engine() asks once per process,
when quantize first needs it, and says what it decided (python -m fp8lab doctor). Nothing
else in fp8lab reads the environment (but kernels.py honours CC and XDG_CACHE_HOME to
build them).
"""

from __future__ import annotations

import os

__all__ = ["kernels_requested", "size", "smoke"]

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def smoke() -> bool:
    """FP8LAB_SMOKE is set to 1 (true, yes, on): small sizes and few steps, for CI."""
    return os.environ.get("FP8LAB_SMOKE", "").strip().lower() in _ON


def kernels_requested() -> bool:
    """FP8LAB_KERNELS is not 0 (false, no, off): the fused CPU kernels may be built and used."""
    return os.environ.get("FP8LAB_KERNELS", "1").strip().lower() not in _OFF


def size(workshop: int, smoke_size: int) -> int:
    """`workshop` normally, `smoke_size` under FP8LAB_SMOKE=1 (read now)."""
    return smoke_size if smoke() else workshop
