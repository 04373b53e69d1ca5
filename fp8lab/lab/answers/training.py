"""The key's answers for notebook 06 (training live).

Public: ANSWERS (this part's answer functions, in notebook order).
"""

from __future__ import annotations

import math

from fp8lab.lab.answers.base import Answer
from fp8lab.lab.predictions import fresh_panel as _panel
from fp8lab.lab.predictions import magnitude, percent, share
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
        f"). (2) fc2's input holds the sinks: under tensorwise {percent(fp['tensorwise'])} of it flushes to zero, "
        "and the same codes feed fc2's weight-gradient GEMM (per tensor the transposed quantization is reused), so "
        "fc2's weight gradient sees only what its forward pass saw (rowwise: the next section). Under blockwise "
        f"{percent(fp['blockwise'])} flushes in the forward GEMM (the sinks' own 1x128 block) and {share(wg)} in the "
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
        f"flushes {percent(fl['tensorwise', 'fprop'])} of it under tensorwise and "
        f"{percent(fl['rowwise', 'fprop'])} under "
        "rowwise (all but the 4 sink channels and, per tensor, a handful of values: each token's row holds the "
        "sinks, so each row's scale is theirs). The weight-gradient GEMM flushes "
        f"{percent(fl['tensorwise', 'wgrad'])} under tensorwise (the same codes, reused) and "
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


def _q06_placement() -> Answer:
    panel = _panel("placement")
    f = {pl: panel.table(pl, 1e5).set_index(["gemm", "recipe"]) for pl in ("channels", "tokens", "both")}
    tok, ch = f["tokens"], f["channels"]
    recipes = list(dict.fromkeys(tok.index.get_level_values("recipe")))
    most = {g: max(recipes, key=lambda r, g=g: tok.loc[(g, r), "flushed"]) for g in ("fprop", "wgrad")}
    block = max(float(x.loc[(g, "blockwise"), "flushed"]) for x in f.values() for g in ("fprop", "wgrad"))
    return Answer(
        "06_training_live",
        "With the sinks in the first 2 tokens at 1e5x the median, which recipe flushes the most of fc2's ordinary "
        "inputs, and where does rowwise's damage go in each GEMM?",
        "With the sinks in the first 2 tokens (fc2's input at the initial weights, the sinks 1e5x its median "
        "ordinary value): " + "; ".join(
            f"{g} "
            f"" + ", ".join(f"{r} {percent(tok.loc[(g, r), 'flushed'])}" for r in recipes) for g in ("fprop", "wgrad"))
        + f" of the ordinary values flushed. {most['fprop']} flushes the most: one scale for the whole tensor, set by "
        f"the same amax as with the sinks in every token ({percent(ch.loc[('fprop', 'tensorwise'), 'flushed'])} "
        f"there). "
        "Rowwise's damage stays where the sinks are: in fprop (one scale per token) the two tokens that hold them "
        f"lose their small values (the worst token {percent(tok.loc[('fprop', 'rowwise'), 'worst'])}); in wgrad (one "
        "scale per channel, dW = dy^T x sums over the tokens) a token's sink sets the scale of its whole channel, "
        f"and the sink channels lose theirs (the worst channel {percent(tok.loc[('wgrad', 'rowwise'), 'worst'])}). "
        f"With the sinks in every token rowwise flushes {percent(ch.loc[('fprop', 'rowwise'), 'flushed'])} in fprop "
        f"(every token's scale is theirs) and {share(ch.loc[('wgrad', 'rowwise'), 'flushed'])} in wgrad. So channel "
        "outliers break per-token scales in fprop, token outliers break per-channel scales in wgrad, one scale per "
        f"tensor breaks under both, and blocks along K confine both: blockwise flushes at most {percent(block)} in any "
        "placement and GEMM. In a real model the token outliers' channels also carry the other tokens' values, which "
        "their wgrad scale flushes; in this toy fc2's weights for those channels are held at zero.",
        {"with token sinks tensorwise flushes the most in both GEMMs": most == {"fprop": "tensorwise",
                                                                               "wgrad": "tensorwise"},
         "with token sinks rowwise flushes under 1% in either GEMM, with channel sinks over 10% in fprop":
             bool(max(tok.loc[("fprop", "rowwise"), "flushed"], tok.loc[("wgrad", "rowwise"), "flushed"]) < 0.01
                  and ch.loc[("fprop", "rowwise"), "flushed"] > 0.1),
         "with token sinks rowwise's worst token (fprop) and worst channel (wgrad) lose over 10%":
             bool(min(tok.loc[("fprop", "rowwise"), "worst"], tok.loc[("wgrad", "rowwise"), "worst"]) > 0.1),
         "blockwise flushes under 2% in every placement and GEMM": block < 0.02},
    )


