"""Run-wide settings read once from the environment.

Public: SMOKE, KERNELS, size(workshop, smoke).
FP8LAB_SMOKE=1 shrinks sizes and steps so every notebook runs in seconds in CI; without
it, everything is workshop-sized. FP8LAB_KERNELS=0 turns off the fused CPU kernels
(fp8lab.kernels): same numbers, computed in torch. Nothing else in fp8lab reads the
environment (but kernels.py honours CC and XDG_CACHE_HOME to build them).
"""

from __future__ import annotations

import os

__all__ = ["KERNELS", "SMOKE", "size"]

SMOKE: bool = os.environ.get("FP8LAB_SMOKE", "").strip().lower() in ("1", "true", "yes", "on")
KERNELS: bool = os.environ.get("FP8LAB_KERNELS", "1").strip().lower() not in ("0", "false", "no", "off")


def size(workshop: int, smoke: int) -> int:
    """`workshop` normally, `smoke` under FP8LAB_SMOKE=1."""
    return smoke if SMOKE else workshop
