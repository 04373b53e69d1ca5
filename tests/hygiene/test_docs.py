"""The front door and the docs: the README stays short, every file it or the docs link exists, its
generated blocks are current, and what it claims holds on the data the lab ships."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab.training.measured import cliff_means, first_break, recovery

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, ROOT / "FACILITATOR.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the rest to docs/"
    for needed in ("make lab", "make test", "docs/internals.md", "docs/performance.md", "docs/testing.md",
                   "FACILITATOR.md", "notebooks/ANSWERS.md", "docs/install.md"):
        assert needed in README.read_text(), needed


@pytest.mark.parametrize("doc", [d for d in DOCS if d.exists()], ids=lambda d: str(d.relative_to(ROOT)))
def test_every_file_a_doc_links_exists(doc):
    missing = []
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        if not path.exists():
            missing.append(target)
    assert not missing, f"{doc.relative_to(ROOT)} links files that do not exist: {missing}"


def test_the_readmes_generated_blocks_are_current():
    # (the timeouts guard against a hang only: a loaded machine takes minutes for 10 s of CPU)
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "readme.py"), "--check"], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr


def test_what_the_readme_says_of_the_sink_cliff_holds_on_the_shipped_runs():
    _, _, change = cliff_means()
    recipes = [r for r in dict.fromkeys(change.index.get_level_values("run")) if r != "fp32"]
    for recipe in recipes:  # "every FP8 recipe ends within a fraction of a percent" at 1e3-1e4
        assert abs(change[recipe, 1e3]) < 0.01 and abs(change[recipe, 1e4]) < 0.01, recipe
    for recipe in ("tensorwise", "delayed", "rowwise"):  # "break between 10^5 and 10^6"
        assert first_break(change, recipe) in (1e5, 1e6), recipe
    for recipe in ("blockwise", "mxfp8"):  # "hold to 10^7"
        assert first_break(change, recipe) is None, recipe
    steps = recovery().set_index("history")["steps_to_recover"]
    assert steps[4] == 4  # "a 4-step history recovers ... in 4 steps"
    assert steps[256] is None or steps[256] != steps[256]  # "a 256-step one not within the run" (None or NaN)


SNIPPET = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _snippets():
    for doc in (d for d in [README, *sorted((ROOT / "docs").glob("*.md"))] if d.exists()):
        for i, code in enumerate(SNIPPET.findall(doc.read_text())):
            yield pytest.param(doc, code, id=f"{doc.relative_to(ROOT)}[{i}]")


@pytest.mark.parametrize("doc, code", list(_snippets()))
def test_every_python_snippet_of_the_readme_and_the_docs_runs(doc, code, tmp_path):
    """A snippet a reader copies runs as printed, in a fresh process (the front door's example once
    failed on a name fp8lab did not export). A notebook cell shown in the docs (IPython magics: %, !)
    is the cell the notebooks open with, which the notebook tests run."""
    if any(line.lstrip().startswith(("%", "!")) for line in code.splitlines()):
        import nbformat

        firsts = {next(c.source for c in nbformat.read(nb, as_version=4).cells if c.cell_type == "code")
                  for nb in (ROOT / "notebooks").glob("*.ipynb")}
        assert code.strip() in {f.strip() for f in firsts}, "a notebook cell in the docs that no notebook opens with"
        return
    script = tmp_path / "snippet.py"
    script.write_text("import matplotlib\nmatplotlib.use('Agg')\n" + code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, f"{doc.relative_to(ROOT)}:\n{code}\n{proc.stderr[-3000:]}"


def _measured_rows(name: str, part: str) -> list[list[str]]:
    """The rows of one table of a device run's output, kept as printed in docs/measured/."""
    text = (ROOT / "docs" / "measured" / name).read_text().split(f"\n{part} ", 1)[1].split("\n\n", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[4:]]


def test_the_h200_tables_are_the_device_runs_output():
    """docs/gpu.md and docs/performance.md quote the H200 run kept in docs/measured/ (copied, not retyped)."""
    gpu, perf = (ROOT / "docs" / "gpu.md").read_text(), (ROOT / "docs" / "performance.md").read_text()
    speed = _measured_rows("bench_gpu_h200.txt", "(e)")
    assert len(speed) == 9
    for what, _, ms, tflops, ratio in speed:
        if ms == "-":
            continue
        row = f"| {what.replace('torch.mm 8192^3', '`torch.mm`')} | {ms} | {tflops} | {ratio} |"
        assert row in gpu and row in perf, row
    for k, *errors in _measured_rows("bench_gpu_h200.txt", "(d)"):
        assert f"| {k} | {' | '.join(errors)} |" in gpu, k
    panel = {}
    for line in (ROOT / "docs" / "measured" / "timing_panel_h200.txt").read_text().splitlines()[1:]:
        n, recipe = line.split()[:2]
        ms = re.findall(r"([\d.]+) ms", line)
        panel.setdefault(n, {"fp32": ms[0], "bf16": ms[1]})[recipe] = f"{float(ms[2]):.3f} ({line.split()[-1]})"
    assert len(panel) == 4
    for n, t in panel.items():
        fp32 = t["fp32"] if float(t["fp32"]) < 10 else f"{float(t['fp32']):.2f}"
        row = f"| {n} | {fp32} | {t['bf16']} | {t['tensorwise']} | {t['rowwise']} | {t['blockwise']} |"
        assert row in gpu, row
