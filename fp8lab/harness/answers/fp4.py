"""The key's answers for notebook 09 (below eight bits, and the gradient side).

Public: ANSWERS (this part's answer functions, in notebook order).
"""

from __future__ import annotations

from fp8lab.harness.answers.base import Answer, decibels, lab_panel
from fp8lab.lab import exercises as ex
from fp8lab.lab.predictions import percent, share
from fp8lab.training.gradients import WHEN
from fp8lab.training.measured_fp4 import dy_control_runs, dy_runs, means, parts, split
from fp8lab.training.parts import PART_SETS, part_label, split_gaps

__all__ = ["ANSWERS"]

NB = "09_below_eight_bits"


def _q09_gradients() -> Answer:
    panel = lab_panel("gradients")
    spans, tables = {}, {}
    for model, rec in panel.records.items():
        for layer in rec.layers:
            d = panel.update(layer=(model, layer), when=WHEN[-1], choice="E4M3 per-tensor")
            spans[model, layer], tables[model, layer] = d["span"], d["table"]
    widest = max(spans, key=spans.get)
    # which projection is widest is a near tie that a machine's last bits decide: the key names them all
    projections = sorted(layer for model, layer in spans if model == widest[0] and "qkv" in layer)
    t = tables[widest]
    tiles = panel.update(layer=widest, when=WHEN[-1], choice="E4M3 per-tensor")["tiles"]
    mlp_worst = max(tables[k].loc["E4M3 per-tensor", "flushed"] for k in tables if k[0] == "mlp")
    e4, e5 = t.loc["E4M3 1x128", "sqnr_db"], t.loc["E5M2 1x128", "sqnr_db"]
    return Answer(
        NB,
        "(1) Which layer's gradient spans the most binades, and how much of it does E4M3 with one scale per tensor "
        "flush there?",
        f"(1) The LLM-like model's attention projections ({', '.join(projections)}): at the last step the widest "
        f"of their dys spans about "
        f"{spans[widest]:.1f} binades (largest over smallest nonzero), more than E5M2's 31.8. E4M3 per tensor "
        f"flushes about {percent(t.loc['E4M3 per-tensor', 'flushed'])} of its nonzero values, E5M2 per tensor "
        f"about {share(t.loc['E5M2 per-tensor', 'flushed'], 1e-5)}, E4M3 in 1x128 tiles "
        f"{share(t.loc['E4M3 1x128', 'flushed'])}. The lesson MLP's gradients span fewer binades: E4M3 per "
        f"tensor flushes no more than about {share(mlp_worst, 1e-5)} of any of its layers'. (2) The range lies "
        "between tokens: "
        f"the scales of 1x128 tiles lie about {tiles:.1f} binades apart. A scale per token and 128 channels puts each "
        "token's largest value at E4M3's top, "
        "and within one token's 128 values the gradient spans far fewer binades than across tokens. (3) E4M3: "
        f"{decibels(e4)} dB against E5M2's {decibels(e5)} dB in 1x128 tiles, one more mantissa bit (about 6 dB); "
        "with a scale per tile, E5M2's extra range buys nothing.",
        {"the widest gradient is an LLM-like attention projection's": widest[0] == "llm_like" and "qkv" in widest[1],
         "most of its range lies between tokens (1x128 tiles' scales over 18 binades apart)": tiles > 18,
         "it spans more binades than E5M2 covers": spans[widest] > 31.8,
         "E4M3 per tensor flushes more of it than E5M2 per tensor, and 1x128 tiles almost none":
             t.loc["E4M3 per-tensor", "flushed"] > t.loc["E5M2 per-tensor", "flushed"]
             and t.loc["E4M3 1x128", "flushed"] < 1e-4,
         "E4M3 in 1x128 tiles keeps dy more precisely than E5M2 (by over 4 dB)": e4 > e5 + 4},
    )


