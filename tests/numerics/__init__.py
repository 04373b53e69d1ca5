"""Tests of fp8lab.numerics, one file per module; `same_bits` is the equality their bit-exact checks share."""

from __future__ import annotations

import math

import torch


def bit_patterns(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bit patterns as integers, so that -0 against 0 and NaN payloads count."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()])


def same_bits(a, b) -> bool:
    """Same dtype, shape and bits (tensors; tuples and lists of them; Python numbers), except that any NaN equals
    any NaN: payloads are not numbers."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, int):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        nan = torch.isnan(a.float())
        if not torch.equal(nan, torch.isnan(b.float())):
            return False
        # the patterns are indexed, not the values: torch < 2.9 cannot boolean-index float8 on the CPU
        return torch.equal(bit_patterns(a)[~nan], bit_patterns(b)[~nan])
    return torch.equal(bit_patterns(a), bit_patterns(b))
