"""fp8lab.lab.exercises.formats: exercise 01 (decode an E4M3 code), graded against torch's own float8_e4m3fn."""

from __future__ import annotations

import torch

from fp8lab.lab.exercises.formats import check_decode, hint_decode, solution_decode


def _torch_decode(code: int) -> float:
    return float(torch.tensor([code], dtype=torch.uint8).view(torch.float8_e4m3fn).float()[0])


def test_a_correct_decoder_passes_and_the_solution_is_one():
    assert check_decode(_torch_decode)
    namespace: dict = {}
    exec(solution_decode(), namespace)
    assert check_decode(namespace["decode"])
    assert "mantissa" in hint_decode()


def test_plausible_mistakes_are_named():
    def no_subnormals(code):  # the implicit 1 kept at exponent 0
        s, e, m = code >> 7, (code >> 3) & 15, code & 7
        if e == 15 and m == 7:
            return float("nan")
        return (-1) ** s * 2.0 ** (e - 7) * (1 + m / 8)

    fb = check_decode(no_subnormals)
    assert not fb and "subnormal" in fb.message and "code 0 " in fb.message
    fb = check_decode(lambda code: abs(_torch_decode(code)))
    assert not fb and "sign bit" in fb.message
    fb = check_decode(_torch_decode(1))
    assert not fb and "pass your function itself" in fb.message
    fb = check_decode(lambda code: 1 / 0)
    assert not fb and "ZeroDivisionError" in fb.message
