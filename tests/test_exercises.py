"""Each checker accepts the reference solution and rejects plausible wrong answers with
a specific reason."""

import math

import pytest

from fp8lab.lab import exercises as ex


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


def test_scaled_gemm_needs_the_scales_in_the_right_place():
    """Dequantizing first, or scaling the whole sum once, cannot pass: only per-K-block scales do."""
    f = ex.check_scaled_gemm(lambda a, b: a.dequantize() @ b.dequantize().t())
    assert not f and "no dequantize()" in f.message
    f = ex.check_scaled_gemm(lambda a, b: (a.data.float() @ b.data.float().t()) * a.scale * b.scale.t())
    assert not f and "1x16 blocks" in f.message  # the per-tensor answer: right on the per-tensor cases only

    def once_at_the_end(a, b):  # per-row scales at the end: the placement per-tensor and per-row GEMMs use
        return (a.data.float() @ b.data.float().t()) * a.scale.amax(1, keepdim=True) * b.scale.amax(1)[None, :]

    f = ex.check_scaled_gemm(once_at_the_end)
    assert not f and "each K block's partial sum" in f.message


@pytest.mark.parametrize("wrong,needle", [({"tensorwise", "blockwise", "mxfp8"}, "tensorwise does not survive"),
                                          ({"blockwise"}, "mxfp8 survives too"),
                                          ("blockwise", "mxfp8 survives too"),  # a string is a name, not letters
                                          ({"rowwise", "mxfp8", "blockwise"}, "worse than predicting the mean"),
                                          ({"fp8"}, "unknown"), (3, "set of recipe names")])
def test_survivors(wrong, needle):
    f = ex.check_survivors(wrong)
    assert not f and needle in f.message


def test_survivors_come_from_the_measured_runs_and_accept_baselines():
    from fp8lab.lab.answers import survivors

    truth = survivors()
    assert truth == {"blockwise", "mxfp8"}  # the lesson, as measured (fp8lab.training.measured; tests/test_lessons.py)
    assert ex.check_survivors(truth)
    assert ex.check_survivors("blockwise, mxfp8")
    f = ex.check_survivors({"fp32", "blockwise", "mxfp8"})  # fp32 is a baseline, not unknown
    assert f and "survives trivially" in f.message


def test_delayed_amax_names_transformer_engines_convention():
    f = ex.check_delayed_amax(lambda h, c, a: (max(h) if a == "max" else h[-1]) if h else 1.0)
    assert not f and "TransformerEngine starts from scale 1" in f.message


def test_history():
    from fp8lab.training.measured import recovery

    best = ex.history_answer()
    rec = dict(zip(recovery()["history"], recovery()["steps_to_recover"], strict=True))
    assert rec[best] <= ex.RECOVER_WITHIN and all(
        n is None or n > ex.RECOVER_WITHIN for h, n in rec.items() if h > best)
    assert ex.check_history(best)
    f = ex.check_history(2 * best)
    assert not f and f"needs {rec[2 * best]} steps" in f.message
    f = ex.check_history(best // 2)
    assert not f and "recovers in time" in f.message
    assert "one of the panel's history lengths" in ex.check_history(3).message
    f = ex.check_history(1024)  # the panel's longest, TransformerEngine's default
    assert not f and "does not recover" in f.message
    assert str(best) in ex.solution_history()


def _run(losses_at_30: dict, losses_at_150: dict):
    """A TrainResult-like run: each recipe's loss flat at one value up to step 29, another after."""
    import pandas as pd

    from fp8lab.training.train import TrainResult

    rows = [{"step": s, "run": r, "loss": losses_at_30[r] if s < 30 else losses_at_150[r]}
            for s in range(150) for r in losses_at_30]
    return TrainResult(pd.DataFrame(rows), None)


def test_ranking_is_judged_on_the_learners_own_run():
    same = _run({"fp32": 0.06, "tensorwise": 0.37, "blockwise": 0.062}, {"fp32": 0.039, "tensorwise": 0.08,
                                                                          "blockwise": 0.040})
    swapped = _run({"fp32": 0.06, "tensorwise": 0.37, "blockwise": 0.059}, {"fp32": 0.039, "tensorwise": 0.08,
                                                                             "blockwise": 0.040})
    assert ex.check_ranking(same, True) and not ex.check_ranking(same, False)
    assert ex.check_ranking(swapped, False) and not ex.check_ranking(swapped, True)
    f = ex.check_ranking(swapped, False)
    assert "tensorwise" in f.message and "are the same" in f.message  # the broken recipe is flagged either way
    assert "train first" in ex.check_ranking(None, True).message
    short = _run({"fp32": 0.06, "tensorwise": 0.37}, {"fp32": 0.039, "tensorwise": 0.08})
    assert "3 or more recipes" in ex.check_ranking(short, True).message
    assert "True" in ex.check_ranking(same, None).message


def test_hints_are_text():
    for name in ("decode", "scale", "delayed_amax", "block_amax", "block_choice", "scaled_gemm", "survivors",
                 "history", "ranking"):
        assert len(getattr(ex, f"hint_{name}")()) > 40


def test_every_starter_is_a_blank_the_checker_explains_not_an_answer():
    """The exercise cells of notebooks 02-08 start from a blank (None, an empty set), not a value or code that reads
    like an answer (`448 / x.max()`, `history = 1024`, a filled-in prediction); each checker answers the blank with
    what to fill in, without raising."""
    import re
    from pathlib import Path

    import nbformat

    code = {p.stem: "\n".join(c.source for c in nbformat.read(p, as_version=4).cells if c.cell_type == "code")
            for p in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("0[2-8]_*.ipynb"))}
    for wrong in ("448 / x.max()", "history = 1024", 'predict_text = {"recipe": "tensorwise"',
                  'answer = {"tensorwise"}', 'answer = "per-tensor"', "max(history + [current_amax])",
                  "x.reshape(k // block, -1)", "a_q.data.float() @ b_q.data.float().t()"):
        assert not any(wrong in c for c in code.values()), wrong
    for stem, needle in (("02_per_tensor_scaling", "return None"), ("03_delayed_scaling", "return None"),
                         ("04_per_block_scaling", "answer = None"), ("05_fp8_gemm", "return None"),
                         ("06_training_live", "history = None"), ("06_training_live", "answer = set()")):
        assert needle in code[stem], (stem, needle)
    assert len(re.findall(r'predict_\w+ = \{"recipe": None, "monitor": None\}', code["08_your_model"])) == 3
    blanks = [ex.check_scale(lambda x: None), ex.check_delayed_amax(lambda h, c, a: None),
              ex.check_block_amax(lambda x, b: None), ex.check_block_choice(None),
              ex.check_scaled_gemm(lambda a, b: None), ex.check_history(None), ex.check_survivors(set())]
    for f in blanks:
        assert not f and f.message, f
    for f in blanks[:2] + blanks[4:5]:
        assert "None" in f.message or "returned" in f.message, f.message
