"""fp8lab.harness.answers.base: the Answer record, where the key lives, and how it prints decibels."""

from __future__ import annotations

import dataclasses

import pytest

from fp8lab.harness.answers.base import KEY_PATH, Answer, decibels


def test_the_key_is_the_notebooks_answers_file():
    assert KEY_PATH.name == "ANSWERS.md" and KEY_PATH.parent.name == "notebooks"
    assert KEY_PATH.read_text().startswith("# fp8lab answer key")


def test_decibels_print_one_decimal_and_no_negative_zero():
    assert decibels(31.46) == "31.5"
    assert decibels(-0.04) == "0.0"
    assert decibels(-0.06) == "-0.1"


def test_an_answer_is_frozen_with_its_own_claims():
    a, b = Answer("01_fp8_formats", "q?", "a."), Answer("01_fp8_formats", "q?", "a.")
    assert a.claims == {} and a.claims is not b.claims
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.answer = "b."
