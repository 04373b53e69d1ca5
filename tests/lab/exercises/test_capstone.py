"""fp8lab.lab.exercises.capstone: exercise 08's checker refuses a prediction it cannot grade, saying why (the grading
against a trained case is tested with notebook 08's capstone in tests of training.capstone)."""

from __future__ import annotations

from fp8lab.lab.exercises.capstone import MONITORS, check_capstone, hint_capstone


def test_a_prediction_is_a_dict_with_a_recipe_and_a_monitor():
    fb = check_capstone(["tensorwise"], None, None)
    assert not fb and "predict with a dict" in fb.message
    fb = check_capstone({"recipe": "tensorwise", "monitor": "underflow"}, None, None)
    assert not fb and "CaseResult" in fb.message


def test_the_monitors_and_the_hint():
    assert "underflow" in MONITORS
    assert hint_capstone().strip()
