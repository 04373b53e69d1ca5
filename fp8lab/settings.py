"""Run-wide settings read once from the environment: only the CI smoke switch lives here.

Public: SMOKE, size(workshop, smoke).
FP8LAB_SMOKE=1 shrinks sizes and steps so every notebook runs in seconds in CI; without
it, everything is workshop-sized. Nothing else in fp8lab reads the environment.
"""

from __future__ import annotations

import os

__all__ = ["SMOKE", "size"]

SMOKE: bool = os.environ.get("FP8LAB_SMOKE", "").strip().lower() in ("1", "true", "yes", "on")


def size(workshop: int, smoke: int) -> int:
    """`workshop` normally, `smoke` under FP8LAB_SMOKE=1."""
    return smoke if SMOKE else workshop
