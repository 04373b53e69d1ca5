"""Notebook 08's pieces: the real data (no network), the cases and their training, the use-case claims as
the notebook concludes them, the cost side, and the capstone exercise's grading."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

import fp8lab
from fp8lab.data import real as realdata
from fp8lab.gemm.emulation import _segments, k_blocks
from fp8lab.lab import exercises as ex
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import RECIPES, get_recipe
from fp8lab.training import capstone, cost
from fp8lab.training.models import MarkovTask, make_model

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "08_your_model.ipynb"


# ---- real data, shipped with Python and scikit-learn --------------------------------------------------------


def test_digits_are_scikit_learns_own():
    from sklearn.datasets import load_digits as sk_load_digits  # the oracle: scikit-learn's own loader

    x, y = realdata.load_digits()
    ref = sk_load_digits()
    assert x.shape == (1797, 64) and y.shape == (1797,)
    assert torch.equal(x, torch.from_numpy(ref.data).float()) and torch.equal(y, torch.from_numpy(ref.target))
    d = realdata.Digits.load()
    assert len(d.train_y) + len(d.test_y) == 1797 and len(d.test_y) == 359
    assert float(d.train_x.max()) == 1.0 and float(d.train_x.min()) == 0.0
    train = {tuple(r) for r in d.train_x.tolist()}
    assert sum(tuple(r) in train for r in d.test_x.tolist()) < 10  # a few duplicate images exist in the set


@pytest.mark.parametrize("source", ["pydoc", "stdlib"])
def test_text_ships_with_python(source):
    text, where = realdata.text_corpus(source)
    assert len(text) > 100_000 and set(text) <= set(realdata.VOCAB)
    assert ("pydoc_data" in where) == (source == "pydoc")
    with pytest.raises(ValueError, match="valid: auto, pydoc, stdlib"):
        realdata.text_corpus("web")


def test_char_windows_predict_the_next_character():
    t = realdata.CharText.load()
    x, y = t.batch(torch.Generator().manual_seed(0), 4, 16)
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    hx, hy = t.heldout(8, 16)
    assert torch.equal(hx[:, 1:], hy[:, :-1])
    text = t.decode(t.ids[t.split:])
    assert all(t.decode(row) in text for row in hx)  # held-out windows come from the held-out tail


# ---- the cases and their training -----------------------------------------------------------------------------


def test_every_run_starts_from_the_same_weights_and_an_identity_run_equals_fp32():
    case = capstone.make_case("digits")
    res = capstone.train_case(case, ["fp32", capstone.Run("again", "fp32")], steps=5, progress=False)
    a, b = (res.history[res.history.run == r]["loss"].tolist() for r in ("fp32", "again"))
    assert a == b and res.gap("again") == 0.0 and res.suits("again")


def test_a_run_with_a_skip_list_keeps_those_layers_in_high_precision():
    case = capstone.make_case("digits")
    res = capstone.train_case(case, ["fp32", "tensorwise", capstone.Run("fc1 kept", "tensorwise", ("fc1",))],
                              steps=3, progress=False)
    assert list(res.table.index) == ["fp32", "tensorwise", "fc1 kept"]
    assert set(res.table.columns) >= {"heldout loss", "accuracy", "gap", "accuracy drop", "within budget"}
    assert res.history.groupby("run").size().tolist() == [3, 3, 3]


def test_train_case_refuses_what_it_cannot_judge():
    case = capstone.make_case("digits")
    with pytest.raises(ValueError, match="must include 'fp32'"):
        capstone.train_case(case, ["tensorwise"], steps=1, progress=False)
    with pytest.raises(ValueError, match="each run label once"):
        capstone.train_case(case, ["fp32", "fp32"], steps=1, progress=False)
    with pytest.raises(ValueError, match="valid: llm_like, char_lm, digits"):
        capstone.make_case("vision")


# The use-case claims as notebook 08 concludes them (its own runs, seed 0, workshop steps) are checked on the
# notebook's workshop-size run: tests/notebook_checks.py (in the browser test, or test_notebooks without one).


def test_notebook_08_computes_its_conclusions():
    nb = json.loads(NOTEBOOK.read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    prose = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "capstone.claims(results, reports)" in code and "print(capstone.verdict(claims))" in code
    for case in capstone.CASES:
        assert f'capstone.make_case("{case}")' in code
    assert "CostPanel()" in code and "fp8lab.inspect(" in code
    # the verdicts are printed from the measurements, never written into the prose
    for phrase in ("does as well as per-block", "outlier channels did", "per-tensor scaling fails"):
        assert phrase not in prose


def test_claims_need_every_case_and_both_recipes():
    case = capstone.make_case("digits")
    res = capstone.train_case(case, ["fp32", "tensorwise"], steps=1, progress=False)
    with pytest.raises(ValueError, match="missing"):
        capstone.claims({"digits": res})
    with pytest.raises(ValueError, match="blockwise"):
        capstone.claims({"llm_like": res, "char_lm": res, "digits": res})


# ---- the cost side ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("shape", [(256, 512), (100, 300)])
def test_scale_bits_match_a_real_quantization(recipe, shape):
    r = get_recipe(recipe)
    x = torch.randn(*shape)
    for s in (r.input, r.weight):
        assert cost.scale_bits_per_element(s, *shape) == pytest.approx(quantize(x, s).scale_bits_per_element)


@pytest.mark.parametrize("k", [256, 1000, 4096])
def test_scale_multiplies_follow_the_emulated_gemms_segments(k):
    """Oracle: the K segments fp8lab.gemm's emulation scales separately, from the quantized operands."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, k, generator=g), torch.randn(48, k, generator=g)
    for name in RECIPES:
        pairs = fp8lab.nn.layer_gemms(a, b, torch.randn(64, 48, generator=g), name)
        a_q, b_q = pairs["fprop"]
        seg = _segments(k, k_blocks(a_q)[1], k_blocks(b_q)[1])
        two_level = a_q.tensor_scale is not None
        mults, where = cost.scale_multiplies(name, k)
        assert mults == math.ceil(k / seg) + two_level, name
        assert ("epilogue" in where) == (seg == k)


