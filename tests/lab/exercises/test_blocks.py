"""fp8lab.lab.exercises.blocks: exercise 04 (per-block amax) and 04b (the cheapest FP4 block at 18 dB)."""

from __future__ import annotations

import pytest

from fp8lab.lab.exercises.blocks import CHOICE_BLOCKS, block_choice_tensor, check_block_amax, check_block_choice
from fp8lab.numerics.metrics import sqnr
from fp8lab.numerics.quantize import quantize


def test_block_amax_is_the_max_magnitude_of_each_tile():
    assert check_block_amax(lambda x, b: x.abs().reshape(x.shape[0], -1, b).amax(-1))
    assert not check_block_amax(lambda x, b: x.reshape(x.shape[0], -1, b).amax(-1))  # no abs
    assert not check_block_amax(lambda x, b: x.abs().reshape(-1, b, x.shape[1] // b).amax(1))  # wrong tiles


@pytest.mark.slow  # every block of a 128 x 1024 tensor in FP4, per check (seconds)
def test_the_block_choice_is_the_cheapest_label_at_18_db():
    x = block_choice_tensor()
    ok = {}
    for label in CHOICE_BLOCKS:
        q = quantize(x, "e2m1", label)
        if sqnr(x, q) >= 18:
            ok[label] = q.scale_bits_per_element
    best = min(ok, key=ok.get)
    assert check_block_choice(best)
    assert all(not check_block_choice(label) for label in CHOICE_BLOCKS if label != best)
    fb = check_block_choice([best])
    assert not fb and "One name, not a list" in fb.message
