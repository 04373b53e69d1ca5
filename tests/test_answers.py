"""The answer key (notebooks/ANSWERS.md): generated from the panels, current, every claim true,
every question under a widget answered, and linked from the facilitator guide. Computing the
key drives every panel at workshop size (~40 s on 2 idle cores): those tests are marked slow."""

import re
from pathlib import Path

import nbformat
import pytest

from fp8lab.lab import answers
from fp8lab.lab.predictions import PREDICTIONS

ROOT = Path(__file__).resolve().parent.parent
WORKSHOP = [p for p in sorted((ROOT / "notebooks").glob("0[0-6]_*.ipynb"))]


def _norm(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def key():
    return answers.key()


@pytest.mark.slow
def test_the_committed_key_is_what_the_panels_say_now(key):
    committed = answers.KEY_PATH.read_text()
    fresh = answers.markdown(key)
    assert fresh == committed, "notebooks/ANSWERS.md is stale: run `python -m fp8lab answers --write`"


@pytest.mark.slow
def test_every_claim_holds(key):
    assert key and all(a.claims or a.notebook == "00_setup_check" for a in key)
    failed = [(a.notebook, claim) for a in key for claim, ok in a.claims.items() if not ok]
    assert not failed, failed


@pytest.mark.slow
def test_every_question_under_a_widget_is_answered(key):
    """Each **Question(s)** block of notebooks 00-06 contains the text of one key entry, and
    each key entry's question (exercises aside) is in its notebook."""
    asked = {a.notebook: [] for a in key}
    for path in WORKSHOP:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                asked.setdefault(path.stem, []).extend(
                    _norm(block) for block in re.split(r"\n\s*\n", cell.source) if block.startswith("**Question"))
    for nb, blocks in asked.items():
        for block in blocks:
            assert any(_norm(a.question) in block for a in key if a.notebook == nb), f"{nb}: unanswered: {block[:80]}"
    for a in key:
        if not a.question.startswith("Exercises"):
            assert any(_norm(a.question) in b for b in asked[a.notebook]), f"{a.notebook}: not asked: {a.question}"


def test_every_prediction_has_a_measured_answer_among_its_options():
    for name, spec in PREDICTIONS.items():
        right, why = spec.measure()
        assert right in spec.options, (name, right)
        assert any(ch.isdigit() for ch in why), f"{name}: the reveal states no measured number"


def test_the_facilitator_guide_links_the_key():
    readme = (ROOT / "README.md").read_text()
    guide = readme[readme.index("## Facilitator guide"):]
    assert "notebooks/ANSWERS.md" in guide and "python -m fp8lab answers --write" in guide


def test_a_wrong_claim_is_caught(monkeypatch):
    """The claims are computed: a panel that reports a different number flips one."""
    from fp8lab.lab.panels import GemmPanel

    original = GemmPanel.compute

    def no_difference(self, **kw):
        data = original(self, **kw)
        data["errors"]["blockwise"] = data["errors"]["tensorwise"]  # blocks no better than per tensor
        return data

    monkeypatch.setattr(GemmPanel, "compute", no_difference)
    a = answers._q05_gemm()
    assert not a.claims["with zero rows at 1e5, blockwise's error is under a third of tensorwise's"]
