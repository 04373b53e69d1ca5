"""Tests of fp8lab.harness.answers: one file per part of the lab (test_<part>.py), each made by
`part_tests`, and test_answers.py, which regenerates the whole key and compares it with the committed one."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from fp8lab.harness.answers.base import KEY_PATH


def _norm(text: str) -> str:
    return " ".join(text.split())


def _notebook_text(name: str) -> str:
    cells = json.loads((KEY_PATH.parent / f"{name}.ipynb").read_text())["cells"]
    return _norm(" ".join("".join(c["source"]) for c in cells))


def part_tests(part: ModuleType, notebooks: tuple[str, ...], quick: list[str], slow: bool = False):
    """The two tests of one part's answers: they are its notebooks' in notebook order, and each quick answer
    (computed here; the whole key is test_answers') asks its notebook's question verbatim, stands in the
    committed key and holds every claim it makes. `slow` marks the quick answers that drive a panel at
    workshop size."""

    def test_the_answers_are_this_parts_notebooks_in_notebook_order():
        numbers = [fn.__name__[2:4] for fn in part.ANSWERS]
        assert numbers and set(numbers) == set(notebooks)
        assert numbers == sorted(numbers)
        assert len(set(part.ANSWERS)) == len(part.ANSWERS)

    @pytest.mark.parametrize("name", quick)
    def test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold(name):
        fn = next(f for f in part.ANSWERS if f.__name__ == name)
        a = fn()
        assert a.notebook.startswith(name[2:4] + "_")
        assert _norm(a.question) in _notebook_text(a.notebook)
        assert _norm(a.question) in _norm(KEY_PATH.read_text())
        assert a.answer.strip()
        assert all(a.claims.values()), [c for c, ok in a.claims.items() if not ok]

    if slow:
        test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold = pytest.mark.slow(
            test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold)
    return (test_the_answers_are_this_parts_notebooks_in_notebook_order,
            test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold)
