"""The key's answers for notebooks 02 (per-tensor scaling), 03 (delayed scaling) and 04 (per-block scaling).

Public: ANSWERS (this part's answer functions, in notebook order).
"""

from __future__ import annotations

import itertools
import math
import warnings

from fp8lab.data.synthetic import sample
from fp8lab.harness.answers.base import Answer, decibels, lab_panel
from fp8lab.lab.panels.base import BLOCKS, OUTLIERS
from fp8lab.lab.panels.blocks import activation_shape
from fp8lab.lab.panels.nvfp4 import nvfp4_collapse
from fp8lab.lab.predictions import magnitude, percent
from fp8lab.numerics.formats import E4M3, E8M0
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.scaling import AmaxHistory, PerBlock
from fp8lab.training.train import history_in_a_loop

__all__ = ['ANSWERS']


# ---- 02 per-tensor scaling -------------------------------------------------------------------------------------


def _q02_window() -> Answer:
    p = lab_panel("per_tensor")
    first = {}
    for fmt in ("e4m3", "e5m2"):
        first[fmt] = next((m for m in OUTLIERS if p.update(fmt=fmt, outliers=m)["report"]["ordinary_underflow"] > 0.1),
                          None)
    p.update(fmt="e4m3", outliers=0.0)
    margins = [p.update(margin=m)["report"]["ordinary_sqnr_db"] for m in range(7)]
    p.update(margin=0)
    raw = p.update(distribution="channel scales", normalize=False)["report"]
    norm = p.update(normalize=True)["report"]
    sinks = {on: p.update(distribution="normal", outliers=1e6, normalize=on)["report"] for on in (False, True)}
    p.update(outliers=0.0, normalize=False)
    e5 = "no magnitude up to 1e7" if first["e5m2"] is None else f"{first['e5m2']:g}x"
    return Answer(
        "02_per_tensor_scaling",
        "(1) At which outlier magnitude does the share of ordinary values flushed to zero pass 10% for E4M3? "
        "For E5M2?",
        f"(1) E4M3 at {first['e4m3']:g}x; E5M2: {e5} (32 binades). The whole-tensor SQNR hardly moves meanwhile: "
        "the outliers' energy decides it. (2) With the current amax nothing clips, so a margin only moves every value "
        f"down the window: the ordinary SQNR for margins 0..6 is {', '.join(f'{v:.1f}' for v in margins)} dB. It "
        "helps when the amax is stale (delayed scaling, notebook 03): headroom for a tensor that grows. "
        f"(3) Channel scales: dividing each channel by its amax raises the ordinary SQNR from "
        f"{raw['ordinary_sqnr_db']:.1f} to {norm['ordinary_sqnr_db']:.1f} dB, and the flushed share falls from "
        f"{percent(raw['ordinary_underflow'])} to {percent(norm['ordinary_underflow'])}. Normal data with "
        f"outlier channels "
        f"at 1e6: the flushed share falls from {percent(sinks[False]['ordinary_underflow'])} to "
        f"{percent(sinks[True]['ordinary_underflow'])} (SQNR {decibels(sinks[False]['ordinary_sqnr_db'])} -> "
        f"{decibels(sinks[True]['ordinary_sqnr_db'])} dB): the outlier channels are divided by their own factor "
        "too. For input features that is normalization, nothing to undo; for a hidden activation the factors must go "
        "somewhere: into the next layer's weights, as SmoothQuant folds them.",
        {"E4M3 flushes >10% of ordinary values at a smaller outlier magnitude than E5M2":
             first["e5m2"] is None or first["e4m3"] < first["e5m2"],
         "the ordinary SQNR never rises with the margin (current amax)":
             all(b <= a + 0.05 for a, b in itertools.pairwise(margins)),
         "dividing each channel by its amax raises the ordinary SQNR of channel scales by more than 10 dB":
             norm["ordinary_sqnr_db"] - raw["ordinary_sqnr_db"] > 10,
         "with outlier channels at 1e6 it brings the flushed share from over 90% to under 1%":
             sinks[False]["ordinary_underflow"] > 0.9 and sinks[True]["ordinary_underflow"] < 0.01},
    )