def _q09_dy_losses() -> Answer:
    m = means(dy_runs())["final loss"]
    change = {(model, run): m[model, run] / m[model, "fp32"] - 1 for model, run in m.index if run != "fp32"}
    worst = max(change, key=lambda k: abs(change[k]))
    within = {model: max(v for (mo, _), v in change.items() if mo == model)
              - min(v for (mo, _), v in change.items() if mo == model) for model in ("mlp", "llm_like")}
    runs = ", ".join(f"{run[3:]} {100 * v:+.2f}%" for (model, run), v in change.items() if model == "llm_like")
    control = means(dy_control_runs())["final loss"].xs("dy unquantized", level="run")
    vs = {model: [m[model, run] / control[model] - 1 for mo, run in m.index if mo == model and run != "fp32"]
          for model in ("mlp", "llm_like")}
    return Answer(
        NB,
        "Which of the four choices for dy ends measurably worse than fp32 on either model, and what does that say "
        "about how much of dy the flushed values carry?",
        f"None by much: the largest change of a final loss against fp32's, mean of 3 seeds, is "
        f"{100 * change[worst]:+.2f}% ({worst[1][3:]}, {'the LLM-like model' if worst[0] == 'llm_like' else 'the MLP'}"
        f"), and the four choices end within {100 * within['mlp']:.2f} points of each other on the MLP, "
        f"{100 * within['llm_like']:.2f} on the LLM-like model ({runs}): which one flushes most of dy does not show "
        "in the loss. The values one E4M3 scale per tensor flushes are the smallest gradients, many binades below "
        "the largest: their share of the sums dgrad and wgrad make is tiny, so on these toys losing them costs "
        "nothing measurable. (2) Against the control, blockwise's forward with dy unquantized (mean of 3 seeds): "
        + "; ".join(f"{'the MLP' if model == 'mlp' else 'the LLM-like model'}: the control "
                    f"{100 * (control[model] / m[model, 'fp32'] - 1):+.2f}% against fp32, the four choices between "
                    f"{100 * min(vs[model]):+.2f}% and {100 * max(vs[model]):+.2f}% against the control"
                    for model in ("mlp", "llm_like"))
        + ". Most of what separates a choice from fp32 is the blockwise forward's, not dy's quantization.",
        {"every choice for dy ends within 2% of fp32 on both models": all(abs(v) < 0.02 for v in change.values()),
         "the four choices end within half a point of each other on each model": max(within.values()) < 0.005,
         "against the control (dy unquantized) every choice ends within 1%":
             all(abs(v) < 0.01 for model in vs for v in vs[model])},
    )


def _q09_two_d() -> Answer:
    panel = lab_panel("two_d_weights")
    one = panel.update(recipe="nvfp4", blocks=False, outliers=1.0)
    two = panel.update(recipe="nvfp4", blocks=True)
    mx = panel.update(recipe="mxfp8", blocks=False)
    return Answer(
        NB,
        "(1) With 1x16 NVFP4 blocks, what share of the weights have two different copies, and how far is dgrad's dx "
        "from the chain rule's?",
        f"(1) {percent(one['differ'])} of the weights: dgrad's copy lies {one['copies']:.3g} (relative) from fprop's, "
        f"and dgrad's dx {one['dx']:.3g} from dy times the weight the forward used, about as far as each copy from "
        f"the weight itself ({one['err_f']:.3g}). With 16x16 blocks: {percent(two['differ'])}, and dx is the chain "
        f"rule's exactly. (2) MXFP8's scales are powers of two, and E4M3 keeps 3 mantissa bits whatever the power: "
        f"a weight rounds to the same value under either block's scale unless one of them pushes it into E4M3's "
        f"subnormals ({percent(mx['differ'])} of them differ). E2M1 has 1 mantissa bit and 8 values: under scales that "
        "are not powers of two, and 16 values to a block, the same weight lands on different grid points.",
        {"with 1x16 NVFP4 blocks most weights have two copies": one["differ"] > 0.3,
         "16x16 blocks give one copy: dgrad's dx is the chain rule's": two["differ"] == 0 and two["dx"] == 0,
         "MXFP8's 1x32 copies differ in under 2% of the weights": mx["differ"] < 0.02},
    )


