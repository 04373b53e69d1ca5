"""Exercises 04a and 04b (notebook 04): the amax of each 1 x block tile; a block size for FP4.

Public: check_block_amax, hint_block_amax, solution_block_amax; check_block_choice, hint_block_choice,
solution_block_choice, block_choice_tensor, CHOICE_BLOCKS.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fp8lab.data.synthetic import FLOAT32_CPU, sample
from fp8lab.lab.exercises.base import Feedback, as_tensor, call_learner, describe, not_a_function, one_name_not_a_list
from fp8lab.numerics.formats import E4M3
from fp8lab.numerics.metrics import sqnr
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.scaling import PerBlock, parse_granularity

__all__ = [
    "CHOICE_BLOCKS",
    "block_choice_tensor",
    "check_block_amax",
    "check_block_choice",
    "hint_block_amax",
    "hint_block_choice",
    "solution_block_amax",
    "solution_block_choice",
]



def check_block_amax(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> Feedback:
    """fn(x[M, K], block) -> amax[M, K // block]: max |x| over each 1 x block tile along K."""
    if (wrong := not_a_function(fn, "check_block_amax(fn)")) is not None:
        return wrong
    g = torch.Generator().manual_seed(4)
    cases = [("x[4, 64], block 32", torch.randn(4, 64, generator=g, **FLOAT32_CPU), 32),
             ("x[3, 256], block 128, negative extremes", -torch.rand(3, 256, generator=g, **FLOAT32_CPU) * 7, 128),
             ("x[8, 16], block 16 (per row)", torch.randn(8, 16, generator=g, **FLOAT32_CPU), 16)]
    for name, x, block in cases:
        got, err = call_learner(fn, x.clone(), block)
        if err:
            return Feedback(False, f"{name}: {err}")
        want = quantize(x, E4M3, PerBlock(1, block)).amax
        if got is None:
            return Feedback(False, "fn returned None: write the code that returns the amaxes.")
        got, err = as_tensor(got, f"a tensor of amaxes shaped {tuple(want.shape)} (M, K / block)")
        if err:
            return Feedback(False, f"{name}: {err}.")
        if tuple(got.shape) != tuple(want.shape):
            msg = f"{name}: expected shape {tuple(want.shape)} (M, K / block), got {tuple(got.shape)}."
            if tuple(got.shape) == (x.shape[0] // block, x.shape[1]) or got.numel() == want.numel():
                msg += " The tiles run along K (the last dim): reshape to (M, K // block, block)."
            return Feedback(False, msg)
        if not torch.allclose(got.float(), want):
            msg = f"{name}: the shapes match but the values don't."
            if bool((got < 0).any()):
                msg += " An amax is a largest MAGNITUDE: never negative."
            elif torch.allclose(got.float(), x.reshape(x.shape[0], -1, block).amax(-1)):
                msg += " Take the max of |x|: a block's largest magnitude can be negative."
            return Feedback(False, msg)
    return Feedback(True, "per-tile amax along K, magnitudes included.")


def hint_block_amax() -> str:
    return "x.reshape(M, K // block, block) puts each tile on the last dim; what reduction gives max |x| there?"


def solution_block_amax() -> str:
    return '''def fn(x, block):
    m, k = x.shape
    return x.abs().reshape(m, k // block, block).amax(dim=-1)   # (M, K/block)'''


CHOICE_BLOCKS = ("1x16", "1x32", "1x64", "1x128", "32x32", "128x128", "per-row", "per-tensor")
CHOICE_FORMAT = "e2m1"
CHOICE_THRESHOLD = 18.0


def block_choice_tensor() -> torch.Tensor:
    """The tensor of exercise 04b: heavy-tailed (Laplace) activations, 128 x 1024."""
    return sample("laplace", (128, 1024), seed=42)


def _block_table() -> list[tuple[str, float, float]]:
    x = block_choice_tensor()
    rows = []
    for label in CHOICE_BLOCKS:
        q = quantize(x, CHOICE_FORMAT, parse_granularity(label))
        rows.append((label, sqnr(x, q), q.scale_bits_per_element))
    return rows


def check_block_choice(label: str) -> Feedback:
    """With FP4 (E2M1) elements and float32 scales, which block keeps the SQNR of
    block_choice_tensor() at or above 18 dB with the least scale overhead (bits/element)?"""
    if not isinstance(label, str):
        return Feedback(False, f"answer with one block label, a string such as '1x32' (one of "
                               f"{', '.join(CHOICE_BLOCKS)}); got {describe(label)}" + one_name_not_a_list(label))
    label = label.strip()
    rows = {r[0]: r for r in _block_table()}
    if label not in rows:
        return Feedback(False, f"{label!r} is not one of {', '.join(CHOICE_BLOCKS)}.")
    ok = [r for r in rows.values() if r[1] >= CHOICE_THRESHOLD]
    best = min(ok, key=lambda r: r[2])
    _, db, bits = rows[label]
    if label == best[0]:
        return Feedback(True, f"{label}: {db:.1f} dB for {bits:.3g} bits of scale per element - the cheapest that "
                              f"reaches {CHOICE_THRESHOLD:g} dB.")
    if db < CHOICE_THRESHOLD:
        return Feedback(False, f"{label} reaches only {db:.1f} dB (< {CHOICE_THRESHOLD:g}): its blocks are too "
                               "big for FP4's 3.6 binades on heavy-tailed data.")
    return Feedback(False, f"{label} reaches {db:.1f} dB but costs {bits:.3g} bits per element; a bigger block "
                           "also passes and costs less.")


def hint_block_choice() -> str:
    return ("Loop over the labels: q = fp8lab.quantize(x, 'e2m1', label); keep those with fp8lab.sqnr(x, q) >= 18, "
            "then compare q.scale_bits_per_element. (In E4M3 every block clears 30 dB here: why?)")


def solution_block_choice() -> str:
    rows = _block_table()
    lines = [f"{label:>10}  {db:5.1f} dB  {bits:.3g} bits/element" for label, db, bits in rows]
    best = min((r for r in rows if r[1] >= CHOICE_THRESHOLD), key=lambda r: r[2])
    return "\n".join([*lines, f"answer: {best[0]}"])