def _q02_cliff() -> Answer:
    p = lab_panel("cliff")
    d = p.update(measure="ordinary_sqnr_db", distribution="normal")
    df = d["df"].set_index(["recipe", "outliers"])
    at = {r: float(df.loc[(r, 1e6), "ordinary_sqnr_db"]) for r in d["cliffs"]}
    flushed = {r: float(df.loc[(r, 1e6), "ordinary_underflow"]) for r in d["cliffs"]}
    clean = {r: float(df.loc[(r, 1.0), "ordinary_sqnr_db"]) for r in ("tensorwise", "nvfp4")}
    cl = d["cliffs"]
    nv = nvfp4_collapse(shape=p.shape).set_index("outliers")  # on this panel's tensor
    low = float(nv.loc[[m for m in nv.index if 0 < m <= 1e4], "clean_flushed"].max())
    below = next(m for m in nv.index if nv.loc[m, "below_subnormals"] == 1)  # no E4M3 scale, subnormal or not
    tokens = p.update(placement="tokens")  # massive activations sit in a few tokens' channels: measured there
    pub = tokens["published"][tokens["published"].ratio == 1e5].set_index("recipe")
    massive = float(pub["outliers"].iloc[0])
    clean_db = {r: float(df.loc[(r, 1.0), "ordinary_sqnr_db"]) for r in d["cliffs"]}
    return Answer(
        "02_per_tensor_scaling",
        "Where does each recipe's curve fall off, and why there for per-tensor E4M3?",
        "First outlier magnitude at which the ordinary SQNR is 3 dB below its clean value: " +
        ", ".join(f"{r} {'never' if v is None else magnitude(v) + 'x'}" for r, v in cl.items()) +
        ". Per tensor, the scale maps the outliers (~4.5 x magnitude) onto 448: ordinary values (~1) leave E4M3's "
        "normal range (15 binades below 448) once the outliers are ~10^4 times larger, and flush to zero past all 18 "
        "binades, ~10^5 and beyond. At 1e6x: " +
        ", ".join(f"{r} {at[r]:.1f} dB ({percent(flushed[r])} flushed)" for r in at) +
        ". For the E4M3 block recipes a block only loses the ordinary values that share it with an outlier, so "
        f"smaller blocks lose less. nvfp4 starts lower ({clean['nvfp4']:.1f} dB against tensorwise's "
        f"{clean['tensorwise']:.1f} dB without outliers: E2M1 keeps 1 mantissa bit, E4M3 3) and falls off first for "
        "two reasons. First its block-mates: E2M1 spans 0.5 to 6 (3.6 binades), so a 16-value block that holds an "
        "outlier channel flushes the ordinary values beside it once the outlier is a few dozen times larger. Then "
        "the blocks without an outlier: NVFP4's per-tensor scale, amax / (448 x 6), grows with the outliers until "
        "those blocks need E4M3 scales below E4M3's smallest normal, 2^-6, and then below 2^-10, where even an E4M3 "
        "subnormal scale rounds to 0. fp8lab's recipes follow the training engines (TransformerEngine, torchao's "
        "NVFP4 training path), which store subnormal scales: those blocks flush "
        f"{percent(low)} of their values at 1e4x and below (E2M1's own range), "
        f"{percent(nv.loc[1e5, 'clean_flushed'])} at "
        f"1e5x, {percent(nv.loc[below, 'clean_flushed'])} at {magnitude(below)}x; torchao's inference "
        f"NVFP4Tensor, which "
        f"clamps them at 2^-6, flushes {percent(nv.loc[1e5, 'clean_flushed_min_normal'])} already at 1e5x (notebook "
        "04's NVFP4 panel shows the scales against both floors). The massive activations' published example, "
        "100,000 times the other values' median, "
        f"is {massive:,.0f}x here, with the outliers where massive activations sit (the first 2 tokens' channels): " +
        ", ".join(f"{r} {pub.loc[r, 'ordinary_sqnr_db']:.1f} dB ({percent(pub.loc[r, 'ordinary_underflow'])} flushed)"
                  for r in pub.index) +
        ": per tensor past the start of the cliff, per row and blocks along K within 3 dB of their clean SQNR (the "
        "next question says why per row holds there).",
        {"tensorwise falls off first among the E4M3 recipes, at 1e4x":
             cl["tensorwise"] == 1e4 and all(v is None or v >= 1e4 for r, v in cl.items() if r != "nvfp4"),
         "nvfp4 falls off at 1e3x or below": cl["nvfp4"] is not None and cl["nvfp4"] <= 1e3,
         "at 1e6x: mxfp8 > blockwise > rowwise in ordinary SQNR": at["mxfp8"] > at["blockwise"] > at["rowwise"],
         "at 1e6x tensorwise flushes every ordinary value": flushed["tensorwise"] > 0.99,
         "at the massive-activation ratio, in the first 2 tokens, tensorwise lies over 3 dB below its clean SQNR, "
         "rowwise, blockwise and mxfp8 within 3 dB": bool(pub.loc["tensorwise", "ordinary_sqnr_db"]
                                                          < clean_db["tensorwise"] - 3)
         and all(pub.loc[r, "ordinary_sqnr_db"] > clean_db[r] - 3 for r in ("rowwise", "blockwise", "mxfp8")),
         "nvfp4's blocks without an outlier flush under 10% up to 1e5x and over 99% from 1e6x with the training "
         "engines' floor; over 20% already at 1e5x with torchao's inference floor":
             bool(low < 0.1 and nv.loc[1e5, "clean_flushed"] < 0.1 and below == 1e6
                  and nv.loc[1e6, "clean_flushed"] > 0.99 and nv.loc[1e5, "clean_flushed_min_normal"] > 0.2)},
    )


