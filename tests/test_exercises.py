"""Each checker accepts the reference solution and rejects plausible wrong answers with
a specific reason."""

import math

import pytest

from fp8lab import exercises as ex


def _solution(text: str, name: str = "fn"):
    scope = {}
    exec(text, scope)  # the solutions are code a learner can paste
    return scope[name]


def test_decode():
    assert ex.check_decode(_solution(ex.solution_decode(), "decode"))

    def no_subnormals(code):
        s, e, m = code >> 7, (code >> 3) & 15, code & 7
        if e == 15 and m == 7:
            return math.nan
        return (-1) ** s * 2.0 ** (e - 7) * (1 + m / 8)

    def ieee_inf(code):
        v = _solution(ex.solution_decode(), "decode")(code)
        return math.inf if (code & 0x7F) == 0x78 else v

    def unsigned(code):
        return abs(_solution(ex.solution_decode(), "decode")(code))

    f = ex.check_decode(no_subnormals)
    assert not f and "subnormal" in f.message
    f = ex.check_decode(ieee_inf)
    assert not f and "no infinity" in f.message
    f = ex.check_decode(unsigned)
    assert not f and "sign bit" in f.message
    assert not ex.check_decode(lambda code: 1 / 0)  # an exception is reported, not raised


def test_scale():
    assert ex.check_scale(_solution(ex.solution_scale(), "scale_fn"))
    f = ex.check_scale(lambda x: 448 / x.abs().max().item())
    assert not f and "reciprocal" in f.message
    f = ex.check_scale(lambda x: x.max().item() / 448)
    assert not f and "MAGNITUDE" in f.message
    f = ex.check_scale(lambda x: x.abs().max().item() / 57344)
    assert not f and "E5M2" in f.message
    f = ex.check_scale(lambda x: x.abs().max().item() / 448)
    assert not f and "all-zero" in f.message


def test_delayed_amax():
    assert ex.check_delayed_amax(_solution(ex.solution_delayed_amax()))
    f = ex.check_delayed_amax(lambda h, c, a: max([*h, c]))
    assert not f and "PAST" in f.message
    f = ex.check_delayed_amax(lambda h, c, a: sum(h) / len(h) if h else c)
    assert not f and "mean" in f.message
    f = ex.check_delayed_amax(lambda h, c, a: (max(h) if a == "max" else h[-1]))
    assert (not f and "first step" in f.message) or "raised" in f.message


def test_block_amax():
    assert ex.check_block_amax(_solution(ex.solution_block_amax()))
    f = ex.check_block_amax(lambda x, b: x.abs().reshape(-1, b).amax(-1))  # flattened: the tiles lose their rows
    assert not f and "along K" in f.message
    f = ex.check_block_amax(lambda x, b: x.reshape(x.shape[0], -1, b).amax(-1))
    assert not f and "|x|" in f.message


def test_block_choice():
    answer = ex.solution_block_choice().splitlines()[-1].split(": ")[1]
    assert ex.check_block_choice(answer)
    f = ex.check_block_choice("per-tensor")
    assert not f and "reaches only" in f.message
    f = ex.check_block_choice("1x16")
    assert not f and "costs" in f.message
    assert not ex.check_block_choice("2x2") and "not one of" in ex.check_block_choice("2x2").message


def test_scaled_gemm():
    assert ex.check_scaled_gemm(_solution(ex.solution_scaled_gemm()))
    f = ex.check_scaled_gemm(lambda a, b: a.data.float() @ b.data.float().t())
    assert not f and "scaled back" in f.message
    f = ex.check_scaled_gemm(lambda a, b: (a.data.float() @ b.data.float().t()) / (a.scale * b.scale))
    assert not f and "don't divide" in f.message
    f = ex.check_scaled_gemm(lambda a, b: (a.data.float() @ b.data.float().t()) * a.scale)
    assert not f and "own" in f.message


@pytest.mark.parametrize("wrong,needle", [({"tensorwise", "blockwise", "mxfp8"}, "tensorwise does not survive"),
                                          ({"blockwise"}, "mxfp8 survives too"),
                                          ({"rowwise", "mxfp8", "blockwise"}, "every row"),
                                          ({"fp8"}, "unknown")])
def test_survivors(wrong, needle):
    assert ex.check_survivors({"blockwise", "mxfp8"})
    f = ex.check_survivors(wrong)
    assert not f and needle in f.message


def test_hints_are_text():
    for name in ("decode", "scale", "delayed_amax", "block_amax", "block_choice", "scaled_gemm", "survivors"):
        assert len(getattr(ex, f"hint_{name}")()) > 40
