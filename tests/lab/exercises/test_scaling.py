"""fp8lab.lab.exercises.scaling: exercises 02 (the per-tensor E4M3 scale) and 03 (delayed scaling's amax)."""

from __future__ import annotations

from fp8lab.lab.exercises.scaling import check_delayed_amax, check_scale


def test_the_scale_is_amax_over_448_and_one_for_zeros():
    assert check_scale(lambda x: float(x.abs().max()) / 448.0 or 1.0)
    fb = check_scale(lambda x: float(x.abs().max()) / 448.0)
    assert not fb and "all-zero" in fb.message
    assert not check_scale(lambda x: 448.0 / (float(x.abs().max()) or 448.0))  # the quantization multiplier, inverted
    assert not check_scale(lambda x: float(x.max()) / 448.0 or 1.0)  # forgets negative values


def test_delayed_amax_uses_the_history_and_the_current_amax_only_when_empty():
    def right(history, current, algo):
        if not history:
            return current
        return max(history) if algo == "max" else history[-1]

    assert check_delayed_amax(right)
    assert not check_delayed_amax(lambda history, current, algo: max([*history, current]))  # peeks at this step
    assert not check_delayed_amax(lambda history, current, algo: max(history) if history else current)  # one algo
