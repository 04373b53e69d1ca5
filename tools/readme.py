"""The README's generated blocks: the notebook map (learner minutes from FACILITATOR.md), the sink
cliff table (the shipped runs) and the speed table (docs/performance.md's measured tables).

    python tools/readme.py           write them
    python tools/readme.py --check   exit 1 where the README differs (tests/hygiene/test_docs.py runs it)

Each block sits between `<!-- NAME:begin -->` and `<!-- NAME:end -->`. The map's minutes are the
"solo" column of FACILITATOR.md's learner-minutes table, the one place they live; the cliff is the
final loss against each run's own run without sinks, mean of the shipped seeds
(fp8lab.training.measured); the speed table joins performance.md's notebooks and widgets tables
(written from `python -m fp8lab bench notebooks` and `bench widgets`) per notebook, with their
date-and-machine line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FACILITATOR = ROOT / "FACILITATOR.md"
PERFORMANCE = ROOT / "docs" / "performance.md"
SINKS = (1e3, 1e4, 1e5, 1e6, 1e7)
# what a learner does and meets in each notebook (the README's words; the notebooks say it at length)
TEACHES = {
    "00_setup_check": "what this machine runs real and emulated, and why; where FP8 sits in a training step; a first "
                      "timing",
    "01_fp8_formats": "click the bits of E4M3, E5M2, E8M0, E2M1: value, neighbours, gap, rounding; number lines; "
                      "precision in dB",
    "02_per_tensor_scaling": "amax, scale, overflow, underflow, margin; outlier channels flush the ordinary values "
                             "while the whole-tensor SQNR looks fine; the outlier cliff per recipe",
    "03_delayed_scaling": "an amax history against a spike and drift; history length, max vs most recent, margin",
    "04_per_block_scaling": "block size from 1x16 to per-tensor; scale heatmaps; SQNR against the scales' cost; "
                            "MX's E8M0 floor vs rceil",
    "05_fp8_gemm": "the three GEMMs of a linear layer; the error per recipe; accumulation precision and K "
                   "(DeepSeek-V3's 14 bits); speed here",
    "06_training_live": "a toy model trains live, recipes side by side, the sink channels; why per-tensor and "
                        "rowwise break; per-layer monitors; delayed scaling when the data change",
    "07_beyond_one_machine": "one process against two under FSDP2; where ranks must agree on an amax; the recipe "
                             "for torchao, TransformerEngine, torchtitan",
    "08_your_model": "predict, then inspect and train: an LLM-like model, real text, real images; a use-case rule "
                     "of thumb tested; the cost side",
    "09_below_eight_bits": "the gradient side: dy's range, E4M3 vs E5M2, per tensor vs 1x128; NVFP4's training recipe "
                           "part by part (2-D weight blocks, a Hadamard transform, stochastic rounding, layers in "
                           "bf16), each measured on a run",
}


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


def learner_minutes() -> dict[str, int]:
    """{notebook: solo minutes} from FACILITATOR.md's learner-minutes table."""
    out = {}
    for line in FACILITATOR.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in TEACHES and cells[1].isdigit():
            out[cells[0]] = int(cells[1])
    return out


_WORDS = {9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}


def notebook_map() -> str:
    minutes = learner_minutes()
    missing = set(TEACHES) - set(minutes)
    if missing:
        raise ValueError(f"FACILITATOR.md's learner-minutes table lacks {sorted(missing)}")
    rows = ["| notebook | what you do and learn | minutes |", "|---|---|---|"]
    rows += [f"| [{nb}](notebooks/{nb}.ipynb) | {what} | {minutes[nb]} |" for nb, what in TEACHES.items()]
    total = sum(minutes.values())
    every = _WORDS.get(len(TEACHES), len(TEACHES))
    rows.append(f"| all {every} | | {total} (about {total // 60} h {total % 60:02d}) |")
    return "\n".join(rows)


