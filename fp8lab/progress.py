"""Progress bars for the work that runs longer than a few seconds: training, `inspect`, the capstone.

Public: progress_bar(iterable=None, total=None, desc=None), DELAY.
A tqdm.auto bar: a widget in a notebook, text on a terminal. It appears only once the work has run
DELAY seconds (quick calls show nothing) and stays, full, when the work is done (leave=True), so a
notebook shows how long each run took. Callers pass progress=False to go without one.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["DELAY", "progress_bar"]

DELAY = 2.0  # seconds before a bar appears


def progress_bar(iterable: Iterable | None = None, total: int | None = None, desc: str | None = None,
                 unit: str = "step"):
    """A tqdm.auto bar over `iterable` (or of `total` steps, advanced with .update(n)); close() it when done."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=True, delay=DELAY)