# ---- 03 delayed scaling --------------------------------------------------------------------------------------------


def _q02_placement() -> Answer:
    p = lab_panel("cliff")
    at = {}
    for placement in ("channels", "tokens"):
        for gemm in ("fprop", "wgrad"):
            df = p.table("normal", placement, gemm)
            at[placement, gemm] = df[df.outliers == 1e5].set_index("recipe")["ordinary_underflow"]

    def shares(placement: str, gemm: str) -> str:
        return ", ".join(f"{r} {percent(v)}" for r, v in at[placement, gemm].items() if r != "nvfp4")

    return Answer(
        "02_per_tensor_scaling",
        "Which GEMM's per-row scales does each placement break?",
        "Share of the ordinary values flushed at outliers 1e5x (normal data). Outliers in every token's channels: "
        f"forward GEMM {shares('channels', 'fprop')}; weight-gradient GEMM {shares('channels', 'wgrad')}. In the "
        f"first 2 tokens' channels: forward {shares('tokens', 'fprop')}; weight gradient "
        f"{shares('tokens', 'wgrad')}. The forward GEMM reads x along K, so rowwise's scale is a token's: outliers in "
        "every token set every token's scale, outliers in 2 tokens only those 2. The weight-gradient GEMM reads x "
        "along M, so rowwise's scale is a channel's: outliers in every token share a scale only with their own "
        "channel, and outliers in 2 tokens set the scale of their channels, whose other values flush (4 channels "
        f"of {p.shape[1]} here: a small share). Per tensor the placement changes only how large the amax is. Channel "
        "outliers break per-token scales (fprop), token outliers per-channel scales (wgrad); blocks along K confine "
        "both to the block that holds them.",
        {"channel outliers: rowwise flushes over 10% in the forward GEMM, nothing in the weight gradient's":
             bool(at["channels", "fprop"]["rowwise"] > 0.1 and at["channels", "wgrad"]["rowwise"] == 0),
         "token outliers: rowwise flushes under 5% in both GEMMs, tensorwise over 5%":
             bool(max(at["tokens", g]["rowwise"] for g in ("fprop", "wgrad")) < 0.05
                  and min(at["tokens", g]["tensorwise"] for g in ("fprop", "wgrad")) > 0.05)},
    )


