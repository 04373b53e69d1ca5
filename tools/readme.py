"""The README's generated blocks, from the package's own data: the sink cliff table.

    python tools/readme.py           write them
    python tools/readme.py --check   exit 1 where the README differs (tests/test_docs.py runs it)

The block sits between `<!-- cliff:begin -->` and `<!-- cliff:end -->`: final loss against each
run's own run without sinks, mean of the shipped seeds (fp8lab.training.measured).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SINKS = (1e3, 1e4, 1e5, 1e6, 1e7)


def cliff_table() -> str:
    from fp8lab.figures.plots import magnitude
    from fp8lab.training.measured import cliff_means

    _, _, change = cliff_means()
    runs = [r for r in dict.fromkeys(change.index.get_level_values("run")) if r != "fp32"]
    head = "| run | " + " | ".join(f"sinks {magnitude(s)}" for s in SINKS) + " |"
    rows = [head, "|---|" + "---|" * len(SINKS)]
    for run in runs:
        cells = [f"{100 * change[run, s]:+.0f}%" if abs(change[run, s]) >= 0.1 else f"{100 * change[run, s]:+.1f}%"
                 for s in SINKS]
        rows.append(f"| {run} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def blocks() -> dict[str, str]:
    return {"cliff": cliff_table()}


def filled(text: str) -> str:
    for name, body in blocks().items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        head, rest = text.split(begin)
        _, tail = rest.split(end)
        text = f"{head}{begin}\n{body}\n{end}{tail}"
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the README differs, write nothing")
    args = p.parse_args(argv)
    text = README.read_text()
    new = filled(text)
    if args.check:
        if new != text:
            print("README.md's generated blocks are stale: run python tools/readme.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
