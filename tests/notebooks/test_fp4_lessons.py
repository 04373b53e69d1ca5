"""The lessons of notebook 09, as claims on trained runs (settings: fp8lab.training.parts, LESSON's: the lesson MLP,
150 steps, no sinks; notebook 08's LLM-like model for the gradients).

(a) NVFP4 ends several percent above bf16 with or without its training recipe's parts, and no part alone moves its
    final loss by 2 points (mean of 3 seeds); (b) the weights NVFP4 trains, evaluated with a high-precision forward,
    are within 3% of bf16's (mean of 3 seeds) and lose far less than the same weights as trained: the toy's gap is
    the forward pass's 4-bit noise; (c) keeping fc1 (the layer with the largest weight-gradient error, 20% of the
    work) in bf16 closes most of the gap, keeping the last layer (the recipe's choice) does not; (d) every FP8 choice
    for dy (E4M3 / E5M2, per tensor / 1x128) ends within 3% of fp32 on both models; (e) fc1's gain is its forward:
    with fc1's forward GEMM alone in high precision NVFP4 closes over 80% of its gap to bf16, with fc1's weight
    gradient alone under 20% (the fc1 split, every seed: exercise 09b grades against it).
Seed 0 is trained here; seeds 1 and 2 are the runs fp8lab.training.measured_fp4 ships, which seed 0's runs check
against the code. The trained numbers move with the machine (tests/conftest.py MACHINE_SENSITIVE).
"""

import pandas as pd
import pytest

from fp8lab.numerics.recipes import NVFP4_PARTS
from fp8lab.training.gradients import grad_recipes
from fp8lab.training.measured_fp4 import dy_runs, layer_recipes, parts, split
from fp8lab.training.parts import REFERENCES, fc1_split, part_label, split_gaps, train_parts

SEEDS = (0, 1, 2)
LIVE_SEED = 0
SINGLES = tuple((p,) for p in NVFP4_PARTS)
ALL = tuple(NVFP4_PARTS)
FC1 = layer_recipes()[0]  # NVFP4 1x16 with fc1 in bf16
LIVE_RUNS = (*REFERENCES, (), *SINGLES, ALL, FC1)

# How far a run trained here may end from the shipped one (relative), in every column. Measured on seed 0 (shipped:
# AMD EPYC, 1 thread per run) retrained on the same machine with 2 threads, with OMP_NUM_THREADS=1
# MKL_CBWR=COMPATIBLE and with ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2: fp32 ends at the same 6 digits
# everywhere; bf16 moved by up to 0.021%, MXFP8 0.15%, the NVFP4 runs up to 2.75% (AVX2; 1.78% with
# MKL_CBWR=COMPATIBLE), the dy runs up to 0.77%. The bound is ~3x the largest; the claims rest on gaps of points.
SHIPPED_FP32 = 1e-5
SHIPPED_LOW_PRECISION = 0.08


@pytest.fixture(scope="module")
def live():
    return train_parts(LIVE_RUNS, seed=LIVE_SEED).table


@pytest.fixture(scope="module")
def by_seed(live):
    """{seed: the parts runs' table}: LIVE_SEED trained now, the other seeds shipped."""
    t = parts()
    out = {s: t[(t.model == "mlp") & (t.seed == s)].set_index("run").iloc[:, 2:] for s in SEEDS if s != LIVE_SEED}
    out[LIVE_SEED] = live
    return out


def _vs_bf16(table: pd.DataFrame, column: str = "final loss") -> pd.Series:
    return table[column] / table.loc["bf16", column] - 1