def _q03_delayed() -> Answer:
    p = lab_panel("delayed")
    spike = p.steps // 4

    def lagging(spike_size: float) -> int:  # steps after the spike more than 3 dB worse than current scaling
        df = p.update(history=16, algo="max", spike=spike_size, drift=0.0, margin=0)["df"]
        return int(((df["sqnr delayed"] < df["sqnr current"] - 3) & (df.step > spike)).sum())

    small, large = lagging(20), lagging(1e4)
    clipped_at = {}
    for m in range(5):
        d = p.update(history=16, spike=1, drift=0.05, margin=m)["df"]
        clipped_at[m] = int((d["overflow (delayed)"] > 0).sum())
    smallest = next((m for m, n in clipped_at.items() if n == 0), None)
    spike_clips, ratio = {}, {}
    for h in (1, 4, 16, 64):
        for m in range(5):
            d = p.update(history=h, spike=20, drift=0.0, margin=m)["df"]
            spike_clips[h, m] = bool(d.loc[spike, "overflow (delayed)"] > 0)
        ratio[h] = float(d.loc[spike, "amax"] / d.loc[spike, "scale amax (delayed)"])
    stops = {h: next((m for m in range(5) if not spike_clips[h, m]), None) for h in ratio}
    p.update(history=16, spike=20, drift=0.0, margin=0)
    return Answer(
        "03_delayed_scaling",
        "(1) With history 16 and algo max, for how many steps after a 20x spike is SQNR more than 3 dB worse than "
        "current scaling? And after a 1e4x spike? Why the difference?",
        f"(1) {small} steps after the 20x spike, {large} after the 1e4x one. The spike's amax stays the max of the "
        "history for 16 steps either way, but floating point is relative: 20x (4.3 binades) moves the ordinary values "
        "down the window and they keep their 3 mantissa bits; 1e4x (13.3 binades) pushes them out of E4M3's normal "
        "range into subnormals and zero. (2) With drift 0.05 and no spike, the steps that clip per margin 0..4: "
        f"{list(clipped_at.values())}; the smallest margin that stops it is {smallest} (2^{smallest} of headroom "
        "covers the 5% growth per step). (3) The spike step's scale comes from past amaxes only, none of which saw "
        "it: it clips with every history length. Its amax is " +
        ", ".join(f"{ratio[h]:.1f}x (history {h})" for h in ratio) +
        " the max the scale used (a 20x batch of random values), so the first margin that stops it is " +
        ", ".join(f"{'beyond 4' if stops[h] is None else stops[h]} (history {h})" for h in stops) +
        ". That headroom moves every other step's values 4 binades down the window: harmless while they stay in "
        "E4M3's normal range.",
        {"a 20x spike costs no step after it 3 dB": small == 0,
         "a 1e4x spike costs the 16 steps of the history": large == 16,
         "with drift 0.05 and no spike, margin 1 stops the clipping": smallest == 1,
         "the spike step clips for every history length at margins 0-3": all(
             spike_clips[h, m] for h in (1, 4, 16, 64) for m in range(4)),
         "margin 4 (16x) is the first that covers the spike with history 16 (its amax is 15-16x the max used)":
             stops[16] == 4 and 15 <= ratio[16] <= 16},
    )


