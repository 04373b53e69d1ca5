"""Workshop exercises: check_* gives specific feedback, hint_* a nudge, solution_* the answer.

Public: one check/hint/solution trio per exercise, for notebooks 01-06 and 08:
  01 decode an E4M3 code           check_decode, hint_decode, solution_decode
  02 the per-tensor E4M3 scale     check_scale, hint_scale, solution_scale
  03 the amax of delayed scaling   check_delayed_amax, hint_delayed_amax, solution_delayed_amax
  04 per-block amax; FP4 blocks    check_block_amax, ...; check_block_choice, ...
  05 the scaled FP8 GEMM           check_scaled_gemm, ... (operands: GemmOperand)
  06 which recipes survive sinks   check_survivors, hint_survivors, solution_survivors
  06b the longest amax history     check_history, hint_history, solution_history
  06c does step 30 predict 150?    check_ranking, hint_ranking, solution_ranking
  08 a recipe for your model       check_capstone, hint_capstone, solution_capstone
A check returns a Feedback (printed in the notebook): ok, and a message naming the case
that failed and why. Solutions are printed only when a learner asks for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fp8lab.numerics.formats import E4M3
from fp8lab.numerics.quantize import QuantizedTensor, quantize
from fp8lab.numerics.scaling import PerBlock, PerTensor, parse_granularity

__all__ = [
    "Feedback",
    "GemmOperand",
    "block_choice_tensor",
    "check_block_amax",
    "check_block_choice",
    "check_decode",
    "check_delayed_amax",
    "check_history",
    "check_ranking",
    "check_scale",
    "check_scaled_gemm",
    "check_survivors",
    "hint_block_amax",
    "hint_block_choice",
    "hint_decode",
    "hint_delayed_amax",
    "hint_history",
    "hint_ranking",
    "hint_scale",
    "hint_scaled_gemm",
    "hint_survivors",
    "history_answer",
    "ranking_answer",
    "solution_block_amax",
    "solution_block_choice",
    "solution_decode",
    "solution_delayed_amax",
    "solution_history",
    "solution_ranking",
    "solution_scale",
    "solution_scaled_gemm",
    "solution_survivors",
]


@dataclass(frozen=True)
class Feedback:
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def _repr_html_(self) -> str:
        color = "#009e73" if self.ok else "#d55e00"
        mark = "correct" if self.ok else "not yet"
        return f"<div style='color:{color}'><b>{mark}:</b> {self.message}</div>"

    def __repr__(self) -> str:
        return f"{'correct' if self.ok else 'not yet'}: {self.message}"


def _call(fn: Callable, *args) -> tuple[object, str | None]:
    try:
        return fn(*args), None
    except Exception as err:  # the learner's code: report, don't raise
        return None, f"your function raised {type(err).__name__}: {err}"


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _tensor(v) -> torch.Tensor:
    return v if isinstance(v, torch.Tensor) else torch.as_tensor(v, dtype=torch.float32)


# ---- 01: decode an E4M3 code -----------------------------------------------------------------


def check_decode(decode: Callable[[int], float]) -> Feedback:
    """decode(code) -> value of an E4M3 (fn) code, 0..255. Checked on all 256 codes."""
    for code in range(256):
        got, err = _call(decode, code)
        if err:
            return Feedback(False, f"code {code} (0b{code:08b}): {err}")
        want = E4M3.decode(code)
        try:
            got = float(got)
        except (TypeError, ValueError):
            return Feedback(False, f"code {code}: return a number, got {got!r}")
        if not _same(got, want):
            f = E4M3.fields(code)
            why = ""
            if abs(got) == abs(want):
                why = " The sign bit is the top bit (128)."
            elif f["exponent"] == 0:
                why = " Exponent field 0 means subnormal (or zero): value = 2^(1-7) * mantissa/8, no implicit 1."
            elif f["exponent"] == 15 and f["mantissa"] == 7:
                why = " S.1111.111 is E4M3's only NaN pattern."
            elif f["exponent"] == 15:
                why = " E4M3 (fn) has no infinity: exponent 1111 is a normal binade up to 448."
            return Feedback(False, f"code {code} (0b{code:08b} = sign {f['sign']}, exponent {f['exponent']}, "
                                   f"mantissa {f['mantissa']}): expected {want:g}, got {got:g}.{why}")
    return Feedback(True, "all 256 codes decode correctly, subnormals and NaN included.")


def hint_decode() -> str:
    return ("Split the byte: sign = code >> 7, exponent = (code >> 3) & 0b1111, mantissa = code & 0b111. "
            "Normal: (-1)^s * 2^(e - 7) * (1 + m/8). What happens when e == 0? And which single pattern is NaN?")


def solution_decode() -> str:
    return '''def decode(code):
    s, e, m = code >> 7, (code >> 3) & 0xF, code & 0x7
    sign = -1.0 if s else 1.0
    if e == 15 and m == 7:
        return float("nan")                    # S.1111.111: the only NaN, no inf in E4M3fn
    if e == 0:
        return sign * 2.0 ** (1 - 7) * m / 8   # subnormal: no implicit leading 1
    return sign * 2.0 ** (e - 7) * (1 + m / 8)'''


# ---- 02: the per-tensor scale -------------------------------------------------------------------------


def _scale_cases() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [
        ("a standard normal tensor", torch.randn(64, 64, generator=g)),
        ("a tensor whose largest magnitude is negative", -torch.rand(8, 8, generator=g) * 1000),
        ("a tiny tensor (|x| < 1e-3)", torch.randn(16, 16, generator=g) * 1e-4),
        ("an all-zero tensor", torch.zeros(4, 4)),
    ]


def check_scale(scale_fn: Callable[[torch.Tensor], float]) -> Feedback:
    """scale_fn(x) -> fp8lab's per-tensor E4M3 scale: the dequantization multiplier."""
    for name, x in _scale_cases():
        got, err = _call(scale_fn, x)
        if err:
            return Feedback(False, f"{name}: {err}")
        want = float(quantize(x, E4M3, PerTensor()).scale)
        got = float(got)
        if math.isclose(got, want, rel_tol=1e-5):
            continue
        amax = float(x.abs().max())
        msg = f"{name}: expected {want:.6g}, got {got:.6g}."
        if amax > 0 and math.isclose(got * want, 1.0, rel_tol=1e-4):
            msg += " That is the reciprocal: fp8lab's scale is the DEQUANTIZATION multiplier, x ~ q * scale."
        elif amax > 0 and math.isclose(got, float(x.max()) / 448, rel_tol=1e-4):
            msg += " Use the largest MAGNITUDE, max(|x|), not max(x)."
        elif amax > 0 and math.isclose(got, amax / 57344, rel_tol=1e-4):
            msg += " 57344 is E5M2's maximum; E4M3's is 448."
        elif amax == 0:
            msg += " An all-zero tensor has amax 0: fp8lab gives it scale 1 (any scale stores zeros)."
        return Feedback(False, msg)
    return Feedback(True, "scale = amax / 448, with the all-zero case handled.")


