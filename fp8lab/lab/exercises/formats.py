"""Exercise 01 (notebook 01): decode an E4M3 code.

Public: check_decode, hint_decode, solution_decode.
"""

from __future__ import annotations

from collections.abc import Callable

from fp8lab.lab.exercises.base import Feedback, as_number, call_learner, not_a_function, same_number
from fp8lab.numerics.formats import E4M3

__all__ = [
    "check_decode",
    "hint_decode",
    "solution_decode",
]



def check_decode(decode: Callable[[int], float]) -> Feedback:
    """decode(code) -> value of an E4M3 (fn) code, 0..255. Checked on all 256 codes."""
    if (wrong := not_a_function(decode, "check_decode(decode)")) is not None:
        return wrong
    for code in range(256):
        got, err = call_learner(decode, code)
        if err:
            return Feedback(False, f"code {code} (0b{code:08b}): {err}")
        want = E4M3.decode(code)
        got, err = as_number(got, "the code's value, a number")
        if err:
            return Feedback(False, f"code {code}: {err}.")
        if not same_number(got, want):
            f = E4M3.fields(code)
            why = ""
            if abs(got) == abs(want):
                why = " The sign bit is the top bit (128)."
            elif f["exponent"] == 0:
                why = " Exponent field 0 means subnormal (or zero): value = 2^(1-7) * mantissa/8, no implicit 1."
            elif f["exponent"] == 15 and f["mantissa"] == 7:
                why = " S.1111.111 is E4M3's only NaN pattern."
            elif f["exponent"] == 15:
                why = " E4M3 (fn) has no infinity: exponent 1111 is a normal binade up to 448."
            return Feedback(False, f"code {code} (0b{code:08b} = sign {f['sign']}, exponent {f['exponent']}, "
                                   f"mantissa {f['mantissa']}): expected {want:g}, got {got:g}.{why}")
    return Feedback(True, "all 256 codes decode correctly, subnormals and NaN included.")


def hint_decode() -> str:
    return ("Split the byte: sign = code >> 7, exponent = (code >> 3) & 0b1111, mantissa = code & 0b111. "
            "Normal: (-1)^s * 2^(e - 7) * (1 + m/8). What happens when e == 0? And which single pattern is NaN?")


def solution_decode() -> str:
    return '''def decode(code):
    s, e, m = code >> 7, (code >> 3) & 0xF, code & 0x7
    sign = -1.0 if s else 1.0
    if e == 15 and m == 7:
        return float("nan")                    # S.1111.111: the only NaN, no inf in E4M3fn
    if e == 0:
        return sign * 2.0 ** (1 - 7) * m / 8   # subnormal: no implicit leading 1
    return sign * 2.0 ** (e - 7) * (1 + m / 8)'''
