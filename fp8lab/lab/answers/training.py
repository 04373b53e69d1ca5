"""The key's answers for notebook 06 (training live).

Public: ANSWERS (this part's answer functions, in notebook order).
"""

from __future__ import annotations

import math

from fp8lab.lab.answers.base import Answer
from fp8lab.lab.predictions import _pct, magnitude, share
from fp8lab.training.measured import cliff_means, first_break, survivors

__all__ = ['ANSWERS']


# ---- 06 training -----------------------------------------------------------------------------------------------------


def _q06_live() -> Answer:
    from fp8lab.training.train import train

    change = cliff_means()[2]
    behind = sorted(r for r in ("tensorwise", "rowwise", "blockwise", "mxfp8") if change[r, 1e6] > 0.05)
    res = train(("tensorwise", "blockwise"), steps=4, sink_magnitude=1e6, progress=False, monitor_every=1)
    m = res.monitor.groupby(["run", "layer", "gemm", "role"])["underflow"].mean()
    fp = {r: m[r, "fc2", "fprop", "input"] for r in ("tensorwise", "blockwise")}
    wg = m["blockwise", "fc2", "wgrad", "input"]
    grads = max(m[r, "fc2", "dgrad", "grad_output"] for r in ("tensorwise", "blockwise"))
    return Answer(
        "06_training_live",
        "(1) Set the sinks to 1e6 and train fp32, tensorwise, rowwise, blockwise and mxfp8. Which recipes fall behind?",
        "(1) " + ", ".join(behind) + " (final loss vs its own no-sink run, mean of 3 seeds: " +
        ", ".join(f"{r} {100 * change[r, 1e6]:+.0f}%" for r in ("tensorwise", "rowwise", "blockwise", "mxfp8")) +
        f"). (2) fc2's input holds the sinks: under tensorwise {_pct(fp['tensorwise'])} of it flushes to zero, "
        "and the same codes feed fc2's weight-gradient GEMM (per tensor the transposed quantization is reused), so "
        "fc2's weight gradient sees only what its forward pass saw (rowwise: the next section). Under blockwise "
        f"{_pct(fp['blockwise'])} flushes in the forward GEMM (the sinks' own 1x128 block) and {share(wg)} in the "
        "weight-gradient GEMM, whose blocks run along the tokens: a sink channel fills its own blocks there. "
        f"grad_output: {share(grads)} of it flushed in either recipe; the sinks do not reach the gradients. "
        "(3) The transformer puts sinks in each block's MLP; this key does not train it (a step costs ~2-3x the "
        "MLP's): compare what your run shows with the MLP's.",
        {"tensorwise and rowwise fall behind, blockwise and mxfp8 do not":
             set(behind) == {"tensorwise", "rowwise"},
         "tensorwise flushes most of fc2's input": bool(fp["tensorwise"] > 0.9),
         "blockwise flushes under a fifth of fc2's input in fprop, under 1% in wgrad":
             bool(fp["blockwise"] < 0.2 and wg < 0.01),
         "the sinks flush under 1% of fc2's grad_output": bool(grads < 0.01)},
    )


def _q06_mismatch() -> Answer:
    from fp8lab.training.measured import MISMATCH_RUNS, mismatch
    from fp8lab.training.operands import lesson_mismatch

    f = lesson_mismatch(MISMATCH_RUNS)
    df = mismatch()
    fl = {(r, g): float(f.loc[(r, g), "underflow"]) for r, g in f.index if f.loc[(r, g), "format"] != "high precision"}
    mean = df.groupby("run", sort=False)["loss"].mean()
    constant = float(df.groupby("seed")["constant"].first().mean())
    by_seed = {s: part.set_index("run")["loss"] for s, part in df.groupby("seed")}
    consts = df.groupby("seed")["constant"].first()
    order = all(by_seed[s]["tensorwise"] < consts[s] < min(by_seed[s]["rowwise"], by_seed[s]["rowwise_with_gw_hp"])
                for s in by_seed)
    close = max(abs(by_seed[s]["rowwise_with_gw_hp"] / by_seed[s]["rowwise"] - 1) for s in by_seed)
    return Answer(
        "06_training_live",
        "Rowwise flushes fc2's forward input as tensorwise does, yet ends worse than predicting the mean. Which GEMM "
        "differs between the two?",
        f"The weight-gradient GEMM. fc2's input, sinks at 1e6, one batch at the initial weights: the forward GEMM "
        f"flushes {_pct(fl['tensorwise', 'fprop'])} of it under tensorwise and {_pct(fl['rowwise', 'fprop'])} under "
        "rowwise (all but the 4 sink channels and, per tensor, a handful of values: each token's row holds the "
        "sinks, so each row's scale is theirs). The weight-gradient GEMM flushes "
        f"{_pct(fl['tensorwise', 'wgrad'])} under tensorwise (the same codes, reused) and "
        f"{share(fl['rowwise', 'wgrad'])} under rowwise (one scale per channel: the ordinary "
        "channels keep theirs). So tensorwise learns fc2's weights from what its forward pass saw, and rowwise from "
        "inputs its forward pass dropped. Final losses after 150 steps, mean of 3 seeds: tensorwise "
        f"{mean['tensorwise']:.2g}, rowwise {mean['rowwise']:.2g}, rowwise_with_gw_hp "
        f"{mean['rowwise_with_gw_hp']:.2g}; "
        f"predicting the mean target {constant:.2g}. On every seed tensorwise ends below the constant and both "
        "rowwise recipes above it. rowwise_with_gw_hp computes the weight gradient with no FP8 at all and ends as "
        f"badly as rowwise (within {100 * close:.0f}% on every seed): the harm is not a quantization error in the "
        "backward pass but the mismatch between the passes.",
        {"both recipes flush over 99% of fc2's input in the forward GEMM":
             fl["tensorwise", "fprop"] > 0.99 and fl["rowwise", "fprop"] > 0.99,
         "tensorwise's weight-gradient GEMM flushes as much; rowwise's under 0.01%":
             fl["tensorwise", "wgrad"] > 0.99 and fl["rowwise", "wgrad"] < 1e-4,
         "on every seed: tensorwise < predicting the mean < rowwise and rowwise_with_gw_hp": order,
         "rowwise_with_gw_hp ends within 15% of rowwise on every seed": bool(close < 0.15)},
    )


