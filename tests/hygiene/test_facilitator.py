"""FACILITATOR.md: the learner minutes (defined there once), a 3-hour plan that adds up with an opening, a close
and a buffer, every notebook in it or named after it, the training length the questions assume, a path for a
room without laptops, the key linked, and the smoke-mode differences it names are the ones the key shows."""

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "FACILITATOR.md"
NOTEBOOKS = [p.stem for p in sorted((ROOT / "notebooks").glob("0*.ipynb"))]
WORKSHOP_MINUTES = 180
HOWS = ("run", "demo", "talk", "-")
NOT_NOTEBOOKS = ("opening", "break", "buffer", "close")  # the plan's blocks that are not a notebook
HUB = "#running-the-workshop-on-one-jupyterhub-or-binder-node"  # the hub section's heading, as an anchor


def _section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _table(section: str) -> list[list[str]]:
    """The rows of the first Markdown table in `section` (header and rule left out), cells stripped."""
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def learner_minutes(text: str | None = None) -> dict[str, tuple[int, int]]:
    """notebook -> (solo minutes, workshop minutes), from FACILITATOR.md's "Learner minutes" table: the one
    place these numbers live (the README's notebook map quotes it)."""
    text = GUIDE.read_text() if text is None else text
    return {nb: (int(solo), int(workshop)) for nb, solo, workshop in _table(_section(text, "Learner minutes"))}


def plan(text: str | None = None) -> list[tuple[int, str, str]]:
    """(minutes, notebook or one of NOT_NOTEBOOKS, how) per block of FACILITATOR.md's 3-hour plan."""
    text = GUIDE.read_text() if text is None else text
    return [(int(minutes), nb, how) for _, minutes, nb, how, _ in _table(_section(text, "The 3-hour plan"))]


def check_plan(text: str) -> None:
    minutes = learner_minutes(text)
    blocks = plan(text)
    assert set(minutes) == set(NOTEBOOKS), "the learner-minutes table names every notebook, once"
    assert sum(m for m, _, _ in blocks) <= WORKSHOP_MINUTES, f"the plan takes {sum(m for m, _, _ in blocks)} min"
    names = [nb for _, nb, _ in blocks]
    assert names[0] == "opening" and names[-1] == "close", "the plan opens and closes"
    assert {"buffer", "break"} <= set(names), "the plan keeps a buffer and a break"
    assert set(names) - set(NOT_NOTEBOOKS) <= set(NOTEBOOKS), "every other block is a notebook"
    after = _section(text, "After the workshop")
    for nb in set(NOTEBOOKS) - set(names):  # a notebook left out of the three hours is named after them
        assert nb in after, f"{nb} is neither in the plan nor named after the workshop"
    assert all(how in HOWS for _, _, how in blocks)
    for nb, (_, workshop) in minutes.items():
        assert sum(m for m, n, _ in blocks if n == nb) == workshop, f"{nb}: the plan and the table disagree"
    assert sum(w for _, w in minutes.values()) <= WORKSHOP_MINUTES
    assert all(solo >= workshop for solo, workshop in minutes.values()), "a workshop does not take longer than solo"


def test_the_plan_fits_three_hours_and_matches_the_learner_minutes():
    check_plan(GUIDE.read_text())
    solo = sum(s for s, _ in learner_minutes().values())
    assert 240 <= solo <= 330, f"solo, the lab takes {solo} min: the guide says about 5 h 25 min (09 included)"
    assert f"{solo // 60} h {solo % 60} min" in GUIDE.read_text()


def test_a_plan_that_does_not_add_up_is_caught():
    """Mutations of the guide: a block longer than the table says, a plan past 180 minutes, a plan without its
    opening, close or buffer, and a notebook dropped without being named after the workshop."""
    text = GUIDE.read_text()
    longer = text.replace("| 8 | 25 | 05_fp8_gemm |", "| 8 | 30 | 05_fp8_gemm |")
    assert longer != text
    with pytest.raises(AssertionError):
        check_plan(longer)
    both = longer.replace("| 05_fp8_gemm | 45 | 25 |", "| 05_fp8_gemm | 45 | 30 |")
    with pytest.raises(AssertionError, match="the plan takes 185 min"):
        check_plan(both)
    for block in ("| 1 | 10 | opening | talk |", "| 13 | 5 | close | talk |", "| 12 | 10 | buffer | - |"):
        assert block in text, block
        number, minutes = block.split("|")[1].strip(), block.split("|")[2].strip()
        with pytest.raises(AssertionError, match=r"opens and closes|buffer"):
            check_plan(text.replace(block, f"| {number} | {minutes} | break | - |"))
    dropped = "\n".join(line for line in text.splitlines() if "| 10 | 10 | 07_beyond_one_machine |" not in line)
    dropped = dropped.replace("| 07_beyond_one_machine | 20 | 10 |", "| 07_beyond_one_machine | 20 | 0 |")
    with pytest.raises(AssertionError, match="07_beyond_one_machine is neither in the plan"):
        check_plan(dropped)


