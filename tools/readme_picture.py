"""The picture at the top of the README: one of the lab's panels, drawn as a notebook draws it.

    python tools/readme_picture.py [--panel CliffPanel] [--out docs/img/outlier_cliff.png]

The panel is built with its default controls at workshop size (FP8LAB_SMOKE=0), refreshed once, and
its PNG (the bytes its ipywidgets.Image shows) written to --out. The default is notebook 02's outlier
cliff: each recipe's SQNR on the ordinary channels as outlier channels grow, where per-tensor and
per-row scaling fall off and per-block scaling holds.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "img" / "outlier_cliff.png"


def draw(panel_name: str) -> bytes:
    """The PNG of panel `panel_name` (a class in fp8lab.lab.panels) with its default controls."""
    import fp8lab
    from fp8lab.lab import panels

    cls = getattr(panels, panel_name, None)
    if not (isinstance(cls, type) and issubclass(cls, panels.Panel)):
        names = sorted(n for n in dir(panels) if isinstance(getattr(panels, n), type)
                       and issubclass(getattr(panels, n), panels.Panel) and n != "Panel")
        raise ValueError(f"unknown panel {panel_name!r}; valid: {', '.join(names)}")
    fp8lab.setup(quiet=True)
    panel = cls()
    panel.refresh()
    if "error" in panel.data:
        raise RuntimeError(f"{panel_name} could not draw: {panel.data['error']}")
    return bytes(panel.image.value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--panel", default="CliffPanel", help="a panel class of fp8lab.lab.panels")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    os.environ.setdefault("FP8LAB_SMOKE", "0")
    try:
        png = draw(args.panel)
    except ValueError as err:
        parser.error(str(err))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(png)
    print(f"wrote {args.out} ({len(png) // 1024} KiB, {args.panel})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
