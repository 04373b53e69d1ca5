"""The lessons of notebook 06, as tests with fixed seeds (settings: fp8lab.training.train.LESSON).

(a) without outliers every FP8 recipe ends within 3% of the fp32 baseline;
(b) with 4 sink channels at 1e6, per-tensor and per-row E4M3 end >= 25% worse than their
    own runs without outliers, blockwise (1x128 / 128x128) and MXFP8 stay within 5%, and
    smaller activation tiles lose less than larger ones;
(c) when fc1's input shrinks 1e5-fold mid-run, delayed scaling with a short history
    recovers and a long one lags behind (its old amax flushes the new values to zero).
Seed 0 is trained here in full; seeds 1 and 2 share the fp32 and FP8 runs that fp8lab.training.measured
ships (notebook 06's cliff), which seed 0's runs check against the code, and train the tiles.
"""

import pandas as pd
import pytest

from fp8lab.training.measured import cliff
from fp8lab.training.train import LESSON, block_size_recipes, delayed_recipes, train

SEEDS = (0, 1, 2)
FP8 = ("tensorwise", "rowwise", "blockwise", "mxfp8")
TILES = block_size_recipes((32, 512))  # with blockwise itself (1x128): 32 < 128 < 512
LIVE_SEED = 0  # trained here in full; the other seeds' fp32 and FP8 runs are the ones fp8lab.training.measured ships


def _shipped(magnitude: float, seed: int) -> pd.Series:
    t = cliff()
    part = t[(t.seed == seed) & (t.sinks == magnitude) & t.run.isin(("fp32", *FP8))]
    return part.set_index("run")["loss"]


@pytest.fixture(scope="module")
def live():
    """{sink_magnitude: final losses of every run of LIVE_SEED}, trained now."""
    return {magnitude: train(("fp32", *FP8, *(TILES if magnitude else ())), seed=LIVE_SEED, sink_magnitude=magnitude,
                             progress=False, monitor_every=None).final_loss()
            for magnitude in (0.0, LESSON.sink_magnitude)}


@pytest.fixture(scope="module")
def finals(live):
    """{(sink_magnitude, seed): final losses (mean of the last 10 steps) of every run}: LIVE_SEED's
    trained now; the other seeds' fp32 and FP8 runs shared with fp8lab.training.measured (the runs notebook
    06 plots, checked against the code below), their tile runs trained now."""
    out = {}
    for magnitude in (0.0, LESSON.sink_magnitude):
        for seed in SEEDS:
            if seed == LIVE_SEED:
                out[magnitude, seed] = live[magnitude]
                continue
            losses = _shipped(magnitude, seed)
            if magnitude:
                tiles = train(TILES, seed=seed, sink_magnitude=magnitude, progress=False, monitor_every=None)
                losses = pd.concat([losses, tiles.final_loss()])
            out[magnitude, seed] = losses
    return out


# How far a run trained here may end from the shipped one (relative). The FP8 runs move with the
# machine: a last-bit difference in an fp32 sum (another instruction set, MKL's code path) turns a value
# near an E4M3 rounding boundary into the neighbouring code, and the trajectories drift. Measured on
# seeds 0 and 1 at 150 steps, shipped runs (AMD EPYC, AVX2, 1 thread) against an Intel Xeon (AVX-512)
# with 2 threads, 1 thread, MKL_CBWR=COMPATIBLE, ONEDNN_MAX_CPU_ISA=AVX2 and MKL_ENABLE_INSTRUCTIONS=AVX2:
# fp32 ends at the same 6 digits everywhere; a run that trains well (within 5% of fp32) moved by at
# most 0.52%; a run the sinks break (tensorwise, rowwise at 1e6) by at most 3.7%. The bounds are ~4x
# and ~3x those; the claims the lessons make (the tests below) rest on gaps of 25% and more.
SHIPPED_FP32 = 1e-5
SHIPPED_TRAINS_WELL = 0.02
SHIPPED_BROKEN = 0.10


@pytest.mark.slow
@pytest.mark.parametrize("magnitude", [0.0, LESSON.sink_magnitude])
def test_the_shipped_runs_are_what_the_code_trains_now(live, magnitude):
    """fp8lab.training.measured's runs (shipped to 6 significant digits, the lessons' other seeds) are the
    code's: LIVE_SEED trained now ends where the shipped table says, every run, within what another
    machine moves it by (a change to training, quantization or the GEMM that moves them further: then
    `python -m fp8lab measured --write`)."""
    shipped = _shipped(magnitude, LIVE_SEED)
    assert set(shipped.index) == {"fp32", *FP8}
    for run, loss in shipped.items():
        if run == "fp32":
            allowed = SHIPPED_FP32
        else:
            allowed = SHIPPED_TRAINS_WELL if loss <= 1.05 * shipped["fp32"] else SHIPPED_BROKEN
        assert abs(live[magnitude][run] - loss) <= allowed * loss, (run, live[magnitude][run], loss, allowed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_without_outliers_every_recipe_is_within_3_percent_of_fp32(finals, seed):
    f = finals[0.0, seed]
    for recipe in FP8:
        assert abs(f[recipe] - f["fp32"]) / f["fp32"] < 0.03, (recipe, f.to_dict())


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_b_outliers_break_per_tensor_and_per_row_but_not_blocks(finals, seed):
    clean, sunk = finals[0.0, seed], finals[LESSON.sink_magnitude, seed]
    assert sunk["fp32"] == pytest.approx(clean["fp32"], rel=1e-4)  # fp32 never sees the sinks
    for recipe in ("tensorwise", "rowwise"):
        assert sunk[recipe] >= 1.25 * clean[recipe], (recipe, sunk[recipe], clean[recipe])
    for recipe in ("blockwise", "mxfp8"):
        assert sunk[recipe] <= 1.05 * clean[recipe], (recipe, sunk[recipe], clean[recipe])


@pytest.mark.slow
def test_b_smaller_blocks_lose_less(finals):
    def mean_loss(recipe):
        return sum(finals[LESSON.sink_magnitude, s][recipe] for s in SEEDS) / len(SEEDS)

    assert mean_loss("blockwise 1x32") < mean_loss("blockwise") < mean_loss("blockwise 1x512")


@pytest.mark.slow
@pytest.mark.parametrize("seed", (0, 1))
def test_c_delayed_scaling_short_history_recovers_long_history_lags(seed):
    short, long = delayed_recipes()
    res = train(("tensorwise", short, long), seed=seed, gain_schedule=LESSON.gain_schedule, monitor_every=1,
                progress=False)
    f = res.final_loss()
    assert f[short.name] < 1.10 * f["tensorwise"]
    assert f[long.name] > 2.0 * f["tensorwise"]
    m = res.monitor
    flushed = m[(m.layer == "fc1") & (m.role == "input") & (m.gemm == "fprop")].pivot(
        index="step", columns="run", values="underflow")
    after = LESSON.gain_drop_step + LESSON.short_history + 1
    assert (flushed.loc[after:, short.name] < 1e-3).all()  # an odd near-zero element at most
    assert (flushed.loc[after:, long.name] > 0.5).all()
    assert (flushed["tensorwise"] < 1e-3).all()  # current scaling follows the change at once
