"""fp8lab.lab.exercises.training: exercises 06a (who survives the sinks) and 06b (the longest amax history), graded
from the shipped runs (fp8lab.training.measured)."""

from __future__ import annotations

from fp8lab.lab.exercises.training import check_history, check_survivors, history_answer
from fp8lab.training.measured import cliff_means, recovery


def test_the_survivors_are_the_recipes_within_5_percent_at_1e6():
    change = cliff_means()[2]
    truth = {r for (r, s), v in change.items() if s == 1e6 and r not in ("fp32", "bf16") and v <= 0.05}
    assert check_survivors(truth)
    assert check_survivors(" ".join(sorted(truth)))  # a string of names works
    assert not check_survivors(truth | {"tensorwise"})
    assert not check_survivors(set(sorted(truth)[:-1]))
    fb = check_survivors({"not_a_recipe"})
    assert not fb and "unknown recipes" in fb.message
    assert not check_survivors(set())


def test_the_history_is_the_longest_that_recovers_within_20_steps():
    rec = recovery()
    ok = [int(h) for h, n in zip(rec.history, rec.steps_to_recover, strict=True) if n is not None and n <= 20]
    assert history_answer() == max(ok)
    assert check_history(max(ok))
    if len(ok) > 1:
        assert not check_history(min(ok))  # recovers, but a longer one does too
    assert not check_history(1024)  # TransformerEngine's default lags longer
    fb = check_history(True)
    assert not fb and "an integer" in fb.message
