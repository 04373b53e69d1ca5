"""fp8lab.harness.answers.scaling: the key's answers for notebooks 02 (per-tensor), 03 (delayed) and 04
(per-block scaling).
The quick answers are computed here (question verbatim in its notebook and in the committed key,
every claim true); the whole key is regenerated and compared in test_answers."""

from __future__ import annotations

import json

import pytest

from fp8lab.harness.answers import scaling
from fp8lab.harness.answers.base import KEY_PATH

NOTEBOOKS = ('02', '03', '04')


def _norm(text: str) -> str:
    return " ".join(text.split())


def _notebook_text(name: str) -> str:
    cells = json.loads((KEY_PATH.parent / f"{name}.ipynb").read_text())["cells"]
    return _norm(" ".join("".join(c["source"]) for c in cells))


def test_the_answers_are_this_parts_notebooks_in_notebook_order():
    numbers = [fn.__name__[2:4] for fn in scaling.ANSWERS]
    assert numbers and set(numbers) == set(NOTEBOOKS)
    assert numbers == sorted(numbers)
    assert len(set(scaling.ANSWERS)) == len(scaling.ANSWERS)


@pytest.mark.parametrize("name", ['_q03_loop'])
def test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold(name):
    fn = next(f for f in scaling.ANSWERS if f.__name__ == name)
    a = fn()
    assert a.notebook.startswith(name[2:4] + "_")
    assert _norm(a.question) in _notebook_text(a.notebook)
    assert _norm(a.question) in _norm(KEY_PATH.read_text())
    assert a.answer.strip()
    assert all(a.claims.values()), [c for c, ok in a.claims.items() if not ok]