def markdown_table(section: str, which: int = 0) -> tuple[str, list[dict[str, str]]]:
    """(the measured-on line, the rows) of table number `which` (0: the first) under performance.md's
    `## section`; the measured-on line is the first of the section."""
    text = PERFORMANCE.read_text().split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    measured = re.search(r"Measured (\d{4}-\d\d-\d\d, [^\n]*?)[:;]", text)
    tables, current = [], []
    for ln in [*text.splitlines(), ""]:
        if ln.startswith("|"):
            current.append(ln)
        elif current:
            tables.append(current)
            current = []
    if measured is None or len(tables) <= which or len(tables[which]) < 3:
        raise ValueError(f"docs/performance.md's '{section}' section lacks its measured line or table {which}")
    lines = tables[which]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")), strict=True)) for ln in lines[2:]]
    return measured.group(1), rows


LOADED = "A shared machine: bench load and bench room"


def loaded_rows() -> list[str]:
    """The speed table's rows for notebooks 06 and 08 beside a busy program (two spinning processes in a group of
    their own; kernels as `fp8lab lab` starts them; both runs), and the sentence under the table naming where and
    when they were measured."""
    when, runs = markdown_table(LOADED, 0)
    _, drags = markdown_table(LOADED, 1)
    out = []
    for nb, stem in (("06", "06_training_live"), ("08", "08_your_model")):
        row = next(r for r in runs if r["notebook, start"] == f"{nb}, lab")
        busy = [row["busy, run 1"], row["busy, run 2"]]
        times = " / ".join(b.split()[0] for b in busy)
        ratios = " / ".join(b.split()[1].strip("()") for b in busy)
        drag = "no live slider"
        if nb == "06":
            loaded = [d for d in drags if d["start"] == "lab" and d["condition"] == "busy"]
            worst = [max(loaded, key=lambda d, k=k: float(d[k].split(" / ")[0])) for k in ("run 1", "run 2")]
            drag = (" / ".join(w[k].split(" / ")[0] for w, k in zip(worst, ("run 1", "run 2"), strict=True))
                    + f" ({worst[0]['panel']}; from a value to its frame)")
        out.append(f"| {stem}, beside a busy program | {times} ({ratios} its quiet run) | {drag} |")
    return [*out, "", f"The rows beside a busy program (two spinning processes): `python -m fp8lab bench load`, two "
                      f"runs, kernels as `fp8lab lab` starts them, kernel start included, each against the quiet run "
                      f"of its round, measured {when}; [performance](docs/performance.md#a-shared-machine-bench-load-"
                      "and-bench-room) "
                      "has the spinners in the kernel's own group, the CPU quota, the other start ways and the "
                      "settings compared."]


def panels_in(notebook: str) -> list[str]:
    """The PANELS names whose class a notebook's code cells construct."""
    from fp8lab.lab.panels import PANELS

    code = "".join("".join(c["source"]) for c in json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text())
                   ["cells"] if c["cell_type"] == "code")
    return [name for name, make in PANELS.items() if re.search(rf"\b{make.__name__}\(", code)]


def speed_table() -> str:
    when, runs = markdown_table("Notebooks")
    when_w, widgets = markdown_table("Widgets")
    if when.split(",")[0] != when_w.split(",")[0]:
        raise ValueError("docs/performance.md's notebooks and widgets tables were measured on different days")
    run_s = {r["notebook"]: r["run all s"] for r in runs}
    redraw = {r["panel"]: r for r in widgets}
    # a notebook or panel the measured tables do not have yet is said so, not guessed
    rows = [f"Measured {when}:", "",
            "| notebook | Run All, s | slider drag: median redraw, ms (slowest live panel) |", "|---|---|---|"]
    for nb in TEACHES:
        if nb not in run_s or any(p not in redraw for p in panels_in(nb)):
            rows.append(f"| {nb} | not measured yet | not measured yet |")
            continue
        live = [redraw[p] for p in panels_in(nb) if redraw[p]["live"] == "yes"]
        slowest = max(live, key=lambda r: float(r["median ms"]), default=None)
        drag = f"{slowest['median ms']} ({slowest['panel']})" if slowest else "no live slider"
        rows.append(f"| {nb} | {run_s[nb]} | {drag} |")
    return "\n".join([*rows, *loaded_rows()])


def blocks() -> dict[str, str]:
    return {"notebook-map": notebook_map(), "cliff": cliff_table(), "speed": speed_table()}


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
