"""Notebook 09's exercises, panels and shipped runs: the checkers accept the solutions and name each mistake; the
panels show what their prose says; the shipped runs hold every run the panels and the key read."""

import pytest
import torch

import fp8lab
from fp8lab.lab import exercises as ex
from fp8lab.numerics.formats import E2M1, stochastic_reference


def _solution():
    namespace = {"torch": torch, "fp8lab": fp8lab}
    exec(ex.solution_stochastic_round(), namespace)
    return namespace["my_round"]


def test_exercise_09_accepts_the_solution_and_names_each_mistake():
    mine = _solution()
    assert ex.check_stochastic_round(mine)
    cases = {
        "round to nearest": lambda x, u: fp8lab.cast(x, "e2m1"),
        "wrong way round": lambda x, u: mine(x, 1 - u),
        "sign is lost": lambda x, u: mine(x.abs(), u),
        "clamp |x| to 6": lambda x, u: torch.where(x.abs() > 6, x, mine(x, u)),
        "not E2M1 values": lambda x, u: x,
        "biased": lambda x, u: mine(x, u * 0.9),
        "raised": lambda x, u: 1 / 0,
    }
    for needle, fn in cases.items():
        feedback = ex.check_stochastic_round(fn)
        assert not feedback, needle
        assert needle in feedback.message or (needle == "raised" and "ZeroDivisionError" in feedback.message), \
            (needle, feedback.message)
    assert isinstance(ex.hint_stochastic_round(), str)


def test_the_solution_is_the_reference_on_any_draws():
    mine = _solution()
    x = torch.randn(5000) * 3
    for seed in range(3):
        u = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(mine(x, u), stochastic_reference(x, E2M1, u))


def test_exercise_09b_reads_the_shipped_split():
    """09b's answer is the shipped seed-0 split, read as its shares of NVFP4's gap: (nvfp4 - run) / (nvfp4 - bf16)
    from the final losses; the solution prints those shares."""
    from fp8lab.training.measured_fp4 import split

    loss = split().query("seed == 0").set_index("run")["final loss"]
    nv, bf = loss["nvfp4 1x16"], loss["bf16"]
    want = ex.fc1_split_answer()
    forward, wgrad = (loss[f"nvfp4 1x16, fc1's {part} in high precision"] for part in ("forward", "weight gradient"))
    assert want["forward"] == pytest.approx((nv - forward) / (nv - bf))
    assert want["wgrad"] == pytest.approx((nv - wgrad) / (nv - bf))
    assert ex.check_fc1_split(want["forward"], want["wgrad"])
    assert f"{want['forward']:.2f}, {want['wgrad']:.2f}" in ex.solution_fc1_split()


def test_the_shipped_runs_hold_every_run_the_panels_and_the_key_read():
    from fp8lab.training.gradients import grad_recipes
    from fp8lab.training.measured_fp4 import dy_runs, layer_runs, parts
    from fp8lab.training.parts import PART_SETS, REFERENCES, part_label

    t = parts()
    for seed in (0, 1, 2):
        runs = set(t[(t.model == "mlp") & (t.seed == seed)].run)
        assert runs == {*REFERENCES, *(part_label(p) for p in PART_SETS), *layer_runs()}, seed
    d = dy_runs()
    for model in ("mlp", "llm_like"):
        for seed in (0, 1, 2):
            assert set(d[(d.model == model) & (d.seed == seed)].run) == {"fp32", *(r.name for r in grad_recipes())}
    # the recipe's share of the MLP's 3 layers is fc3: its run and the "fc3 in bf16" run are one run, twice
    same = t[t.run.isin(["nvfp4 HP", "nvfp4 1x16, fc3 in bf16"])].groupby("seed")["final loss"].nunique()
    assert (same == 1).all()


def test_the_parts_panel_labels_each_combination_as_the_shipped_runs_do():
    from fp8lab.lab.panels import PartsPanel

    panel = PartsPanel()
    assert panel.update(two_d=True, hadamard=True, stochastic=True, high=True)["label"] == "nvfp4 2D+RHT+SR+HP"
    data = panel.update(two_d=False, hadamard=False, stochastic=False, high=False, measure="heldout high precision")
    assert data["label"] == "nvfp4 1x16" and abs(data["values"]["bf16"]) < 1e-12
    assert "mean of 3 seeds" in str(panel._figure[0].axes[0].get_title())


def test_the_two_d_panel_shows_one_copy_with_square_blocks():
    from fp8lab.lab.panels import TwoDWeightPanel

    panel = TwoDWeightPanel()
    one = panel.update(blocks=False)
    two = panel.update(blocks=True)
    assert one["differ"] > 0.3 and one["dx"] > 0.01
    assert two["differ"] == 0 and two["dx"] == 0


def test_the_hadamard_panel_measures_back_in_the_original_values():
    """The transformed tensor's SQNR is measured after the inverse transform: at outlier 1x (a Gaussian tensor) the
    transform changes little, and the GEMM over transformed operands approximates the plain product."""
    from fp8lab.lab.panels import HadamardPanel

    panel = HadamardPanel()
    d = panel.update(source="outlier", outlier=1.0)
    assert abs(d["sqnr_rot"] - d["sqnr_plain"]) < 3 and d["gemm_rot"] < 0.3