def _q06_cliff() -> Answer:
    from fp8lab.training.measured import TOKEN_SEEDS, cliff_rows, published_means
    from fp8lab.training.published import PUBLISHED, lesson_median, marker_sinks, sinks_for

    change = cliff_means()[2]
    runs = [r for r in dict.fromkeys(change.index.get_level_values("run")) if r != "fp32"]
    breaks = {r: first_break(change, r) for r in runs}
    tokens = cliff_rows("tokens").groupby(["run", "sinks"], sort=False)["loss"].mean()
    tok = tokens / tokens.index.get_level_values("run").map(tokens.xs(0.0, level="sinks")).to_numpy() - 1
    tok_runs = [r for r in dict.fromkeys(tok.index.get_level_values("run")) if r != "fp32"]
    tok_breaks = {r: first_break(tok, r) for r in tok_runs}
    massive = sinks_for(PUBLISHED[-1].ratio)
    fp8 = {r: float(tok[r, massive]) for r in tok_runs}  # where massive activations sit: 2 tokens
    every = published_means()  # the same sinks in every token
    every = {r: float(every[r, massive]) for r in runs}
    worst = max(fp8, key=lambda r: abs(fp8[r]))
    first = min(v for v in tok_breaks.values() if v is not None)
    markers = marker_sinks()

    def listed(b: dict) -> str:
        return ", ".join(f"{r} {'never (up to 1e7)' if v is None else magnitude(v)}" for r, v in b.items())

    return Answer(
        "06_training_live",
        "Where is each recipe's cliff, and where do the published ratios fall on it? At the massive-activation ratio, "
        "does any FP8 recipe lose more than 5% in this toy, and how far below the first sink value where one does "
        "does that ratio sit?",
        "First sink value at which the final loss is more than 5% above the run's own no-sink loss, with the sinks "
        f"in every token (3 seeds): {listed(breaks)}; in the first 2 tokens ({TOKEN_SEEDS} seeds): "
        f"{listed(tok_breaks)}. The median ordinary input of fc2 is {lesson_median():.3g}, so a published ratio r "
        f"sits at sinks r x {lesson_median():.3g}: " + ", ".join(f"{label} at {v:g}" for label, v in markers.items()) +
        ". The first two are channel outliers and sit on the channel cliff where no recipe moves (its points at 10 "
        "and 100). The massive activations' 100,000x, sinks " f"{massive:g}, belongs on the token cliff: there "
        f"every FP8 recipe ends within {100 * abs(fp8[worst]):.1f}% of its own clean run ({worst} "
        f"{100 * fp8[worst]:+.1f}%): no recipe loses 5%, and that point is a factor of {first / massive:.2g} below "
        f"{magnitude(first)}, the first sink value where one does "
        f"({', '.join(r for r, v in tok_breaks.items() if v == first)}). With the same sinks in every token every "
        f"recipe ends within {100 * max(abs(v) for v in every.values()):.1f}% too (3 seeds). Rowwise's collapse "
        f"needs channel sinks: at 1e6 it ends {100 * change['rowwise', 1e6]:.0f}% behind with the sinks in every "
        f"token, {100 * tok['rowwise', 1e6]:.0f}% with them in 2 tokens, whose own scales the sinks set. nvfp4 "
        "(channel cliff) starts worse and breaks at 1e6: its tensor scale pushes the blocks without a sink below "
        "every E4M3 scale, subnormals included (notebook 04's NVFP4 panel), not E2M1's range.",
        {"no FP8 recipe loses more than 1% at the massive-activation ratio, in 2 tokens or in every token":
             max(abs(v) for v in [*fp8.values(), *every.values()]) < 0.01,
         "tensorwise breaks at 1e5 or beyond in both placements": (breaks["tensorwise"] or math.inf) >= 1e5
             and (tok_breaks["tensorwise"] or math.inf) >= 1e5,
         "blockwise and mxfp8 hold up to 1e7 in both placements": all(
             b[r] is None for b in (breaks, tok_breaks) for r in ("blockwise", "mxfp8")),
         "rowwise loses over 10x more at 1e6 with channel sinks than with token sinks":
             bool(change["rowwise", 1e6] > 10 * tok["rowwise", 1e6]),
         "LLM.int8()'s and SmoothQuant's ratios sit below sinks 100": all(
             v < 100 for label, v in markers.items() if label != PUBLISHED[-1].label)},
    )


