"""The key's answers for notebook 09's panels that show each backward part of the 4-bit recipe at work.

Public: ANSWERS (this part's answer functions, in notebook order).
"""

from __future__ import annotations

from fp8lab.harness.answers.base import Answer, lab_panel
from fp8lab.lab.panels.fp4_parts import backward_table
from fp8lab.lab.predictions import percent

__all__ = ["ANSWERS"]

NB = "09_below_eight_bits"


def _q09_sum_rounding() -> Answer:
    panel = lab_panel("sum_rounding")
    head = panel.update(source="head_first", k=1024, ratio=0.03, steps=200)
    s, at = head["sum"], head["at"]
    last = panel.update(source="head_last")
    mixed = panel.update(source=0.5, k=1024)
    same = panel.update(source=0.98, k=1024)
    sm, mm = same["sum"]["sum"], mixed["sum"]["sum"]
    u = head["update"]
    above = panel.update(ratio=0.05)["update"]
    return Answer(
        NB,
        "(1) The LLM-like model's head at the first step: which rounding keeps the single values closer, and which the "
        "per-class sums over 1024 tokens?",
        f"(1) Per value round to nearest ({s['per_value']['nearest']:.3g} against one stochastic draw's "
        f"{s['per_value']['stochastic']:.3g}); in the sums one stochastic draw: {at['stochastic']:.3g} against round "
        f"to nearest's {at['nearest']:.3g}. {percent(s['positive'])} of the head's dy is positive (every class but the "
        "right one gets a small positive gradient): round to nearest flushes or rounds down the small ones in the "
        "same direction in every block, and 1024 errors of one sign add up; stochastic rounding's errors have mean "
        f"zero and cancel. At the last step: round to nearest {last['at']['nearest']:.3g}, stochastic "
        f"{last['at']['stochastic']:.3g}. (2) With half the values positive, round to nearest's sum error over 1024 "
        f"values is {mm['nearest'][-1]:.3g} (from {mm['nearest'][0]:.3g} over 16), stochastic's "
        f"{mm['stochastic'][-1]:.3g}; at 98% positive, round to nearest's stays at {sm['nearest'][-1]:.3g} while "
        f"stochastic's falls to {sm['stochastic'][-1]:.3g}: a bias does not shrink with k, noise does. (3) An update "
        f"{u['ratio']:g} of its block's largest is under NVFP4's flush threshold ({head['threshold']:.4f}): round "
        f"to nearest sends 0 every step and the weight stays at {float(u['nearest'][-1]) + 0.0:.3g}; stochastic "
        f"rounding moves it to {float(u['stochastic'][-1]):.3g} in {u['steps']} steps "
        f"(exact: {float(u['exact'][-1]):.3g}), "
        f"{u['rate']['stochastic']:.3g} of the right rate. At 0.05, just over the threshold, round to nearest rounds "
        f"every update up to the grid's smallest value: {above['rate']['nearest']:.3g} times the right rate.",
        {"the head's per-value error is smaller to nearest": s["per_value"]["nearest"] < s["per_value"]["stochastic"],
         "the head's per-class sums are over 3x closer with one stochastic draw": at["nearest"] > 3 * at["stochastic"],
         "at 98% positive round to nearest's sum error stays above 2%, stochastic's falls below half of it by k = 1024":
             sm["nearest"][-1] > 0.02 and sm["stochastic"][-1] < 0.5 * sm["nearest"][-1],
         "an update under the threshold never moves the weight to nearest": u["rate"]["nearest"] == 0
             and u["ratio"] < head["threshold"],
         "stochastic rounding moves it within 10% of the right rate": abs(u["rate"]["stochastic"] - 1) < 0.1},
    )


def _q09_hadamard_contrast() -> Answer:
    panel = lab_panel("hadamard_contrast")
    t = panel.update(layer="blocks.0.qkv", when=3)["table"]
    every = {layer: panel.update(layer=layer, when=3)["table"] for layer in panel.record.layers}
    mx_helped = sum(bool((tab.loc["MXFP4", "change"] < 0).all()) for tab in every.values())
    nv_helped = sum(bool((tab.loc["NVFP4", "change"] < 0).all()) for tab in every.values())
    nv_raised = sum(bool((tab.loc["NVFP4", "change"] > 0).all()) for tab in every.values())

    def pair(fmt: str, rounding: str) -> str:
        return f"{t.loc[(fmt, rounding), 'without']:.3f} -> {t.loc[(fmt, rounding), 'with']:.3f}"

    return Answer(
        NB,
        "(1) blocks.0.qkv's dy at the last step: where does the transform lower the error, and where does it raise it?",
        f"(1) It raises NVFP4's: {pair('NVFP4', 'nearest')} to nearest, {pair('NVFP4', 'stochastic')} stochastic; "
        f"it lowers MXFP4's: {pair('MXFP4', 'nearest')} to nearest, {pair('MXFP4', 'stochastic')} stochastic. Over "
        f"the model's {len(every)} layers at the last step it lowers MXFP4's error in both roundings on "
        f"{mx_helped}, NVFP4's on {nv_helped}. (2) MXFP4's blocks are 32 values under one power-of-two scale: the "
        "largest value lands between 4 and 8 in E2M1's units (the OCP rule; above 6 it clips), and one large value "
        "pushes its 31 neighbours "
        "toward zero. The transform spreads a block's outlier over the block, so the scale fits more of the values. "
        "NVFP4's blocks are 16 values under an E4M3 scale that puts the largest value right at the top: the transform "
        "has little left to fix. With stochastic rounding the errors are larger in both formats, and the transform "
        "changes them in the same direction as to nearest.",
        {"the transform raises NVFP4's error on blocks.0.qkv, both roundings":
             bool((t.loc["NVFP4", "change"] > 0).all()),
         "... and lowers MXFP4's by over 10%, both roundings": bool((t.loc["MXFP4", "change"] < -0.1).all()),
         "at the last step the transform lowers MXFP4's error on every layer, both roundings": mx_helped == len(every),
         "... and raises NVFP4's on every layer, both roundings": nv_raised == len(every),
         "MXFP4 as it is has a larger error than NVFP4": bool((t.loc["MXFP4", "without"] > t.loc["NVFP4", "without"])
                                                              .all())},
    )