def test_the_plan_trains_as_long_as_the_questions_assume_and_has_a_path_without_laptops():
    """Notebook 06's block trains the 150 steps its questions and exercises assume (LESSON.steps); the guide offers
    laptops and a shared JupyterHub or Binder node, linking the section that says how; notebook 09, where it
    exists, is optional."""
    from fp8lab.training.train import LESSON

    text = GUIDE.read_text()
    block = next(row for row in _table(_section(text, "The 3-hour plan")) if row[2] == "06_training_live")
    assert f"{LESSON.steps} steps" in block[4] and "20-50 steps" not in text
    assert f"]({HUB})" in text and "No laptops" in text
    assert "Python 3.11" in _section(text, "The 3-hour plan")  # what the laptop path needs, said where it is chosen
    assert "09_below_eight_bits" in _section(text, "After the workshop") and "optional" in _section(
        text, "After the workshop")


def test_the_guide_links_the_key_and_says_how_to_reset_and_stop():
    text = GUIDE.read_text()
    assert "notebooks/ANSWERS.md" in text and "python -m fp8lab answers --write" in text
    for needle in ("Restart Kernel", "Stop", "Interrupt", "FP8LAB_SMOKE=1"):
        assert needle in text, needle
    for nb in NOTEBOOKS:  # misconceptions and questions for every notebook
        assert f"**{nb[:2]} · " in _section(text, "Per notebook"), nb


@pytest.mark.slow
def test_the_answers_that_smoke_mode_changes_are_the_ones_the_guide_names(monkeypatch):
    """Every answer of the key computed at workshop size and under FP8LAB_SMOKE=1: the notebooks whose answers
    differ are the ones the guide lists (~1 min: the key twice)."""
    from fp8lab.harness import answers
    from fp8lab.harness.answers import scale_out

    def run(smoke: str) -> dict:
        monkeypatch.setenv("FP8LAB_SMOKE", smoke)
        scale_out._llm_report.cache_clear()
        return {f.__name__: f() for f in answers.ANSWERS}

    workshop, smoke = run("0"), run("1")
    differ = sorted({workshop[k].notebook[:2] for k in workshop
                     if (workshop[k].answer, workshop[k].claims) != (smoke[k].answer, smoke[k].claims)})
    line = re.search(r"answers that differ under `FP8LAB_SMOKE=1` are those of notebooks: ([\d, ]+)\.",
                     " ".join(GUIDE.read_text().split()))
    assert line, "the guide names the notebooks whose answers smoke mode changes"
    assert differ == [n.strip() for n in line.group(1).split(",")]
    assert os.environ.get("FP8LAB_SMOKE") == "1"  # (monkeypatch restores it after the test)


def test_the_readme_map_quotes_the_learner_minutes():
    """The README's notebook map (between its notebook-map markers) gives each notebook FACILITATOR.md's solo
    minutes, and their sum."""
    readme = (ROOT / "README.md").read_text()
    if "<!-- notebook-map:begin -->" not in readme:
        pytest.skip("the README has no notebook map (FACILITATOR.md holds the learner minutes)")
    block = readme.split("<!-- notebook-map:begin -->")[1].split("<!-- notebook-map:end -->")[0]
    lines = [r for r in block.splitlines() if r.startswith("|")]
    cols = [c.strip().lower() for c in lines[0].strip("|").split("|")]
    col = next(i for i, c in enumerate(cols) if "minutes" in c)
    minutes = learner_minutes()
    seen = {}
    for row in lines[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        nb = next((n for n in NOTEBOOKS if n in cells[0]), None)
        number = int(re.findall(r"\d+", cells[col])[0])
        if nb is None:
            assert number == sum(s for s, _ in minutes.values()), row  # the total
        else:
            seen[nb] = number
    assert seen == {nb: solo for nb, (solo, _) in minutes.items()}


def test_every_block_the_guide_names_by_number_is_that_notebooks_block_and_deepseek_is_quoted():
    """Where the guide names plan blocks by number for notebooks ("notebook 06's ... and 08's ... (blocks 9 and
    11"), the numbers are those notebooks' rows of the plan; DeepSeek-V3's measure is quoted as the report writes
    it (arXiv 2412.19437, section 3.3.2), not paraphrased."""
    text = GUIDE.read_text()
    number = {nb[:2]: int(row[0]) for row in _table(_section(text, "The 3-hour plan"))
              for nb in [row[2]] if nb in NOTEBOOKS}
    named = re.findall(r"notebook (\d\d)'s [^(]*?and (\d\d)'s [^(]*\(blocks (\d+) and (\d+)", text)
    assert named, "the guide names the demo blocks of 06 and 08 by number"
    for first, second, a, b in named:
        assert (number[first], number[second]) == (int(a), int(b)), (first, second, a, b)
    assert '"maximum relative error of nearly 2%"' in text and "of one element" not in text
