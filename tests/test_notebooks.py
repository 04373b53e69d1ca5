"""The notebooks: stripped in git, import-only, exercises present, and they run top to
bottom without errors (smoke mode always; workshop mode marked slow, timed, memory-capped)."""

import json
import os
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NAMES = [p.stem for p in NOTEBOOKS]
WORKSHOP_LIMIT_S = 60.0
MEMORY_LIMIT_MB = 1536.0
PEAK = "import resource; print('PEAK_RSS_MB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"


def test_the_notebook_plan_is_complete():
    expected = ["00_setup_check", "01_fp8_formats", "02_per_tensor_scaling", "03_delayed_scaling",
                "04_per_block_scaling", "05_fp8_gemm", "06_training_live", "07_beyond_one_machine", "08_your_model"]
    assert [n for n in NAMES if n in expected] == [n for n in expected if n in NAMES]
    assert set(expected) - {"07_beyond_one_machine"} <= set(NAMES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_committed_stripped(path):
    raw = json.loads(path.read_text())
    assert "widgets" not in raw.get("metadata", {}), "widget state must not be committed"
    for cell in raw["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, "outputs must be stripped"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_notebooks_import_and_define_nothing_reusable(path):
    nb = nbformat.read(path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert code[0] == "import fp8lab\nfp8lab.setup()", "the first cell is the setup call"
    for src in code:
        assert not re.search(r"^\s*[!%]", src, re.M), "no shell or magic cells (no !pip)"
        assert "sys.path" not in src
        # functions are only defined as exercise answers, right before their checker
        if re.search(r"^(def|class) ", src, re.M):
            assert "ex.check_" in src, f"a definition outside an exercise: {src[:60]!r}"
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "## Summary" in text
    assert "**Next:**" in text


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem[:2] in {"01", "02", "03", "04", "05", "06", "08"}],
                         ids=lambda p: p.stem)
def test_every_workshop_notebook_has_an_exercise_with_a_hint_and_a_solution(path):
    src = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    assert "ex.check_" in src and "ex.hint_" in src and "ex.solution_" in src


def test_the_four_best_practices_are_taught():
    text = "\n".join(c.source for p in NOTEBOOKS for c in nbformat.read(p, as_version=4).cells).lower()
    for practice in ("experiment on small data first", "monitor per layer", "tune scale factors during training",
                     "normalize your data"):
        assert practice in text, practice


def _execute(path: Path, smoke: bool) -> tuple[nbformat.NotebookNode, float]:
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PEAK))
    env_before = os.environ.get("FP8LAB_SMOKE")
    os.environ["FP8LAB_SMOKE"] = "1" if smoke else "0"
    try:
        client = NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        t0 = time.perf_counter()
        client.execute()
        return nb, time.perf_counter() - t0
    finally:
        if env_before is None:
            os.environ.pop("FP8LAB_SMOKE", None)
        else:
            os.environ["FP8LAB_SMOKE"] = env_before


def _errors(nb) -> list[str]:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                out.append(f"{o['ename']}: {o['evalue']}")
            elif o.get("output_type") == "stream" and o.get("name") == "stderr" and "Traceback" in o.get("text", ""):
                out.append(o["text"][:500])
    return out


def _peak_mb(nb) -> float:
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    return float(text.split("PEAK_RSS_MB")[1])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_runs_top_to_bottom_in_smoke_mode(path):
    nb, _ = _execute(path, smoke=True)
    assert not _errors(nb), _errors(nb)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_runs_at_workshop_size_within_a_minute_and_1_5_gb(path, record_property):
    nb, seconds = _execute(path, smoke=False)
    assert not _errors(nb), _errors(nb)
    peak = _peak_mb(nb)
    record_property("seconds", seconds)
    record_property("peak_mb", peak)
    print(f"{path.stem}: {seconds:.1f} s, kernel peak {peak:.0f} MB")
    assert seconds <= WORKSHOP_LIMIT_S
    assert peak <= MEMORY_LIMIT_MB