def test_cost_table_and_the_question_is_per_tensor_cheaper():
    table = cost.cost_table(k=4096, parallel="sequence parallel: FP8 all-gather of activations")
    assert list(table.index) == list(cost.COST_RECIPES)
    assert table.loc["tensorwise", "scale multiplies per output"] == 1
    assert table.loc["blockwise", "scale multiplies per output"] == 32
    assert "read twice" in table.loc["tensorwise", "amax"] and "read once" in table.loc["delayed", "amax"]
    assert "all-reduce for fprop input" in table.loc["tensorwise", "amax"]
    assert "no all-reduce" in table.loc["blockwise", "amax"]
    assert "wgrad input" in table.loc["rowwise", "amax"] and "fprop" not in table.loc["rowwise", "amax"]
    assert "fprop input" in table.loc["nvfp4", "amax"]  # its fp32 tensor scale spans every token
    assert "all-reduce" not in cost.cost_table().loc["tensorwise", "amax"]
    dp = cost.cost_table(parallel="data parallel")  # per-rank current scales are normal; delayed's histories agree
    assert "nothing to agree on" in dp.loc["tensorwise", "amax"] and "reduce_amax" in dp.loc["delayed", "amax"]
    fsdp = cost.cost_table(parallel="FSDP: FP8 all-gather of weights")
    assert "all-reduce of each weight's amax" in fsdp.loc["tensorwise", "amax"]
    assert "no all-reduce" in fsdp.loc["mxfp8", "amax"] and "all-reduce" in fsdp.loc["nvfp4", "amax"]
    with pytest.raises(ValueError, match="unknown parallelism"):
        cost.cost_table(parallel="pipeline")
    assert all(table["sources"].str.len() > 0)
    measured = pd.DataFrame({"quantize ms": [0.0, 1.0, 3.0], "GEMM ms": [1.0, 2.0, 2.05],
                             "backend": ["torch.mm", "emulated", "emulated"]},
                            index=["fp32 (no FP8)", "tensorwise", "blockwise"])
    cmp = cost.per_tensor_vs_block(table, measured)
    assert cmp["cheaper"].tolist() == ["tensorwise", "tensorwise", "blockwise", "tensorwise", "mxfp8", "tensorwise",
                                       "within 10% (a tie here)"]
    assert cost.answer(cmp).startswith("tensorwise is cheaper in: scale storage")


def test_transformer_engines_speedups_are_labelled_as_what_they_measure():
    """TransformerEngine's H200 and B300 figures are autocast ones (GEMM plus quantization), from its
    speedups page: current per-tensor 1.57x / 1.41x, delayed 1.69x / 1.61x, block 1.41x (H200), MXFP8 1.44x."""
    te = {(r, p.hardware): p.value for r, pubs in cost.PUBLISHED.items() for p in pubs
          if p.source.startswith("TransformerEngine")}
    assert te == {("delayed", "H200"): "1.69x", ("delayed", "B300"): "1.61x", ("tensorwise", "H200"): "1.57x",
                  ("tensorwise", "B300"): "1.41x", ("blockwise", "H200"): "1.41x", ("mxfp8", "B300"): "1.44x",
                  ("nvfp4", "B300"): "2.03x"}
    assert all("autocast" in p.what and "GEMM" in p.what for pubs in cost.PUBLISHED.values() for p in pubs
               if p.source.startswith("TransformerEngine"))
    assert "1.92x" in cost.PUBLISHED_NOTE and "MXFP8" in cost.PUBLISHED_NOTE