def _q03_loop() -> Answer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the NaN's warning: the notebook shows it)
        df = history_in_a_loop()
    steps, nan_step = len(df), 3
    micro = [c for c in df.columns if c.startswith("amax, micro-batch")]
    clean = df[micro].where(df[micro].notna())
    entries = int(df["history entries"].iloc[-1])
    evaluation_set_it = bool((df["history max"] >= df["evaluation amax"].min()).any())
    after = float(df.loc[nan_step + 1, "scaled with"])
    step_max = clean.max(axis=1)
    # the same steps replayed by a bare AmaxHistory that takes the NaN in
    poisoned = AmaxHistory(16, "max").replay([math.nan if i == nan_step else float(step_max.iloc[i])
                                              for i in range(steps)])
    return Answer(
        "03_delayed_scaling",
        "(4) How many entries does the input's history hold after six steps of two micro-batches each, and why not "
        "twelve? (5) Did the 100x evaluation batches ever set the scale? (6) Step 3's loss is NaN: what does step 4 "
        "scale with, and what would it have scaled with had the NaN entered the history?",
        f"(4) {entries}: one per optimizer step. Both micro-batches of a step scale with the history as the step "
        "found it, and the larger of their two amaxes enters when the optimizer steps (each row's history max is "
        "the larger micro-batch amax of its step, whenever that exceeds the entries before it). (5) No: the "
        "evaluation forwards run under no_grad, so they record nothing; their amaxes "
        f"({df['evaluation amax'].min():.0f}-{df['evaluation amax'].max():.0f}) never appear in the history, whose "
        f"largest entry is {df['history max'].max():.2f}. (6) Step 4 scales with {after:.2f}, step 3's clean "
        f"micro-batch amax (the max of the history). Had the NaN entered (an AmaxHistory replaying these steps with "
        f"it), step 4 would scale with {poisoned[nan_step + 1]}, and so would every step until the NaN left the "
        "16-step history: every scale NaN, every output NaN, the layer blind that long.",
        {"one history entry per optimizer step, not per micro-batch": entries == steps,
         "each step's entry is the larger of its micro-batches' amaxes":
             all(math.isclose(df["history max"].iloc[i], step_max.iloc[: i + 1].max(), rel_tol=1e-6)
                 for i in range(steps)),
         "the evaluation batches never enter the history": not evaluation_set_it,
         "the NaN step's loss is NaN and the next is finite":
             math.isnan(df.loc[nan_step, "loss"]) and math.isfinite(df.loc[nan_step + 1, "loss"]),
         "the step after the NaN scales with a finite amax, the clean micro-batch's": math.isclose(
             after, float(clean.loc[nan_step].max()), rel_tol=1e-6),
         "a history that took the NaN in scales every later step with NaN": all(
             math.isnan(v) for v in poisoned[nan_step + 1:])},
    )


# ---- 04 per-block scaling ----------------------------------------------------------------------------------------


def _q04_blocks() -> Answer:
    p = lab_panel("block")
    sq, bits = {}, {}
    for b in BLOCKS:
        r = p.update(block=b, fmt="e4m3", scales="fp32, exact", outliers=1e5)["report"]
        sq[b], bits[b] = r["ordinary_sqnr_db"], r["scale_bits_per_element"]
    best = max(sq, key=sq.get)
    cheapest = min(bits, key=bits.get)
    fp4 = {b: p.update(block=b, fmt="e2m1", scales="fp32, exact", outliers=0.0)["report"]["ordinary_sqnr_db"]
           for b in ("1x16", "1x128", "per-tensor")}
    gain = {}  # what 1x16 blocks gain over per-tensor, per format and distribution
    for dist in ("normal", "laplace"):
        for fmt in ("e2m1", "e4m3"):
            db = {b: p.update(block=b, fmt=fmt, scales="fp32, exact", outliers=0.0, distribution=dist)["report"]
                  ["ordinary_sqnr_db"] for b in ("1x16", "per-tensor")}
            gain[fmt, dist] = db["1x16"] - db["per-tensor"]
    p.update(distribution="normal")
    e8 = {rule: p.update(block="1x32", fmt="e4m3", scales=label, outliers=0.0)["report"]
          for rule, label in (("rceil", "E8M0, rceil (MX as cuBLAS/TE)"), ("floor", "E8M0, floor (OCP MX)"))}
    p.update(block="1x128", fmt="e4m3", scales="fp32, exact", outliers=1e5)
    return Answer(
        "04_per_block_scaling",
        "(1) With outliers at 1e5, which block shape gives the highest SQNR of the ordinary channels? Which the lowest "
        "scale overhead?",
        f"(1) {best} ({sq[best]:.1f} dB; 1x128 {sq['1x128']:.1f}, per-tensor {sq['per-tensor']:.1f}); the lowest "
        f"overhead is {cheapest} ({bits[cheapest]:.2g} bits/element): quality and cost pull opposite ways. "
        f"(2) E8M0 1x32, normal data: rceil {e8['rceil']['sqnr_db']:.1f} dB and {percent(e8['rceil']['overflow'])} "
        f"clipped; floor {e8['floor']['sqnr_db']:.1f} dB and {percent(e8['floor']['overflow'])} clipped. E8M0 holds "
        "only powers of two, so the exact rule (amax / 448) cannot be stored: the panel offers rceil and floor. "
        f"(3) E2M1 without outliers: 1x16 {fp4['1x16']:.1f} dB, 1x128 {fp4['1x128']:.1f} dB, per-tensor "
        f"{fp4['per-tensor']:.1f} dB: 1x16 gains {gain['e2m1', 'normal']:.1f} dB where E4M3 gains "
        f"{gain['e4m3', 'normal']:.1f} dB; on laplace (heavy-tailed) data {gain['e2m1', 'laplace']:.1f} dB against "
        f"{gain['e4m3', 'laplace']:.1f}: with 3.6 binades, a block's own amax matters more (exercise 04b).",
        {"a 1-row block along K beats per-tensor by more than 10 dB on the ordinary channels at 1e5":
             sq["1x32"] - sq["per-tensor"] > 10,
         "per-tensor has the lowest scale overhead": cheapest == "per-tensor",
         "floor clips, rceil does not (E8M0, 1x32)": e8["floor"]["overflow"] > 0 and e8["rceil"]["overflow"] == 0,
         "1x16 blocks gain E2M1 more than E4M3 on normal data, and more than twice as much on laplace data":
             gain["e2m1", "normal"] > gain["e4m3", "normal"] and
             gain["e2m1", "laplace"] > 2 * gain["e4m3", "laplace"]},
    )


