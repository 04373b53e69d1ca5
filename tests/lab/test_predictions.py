"""fp8lab.lab.predictions: predict, then reveal what the lab measures (the margins of every prediction over seeds
are tested with the answer key)."""

from __future__ import annotations

import json

import pytest

from fp8lab.harness.answers.base import KEY_PATH
from fp8lab.lab.predictions import PREDICTIONS, Prediction, share


def _norm(text: str) -> str:
    return " ".join(text.split())


def test_every_prediction_is_asked_in_its_notebook_with_distinct_options():
    for name, spec in PREDICTIONS.items():
        cells = json.loads((KEY_PATH.parent / f"{spec.notebook}.ipynb").read_text())["cells"]
        source = _norm(" ".join("".join(c["source"]) for c in cells))
        assert f"Prediction({name!r})" in source or f'Prediction("{name}")' in source, name
        assert len(set(spec.options)) == len(spec.options) >= 2


def test_e4m3s_binades_from_its_definition():
    # E4M3: smallest subnormal 2^-9, largest 448 = 1.75 * 2^8: log2(448 / 2^-9) = 17.8 binades
    right, why = PREDICTIONS["format_binades"].measure()
    assert right == "about 18" and why


def test_reveal_needs_a_choice_then_locks_it_and_says_whether_it_was_right():
    p = Prediction("format_binades")
    assert p.reveal_button.disabled
    with pytest.raises(ValueError, match="pick a prediction"):
        p.reveal()
    p.choice.value = "about 8"
    assert not p.reveal_button.disabled
    assert p.reveal() is False
    assert p.choice.disabled and p.reveal_button.disabled and p.answer == "about 18"
    assert "Not quite" in p.verdict.value
    q = Prediction("format_binades")
    q.choice.value = "about 18"
    assert q.reveal() is True and "Right" in q.verdict.value
    with pytest.raises(ValueError, match="unknown prediction"):
        Prediction("nope")


def test_share_prints_a_floor_for_tiny_shares():
    assert share(0.5) == "50%" and share(0.01234) == "1.23%"  # 3 significant digits
    assert share(1e-5) == "under 0.01%"