def _q06_flush() -> Answer:
    from fp8lab.training.measured import flush_costs

    f = flush_costs().set_index(["recipe", "sinks"])
    tw, rw = f.loc[("tensorwise", 1e5)], f.loc[("rowwise", 1e5)]
    return Answer(
        "06_training_live",
        "Tensorwise flushes most of fc2's ordinary inputs at 1e5. Why does it end only a few percent behind its clean "
        "run, when the same flushing costs the fp32-trained model far more?",
        f"At sinks 1e5 one scale per tensor flushes {percent(tw['flushed'])} of fc2's ordinary inputs, but they "
        f"are the "
        f"smallest: {percent(tw['energy'])} of the input's sum of squares, and fc2's output moves by "
        f"{percent(tw['fc2_error'])}. The model trained in fp32 learned with them: fed the flushed input, it loses "
        f"{100 * tw['fp32_model_loss']:+.0f}%. Tensorwise trains with them flushed from its first step, and its "
        "weight-gradient GEMM reads the same flushed codes, so fc2 learns its function from the values that survive: "
        f"it ends {100 * tw['trained_loss']:+.1f}% against its clean run. Rowwise flushes as much in its forward GEMM "
        f"({percent(rw['flushed'])}) and ends {100 * rw['trained_loss']:+.1f}%: its weight-gradient GEMM keeps "
        f"what its "
        "forward GEMM dropped (the next section). A flushed share measures what a pass drops, not what training "
        "loses; what it costs depends on whether the model can learn around it, and whether both passes agree.",
        {"at 1e5 tensorwise flushes over half of fc2's ordinary inputs, carrying under 20% of its energy":
             bool(tw["flushed"] > 0.5 and tw["energy"] < 0.2),
         "the fp32-trained model loses over 50% with that input; the tensorwise run ends within 5% of its clean run":
             bool(tw["fp32_model_loss"] > 0.5 and tw["trained_loss"] < 0.05),
         "rowwise flushes about as much (within 10%) and ends worse than tensorwise":
             bool(abs(rw["flushed"] / tw["flushed"] - 1) < 0.1 and rw["trained_loss"] > tw["trained_loss"])},
    )


def _q06_copies() -> Answer:
    p = _panel("weight_copies")
    c = p.copies("lesson")
    u = p.copies("uneven")
    lesson = p.lesson()
    one_d = "blockwise, 1-D weight blocks (1x128)"
    two_d = "blockwise (128x128 weight blocks)"
    fp4_1d, fp4_2d = "nvfp4, 1-D weight blocks (1x16)", "nvfp4 (16x16 weight blocks)"
    bw, rw = lesson[two_d], lesson["rowwise"]
    return Answer(
        "06_training_live",
        "With 1-D weight blocks the forward and input-gradient GEMMs read different copies of the weight, and "
        "rowwise's two GEMMs read different copies of fc2's input. Why does the first cost little and the second "
        "wreck training?",
        f"Because of how far apart the copies are. With 1x128 weight blocks and float32 scales the two copies of fc2's "
        f"weight differ in {percent(c[one_d]['share'])} of their elements, but only by rounding: "
        f"{percent(c[one_d]['gap'])} of the weight's norm (each copy is itself "
        f"{percent(c[one_d]['fprop_error'])} off w). "
        f"With 128x128 blocks they are the same ({percent(c[two_d]['share'])}), as per tensor; nvfp4 with 1x16 weight "
        f"blocks: {percent(c[fp4_1d]['share'])} differ, by {percent(c[fp4_1d]['gap'])}, with its 16x16 blocks "
        f"{percent(c[fp4_2d]['share'])}. Power-of-two scales (rowwise, mxfp8) shift whole binades: on this weight the "
        f"copies agree ({percent(c['rowwise']['share'])}, {percent(c['mxfp8 (1x32)']['share'])}), and on one "
        f"whose rows and "
        f"columns differ in size only where a value reaches the subnormals ({percent(u['rowwise']['share'])}, "
        f"{percent(u['mxfp8 (1x32)']['share'])}). Rowwise's input copies differ by whole values: its forward GEMM "
        f"flushes {percent(rw['fprop'])} of fc2's input, its weight-gradient GEMM {percent(rw['wgrad'])}, and it ends "
        f"{100 * rw['loss']:+.0f}%. Blockwise's input copies differ too ({percent(bw['fprop'])} against "
        f"{percent(bw['wgrad'])}) and it ends {100 * bw['loss']:+.1f}%: the size of the mismatch decides.",
        {"2-D weight blocks give both GEMMs the same weight, 1-D blocks do not":
             c[two_d]["share"] == 0 == c[fp4_2d]["share"] and c[one_d]["share"] > 0.5 and c[fp4_1d]["share"] > 0.5,
         "1-D float32 scales make the copies differ by rounding only: under 5% of the weight's norm":
             c[one_d]["gap"] < 0.05,
         "rowwise's input copies differ by over 99% of fc2's input; blockwise's by under 20%":
             rw["fprop"] - rw["wgrad"] > 0.99 and bw["fprop"] - bw["wgrad"] < 0.2,
         "blockwise ends within 5% of its clean run, rowwise more than 100% behind":
             bw["loss"] < 0.05 and rw["loss"] > 1},
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




ANSWERS = (_q06_live, _q06_placement, _q06_cliff, _q06_flush, _q06_mismatch, _q06_copies, _q06_drift, _q06_exercises)