def test_measure_times_every_recipe_here():
    m = cost.measure(("tensorwise", "mxfp8"), size=64, rounds=1)
    assert list(m.index) == ["fp32 (no FP8)", "tensorwise", "mxfp8"]
    assert (m.loc[["tensorwise", "mxfp8"], ["quantize ms", "GEMM ms"]] > 0).all().all()


def test_cost_classes_rank_by_granularity():
    assert [cost.cost_class(r) for r in ("nvfp4", "tensorwise", "delayed", "rowwise", "blockwise", "mxfp8")] == \
        [0, 1, 1, 2, 3, 3]


# ---- the capstone exercise ---------------------------------------------------------------------------------


def _report(sinks: float):
    model = make_model("transformer", 0, sink_magnitude=sinks)
    task = MarkovTask()
    x, y = task.batch(torch.Generator().manual_seed(0), 8)
    return fp8lab.inspect(model, x, lambda out: task.loss(out, y))


def _result(gaps: dict[str, float]) -> capstone.CaseResult:
    table = pd.DataFrame({"heldout loss": [1 + g for g in gaps.values()], "gap": list(gaps.values())},
                         index=pd.Index(list(gaps), name="run"))
    table["within budget"] = table["gap"] <= capstone.BUDGET
    return capstone.CaseResult("llm_like", pd.DataFrame(), table, 0.0)


@pytest.fixture(scope="module")
def sink_report():
    return _report(1e6)


FAILING = {"fp32": 0.0, "tensorwise": 0.05, "blockwise": 0.004, "mxfp8": 0.003}


@pytest.mark.parametrize(("prediction", "ok", "needle"), [
    ({"recipe": "tensorwise", "monitor": "underflow"}, False, "misses the budget"),
    ({"recipe": "blockwise", "monitor": "underflow"}, True, "flushed to zero"),
    ({"recipe": "mxfp8", "monitor": "underflow"}, True, "none cheaper"),
    ({"recipe": "mxfp8", "monitor": "sqnr"}, False, "looks fine and isn't"),
    ({"recipe": "mxfp8", "monitor": "overflow"}, False, "nothing clips"),
    ({"recipe": "mxfp8", "monitor": "amax"}, False, "same under every recipe"),
    ({"recipe": "mxfp8", "monitor": "loss"}, False, "late and not where"),
    ({"recipe": "nvfp4", "monitor": "loss"}, False, "was not trained here"),
    ({"recipe": "mxfp8", "monitor": "vibes"}, False, "choose from loss, amax"),
    ("mxfp8", False, "predict with a dict"),
])
def test_check_capstone_grades_against_the_measurements(sink_report, prediction, ok, needle):
    fb = ex.check_capstone(prediction, _result(FAILING), sink_report)
    assert fb.ok is ok and needle in fb.message, fb.message


def test_check_capstone_asks_for_the_cheapest_that_works():
    clean = _result({"fp32": 0.0, "tensorwise": 0.002, "blockwise": 0.001, "mxfp8": 0.0})
    report = _report(0.0)
    fb = ex.check_capstone({"recipe": "blockwise", "monitor": "amax"}, clean, report)
    assert not fb.ok and "tensorwise is cheaper" in fb.message
    assert ex.check_capstone({"recipe": "tensorwise", "monitor": "amax"}, clean, report).ok  # nothing failed


def test_the_solution_is_the_answer_the_checker_accepts(sink_report):
    result = _result(FAILING)
    text = ex.solution_capstone(result, sink_report)
    assert text.startswith("recipe: blockwise") and "monitor: underflow" in text
    assert ex.check_capstone({"recipe": "blockwise", "monitor": "underflow"}, result, sink_report).ok
    assert "heatmap" in ex.hint_capstone()


@pytest.mark.parametrize("prediction", [{"recipe": ["mxfp8"], "monitor": "amax"}, {"recipe": "mxfp8", "monitor": 3},
                                        {"recipe": 1.5, "monitor": None}, {"recipe": {"mxfp8"}, "monitor": ["sqnr"]}])
def test_check_capstone_answers_a_prediction_of_the_wrong_type(sink_report, prediction):
    fb = ex.check_capstone(prediction, _result(FAILING), sink_report)
    assert not fb and ("is a name, a string" in fb.message or "fill in your prediction" in fb.message), fb.message