def _q04_sweep() -> Answer:
    p = lab_panel("block_sweep")
    clean = p.update(fmt="e4m3", distribution="normal", outliers=0.0, measure="ordinary channels")["df"]
    c = clean[clean.strategy == "fp32 scales, exact"].set_index("block")["sqnr_db"]
    out = p.update(outliers=1e5)["df"]
    o = out[out.strategy == "fp32 scales, exact"].set_index("block")["sqnr_db"]
    mx = out.set_index(["strategy", "block"])
    floor, rceil = mx.loc[("E8M0 scales, floor (OCP)", "1x32")], mx.loc[("E8M0 scales, rceil", "1x32")]
    higher = [b for b in dict.fromkeys(out.block) if mx.loc[("E8M0 scales, floor (OCP)", b), "sqnr_db"] >
              mx.loc[("E8M0 scales, rceil", b), "sqnr_db"]]
    same = _same_scale_share()
    return Answer(
        "04_per_block_scaling",
        "For normal data without outliers, how many dB separate 1x32 from per-tensor? Why so few?",
        f"{c['1x32'] - c['per-tensor']:.1f} dB ({c['1x32']:.1f} vs {c['per-tensor']:.1f}): floating point is "
        "relative, so a value keeps its 3 mantissa bits wherever it sits in the 18 binades; a block's smaller amax "
        f"only helps the values that would otherwise fall below the normal range. With outliers at 1e5, measured on "
        f"the ordinary channels: 1x32 {o['1x32']:.1f} dB vs per-tensor {o['per-tensor']:.1f} dB. There (the panel's "
        f"default) the OCP floor rule scores the higher SQNR at {len(higher)} of {out.block.nunique()} block sizes "
        f"(1x32: {floor['sqnr_db']:.1f} dB against rceil's {rceil['sqnr_db']:.1f}) but clips "
        f"{percent(floor['overflow'])} of the values at 1x32 (rceil {percent(rceil['overflow'])}). The two "
        f"rules give the "
        f"same scale in {percent(same)} of the 1x32 blocks (those whose amax mantissa is at most 1.75); in the others "
        "floor's scale is half rceil's, which keeps small values further from the bottom of the window and clips "
        "those blocks' largest values, the harm NVIDIA reports in pre-training.",
        {"without outliers 1x32 gains less than 1 dB over per-tensor": c["1x32"] - c["per-tensor"] < 1,
         "with outliers at 1e5, 1x32 gains more than 10 dB on the ordinary channels": o["1x32"] - o["per-tensor"] > 10,
         "with outliers at 1e5, floor has the higher SQNR at most block sizes": len(higher) > out.block.nunique() / 2,
         "floor clips values at 1x32, rceil none": floor["overflow"] > 0 and rceil["overflow"] == 0,
         "floor and rceil give the same scale in most 1x32 blocks (70-95%)": 0.7 < same < 0.95},
    )