def hint_scale() -> str:
    return "Map the largest magnitude onto E4M3's largest value, 448. x ~ q * scale, so scale = ... / ... ."


def solution_scale() -> str:
    return '''def scale_fn(x):
    amax = x.abs().max().item()
    return amax / 448 if amax > 0 else 1.0     # x ~ q * scale; zeros need any scale: 1'''


# ---- 03: delayed scaling's amax --------------------------------------------------------------------------


def _delayed_cases():
    return [
        ("history [1, 5, 2], algo 'max'", [1.0, 5.0, 2.0], 9.0, "max", 5.0),
        ("history [1, 5, 2], algo 'most_recent'", [1.0, 5.0, 2.0], 9.0, "most_recent", 2.0),
        ("an empty history (the first step)", [], 3.0, "max", 3.0),
        ("history [4, 4], current amax 100 (a spike)", [4.0, 4.0], 100.0, "max", 4.0),
    ]


def check_delayed_amax(fn: Callable[[list[float], float, str], float]) -> Feedback:
    """fn(history, current_amax, algo) -> the amax this step's scale uses (before recording)."""
    for name, hist, current, algo, want in _delayed_cases():
        got, err = _call(fn, list(hist), current, algo)
        if err:
            return Feedback(False, f"{name}: {err}")
        if got is None or not math.isclose(float(got), want):
            msg = f"{name}: expected {want:g}, got {got}."
            if got is not None and math.isclose(float(got), max([*hist, current])) and hist:
                msg += " Delayed scaling uses only PAST amaxes: the current one is recorded after quantizing."
            elif hist and got is not None and math.isclose(float(got), sum(hist) / len(hist)):
                msg += " 'max' takes the maximum of the history, not its mean."
            elif not hist:
                msg += (" With nothing recorded yet, fp8lab calibrates on the current amax (fp8lab's convention: "
                        "TransformerEngine starts from scale 1 instead, and its first step can clip).")
            return Feedback(False, msg)
    return Feedback(True, "past amaxes only, 'max' or 'most_recent', first step calibrated on its own amax - as "
                          "fp8lab's AmaxHistory does (TransformerEngine starts from scale 1 instead).")