def _q09_hadamard() -> Answer:
    panel = lab_panel("hadamard")
    g = panel.update(source="outlier", outlier=30.0, block=0)
    fprop = panel.update(source="sinks_fprop", outlier=1000.0)
    wgrad = panel.update(source="sinks_wgrad", outlier=1000.0)
    every = {source: panel.update(source=source, outlier=30.0) for source in ("outlier", "heavy", "sinks_fprop",
                                                                             "sinks_wgrad")}
    return Answer(
        NB,
        "(1) A Gaussian block with one outlier 30 times the rest: does the transform raise or lower the tensor's SQNR "
        "in NVFP4, and why does it flush fewer values all the same?",
        f"(1) It lowers it: {decibels(g['sqnr_plain'])} dB as it is, {decibels(g['sqnr_rot'])} dB transformed "
        f"(ordinary values {decibels(g['ordinary_plain'])} against {decibels(g['ordinary_rot'])} dB), and a GEMM's "
        f"error rises from {g['gemm_plain']:.3g} to {g['gemm_rot']:.3g}. As it is, the outlier takes E2M1's top and "
        f"{percent(g['flushed_plain'])} of the values flush; transformed, the outlier is spread over all 16 values "
        f"({percent(g['flushed_rot'])} flush), but each now carries a share of it, rounded on a grid that share sets: "
        "the rounding noise lands on every value. NVFP4's E4M3 block scale fits one outlier per 16 values well "
        "already; on every tensor of this panel the transform lowers the SQNR. TransformerEngine applies it to the "
        "weight-gradient GEMM, which its documentation calls \"particularly sensitive to quantization errors\", and "
        "the paper measured it on long runs of large models: a benefit this panel's tensors do not show. (2) With "
        "the sinks at 1000x: in fprop's layout a block holds 4 sinks and 12 ordinary channels "
        f"({percent(fprop['flushed_plain'])} of the values flush; transformed {percent(fprop['flushed_rot'])}); "
        f"in wgrad's "
        "layout a block runs along tokens within one channel: a sink channel is constant in its blocks, and an "
        "ordinary channel's blocks hold no sink, so the transform has nothing to spread there "
        f"({percent(wgrad['flushed_plain'])} flushed as it is, {percent(wgrad['flushed_rot'])} "
        "transformed). The sinks are channel outliers; a transform along tokens does not reach them.",
        {"one outlier per block: the transform lowers the tensor's SQNR": g["sqnr_rot"] < g["sqnr_plain"],
         "... and flushes fewer values": g["flushed_rot"] < g["flushed_plain"],
         "on every tensor of the panel (at 30x) the transform lowers the SQNR":
             all(d["sqnr_rot"] < d["sqnr_plain"] for d in every.values())},
    )


def _q09_rounding() -> Answer:
    panel = lab_panel("rounding")
    d = panel.update(draws=1024)
    gemm = d["gemm"]
    n = max(gemm["means"])
    return Answer(
        NB,
        "(1) In one step, which rounding gives fc2's weight gradient the smaller error?",
        f"(1) Round to nearest: relative error {gemm['nearest']:.3g}, one stochastic step {gemm['means'][1]:.3g}: "
        "stochastic rounding adds the variance of its draws, up to half a step per value, and fc2's dy is of both "
        f"signs ({percent(gemm['positive'])} positive), so round to nearest's errors cancel in the sum. Where a GEMM "
        "sums values mostly of one sign, they do not: round to nearest is biased there (the next panel). "
        "(2) Averaged over "
        f"{n} draws, stochastic rounding: {gemm['means'][n]:.3g}. Its mean is the exact dy, so averaging removes "
        "the rounding noise of dy; what stays is the rest of the error, fc2's input x rounded to nearest. Over "
        f"x from 0 to 6, the mean of 1024 draws lies {d['bias_sr']:.3f} from x on average, round to nearest "
        f"{d['bias_rtn']:.3f}.",
        {"one stochastic step is worse than round to nearest": gemm["means"][1] > gemm["nearest"],
         f"the mean of {n} stochastic steps is better than round to nearest": gemm["means"][n] < gemm["nearest"]},
    )


def _q09_high_precision() -> Answer:
    panel = lab_panel("high_precision")
    llm = panel.update(model="llm_like", share=0.15)
    mlp = panel.update(model="mlp", share=0.15)
    fc2 = float(mlp["df"].loc["fc2", "share of flops"])
    return Answer(
        NB,
        "(1) In the LLM-like model, which layers does 15% keep, and which layer has the largest weight-gradient error?",
        f"(1) {', '.join(llm['kept'])}: the last two of its nine linear layers, {percent(llm['high'])} of the GEMM "
        f"work, which leaves {llm['speedup']:.2f}x of NVFP4's {llm['all']:.2f}x. The largest weight-gradient error "
        f"is {llm['worst']}'s ({llm['df']['error'].max():.3g}), the last layer, one of those the share keeps. (2) 15% "
        f"of three layers keeps fc3, {percent(mlp['high'])} of the work ({mlp['speedup']:.2f}x left). The largest "
        f"weight-gradient error is {mlp['worst']}'s ({mlp['df']['error'].max():.3g}), the first layer, "
        f"{percent(float(mlp['df'].loc[mlp['worst'], 'share of flops']))} of the work; fc2 is {percent(fc2)} of it.",
        {"the LLM-like model's largest wgrad error is its head's": llm["worst"] == "head",
         "15% of the LLM-like model keeps its last two layers": llm["kept"] == ["blocks.1.down", "head"],
         "the lesson MLP's largest wgrad error is fc1's, and 15% keeps fc3": mlp["worst"] == "fc1"
             and mlp["kept"] == ["fc3"]},
    )


