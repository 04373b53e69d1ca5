"""fp8lab.lab.exercises.base: Feedback and describe, what every checker prints."""

from __future__ import annotations

import numpy as np
import torch

from fp8lab.lab.exercises.base import Feedback, describe


def test_feedback_is_truthy_only_when_correct_and_says_so():
    assert Feedback(True, "fine") and not Feedback(False, "no")
    assert repr(Feedback(False, "x is 2")) == "not yet: x is 2"
    assert "correct:" in Feedback(True, "ok")._repr_html_()


def test_describe_names_what_a_learner_passed():
    assert describe(None) == "None"
    assert describe(True) == "the bool True"
    assert describe(0.5) == "the number 0.5"
    assert describe("fc3") == "the string 'fc3'"
    assert describe(["fc3"]) == "a list of 1 item(s): ['fc3']"
    assert describe(torch.zeros(64, 64)) == "a tensor of shape (64, 64) (float32)"
    assert describe(torch.tensor(1.0)) == "a 0-d tensor (float32)"
    assert describe(describe) == "a function (describe)"
    assert describe(np.zeros((2, 3))) == "a ndarray of shape (2, 3)"
    assert describe("x" * 100).endswith("...") and len(describe("x" * 100)) < 80