def _q09_depth() -> Answer:
    panel = lab_panel("depth")
    d = panel.update(recipe="nvfp4", depth=32)
    one, two = d["one_d"], d["two_d"]
    mx = panel.update(recipe="mxfp8")["one_d"]
    at = ", ".join(f"{percent(one['drift'][n - 1])} after {n}" for n in (1, 4, 16, 32))
    return Answer(
        NB,
        "(1) With 1x16 blocks, how far is dgrad's dx from the chain rule's after 1, 4, 16 and 32 layers, and with "
        "16x16 blocks?",
        f"(1) {at} (the mean over 16 dy; cosine {one['cosine'][31]:.2f} at 32); with 16x16 blocks 0 at every "
        "depth: dgrad multiplies by the codes the forward used. Each layer's dgrad copy differs from its forward "
        "copy, and the differences compound through the chain. (MXFP8's 1x32 copies drift "
        f"{percent(mx['drift'][31])} after 32 layers.) (2) No: the sum of 16 steps' gradients (other dy, the same "
        f"weights) drifts {percent(one['drift_mean'][31])} after 32 layers, against one step's "
        f"{percent(one['drift'][31])} (independent noise would shrink by sqrt(16) = 4). Every step multiplies by the "
        "same wrong copies: the error is a bias of the backward pass, which averaging over steps does not remove, "
        "unlike stochastic rounding's noise.",
        {"1-D copies: the drift grows with depth (1 < 4 < 16 layers)":
             one["drift"][0] < one["drift"][3] < one["drift"][15],
         "2-D blocks: dgrad is the chain rule's exactly at every depth": all(v == 0 for v in two["drift"]),
         "summing 16 steps keeps over half of one step's drift at every depth (noise would keep a quarter)":
             all(m > 0.5 * d for m, d in zip(one["drift_mean"], one["drift"], strict=True))},
    )


def _q09_backward_only() -> Answer:
    t = backward_table("final loss")
    full, back = t[("vs bf16", "full")], t[("vs bf16", "backward only")]
    spread = t[("spread", "backward only")]
    singles = back[["2D", "RHT", "SR", "HP"]]
    moves = (back.drop("none") - back["none"]).abs()
    return Answer(
        NB,
        "(1) With NVFP4 in the backward GEMMs only, how far from bf16 does the toy end, with no part and with all "
        "four?",
        f"(1) {100 * back['none']:+.2f}% with no part and {100 * back['all four']:+.2f}% with all four (mean of 3 "
        f"seeds; each part alone between {100 * singles.min():+.2f}% and {100 * singles.max():+.2f}%), against "
        f"{100 * full['none']:+.1f}% and {100 * full['all four']:+.1f}% with NVFP4 in every GEMM. The seeds spread "
        f"by up to +-{100 * spread.max():.2f} points. (2) The full runs' gap is the forward pass: its 4-bit noise on "
        "every prediction. The backward pass in NVFP4 costs this toy almost nothing, so there is no gap for the "
        "parts to close: their effects are within the seeds' spread. They guard what the panels above show, a "
        "bias in sums of one sign, coarse blocks, a chain of many layers, which a 3-layer MLP trained 150 steps "
        "hardly has.",
        {"NVFP4 in the backward GEMMs only ends within 1% of bf16, with and without the parts":
             bool((back.abs() < 0.01).all()),
         "no part moves the backward-only run by more than twice the seeds' largest spread":
             bool(moves.max() < 2 * spread.max()),
         "NVFP4 in every GEMM ends over 5% above bf16 with and without the parts": bool((full > 0.05).all())},
    )


ANSWERS = (_q09_sum_rounding, _q09_hadamard_contrast, _q09_depth, _q09_backward_only)