def _q09_parts() -> Answer:
    m = means(parts(), "mlp")
    rel = {col: m[col] / m.loc["bf16", col] - 1 for col in m.columns}
    final, high = rel["final loss"], rel["heldout high precision"]
    plain, full = "nvfp4 1x16", part_label(PART_SETS[-1])
    singles = {part_label(p): final[part_label(p)] - final[plain] for p in PART_SETS if len(p) == 1}
    most = max(singles, key=lambda k: abs(singles[k]))
    nvfp4_runs = [part_label(p) for p in PART_SETS]
    lo, hi = min(final[r] for r in nvfp4_runs), max(final[r] for r in nvfp4_runs)
    return Answer(
        NB,
        "(1) How far above bf16 does NVFP4 end, with and without the parts, and which part moves the final loss "
        "most?",
        f"(1) Without the parts {100 * final[plain]:+.1f}%, with all four {100 * final[full]:+.1f}% (mean of 3 "
        f"seeds; every combination between {100 * lo:+.1f}% and {100 * hi:+.1f}%; MXFP8 {100 * final['mxfp8']:+.1f}%). "
        f"The part that moves it most alone: {most} ({100 * singles[most]:+.1f} points). The paper's NVFP4 run reaches "
        "a training loss \"comparable to an FP8 baseline\" (its abstract): the toy's gap is not. (2) With a "
        "high-precision forward the "
        f"NVFP4-trained weights stand at {100 * high[plain]:+.1f}% (no parts) and {100 * high[full]:+.1f}% (all four) "
        "on held-out data: what training learned is about as good as bf16's; the toy's gap is the forward pass's "
        "4-bit noise on every prediction. The parts guard the backward pass of long, large runs (outlier tokens "
        "in the weight gradient, bias that accumulates over trillions of tokens, the chain rule), which a 150-step "
        "toy does not reach.",
        {"NVFP4 ends over 3% above bf16 with and without the parts": final[plain] > 0.03 and final[full] > 0.03,
         "no part alone moves the final loss by 2 points": max(abs(v) for v in singles.values()) < 0.02,
         "with a high-precision forward, NVFP4's weights are within 3% of bf16's": abs(high[plain]) < 0.03
             and abs(high[full]) < 0.03},
    )


def _q09_exercises() -> Answer:
    seed0 = ex.fc1_split_answer()
    t = split()
    mean = split_gaps(t.groupby("run", sort=False)[["final loss"]].mean())
    return Answer(
        NB,
        "Exercises 09 and 09b: stochastic rounding by hand; which of fc1's GEMMs closes NVFP4's gap",
        "09: see ex.solution_stochastic_round() (up to hi where u < (|x| - lo) / (hi - lo); sign kept; saturate at "
        f"6). 09b: on the lesson MLP, seed 0, fc1's forward in high precision closes {seed0['forward']:.2f} of "
        f"NVFP4's final-loss gap to bf16, fc1's weight gradient in high precision {seed0['wgrad']:+.2f}, fc1 whole "
        f"{seed0['whole']:.2f} (mean of 3 seeds: {mean['forward']:.2f}, {mean['wgrad']:+.2f}, {mean['whole']:.2f}). "
        "fc1's gain is its forward pass, the 4-bit noise on the inputs every prediction starts from; its weight "
        "gradient, the largest weight-gradient error of the three layers, costs nothing measurable here.",
        {"fc1's forward closes over 80% of the gap, on seed 0 and in the mean of 3 seeds":
             seed0["forward"] > 0.8 and mean["forward"] > 0.8,
         "fc1's weight gradient in high precision closes under 20% of it": seed0["wgrad"] < 0.2 and mean["wgrad"] < 0.2,
         "the forward alone closes within 0.2 of what fc1 whole closes": abs(seed0["forward"] - seed0["whole"]) < 0.2},
    )


ANSWERS = (_q09_gradients, _q09_dy_losses, _q09_two_d, _q09_hadamard, _q09_rounding, _q09_high_precision, _q09_parts,
           _q09_exercises)