@pytest.mark.slow
def test_the_shipped_parts_runs_are_what_the_code_trains_now(live):
    shipped = parts()
    shipped = shipped[(shipped.model == "mlp") & (shipped.seed == LIVE_SEED)].set_index("run")
    for run in live.index:
        for column in live.columns:
            want, got = shipped.loc[run, column], live.loc[run, column]
            allowed = SHIPPED_FP32 if run == "fp32" else SHIPPED_LOW_PRECISION
            assert abs(got - want) <= allowed * want, (run, column, got, want, allowed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_nvfp4_ends_several_percent_above_bf16_with_and_without_the_parts(by_seed, seed):
    rel = _vs_bf16(by_seed[seed])
    for parts_on in ((), ALL):
        assert rel[part_label(parts_on)] > 0.03, (seed, parts_on, rel.to_dict())
    assert abs(rel["mxfp8"]) < 0.03  # the 8-bit recipe with blocks along K: close to bf16


@pytest.mark.slow
def test_a_no_part_alone_moves_nvfp4s_final_loss_by_two_points(by_seed):
    rel = pd.concat([_vs_bf16(by_seed[s]) for s in SEEDS], axis=1).mean(axis=1)
    plain = rel[part_label(())]
    for p in SINGLES:
        assert abs(rel[part_label(p)] - plain) < 0.02, (p, rel[part_label(p)], plain)


@pytest.mark.slow
def test_b_nvfp4s_trained_weights_are_within_3_percent_of_bf16s_in_high_precision(by_seed):
    """The held-out batch is one draw (1024 samples): a seed's high-precision gap moves by a few points (measured
    -2.8% to +3.2%), their mean is the claim; each seed's as-trained gap is larger by over 3 points."""
    high = pd.concat([_vs_bf16(by_seed[s], "heldout high precision") for s in SEEDS], axis=1, keys=SEEDS)
    as_trained = pd.concat([_vs_bf16(by_seed[s], "heldout as trained") for s in SEEDS], axis=1, keys=SEEDS)
    for parts_on in ((), ALL):
        run = part_label(parts_on)
        assert abs(high.loc[run].mean()) < 0.03, (run, high.loc[run].to_dict())
        assert (as_trained.loc[run] > high.loc[run] + 0.03).all(), (run, as_trained.loc[run], high.loc[run])


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_c_fc1_in_bf16_closes_most_of_the_gap_the_last_layer_does_not(by_seed, seed):
    rel = _vs_bf16(by_seed[seed])
    plain = rel[part_label(())]
    assert rel[FC1.label] < 0.05 and rel[FC1.label] < plain / 2, (seed, rel[FC1.label], plain)
    assert rel[part_label(("high_precision",))] > 0.05  # the last layer (the recipe's share of 3 layers)


@pytest.fixture(scope="module")
def dy_live():
    return {model: train_parts(["fp32", *grad_recipes()], model=model, seed=LIVE_SEED).table
            for model in ("mlp", "llm_like")}


@pytest.mark.slow
def test_d_every_choice_for_dy_ends_within_3_percent_of_fp32_and_is_what_was_shipped(dy_live):
    shipped = dy_runs()
    for model, live in dy_live.items():
        for seed in SEEDS:
            t = live if seed == LIVE_SEED else shipped[(shipped.model == model) & (shipped.seed == seed)] \
                .set_index("run").iloc[:, 2:]
            rel = t["final loss"] / t.loc["fp32", "final loss"] - 1
            assert (rel.drop("fp32").abs() < 0.03).all(), (model, seed, rel.to_dict())
        want = shipped[(shipped.model == model) & (shipped.seed == LIVE_SEED)].set_index("run")
        for run in live.index:
            allowed = SHIPPED_FP32 if run == "fp32" else SHIPPED_LOW_PRECISION
            got, expected = live.loc[run, "final loss"], want.loc[run, "final loss"]
            assert abs(got - expected) <= allowed * expected, (model, run, got, expected)


@pytest.fixture(scope="module")
def split_live():
    return fc1_split(seed=LIVE_SEED).table


@pytest.mark.slow
def test_e_fc1s_gain_is_its_forward_not_its_weight_gradient_and_the_split_is_what_was_shipped(split_live):
    shipped = split()
    seed0 = shipped[shipped.seed == LIVE_SEED].set_index("run")
    for run in split_live.index:
        for column in split_live.columns:
            want, got = seed0.loc[run, column], split_live.loc[run, column]
            assert abs(got - want) <= SHIPPED_LOW_PRECISION * want, (run, column, got, want)
    tables = {s: shipped[shipped.seed == s].set_index("run") for s in SEEDS if s != LIVE_SEED}
    tables[LIVE_SEED] = split_live
    for seed, table in tables.items():
        gaps = split_gaps(table)
        assert gaps["forward"] > 0.8 and gaps["wgrad"] < 0.2, (seed, gaps)
        assert abs(gaps["forward"] - gaps["whole"]) < 0.2, (seed, gaps)