def _same_scale_share() -> float:
    """The share of notebook 04's 1x32 blocks (outliers 1e5) whose E8M0 scale is the same under floor and rceil."""
    x = sample("normal", activation_shape(), 1e5, seed=0)
    floor, rceil = (quantize(x, E4M3, PerBlock(1, 32), rule, scale_fmt=E8M0).scale for rule in ("floor", "rceil"))
    return float((floor == rceil).float().mean())


def _q04_nvfp4() -> Answer:
    p = lab_panel("nvfp4")
    c = p.curve.set_index("outliers")
    base = float(c.loc[0.0, "clean_flushed"])
    first = {key: next(m for m in c.index if m > 0 and c.loc[m, key] > 2 * base)
             for key in ("clean_flushed_min_normal", "clean_flushed")}
    inf, train = first["clean_flushed_min_normal"], first["clean_flushed"]
    ts = float(c.loc[inf, "tensor_scale"])
    return Answer(
        "04_per_block_scaling",
        "From which outlier magnitude on do the blocks *without* an outlier lose their values under torchao's "
        "inference floor (2^-6), from which under the training engines' subnormal scales, and why there?",
        f"Up to 1e4x they flush {percent(base)} of their values, E2M1's own range (a block's values below about a 24th "
        "of its largest round to 0). NVFP4's tensor scale is amax / (448 x 6), so a block's E4M3 scale is 448 x its "
        "largest value / the tensor's largest. A block without an outlier holds values ~1 against outliers ~4.5 x "
        "the magnitude: past 448 / 2^-6 = 28,672 times its largest, the scale it needs falls below E4M3's smallest "
        f"normal, 2^-6 (at {magnitude(inf)}x, {percent(c.loc[inf, 'at_floor'])} of these blocks; tensor scale "
        f"{ts:.3g}). torchao's inference NVFP4Tensor clamps it there, a scale larger than the block needs, so its "
        f"small values round to 0: from {magnitude(inf)}x, {percent(c.loc[inf, 'clean_flushed_min_normal'])} flushed. "
        "The training engines (TransformerEngine, torchao's NVFP4 training path, fp8lab's recipes) clamp only the "
        "top and store it as an E4M3 subnormal, on a coarse grid (steps of 2^-9) but near what the block needs: at "
        f"{magnitude(inf)}x they flush {percent(c.loc[inf, 'clean_flushed'])}, E2M1's own share "
        f"({percent(c.loc[inf, 'below_subnormals'])} of the blocks need a scale below 2^-10). From {magnitude(train)}x "
        f"{percent(c.loc[train, 'below_subnormals'])} need less than 2^-10, where even a subnormal scale rounds to 0: "
        f"{percent(c.loc[train, 'clean_flushed'])} flushed with the training engines, "
        f"{percent(c.loc[train, 'clean_flushed_min_normal'])} with torchao's inference floor. The collapse is the "
        "two-level scale's range, not E2M1's.",
        {"blocks without an outlier flush under 10% up to 1e4x under either floor":
             bool(c.loc[[m for m in c.index if m <= 1e4], ["clean_flushed", "clean_flushed_min_normal"]].max().max()
                  < 0.1),
         "at 1e5x every block without an outlier needs a scale below 2^-6: torchao's inference floor flushes over "
         "20% of their values, the training engines under 10%":
             bool(inf == 1e5 and c.loc[1e5, "at_floor"] == 1 and c.loc[1e5, "clean_flushed_min_normal"] > 0.2
                  and c.loc[1e5, "clean_flushed"] < 0.1),
         "at 1e5x none needs a scale below 2^-10; at 1e6x all do, and over 99% of their values flush under either "
         "floor": bool(train == 1e6 and c.loc[1e5, "below_subnormals"] == 0 and c.loc[1e6, "below_subnormals"] == 1
                       and c.loc[1e6, ["clean_flushed", "clean_flushed_min_normal"]].min() > 0.99)},
    )


ANSWERS = (_q02_window, _q02_cliff, _q02_placement, _q03_delayed, _q03_loop, _q04_blocks, _q04_sweep, _q04_nvfp4)
