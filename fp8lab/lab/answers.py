"""The answer key: every question under a widget in notebooks 00-06, answered from the panels.

Public: ANSWERS (one function per question), key() -> list[Answer], markdown(), main
(`python -m fp8lab answers --write` regenerates notebooks/ANSWERS.md). The predictions asked
before a panel reveals them are fp8lab.lab.predictions; the key lists their answers too.
Each answer drives the panel the question sits under (fp8lab.lab.panels) at the settings the
question states and reads the numbers off the data that panel draws; training numbers come
from fp8lab.training.measured (see there). Each answer also carries claims: the comparisons the
notebook's prose makes, as booleans that tests/test_answers.py requires to be True.
Timings depend on the machine, so the key explains them instead of quoting them.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fp8lab.lab.predictions import PREDICTIONS, _panel, _pct, magnitude, share
from fp8lab.training.measured import cliff_means, first_break, survivors

__all__ = ["ANSWERS", "Answer", "key", "main", "markdown"]

KEY_PATH = Path(__file__).resolve().parents[2] / "notebooks" / "ANSWERS.md"


@dataclass(frozen=True)
class Answer:
    """notebook: e.g. "02_per_tensor_scaling"; question: its text, verbatim from the notebook;
    answer: the answer with the measured numbers; claims: comparison -> whether it holds."""

    notebook: str
    question: str
    answer: str
    claims: dict[str, bool] = field(default_factory=dict)


# ---- 00 setup check ---------------------------------------------------------------------------------


def _q00_real() -> Answer:
    import torch

    from fp8lab.gemm import KernelUnavailable, plan_gemm, quantize_operands
    from fp8lab.numerics.recipes import RECIPES

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(128, 256, generator=g), torch.randn(256, 128, generator=g)

    def real_on(arch: tuple[int, int]) -> list[str]:  # the fprop pair of each recipe, planned for that GPU
        out = []
        for name in RECIPES:
            try:
                plan_gemm(*quantize_operands(a, b, name), arch=arch, cuda="12.9")
            except KernelUnavailable:
                continue
            out.append(name)
        return out

    h100, b200 = real_on((9, 0)), real_on((10, 0))
    e5m2 = float(torch.tensor([1e6]).to(torch.float8_e5m2).float()[0])
    e4m3 = float(torch.tensor([1e6]).to(torch.float8_e4m3fn).float()[0])
    return Answer(
        "00_setup_check",
        "Which recipes would run for real on an H100? On a B200?",
        f"H100 (sm_90): {', '.join(h100)}; B200 (sm_100): {', '.join(b200)} (CUDA 12.9; fp8lab.gemm.plan_gemm); "
        "everything else is emulated there. "
        f"torch's own cast turns 1e6 into {e5m2:g} in E5M2 (it does not saturate) but into {e4m3:g} in E4M3, "
        "so fp8lab clamps to +-max before casting: hardware casts saturate (satfinite).",
        {"blockwise runs real on an H100 but not on a B200": "blockwise" in h100 and "blockwise" not in b200,
         "mxfp8 and nvfp4 run real on a B200 only": {"mxfp8", "nvfp4"} <= set(b200) - set(h100),
         "torch's E5M2 cast does not saturate": math.isinf(e5m2), "torch's E4M3 cast saturates": e4m3 == 448.0},
    )


def _q00_timing() -> Answer:
    return Answer(
        "00_setup_check",
        "Is bf16 faster or slower than fp32 on this machine, and how does the FP8 bar compare with fp32?",
        "It depends on the CPU, so read your own panel (timings are not quoted in this key). CPUs with bf16 matrix "
        "units (AMX, or AVX512-BF16 dot products) run bf16 faster than fp32; CPUs without them convert and can be "
        "~20x slower (measured 16.8 ms fp32 vs 343 ms bf16 at n=512 on one such machine). The emulated FP8 bar costs "
        "about what the fp32 bar costs: emulation computes exactly, it does not accelerate. At small n, fixed "
        "per-call costs (quantization, Python) weigh more, so ratios move towards 1.",
    )


# ---- 01 formats ----------------------------------------------------------------------------------------------


def _q01_bits() -> Answer:
    p = _panel("bits")
    top = p.update(fmt="e4m3", value=1e9)
    nan = p.update(fmt="e4m3", code=0x7F)["value"]
    c500 = p.update(fmt="e4m3", value=500.0)
    r500 = c500["rounding"]
    c460 = p.update(fmt="e4m3", value=460.0)
    r460 = c460["rounding"]
    e5 = p.update(fmt="e5m2", code=0x7C)["value"]
    tiny = p.update(fmt="e4m3", code=0x01)["value"]
    one4 = p.update(fmt="e4m3", code=0x38)["anatomy"]
    one5 = p.update(fmt="e5m2", code=0x3C)["anatomy"]
    return Answer(
        "01_fp8_formats",
        "(1) What is the largest E4M3 value, and which code is it? Why is 0x7F not a number?",
        f"(1) {top['value']:g}, code 0x{top['code']:02X}; 0x7F decodes to {nan} (S.1111.111 is E4M3's only NaN, "
        f"so the top binade stops at 448). (2) 500 -> {r500.rounded:g} (code 0x{c500['code']:02X}, {r500.status}); "
        f"460 -> {r460.rounded:g} (0x{c460['code']:02X}, {r460.status}: it is nearer 448 than the next step, 480, "
        f"would be). (3) E5M2 0x7C is {e5}: E5M2 keeps IEEE infinities. (4) {tiny:g} = 2^{math.log2(tiny):g} "
        f"(code 0x01, a subnormal). (5) At 1.0: E4M3's neighbours are {one4.below:g} and {one4.above:g}, the gap "
        f"{one4.gap:g} and the relative step {_pct(one4.relative_step)} (2^-3); E5M2's {one5.below:g} and "
        f"{one5.above:g}, gap {one5.gap:g}, step {_pct(one5.relative_step)} (2^-2).",
        {"the largest E4M3 value is 448": top["value"] == 448.0, "0x7F is NaN": math.isnan(nan),
         "500 saturates in E4M3": r500.status == "saturated", "460 rounds to 448 without saturating":
             r460.status == "rounded" and r460.rounded == 448.0,
         "E5M2 0x7C is infinity": math.isinf(e5), "the smallest positive E4M3 value is 2^-9": tiny == 2.0**-9,
         "E4M3's relative step at 1 is 2^-3, E5M2's 2^-2": one4.relative_step == 0.125 and one5.relative_step == 0.25},
    )


def _q01_binades() -> Answer:
    from fp8lab.numerics.recipes import RECIPES

    rows = _panel("number_line").update(formats=("e4m3", "e5m2", "bf16"))["rows"]
    e5m2_grads = [n for n, r in RECIPES.items() if r.grad_output.fmt.name == "e5m2"]
    e4m3_grads = [n for n, r in RECIPES.items() if r.grad_output.fmt.name == "e4m3"]
    return Answer(
        "01_fp8_formats",
        "How many binades does E4M3 span, and E5M2?",
        f"E4M3 {rows['e4m3']['binades']:.1f}, E5M2 {rows['e5m2']['binades']:.1f} (bf16 "
        f"{rows['bf16']['binades']:.1f}). Gradients vary over many orders of magnitude within one tensor, so the "
        f"per-tensor recipes give them E5M2's range ({', '.join(e5m2_grads)}: the HYBRID formats). The "
        f"fine-grained recipes keep E4M3's precision for gradients ({', '.join(e4m3_grads)}): their small blocks "
        "supply the range.",
        {"E5M2 spans more binades than E4M3": rows["e5m2"]["binades"] > rows["e4m3"]["binades"],
         "rowwise, blockwise and mxfp8 use E4M3 for gradients": {"rowwise", "blockwise", "mxfp8"} <= set(e4m3_grads),
         "tensorwise and delayed use E5M2 for gradients": {"tensorwise", "delayed"} <= set(e5m2_grads)},
    )


def _q01_rounding() -> Answer:
    import torch

    from fp8lab.numerics.formats import E4M3, cast

    a, b = (float(v) for v in cast(torch.tensor([1.0625, 1.1875]), E4M3))
    return Answer(
        "01_fp8_formats",
        "1.0625 sits exactly halfway between two E4M3 values. Which one did it round to, and why is that \"to even\"?",
        f"1.0625 -> {a:g}: the neighbours are 1 (mantissa 000, even) and 1.125 (mantissa 001, odd); a tie goes to "
        f"the even mantissa. 1.1875 (halfway between 1.125 and 1.25) -> {b:g}: 1.25 has mantissa 010, the even one.",
        {"1.0625 rounds to 1": a == 1.0, "1.1875 rounds to 1.25": b == 1.25},
    )


def _q01_precision() -> Answer:
    from fp8lab.data.synthetic import sample
    from fp8lab.numerics.formats import E4M3, E5M2, cast
    from fp8lab.numerics.metrics import sqnr

    x = sample("normal", (256, 1024), seed=0)
    db4, db5 = sqnr(x, cast(x, E4M3)), sqnr(x, cast(x, E5M2))
    per_bit = 20 * math.log10(2)
    return Answer(
        "01_fp8_formats",
        "How many dB is one mantissa bit worth, and how far apart are E4M3 and E5M2 on normal data?",
        f"Each mantissa bit halves the step, and halving the error's amplitude is 20 log10(2) = {per_bit:.2f} dB. "
        f"Rounding normal data (no scale, nothing flushes): E4M3 {db4:.1f} dB, E5M2 {db5:.1f} dB, "
        f"{db4 - db5:.1f} dB apart: E4M3's one extra mantissa bit.",
        {"E4M3 and E5M2 differ by one mantissa bit's 6.02 dB, within 0.5 dB": abs(db4 - db5 - per_bit) < 0.5},
    )


# ---- 02 per-tensor scaling -------------------------------------------------------------------------------------


def _q02_window() -> Answer:
    from fp8lab.lab.panels import OUTLIERS

    p = _panel("per_tensor")
    first = {}
    for fmt in ("e4m3", "e5m2"):
        first[fmt] = next((m for m in OUTLIERS if p.update(fmt=fmt, outliers=m)["report"]["ordinary_underflow"] > 0.1),
                          None)
    p.update(fmt="e4m3", outliers=0.0)
    margins = [p.update(margin=m)["report"]["ordinary_sqnr_db"] for m in range(7)]
    p.update(margin=0)
    raw = p.update(distribution="channel scales", normalize=False)["report"]
    norm = p.update(normalize=True)["report"]
    e5 = "no magnitude up to 1e7" if first["e5m2"] is None else f"{first['e5m2']:g}x"
    return Answer(
        "02_per_tensor_scaling",
        "(1) At which outlier magnitude does the share of ordinary values flushed to zero pass 10% for E4M3? "
        "For E5M2?",
        f"(1) E4M3 at {first['e4m3']:g}x; E5M2: {e5} (32 binades). The whole-tensor SQNR hardly moves meanwhile: "
        "the outliers' energy decides it. (2) With the current amax nothing clips, so a margin only moves every value "
        f"down the window: the ordinary SQNR for margins 0..6 is {', '.join(f'{v:.1f}' for v in margins)} dB. It "
        "helps when the amax is stale (delayed scaling, notebook 03): headroom for a tensor that grows. "
        f"(3) Channel scales: normalizing raises the ordinary SQNR from {raw['ordinary_sqnr_db']:.1f} to "
        f"{norm['ordinary_sqnr_db']:.1f} dB, and the flushed share falls from {_pct(raw['ordinary_underflow'])} to "
        f"{_pct(norm['ordinary_underflow'])}; the whole-tensor SQNR moves from {raw['sqnr_db']:.1f} to "
        f"{norm['sqnr_db']:.1f} dB, which is why it is not the headline.",
        {"E4M3 flushes >10% of ordinary values at a smaller outlier magnitude than E5M2":
             first["e5m2"] is None or first["e4m3"] < first["e5m2"],
         "the ordinary SQNR never rises with the margin (current amax)":
             all(b <= a + 0.05 for a, b in itertools.pairwise(margins)),
         "normalizing raises the ordinary SQNR by more than 10 dB":
             norm["ordinary_sqnr_db"] - raw["ordinary_sqnr_db"] > 10,
         "normalizing moves the whole-tensor SQNR by less than 1 dB": abs(norm["sqnr_db"] - raw["sqnr_db"]) < 1},
    )


def _q02_cliff() -> Answer:
    p = _panel("cliff")
    d = p.update(measure="ordinary_sqnr_db", distribution="normal")
    df = d["df"].set_index(["recipe", "outliers"])
    at = {r: float(df.loc[(r, 1e6), "ordinary_sqnr_db"]) for r in d["cliffs"]}
    flushed = {r: float(df.loc[(r, 1e6), "ordinary_underflow"]) for r in d["cliffs"]}
    cl = d["cliffs"]
    return Answer(
        "02_per_tensor_scaling",
        "Where does each recipe's curve fall off, and why there for per-tensor E4M3?",
        "First outlier magnitude at which the ordinary SQNR is 3 dB below its clean value: " +
        ", ".join(f"{r} {'never' if v is None else magnitude(v) + 'x'}" for r, v in cl.items()) +
        ". Per tensor, the scale maps the outliers (~4.5 x magnitude) onto 448: ordinary values (~1) leave E4M3's "
        "normal range (15 binades below 448) once the outliers are ~10^4 times larger, and flush to zero past all 18 "
        "binades, ~10^5 and beyond. At 1e6x: " +
        ", ".join(f"{r} {at[r]:.1f} dB ({_pct(flushed[r])} flushed)" for r in at) +
        ": a block only loses the ordinary values that share it with an outlier, so smaller blocks lose less.",
        {"tensorwise falls off first among the E4M3 recipes, at 1e4x":
             cl["tensorwise"] == 1e4 and all(v is None or v >= 1e4 for r, v in cl.items() if r != "nvfp4"),
         "nvfp4 falls off at 1e3x or below (E2M1: 3.6 binades)": cl["nvfp4"] is not None and cl["nvfp4"] <= 1e3,
         "at 1e6x: mxfp8 > blockwise > rowwise in ordinary SQNR": at["mxfp8"] > at["blockwise"] > at["rowwise"],
         "at 1e6x tensorwise flushes every ordinary value": flushed["tensorwise"] > 0.99},
    )


# ---- 03 delayed scaling --------------------------------------------------------------------------------------------


def _q03_delayed() -> Answer:
    p = _panel("delayed")
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


# ---- 04 per-block scaling ----------------------------------------------------------------------------------------


def _q04_blocks() -> Answer:
    from fp8lab.lab.panels import BLOCKS

    p = _panel("block")
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
        f"(2) E8M0 1x32, normal data: rceil {e8['rceil']['sqnr_db']:.1f} dB and {_pct(e8['rceil']['overflow'])} "
        f"clipped; floor {e8['floor']['sqnr_db']:.1f} dB and {_pct(e8['floor']['overflow'])} clipped. E8M0 holds "
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
    p = _panel("block_sweep")
    clean = p.update(fmt="e4m3", distribution="normal", outliers=0.0, measure="ordinary channels")["df"]
    c = clean[clean.strategy == "fp32 scales, exact"].set_index("block")["sqnr_db"]
    out = p.update(outliers=1e5)["df"]
    o = out[out.strategy == "fp32 scales, exact"].set_index("block")["sqnr_db"]
    mx = out.set_index(["strategy", "block"])
    floor, rceil = mx.loc[("E8M0 scales, floor (OCP)", "1x32")], mx.loc[("E8M0 scales, rceil", "1x32")]
    higher = [b for b in dict.fromkeys(out.block) if mx.loc[("E8M0 scales, floor (OCP)", b), "sqnr_db"] >
              mx.loc[("E8M0 scales, rceil", b), "sqnr_db"]]
    return Answer(
        "04_per_block_scaling",
        "For normal data without outliers, how many dB separate 1x32 from per-tensor? Why so few?",
        f"{c['1x32'] - c['per-tensor']:.1f} dB ({c['1x32']:.1f} vs {c['per-tensor']:.1f}): floating point is "
        "relative, so a value keeps its 3 mantissa bits wherever it sits in the 18 binades; a block's smaller amax "
        f"only helps the values that would otherwise fall below the normal range. With outliers at 1e5, measured on "
        f"the ordinary channels: 1x32 {o['1x32']:.1f} dB vs per-tensor {o['per-tensor']:.1f} dB. There (the panel's "
        f"default) the OCP floor rule scores the higher SQNR at {len(higher)} of {out.block.nunique()} block sizes "
        f"(1x32: {floor['sqnr_db']:.1f} dB against rceil's {rceil['sqnr_db']:.1f}) but clips "
        f"{_pct(floor['overflow'])} of the values at 1x32 (rceil {_pct(rceil['overflow'])}): rounding the scale down "
        "keeps small values further from the bottom of the window and clips each block's largest, which is the harm "
        "NVIDIA reports in pre-training.",
        {"without outliers 1x32 gains less than 1 dB over per-tensor": c["1x32"] - c["per-tensor"] < 1,
         "with outliers at 1e5, 1x32 gains more than 10 dB on the ordinary channels": o["1x32"] - o["per-tensor"] > 10,
         "with outliers at 1e5, floor has the higher SQNR at most block sizes": len(higher) > out.block.nunique() / 2,
         "floor clips values at 1x32, rceil none": floor["overflow"] > 0 and rceil["overflow"] == 0},
    )


# ---- 05 GEMM ---------------------------------------------------------------------------------------------------------


def _q05_gemm() -> Answer:
    p = _panel("gemm")
    e = {(m, w): p.update(k=1024, outliers=m, distribution="normal", weights=w)["errors"]
         for m in (0.0, 100.0, 1e5) for w in ("random", "zero rows")}
    p.update(outliers=0.0, weights="random")
    r, z = e[1e5, "random"], e[1e5, "zero rows"]
    return Answer(
        "05_fp8_gemm",
        "At 1e5 with random weight rows the recipes barely differ; with zero rows they do. Why?",
        f"K=1024, normal inputs. Random rows at 1e5: tensorwise {_pct(r['tensorwise'])}, blockwise "
        f"{_pct(r['blockwise'])}: the outlier channels' own products dominate the output, and they are quantized "
        f"well by every recipe. Zero rows at 1e5 (as LLMs' sink channels meet weights that ignore them): the output "
        f"is made of the ordinary channels only; tensorwise {_pct(z['tensorwise'])}, rowwise {_pct(z['rowwise'])}, "
        f"blockwise {_pct(z['blockwise'])}, mxfp8 {_pct(z['mxfp8'])}. At 100x the ordinary values stay inside E4M3's "
        f"normal range under any scale (tensorwise {_pct(e[100.0, 'zero rows']['tensorwise'])}, blockwise "
        f"{_pct(e[100.0, 'zero rows']['blockwise'])}).",
        {"with zero rows at 1e5, blockwise's error is under a third of tensorwise's":
             z["blockwise"] < z["tensorwise"] / 3,
         "with random rows at 1e5, tensorwise and blockwise are within 2x of each other":
             max(r["tensorwise"], r["blockwise"]) < 2 * min(r["tensorwise"], r["blockwise"]),
         "at 100x with zero rows, tensorwise and blockwise are within 1.5x":
             e[100.0, "zero rows"]["tensorwise"] < 1.5 * e[100.0, "zero rows"]["blockwise"]},
    )


def _q05_accumulation() -> Answer:
    p = _panel("accumulation")

    def at_k(distribution: str, bits: int, promote: int) -> dict[str, float]:
        df = p.update(bits=bits, promote=promote, distribution=distribution)["df"]
        last = df[df.K == df.K.max()]
        return dict(zip(last["accumulation"], last["relative error"], strict=True))

    k = max(p.ks)
    u = at_k("uniform", 14, 128)
    n = at_k("normal", 14, 128)
    none_u, prom_u = u["no promotion"], u["promoted to fp32"]
    none_n = n["no promotion"]
    prom32 = at_k("uniform", 14, 32)["promoted to fp32"]
    enough = next((b for b in range(14, 25) if at_k("uniform", b, 0)["no promotion"] < 1e-3), None)
    p.update(bits=14, promote=128, distribution="uniform")
    return Answer(
        "05_fp8_gemm",
        "(1) How many accumulator bits make the no-promotion error at K=4096 drop below 0.1%?",
        f"(1) {enough} bits (uniform inputs). (2) At K={k} with 14 bits and no promotion: uniform [0, 1) inputs "
        f"{_pct(none_u)}, normal inputs {_pct(none_n)}. With one sign the truncated bits all push the same way and "
        "add up; with both signs the partial sums stay small and the errors partly cancel. DeepSeek-V3's ~2% at "
        f"K=4096 lies between the two. (3) Promotion every 128: {_pct(prom_u)}; every 32: {_pct(prom32)} (uniform "
        "inputs). Each promotion is an extra fp32 add per output (on Hopper, work moved off the tensor cores), so "
        "every 32 costs 4x as many. Every 128 already puts the accumulation error far below the few percent that "
        "rounding the operands to E4M3 costs (the bars above): the rest buys little for the GEMM.",
        {"uniform inputs, 14 bits, no promotion: error above 2% at K=4096 (the notebook says ~8%)":
             0.05 < none_u < 0.12,
         "normal inputs, 14 bits, no promotion: error below 2% at K=4096 (the notebook says ~0.2%)":
             0.001 < none_n < 0.005,
         "promotion every 128 cuts the uniform error more than 10-fold": prom_u < none_u / 10,
         "promoted every 128, the accumulation error is under 0.5%, a tenth of E4M3's rounding error (~3-4%)":
             prom_u < 0.005},
    )


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
        f"fc2's weight gradient loses its ordinary inputs and the layer stops learning. Under blockwise "
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


ANSWERS: tuple[Callable[[], Answer], ...] = (
    _q00_real, _q00_timing, _q01_bits, _q01_binades, _q01_rounding, _q01_precision, _q02_window, _q02_cliff,
    _q03_delayed, _q04_blocks, _q04_sweep, _q05_gemm, _q05_accumulation, _q06_live, _q06_cliff, _q06_drift,
    _q06_exercises,
)


# ---- the key ----------------------------------------------------------------------------------------------------


def key() -> list[Answer]:
    """Every answer, computed now at workshop size (FP8LAB_SMOKE must be off)."""
    from fp8lab.settings import smoke

    if smoke():
        raise RuntimeError("the answer key is computed at workshop size: unset FP8LAB_SMOKE")
    return [fn() for fn in ANSWERS]


def markdown(answers: list[Answer] | None = None) -> str:
    """The key as Markdown: per notebook, each question, its answer, and its checked claims."""
    from fp8lab.training.measured import MEASURED_ON

    answers = answers if answers is not None else key()
    lines = ["# fp8lab answer key", "",
             "Generated by `python -m fp8lab answers --write` from the panels' own data at the settings each "
             "question states (workshop size); training numbers from `fp8lab.training.measured` (measured on "
             f"{MEASURED_ON}). Your screen may differ from these numbers in the last digits: fp32 sums round "
             "differently with another CPU's instruction set, and an FP8 cast turns such a last-bit difference "
             "into a different code now and then, so a training run drifts a little. The claims below hold "
             "everywhere. tests/test_answers.py regenerates this file, compares it with this one within the "
             "tolerance it states, and checks every claim. Do not edit by hand.", ""]
    for nb in dict.fromkeys(a.notebook for a in answers):
        lines += [f"## {nb}", ""]
        for a in (a for a in answers if a.notebook == nb):
            lines += [f"**Q.** {a.question}", "", a.answer, ""]
            for claim, ok in a.claims.items():
                lines.append(f"- [{'x' if ok else ' '}] {claim}")
            if a.claims:
                lines.append("")
        preds = [(k, p) for k, p in PREDICTIONS.items() if p.notebook == nb]
        for name, p in preds:
            right, why = p.measure()
            lines += [f"**Prediction** (`Prediction({name!r})`). {p.question}", "", f"Answer: {right}. {why}", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8lab answers", description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"write {KEY_PATH.name} (else print it)")
    args = p.parse_args(argv)
    text = markdown()
    if args.write:
        KEY_PATH.write_text(text)
        print(f"wrote {KEY_PATH}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
