"""The key's answers for notebooks 00 (setup check) and 01 (FP8 formats).

Public: ANSWERS (this part's answer functions, in notebook order).
"""

from __future__ import annotations

import math

import torch

from fp8lab.data.synthetic import sample
from fp8lab.gemm import KernelUnavailable, plan_gemm, quantize_operands
from fp8lab.harness.answers.base import Answer, lab_panel
from fp8lab.lab.predictions import percent
from fp8lab.numerics.formats import E4M3, E5M2, cast
from fp8lab.numerics.metrics import sqnr
from fp8lab.numerics.recipes import RECIPES

__all__ = ['ANSWERS']


# ---- 00 setup check ---------------------------------------------------------------------------------


def _q00_real() -> Answer:
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(*shape, generator=g, dtype=torch.float32, device="cpu") for shape in ((128, 256), (256, 128)))

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
    e5m2 = float(torch.tensor([1e6], dtype=torch.float32, device="cpu").to(torch.float8_e5m2).float()[0])
    e4m3 = float(torch.tensor([1e6], dtype=torch.float32, device="cpu").to(torch.float8_e4m3fn).float()[0])
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
    p = lab_panel("bits")
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
        f"{one4.gap:g} and the relative step {percent(one4.relative_step)} (2^-3); E5M2's {one5.below:g} and "
        f"{one5.above:g}, gap {one5.gap:g}, step {percent(one5.relative_step)} (2^-2).",
        {"the largest E4M3 value is 448": top["value"] == 448.0, "0x7F is NaN": math.isnan(nan),
         "500 saturates in E4M3": r500.status == "saturated", "460 rounds to 448 without saturating":
             r460.status == "rounded" and r460.rounded == 448.0,
         "E5M2 0x7C is infinity": math.isinf(e5), "the smallest positive E4M3 value is 2^-9": tiny == 2.0**-9,
         "E4M3's relative step at 1 is 2^-3, E5M2's 2^-2": one4.relative_step == 0.125 and one5.relative_step == 0.25},
    )


def _q01_binades() -> Answer:
    rows = lab_panel("number_line").update(formats=("e4m3", "e5m2", "bf16"))["rows"]
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
    a, b = (float(v) for v in cast(torch.tensor([1.0625, 1.1875], dtype=torch.float32, device="cpu"), E4M3))
    return Answer(
        "01_fp8_formats",
        "1.0625 sits exactly halfway between two E4M3 values. Which one did it round to, and why is that \"to even\"?",
        f"1.0625 -> {a:g}: the neighbours are 1 (mantissa 000, even) and 1.125 (mantissa 001, odd); a tie goes to "
        f"the even mantissa. 1.1875 (halfway between 1.125 and 1.25) -> {b:g}: 1.25 has mantissa 010, the even one.",
        {"1.0625 rounds to 1": a == 1.0, "1.1875 rounds to 1.25": b == 1.25},
    )


def _q01_precision() -> Answer:
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




ANSWERS = (_q00_real, _q00_timing, _q01_bits, _q01_binades, _q01_rounding, _q01_precision)