def hint_delayed_amax() -> str:
    return ("The point of delayed scaling: the scale is known BEFORE seeing this step's tensor. Which values "
            "can it use, then? What if the history is still empty?")


def solution_delayed_amax() -> str:
    return '''def fn(history, current_amax, algo):
    if not history:
        return current_amax      # first step: fp8lab calibrates on it (TransformerEngine starts at scale 1)
    return max(history) if algo == "max" else history[-1]'''


# ---- 04: per-block amax; the block choice -------------------------------------------------------------------


def check_block_amax(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> Feedback:
    """fn(x[M, K], block) -> amax[M, K // block]: max |x| over each 1 x block tile along K."""
    g = torch.Generator().manual_seed(4)
    cases = [("x[4, 64], block 32", torch.randn(4, 64, generator=g), 32),
             ("x[3, 256], block 128, negative extremes", -torch.rand(3, 256, generator=g) * 7, 128),
             ("x[8, 16], block 16 (per row)", torch.randn(8, 16, generator=g), 16)]
    for name, x, block in cases:
        got, err = _call(fn, x.clone(), block)
        if err:
            return Feedback(False, f"{name}: {err}")
        want = quantize(x, E4M3, PerBlock(1, block)).amax
        got = _tensor(got)
        if tuple(got.shape) != tuple(want.shape):
            msg = f"{name}: expected shape {tuple(want.shape)} (M, K / block), got {tuple(got.shape)}."
            if tuple(got.shape) == (x.shape[0] // block, x.shape[1]) or got.numel() == want.numel():
                msg += " The tiles run along K (the last dim): reshape to (M, K // block, block)."
            return Feedback(False, msg)
        if not torch.allclose(got.float(), want):
            msg = f"{name}: the shapes match but the values don't."
            if torch.allclose(got.float(), x.reshape(x.shape[0], -1, block).amax(-1)):
                msg += " Take the max of |x|: a block's largest magnitude can be negative."
            return Feedback(False, msg)
    return Feedback(True, "per-tile amax along K, magnitudes included.")


def hint_block_amax() -> str:
    return "x.reshape(M, K // block, block) puts each tile on the last dim; what reduction gives max |x| there?"


def solution_block_amax() -> str:
    return '''def fn(x, block):
    m, k = x.shape
    return x.abs().reshape(m, k // block, block).amax(dim=-1)   # (M, K/block)'''


CHOICE_BLOCKS = ("1x16", "1x32", "1x64", "1x128", "32x32", "128x128", "per-row", "per-tensor")
CHOICE_FORMAT = "e2m1"
CHOICE_THRESHOLD = 18.0


def block_choice_tensor() -> torch.Tensor:
    """The tensor of exercise 04b: heavy-tailed (Laplace) activations, 128 x 1024."""
    from fp8lab.data.synthetic import sample

    return sample("laplace", (128, 1024), seed=42)


def _block_table() -> list[tuple[str, float, float]]:
    from fp8lab.numerics.metrics import sqnr

    x = block_choice_tensor()
    rows = []
    for label in CHOICE_BLOCKS:
        q = quantize(x, CHOICE_FORMAT, parse_granularity(label))
        rows.append((label, sqnr(x, q), q.scale_bits_per_element))
    return rows


def check_block_choice(label: str) -> Feedback:
    """With FP4 (E2M1) elements and float32 scales, which block keeps the SQNR of
    block_choice_tensor() at or above 18 dB with the least scale overhead (bits/element)?"""
    rows = {r[0]: r for r in _block_table()}
    if label not in rows:
        return Feedback(False, f"{label!r} is not one of {', '.join(CHOICE_BLOCKS)}.")
    ok = [r for r in rows.values() if r[1] >= CHOICE_THRESHOLD]
    best = min(ok, key=lambda r: r[2])
    _, db, bits = rows[label]
    if label == best[0]:
        return Feedback(True, f"{label}: {db:.1f} dB for {bits:.3g} bits of scale per element - the cheapest that "
                              f"reaches {CHOICE_THRESHOLD:g} dB.")
    if db < CHOICE_THRESHOLD:
        return Feedback(False, f"{label} reaches only {db:.1f} dB (< {CHOICE_THRESHOLD:g}): its blocks are too "
                               "big for FP4's 3.6 binades on heavy-tailed data.")
    return Feedback(False, f"{label} reaches {db:.1f} dB but costs {bits:.3g} bits per element; a bigger block "
                           "also passes and costs less.")


def hint_block_choice() -> str:
    return ("Loop over the labels: q = fp8lab.quantize(x, 'e2m1', label); keep those with fp8lab.sqnr(x, q) >= 18, "
            "then compare q.scale_bits_per_element. (In E4M3 every block clears 30 dB here: why?)")


def solution_block_choice() -> str:
    rows = _block_table()
    lines = [f"{label:>10}  {db:5.1f} dB  {bits:.3g} bits/element" for label, db, bits in rows]
    best = min((r for r in rows if r[1] >= CHOICE_THRESHOLD), key=lambda r: r[2])
    return "\n".join([*lines, f"answer: {best[0]}"])


# ---- 05: the scaled GEMM -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmOperand:
    """One FP8 GEMM operand as a tensor core sees it: data[rows, K] (FP8 codes), scale[rows or 1,
    K // block] (float32 dequantization multipliers: x ~= data * scale, one per row per block of
    `block` elements along K; per tensor: scale (1, 1), block = K). No dequantize(): the
    exercise is to place the scales."""

    data: torch.Tensor
    scale: torch.Tensor
    block: int

    @classmethod
    def of(cls, q: QuantizedTensor) -> GemmOperand:
        rows, cols = q.block_shape
        k = q.shape[1]
        if rows not in (1, q.shape[0]) or (rows != 1 and cols != k):
            raise ValueError(f"an operand scaled per tensor or per 1 x block tile along K, not {q.granularity.label}")
        return cls(q.data, q.scale.reshape(-1, max(k // cols, 1)).float(), min(cols, k))


def _gemm_cases():
    g = torch.Generator().manual_seed(5)
    a3 = torch.randn(4, 64, generator=g)
    a3[:, :16] *= 1000  # the first K block holds large values: its scales differ from the others' by ~2^10
    return [("a[8, 32] @ b[32, 4], per tensor, amax 3 and 200", torch.randn(8, 32, generator=g) * 3,
             torch.randn(4, 32, generator=g) * 200, PerTensor()),
            ("a[2, 64] @ b[64, 5], per tensor, tiny values", torch.randn(2, 64, generator=g) * 1e-3,
             torch.randn(5, 64, generator=g), PerTensor()),
            ("a[4, 64] @ b[64, 3], 1x16 blocks along K (one K block 1000x larger)", a3,
             torch.randn(3, 64, generator=g), PerBlock(1, 16))]


def _reference_gemm(a: GemmOperand, b: GemmOperand) -> torch.Tensor:
    out = torch.zeros(a.data.shape[0], b.data.shape[0], dtype=torch.float64)
    for j in range(a.scale.shape[1]):
        k = slice(j * a.block, (j + 1) * a.block)
        out += (a.data[:, k].double() @ b.data[:, k].double().t()) * a.scale[:, j, None].double() * \
            b.scale[:, j][None, :].double()
    return out


def check_scaled_gemm(fn: Callable[[GemmOperand, GemmOperand], torch.Tensor]) -> Feedback:
    """fn(a_q, b_q) -> out[M, N] for GemmOperands a_q[M, K], b_q[N, K]: what torch's scaled_mm
    computes, per tensor and with 1x16 block scales along K (where only scales applied per K
    block give the right answer)."""
    for name, a, b, gran in _gemm_cases():
        a_q, b_q = GemmOperand.of(quantize(a, E4M3, gran)), GemmOperand.of(quantize(b, E4M3, gran))
        blocked = a_q.scale.shape[1] > 1
        got, err = _call(fn, a_q, b_q)
        if err:
            extra = ""
            if "dequantize" in err:
                extra = " These operands have no dequantize(): build the product from .data and .scale."
            elif blocked:
                extra = (" Here scale is (rows, K // block): one scale per row per K block, so it cannot multiply "
                         "the [M, N] result directly.")
            return Feedback(False, f"{name}: {err}.{extra}")
        want = _reference_gemm(a_q, b_q)
        got = _tensor(got).double()
        if got.shape != want.shape:
            return Feedback(False, f"{name}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}. "
                                   "b_q is in [N, K] layout: contract with its transpose.")
        if torch.allclose(got, want, rtol=1e-4, atol=1e-6 * want.abs().max().item()):
            continue
        data = a_q.data.double() @ b_q.data.double().t()
        sa, sb = a_q.scale.double(), b_q.scale.double()
        msg = f"{name}: the values are off."
        if torch.allclose(got, data, rtol=1e-4):
            msg += " The FP8 codes' product must still be scaled back: multiply by both scales."
        elif not blocked and torch.allclose(got, data / (sa * sb), rtol=1e-4):
            msg += " scale is the DEQUANTIZATION multiplier: multiply by it, don't divide."
        elif not blocked and (torch.allclose(got, data * sa, rtol=1e-4) or torch.allclose(got, data * sb, rtol=1e-4)):
            msg += " You applied one operand's scale; each operand has its own."
        elif blocked:
            msg += (" With block scales along K, one scale cannot multiply the whole sum: multiply each K block's "
                    "partial sum (a.data[:, k] @ b.data[:, k].T) by that block's scales, then add the blocks.")
        return Feedback(False, msg)
    return Feedback(True, "each K block's products of FP8 codes, summed, times that block's two scales, added up: "
                          "per tensor that is one multiply at the end.")


def hint_scaled_gemm() -> str:
    return ("a ~ a_q.data * a_q.scale, one scale per row per K block of a_q.block elements. Expand (a @ b^T) block "
            "by block along K: which scales multiply which partial sum? (Per tensor there is one block.)")


def solution_scaled_gemm() -> str:
    return '''def fn(a_q, b_q):
    out = 0
    for j in range(a_q.scale.shape[1]):                               # one K block at a time
        k = slice(j * a_q.block, (j + 1) * a_q.block)
        acc = a_q.data[:, k].float() @ b_q.data[:, k].float().t()     # exact products, fp32 sums (the tensor core)
        out = out + acc * a_q.scale[:, j, None] * b_q.scale[:, j][None, :]   # (M, 1) and (1, N) scales
    return out'''


# ---- 06: which recipes survive the sinks -----------------------------------------------------------------------------

SURVIVAL_SINKS = 1e6
SURVIVAL_LIMIT = 0.05
_WHY = {
    "tensorwise": "one scale for the whole tensor is set by the 10^6 sinks: every other activation flushes to zero",
    "delayed": "per-tensor too, and its scale comes from past steps as well",
    "rowwise": "every row holds the sink channels, so every row's scale is set by them - worst of all",
    "nvfp4": "E2M1 has 3.6 binades: even its 16-element blocks lose the rest of a sink's block, and it starts "
             "worse than the FP8 recipes anyway",
    "blockwise": "its 1x128 blocks along K keep the damage in the sinks' own block",
    "mxfp8": "its 1x32 blocks along K keep the damage in the sinks' own block",
}


def _names(answer) -> tuple[set[str] | None, str]:
    if isinstance(answer, str):  # "blockwise" or "blockwise, mxfp8": names, not characters
        answer = [a for a in answer.replace(",", " ").split() if a]
    try:
        return {str(a).strip().lower() for a in answer}, ""
    except TypeError:
        return None, "answer with a set of recipe names, e.g. {'tensorwise', 'mxfp8'}"


def check_survivors(answer) -> Feedback:
    """Which FP8 recipes end within 5% of their own no-outlier loss with 4 sink channels at 1e6
    (LESSON settings, mean of 3 seeds: fp8lab.training.measured)? A set of names (a string of names works)."""
    from fp8lab.numerics.recipes import RECIPES
    from fp8lab.training.measured import survivors
    from fp8lab.training.train import BASELINES

    chosen, err = _names(answer)
    if chosen is None:
        return Feedback(False, err)
    unknown = chosen - set(RECIPES) - set(BASELINES)
    if unknown:
        return Feedback(False, f"unknown recipes {sorted(unknown)}; choose from {', '.join(RECIPES)}")
    note = ""
    if chosen & set(BASELINES):
        note = (f" ({', '.join(sorted(chosen & set(BASELINES)))} never sees the sinks - their next layer's weights "
                "are zero - so it survives trivially; the question is about the FP8 recipes.)")
    chosen -= set(BASELINES)
    truth = survivors(SURVIVAL_SINKS, SURVIVAL_LIMIT)
    wrong = chosen - truth
    if wrong:
        name = sorted(wrong)[0]
        return Feedback(False, f"{name} does not survive: {_WHY.get(name, 'its loss ends more than 5% higher')}.{note}")
    missing = truth - chosen
    if missing:
        name = sorted(missing)[0]
        return Feedback(False, f"{name} survives too: {_WHY.get(name, 'it ends within 5%')}, and the wgrad layout "
                               f"(blocks along M) never sees the sinks.{note}")
    return Feedback(True, f"{' and '.join(sorted(truth))}: blocks along K keep the damage in the sinks' own block."
                          f"{note}")


def hint_survivors() -> str:
    return ("Run the TrainingPanel with the sink knob at 1e6 and again at 'none'; compare each recipe's final loss "
            "with its own. Then ask: how many values share a scale with a sink channel?")


def solution_survivors() -> str:
    from fp8lab.training.measured import survivors

    return f"{sorted(survivors(SURVIVAL_SINKS, SURVIVAL_LIMIT))} - the sink cliff panel below shows the losses"


# ---- 06b: tune the amax history ------------------------------------------------------------------------------------

RECOVER_WITHIN = 20  # steps after the input drop


def history_answer() -> int:
    """The longest amax history (of fp8lab.training.train.HISTORIES) with which the delayed recipe brings
    fc1's input underflow back under 1% within RECOVER_WITHIN steps of the drop (fp8lab.training.measured)."""
    from fp8lab.training.measured import recovery

    rec = recovery()
    if rec.empty:
        raise ValueError("fp8lab.training.measured holds no results: run `python -m fp8lab measured --write`")
    ok = [int(h) for h, n in zip(rec["history"], rec["steps_to_recover"], strict=True)
          if n is not None and n <= RECOVER_WITHIN]
    return max(ok)


def check_history(history: int) -> Feedback:
    """The longest amax history that brings fc1's input underflow back under 1% within 20 steps
    after the input shrinks 1e5-fold at step 75 (delayed recipe, algo max, margin 0)."""
    from fp8lab.training.measured import recovery
    from fp8lab.training.train import HISTORIES

    lengths = (*HISTORIES, 1024)  # the panel's lengths; 1024 (TransformerEngine's default) lags longer than 256
    if isinstance(history, bool) or not isinstance(history, int) or history not in lengths:
        return Feedback(False, f"answer with one of the panel's history lengths: {', '.join(map(str, lengths))}")
    rec = dict(zip(recovery()["history"], recovery()["steps_to_recover"], strict=True))
    best = history_answer()
    steps = rec.get(history)  # None for 1024: a longer history than one that never recovered
    took = "does not recover within the run" if steps is None else f"needs {steps} steps"
    if history == best:
        return Feedback(True, f"history {history} {took} after the drop: with algo max the scale uses the largest of "
                              f"the last {history} amaxes, and the old ones leave one per step. Longer histories ride "
                              "out one-step spikes (notebook 03); this is as long as the drop allows.")
    if history > best:
        return Feedback(False, f"history {history} {took} after the drop (more than {RECOVER_WITHIN}): the old, large "
                               "amax stays the max of the history for that many steps.")
    return Feedback(False, f"history {history} recovers in time ({steps} steps), but a longer one does too - and a "
                           "longer history is what protects against one-step spikes.")


def hint_history() -> str:
    return ("In the live panel pick only 'delayed', tick the input drop, monitor 'underflow' of 'input', and try "
            "histories. Count the steps after step 75 until fc1's line falls back to 0: how does it relate to the "
            "history length?")


def solution_history() -> str:
    return (f"{history_answer()}: with algo 'max' the delayed recipe recovers exactly `history` steps after the drop; "
            f"the longest of the panel's lengths within {RECOVER_WITHIN} steps is {history_answer()}.")


# ---- 06c: does a short run predict a long one? -----------------------------------------------------------------------

SHORT, LONG = 30, 150


def _rankings(history) -> tuple[list[str], list[str], dict, dict]:
    """The runs ordered by loss at step SHORT (mean of steps SHORT-10..SHORT-1) and at the end."""
    early = history[history.step < SHORT].groupby("run", sort=False)["loss"].apply(lambda s: s.tail(10).mean())
    final = history.groupby("run", sort=False)["loss"].apply(lambda s: s.tail(10).mean())
    return list(early.sort_values().index), list(final.sort_values().index), early.to_dict(), final.to_dict()


def ranking_answer(sinks: float = SURVIVAL_SINKS, seed: int = 0) -> tuple[bool, list[str], list[str]]:
    """From fp8lab.training.measured (LESSON settings): (same ranking?, ranking at step 30, at step 150)."""
    from fp8lab.training.measured import cliff

    df = cliff()
    d = df[(df.sinks == sinks) & (df.seed == seed)]
    r30, r150 = list(d.sort_values("loss_short").run), list(d.sort_values("loss").run)
    return r30 == r150, r30, r150


def check_ranking(result, same_ranking: bool | None) -> Feedback:
    """From your own run (the live panel after >= 150 steps with >= 3 recipes, or a TrainResult):
    does ranking the recipes by their loss at step 30 give the same order as at step 150?"""
    history = getattr(result, "result", result)  # a TrainingPanel or its TrainResult
    history = getattr(history, "history", None)
    if history is None or len(history) == 0:
        return Feedback(False, "train first: in the live panel pick 3 or more recipes, 150 steps, and press Start; "
                               "then pass the panel (or its .result).")
    runs = history["run"].nunique()
    last = int(history["step"].max()) + 1
    if runs < 3 or last < LONG:
        return Feedback(False, f"your run has {runs} recipes and {last} steps: the exercise needs 3 or more recipes "
                               f"and {LONG} steps.")
    if not isinstance(same_ranking, bool):
        return Feedback(False, "answer True (the order at step 30 is the order at step 150) or False.")
    r30, r150, early, final = _rankings(history[history.step < LONG])
    same = r30 == r150
    shown = (f"at step {SHORT}: {' < '.join(f'{r} {early[r]:.3g}' for r in r30)}; at step {LONG}: "
             f"{' < '.join(f'{r} {final[r]:.3g}' for r in r150)}")
    base = "fp32" if "fp32" in final else r150[0]
    flagged30 = {r for r in r30 if early[r] > 1.05 * early[base]}
    flagged150 = {r for r in r150 if final[r] > 1.05 * final[base]}
    f30, f150 = ", ".join(sorted(flagged30)) or "none", ", ".join(sorted(flagged150)) or "none"
    lesson = (f" Beyond the order: the recipes more than 5% behind {base} at step {SHORT} ({f30}) and at step "
              f"{LONG} ({f150}){' are the same' if flagged30 == flagged150 else ' differ'}: a short run flags the "
              "recipes that break; near-ties can swap.")
    if same_ranking == same:
        return Feedback(True, f"{'same' if same else 'different'} order - {shown}.{lesson}")
    return Feedback(False, f"look again: {shown}.")


def hint_ranking() -> str:
    return ("Train once for 150 steps (sinks at 1e6 makes it interesting): the loss each run had around step 30 is "
            "what a 30-step experiment would have ended at. Order the runs by it, then by the final loss.")


def solution_ranking() -> str:
    same, r30, r150 = ranking_answer()
    return (f"At sinks 1e6, seed 0 (fp8lab.training.measured): step 30 {' < '.join(r30)}; "
            f"step 150 {' < '.join(r150)} - "
            f"{'the same order' if same else 'a different order'}. Your own run decides your answer.")


# ---- 08: choose a recipe for a model (the capstone) -------------------------------------------------------------

MONITORS = ("loss", "amax", "overflow", "underflow", "sqnr")


def _fp8_runs(result) -> list[str]:
    from fp8lab.numerics.recipes import RECIPES

    return [r for r in result.table.index if r in RECIPES]


def _monitor_feedback(monitor: str, result, report) -> tuple[bool, str]:
    """Would `monitor` have flagged the cheapest recipe that failed this model? Judged on the report."""
    from fp8lab.training.cost import cost_class

    runs = sorted(_fp8_runs(result), key=cost_class)
    failed = [r for r in runs if not result.suits(r)]
    if not failed:
        return True, ("nothing failed here, so any statistic would do; per-layer underflow stays the cheap early "
                      "warning for the day a few channels grow.")
    bad = failed[0]
    if bad not in report.recipes:
        return True, f"{bad} failed in training but was not inspected, so the report cannot judge the monitor."
    f = report.frame
    part = f[f.recipe == bad].assign(score=f[["sqnr_db", "sqnr_ordinary_db"]].min(axis=1))
    row = part.loc[part["score"].idxmin()]
    where = f"{row.layer}'s {row.gemm} {row.operand} under {bad}"
    passing = [r for r in runs if result.suits(r)]
    if monitor == "underflow":
        if row.underflow > 0.01:
            return True, f"underflow flags it from step 0: {100 * row.underflow:.1f}% of {where} flushed to zero."
        return False, f"underflow of {where} is only {100 * row.underflow:.2f}%; look at its SQNR instead."
    if monitor == "sqnr":
        if row.sqnr_db < report.target_db:
            return True, f"whole-tensor SQNR flags it: {row.sqnr_db:.1f} dB for {where}."
        return False, (f"whole-tensor SQNR of {where} reads {row.sqnr_db:.1f} dB (the outliers carry the energy) "
                       f"while {100 * row.underflow:.1f}% of its values flushed to zero: it looks fine and isn't. "
                       f"Its ordinary channels are at {row.sqnr_ordinary_db:.1f} dB.")
    if monitor == "overflow":
        if row.overflow > 0:
            return True, f"overflow flags it: {100 * row.overflow:.2f}% of {where} clipped."
        return False, (f"overflow of {where} is 0: current scaling takes the scale from the tensor's own amax, so "
                       f"nothing clips. The damage is at the other end: {100 * row.underflow:.1f}% flushed to zero.")
    if monitor == "amax":
        other = f" {passing[0]} sees the same amax and stays within the budget." if passing else ""
        return False, (f"amax shows the outliers ({row.amax:.3g} in {row.layer}) but not the damage: it is the same "
                       f"under every recipe.{other} Watch what the amax does to the other values: underflow.")
    return False, (f"the loss ends {result.evidence(bad)}: it says something is off, late and not where, while "
                   f"{100 * row.underflow:.1f}% of {where} flushed to zero from the first step.")


def check_capstone(prediction: dict, result, report) -> Feedback:
    """Grade a prediction {"recipe": ..., "monitor": ...} for one of notebook 08's models against what
    was measured: result (fp8lab.capstone.train_case) and report (fp8lab.inspect).

    recipe: within the budget (CaseResult.suits) and no recipe of a cheaper class (fp8lab.cost.
    cost_class: per-tensor < per-row < blocks) also within it. monitor (one of MONITORS): the
    per-layer statistic that would have flagged the cheapest recipe that failed, judged on the report.
    """
    from fp8lab.training.cost import cost_class

    if not isinstance(prediction, dict) or not {"recipe", "monitor"} <= set(prediction):
        return Feedback(False, "predict with a dict: {'recipe': 'tensorwise', 'monitor': 'underflow'}")
    runs = _fp8_runs(result)
    recipe = str(prediction["recipe"]).strip().lower()
    monitor = str(prediction["monitor"]).strip().lower()
    if recipe not in runs:
        return Feedback(False, f"{recipe!r} was not trained here; choose from {', '.join(runs)}")
    if monitor not in MONITORS:
        return Feedback(False, f"unknown monitor {monitor!r}; choose from {', '.join(MONITORS)}")
    if not result.suits(recipe):
        skip = report.skip(recipe) if recipe in report.recipes else []
        why = f" The report flags {', '.join(skip)} for it." if skip else ""
        recipe_ok, recipe_msg = False, f"{recipe} misses the budget: {result.evidence(recipe)}.{why}"
    else:
        cheaper = [r for r in runs if result.suits(r) and cost_class(r) < cost_class(recipe)]
        if cheaper:
            recipe_ok, recipe_msg = False, (f"{recipe} works ({result.evidence(recipe)}), but {cheaper[0]} is "
                                            f"cheaper and also within the budget ({result.evidence(cheaper[0])}).")
        else:
            recipe_ok, recipe_msg = True, f"{recipe} is within the budget ({result.evidence(recipe)}) and none " \
                                          "cheaper is."
    monitor_ok, monitor_msg = _monitor_feedback(monitor, result, report)
    return Feedback(recipe_ok and monitor_ok, f"Recipe: {recipe_msg} Monitor: {monitor_msg}")


def hint_capstone() -> str:
    return ("Read the report before the training: report.heatmap() shows, per layer, which recipes keep the worst "
            "operand above the target, and report.frame has each operand's underflow beside its SQNR. Which layers "
            "have outlier channels in their input (outlier_channels > 0)? What does a per-tensor scale do to the "
            "other values of such a tensor?")


def solution_capstone(result, report) -> str:
    """The answer for this model, from what was measured: the cheapest recipe within the budget, and
    the statistic that flags the cheapest one that failed."""
    from fp8lab.training.cost import cost_class

    runs = sorted(_fp8_runs(result), key=cost_class)
    good = [r for r in runs if result.suits(r)]
    best = good[0] if good else "none of these: keep the flagged layers in high precision (report.skip)"
    monitors = [m for m in MONITORS if _monitor_feedback(m, result, report)[0]]
    return (f"recipe: {best} ({result.evidence(best) if good else ''}); monitor: {' or '.join(monitors)}. "
            f"inspect's whole-model pick: {report.best_recipe()} with skip={report.skip(report.best_recipe())}")


__all__ += ["MONITORS", "check_capstone", "hint_capstone", "solution_capstone"]