def _q06_cliff() -> Answer:
    change = cliff_means()[2]
    runs = [r for r in dict.fromkeys(change.index.get_level_values("run")) if r != "fp32"]
    breaks = {r: first_break(change, r) for r in runs}
    worst_1e4 = max(abs(change[r, 1e4]) for r in runs if r != "nvfp4")
    return Answer(
        "06_training_live",
        "Where is each recipe's cliff? Massive activations reported for LLMs are ~1e3-1e4 times the median: does any "
        "FP8 recipe lose more than 5% there in this toy?",
        "First sink value at which the final loss is more than 5% above the run's own no-sink loss (3 seeds): " +
        ", ".join(f"{r} {'never (up to 1e7)' if v is None else magnitude(v)}" for r, v in breaks.items()) +
        f". At 1e4 the E4M3 recipes end within {100 * worst_1e4:.1f}% of their clean runs: in this toy the cliff "
        "lies beyond the reported size of massive activations; nvfp4 starts worse and breaks earlier (E2M1's 3.6 "
        "binades).",
        {"no E4M3 recipe loses more than 5% at 1e4": worst_1e4 < 0.05,
         "tensorwise breaks at 1e5 or beyond": (breaks["tensorwise"] or math.inf) >= 1e5,
         "blockwise and mxfp8 hold up to 1e6": (breaks["blockwise"] or math.inf) > 1e6 and
             (breaks["mxfp8"] or math.inf) > 1e6},
    )


def _q06_drift() -> Answer:
    from fp8lab.training.measured import recovery
    from fp8lab.training.train import LESSON

    rec = recovery().set_index("history")["steps_to_recover"]
    short, long = LESSON.short_history, LESSON.long_history
    return Answer(
        "06_training_live",
        "How many steps does the short history need to recover, and why exactly that many?",
        f"History {short}: {rec[short]} steps (fc1's input underflow back under 1% from step "
        f"{LESSON.gain_drop_step + rec[short]}). With algo max the scale uses the largest of the last {short} amaxes, "
        f"and the old, large ones leave the history one per step. History {long}: "
        f"{'never within the run' if rec[long] is None else f'{rec[long]} steps'}. Monitor each layer's underflow "
        "(and the amax each scale used) to catch a lagging scale.",
        {"the short history recovers in exactly its length": rec[short] == short,
         "the long history never recovers within the run": rec[long] is None or math.isnan(rec[long])},
    )


def _q06_exercises() -> Answer:
    from fp8lab.lab import exercises as ex

    surv = survivors()
    hist = ex.history_answer()
    same, r30, r150 = ex.ranking_answer()
    return Answer(
        "06_training_live",
        "Exercises 06a-c: who survives the sinks; the longest history; does step 30 predict step 150?",
        f"06a: {sorted(surv)} (within 5% of their own no-sink loss at 1e6). 06b: history {hist} (the delayed "
        f"recipe recovers after exactly its history length). 06c: at 1e6, seed 0: ranking at step 30 "
        f"{' < '.join(r30)}; at step 150 {' < '.join(r150)}: {'the same' if same else 'different'}.",
        {"blockwise and mxfp8 survive, no per-tensor or per-row recipe does":
             {"blockwise", "mxfp8"} <= surv and not surv & {"tensorwise", "delayed", "rowwise"}},
    )




ANSWERS = (_q06_live, _q06_cliff, _q06_mismatch, _q06_drift, _q06_exercises)
