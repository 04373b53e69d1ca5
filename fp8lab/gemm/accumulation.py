"""The accumulation model: a limited-precision tensor-core accumulator, and promotion to fp32.

Public: AccumulatorModel (DeepSeek-V3's ~14-bit accumulator and its fix, in either reading of their sentence,
ALIGNMENTS), and its fast twin accumulate_all (many models in one walk over GroupedProducts, the same bits);
accumulation_error, accumulation_errors, accumulation_curves (the relative error of a GEMM against its exact
product, for one K or many, one model or many: over the whole output, MEASURES "frobenius", or the largest over
its elements, "max", the measure DeepSeek-V3 quotes), operand_rounding_error (what rounding the same inputs to
E4M3 costs, against their unquantized product), deepseek_check (both readings against DeepSeek-V3's "nearly 2%",
per inputs and measure). The emulation (fp8lab.gemm.emulation) sums in fp32 unless given an AccumulatorModel.
Notebook 05 introduces it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from fp8lab.gemm.emulation import emulated_mm, quantize_operands, scale_output, scaled_products
from fp8lab.numerics.quantize import QuantizedTensor

__all__ = ["ALIGNMENTS", "DEEPSEEK_ERROR", "DEEPSEEK_K", "MEASURES", "NEAR", "AccumulatorModel", "GroupedProducts",
           "accumulate_all", "accumulation_curves", "accumulation_error", "accumulation_errors",
           "accumulation_operands", "deepseek_check", "operand_rounding_error"]

# how a GEMM's error against its exact product is summed up: ||got - exact|| / ||exact|| over the whole
# output (Frobenius), or max_ij |got - exact| / |exact| (the largest relative error of one output element)
MEASURES = ("frobenius", "max")
# the two readings of DeepSeek-V3's sentence (section 3.5.2), AccumulatorModel.alignment:
#   "running": each group of products is aligned, together with the running sum, to the largest exponent
#              among them, and the bits below the top ones are dropped from all of them (the sum included)
#   "group":   each group is aligned to its own largest product, the group's sum is then added into a
#              register that keeps the top bits of the result
ALIGNMENTS = ("running", "group")


# ---- the model ---------------------------------------------------------------------


@dataclass(frozen=True)
class AccumulatorModel:
    """A limited-precision tensor-core accumulator, and the fix of promoting to fp32.

    DeepSeek-V3 (arXiv 2412.19437, section 3.5.2): "After aligning 32 mantissa products by
    right-shifting based on the maximum exponent, the Tensor Core only uses the highest 14 bits
    of each mantissa product for addition ... The accumulation of addition results into registers
    also employs 14-bit precision." Their fix (section 3.3.2): copy the partial sum to an fp32
    accumulator every N_C = 128 elements. The sentence has two readings, `alignment`:

    "running" (the default): per output element, walking K in groups of `group` products,
      e   = exponent of the largest of |group's products| and |accumulator|
      ulp = 2^(e - mantissa_bits)         (keep mantissa_bits + 1 bits: 14 by default)
      accumulator = trunc_ulp(accumulator) + sum(trunc_ulp(product))   (toward zero)
    "group": the running sum takes no part in the alignment,
      ulp_g = 2^(exponent of the largest of |group's products| - mantissa_bits)
      accumulator = trunc14(accumulator + sum(trunc_ulp_g(product)))
      where trunc14 keeps the top mantissa_bits + 1 bits of the result (toward zero).
    Either way, every `promote_every` elements (None: never) the accumulator is added to an fp32
    total (round to nearest) and reset. Products are exact; block scales are applied to the
    products first (exact for power-of-two scales).
    """

    mantissa_bits: int = 13
    group: int = 32
    promote_every: int | None = 128
    alignment: str = "running"

    def __post_init__(self) -> None:
        if self.alignment not in ALIGNMENTS:
            raise ValueError(f"unknown alignment {self.alignment!r}; valid: {', '.join(ALIGNMENTS)}")
        if not (isinstance(self.mantissa_bits, int) and 1 <= self.mantissa_bits <= 50):
            raise ValueError(f"mantissa_bits must be an integer in 1..50, got {self.mantissa_bits!r}")
        if not (isinstance(self.group, int) and self.group >= 1):
            raise ValueError(f"group must be a positive integer, got {self.group!r}")
        if self.promote_every is not None and not (
            isinstance(self.promote_every, int) and self.promote_every >= 1 and self.promote_every % self.group == 0
        ):
            raise ValueError(
                f"promote_every must be None or a positive multiple of group ({self.group}), got {self.promote_every!r}"
            )

    @property
    def label(self) -> str:
        promo = f"promote every {self.promote_every}" if self.promote_every else "no promotion"
        aligned = "aligned with the running sum" if self.alignment == "running" else "each group aligned alone"
        return f"{self.mantissa_bits + 1}-bit accumulator, groups of {self.group} {aligned}, {promo}"

    def accumulate(self, products: torch.Tensor) -> torch.Tensor:
        """Sum products[..., K] along the last dim through the model; returns float32 [...]."""
        p = products.double()
        k = p.shape[-1]
        total = torch.zeros(p.shape[:-1], dtype=torch.float32, device=p.device)
        acc = torch.zeros(p.shape[:-1], dtype=torch.float64, device=p.device)
        interval = self.promote_every or k
        starts = range(0, k, self.group)
        group_max = [p[..., s : s + self.group].abs().amax(-1) for s in starts]  # independent of acc
        for start, gmax in zip(starts, group_max, strict=True):
            grp = p[..., start : start + self.group]  # (..., group)
            if self.alignment == "running":  # the running sum takes part in the alignment
                ulp = self._ulp(torch.maximum(gmax, acc.abs()))
                acc = torch.trunc(acc / ulp) * ulp + (torch.trunc(grp / ulp[..., None]) * ulp[..., None]).sum(-1)
            else:  # the group alone, then a register that keeps the top bits of the sum
                ulp = self._ulp(gmax)
                acc = acc + (torch.trunc(grp / ulp[..., None]) * ulp[..., None]).sum(-1)
                ulp = self._ulp(acc.abs())
                acc = torch.trunc(acc / ulp) * ulp
            end = start + self.group
            if end % interval == 0 or end >= k:
                total = total + acc.to(torch.float32)  # promotion: one fp32 add
                acc = torch.zeros_like(acc)
        return total

    def _ulp(self, top: torch.Tensor) -> torch.Tensor:
        """2^(floor(log2(top)) - mantissa_bits): the last bit kept of a value as large as `top` (exact; top 0 ->
        2^(-1 - mantissa_bits), and what it truncates is 0 anyway)."""
        e = torch.frexp(top).exponent - 1  # floor(log2(top)), exact
        return torch.ldexp(torch.ones_like(top), e - self.mantissa_bits)


# ---- the same walk, fast: all the models at once, in numpy ----------------------------------------


class GroupedProducts:
    """products[..., K] cut into groups of `group` (zeros after the last product, where K is not a multiple: a zero
    truncates nothing and raises no group's largest product), laid out as the walk reads them, one group of every
    output at a time: groups (G, n, group) float64 and their largest magnitude group_max (G, n). Built once, walked
    by many models (accumulate_all)."""

    def __init__(self, products: torch.Tensor, group: int) -> None:
        self.shape, self.k, self.group = tuple(products.shape[:-1]), products.shape[-1], group
        x = products.detach().double().cpu().reshape(-1, self.k).numpy()
        x = np.pad(x, ((0, 0), (0, -self.k % group)))  # (n, G * group)
        self.groups = np.ascontiguousarray(x.reshape(x.shape[0], -1, group).transpose(1, 0, 2))  # (G, n, group)
        self.group_max = np.abs(self.groups).max(-1)  # (G, n)
        self.live = self.group_max > 0  # the groups that hold a nonzero product
        self.live_groups = self.groups[self.live]  # (L, group)
        self._products = torch.from_numpy(self.live_groups)
        self._scratch = torch.empty(self.live_groups.shape, dtype=torch.float64, device="cpu")
        self._lock = threading.Lock()
        self.group_sums = self.groups.sum(-1)  # (G, n), rounded: only a guess of the running sum
        nonzero = self.group_max[self.live]
        # the fast walk forms the same numbers as accumulate where every ulp is a normal float64 (finite products
        # within 2^+-900: tame) and every sum is exact (fast_for)
        self.tame = bool(np.isfinite(self.group_max).all()) and (
            nonzero.size == 0 or (nonzero.min() >= 2.0**-900 and nonzero.max() <= 2.0**900))

    def fast_for(self, model: AccumulatorModel) -> bool:
        """Whether the fast walk gives `model`'s bits here: tame products, the model's group, and exact sums. A group's
        truncated products are whole numbers of ulps below 2^(mantissa_bits + 1) each; with the accumulator's own,
        (group + 1) of them sum below (group + 1) * 2^(mantissa_bits + 1), exact in float64 up to 2^53 (in any
        order: numpy's and torch's sums agree)."""
        exact = (model.group + 1) << (model.mantissa_bits + 1) <= 1 << 53  # every sum an exact float64
        return self.tame and model.group == self.group and exact

    def truncated_sums(self, ulp: np.ndarray) -> np.ndarray:
        """sum(trunc(groups / ulp) * ulp) per group (G, n), for powers of two ulp (G, n); computed on the groups
        that hold a nonzero product as ulp * sum(trunc(groups * (1 / ulp))): the same numbers (powers of two scale
        exactly, the sums are exact). In torch: one thread's vectorized loops over the (L, group) products."""
        live_ulp = ulp[self.live]  # (L,)
        with self._lock:  # one scratch (L, group) per GroupedProducts: a new one costs its pages every time
            work = torch.mul(self._products, torch.from_numpy(1.0 / live_ulp)[:, None], out=self._scratch)
            truncated = work.trunc_().sum(1).numpy()
        sums = np.zeros(self.group_max.shape)
        sums[self.live] = truncated * live_ulp
        return sums


_EXPONENT_BITS = np.int64(0x7FF0000000000000)
_SMALLEST_NORMAL = 2.0**-1022


def _power(x: np.ndarray) -> np.ndarray:
    """2^floor(log2(x)) for positive normal float64 x: x with its mantissa bits cleared."""
    return (x.view(np.int64) & _EXPONENT_BITS).view(np.float64)


def accumulate_all(models: Sequence[AccumulatorModel], products: torch.Tensor | GroupedProducts) -> list[torch.Tensor]:
    """[model.accumulate(products) for model in models], the same bits, in one walk per alignment over all the
    models at once (numpy, small arrays: the walk's steps cost their calls, not their data).

    Each group's truncated products are summed ahead of the walk for a guessed ulp (from the running sum's exact
    value); the walk checks each guess against the accumulator it reaches and sums the group again where it
    was wrong, so the guess sets the speed, never the numbers. Where GroupedProducts.fast_for(model) is False
    (products not tame, or sums that could round) the model's own accumulate runs. tests/gemm/test_accumulation.py
    compares the two bit for bit."""
    models = list(models)
    if isinstance(products, torch.Tensor):
        grouped = {g: GroupedProducts(products, g) for g in {m.group for m in models}}
        device = products.device
    else:
        grouped, device = {products.group: products}, torch.device("cpu")
    out: dict[int, torch.Tensor] = {}
    for alignment, walk in (("running", _walk_running), ("group", _walk_group)):
        for gp in grouped.values():  # (fast_for: the models of gp's group whose sums are exact)
            batch = [i for i, m in enumerate(models) if m.alignment == alignment and gp.fast_for(m)]
            if batch:
                sums = walk([models[i] for i in batch], gp)  # (len(batch), n) float32
                for i, total in zip(batch, sums, strict=True):
                    out[i] = torch.from_numpy(total.reshape(gp.shape)).to(device)
    for i, m in enumerate(models):
        if i not in out:  # not tame: the definition itself
            out[i] = m.accumulate(products if isinstance(products, torch.Tensor) else _ungrouped(products))
    return [out[i] for i in range(len(models))]


def _ungrouped(gp: GroupedProducts) -> torch.Tensor:
    x = gp.groups.transpose(1, 0, 2).reshape(*gp.shape, -1)[..., : gp.k]
    return torch.from_numpy(np.ascontiguousarray(x))


def _promotions(models: list[AccumulatorModel], groups: int) -> list[list[int]]:
    """For each group of the walk, the models whose accumulator is promoted to fp32 after it."""
    return [[c for c, m in enumerate(models)
             if g == groups - 1 or ((g + 1) * m.group) % (m.promote_every or groups * m.group) == 0]
            for g in range(groups)]


def _last_bits(models: list[AccumulatorModel]) -> np.ndarray:
    """2^-mantissa_bits per model (C, 1): a value's last kept bit is 2^floor(log2(value)) times it."""
    return np.ldexp(1.0, -np.array([m.mantissa_bits for m in models]))[:, None]


def _start(models: list[AccumulatorModel], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each model's accumulator (C, n) float64 and fp32 total (C, n) float32, all zeros."""
    return np.zeros((len(models), n)), np.zeros((len(models), n), dtype=np.float32)


def _promote(total: np.ndarray, acc: np.ndarray, promoted: list[int]) -> None:
    """The promoted models' accumulators (rows of acc) added to their fp32 totals (one float32 add) and reset."""
    if promoted:
        total[promoted] += acc[promoted].astype(np.float32)
        acc[promoted] = 0.0


def _walk_running(models: list[AccumulatorModel], gp: GroupedProducts) -> np.ndarray:
    """The "running" alignment's walk for all `models` (same group) at once: (C, n) float32. ulp = 2^floor(log2(top))
    * 2^-mantissa_bits as in accumulate (an all-zero group beside a zero sum takes top = the smallest normal
    float64 instead of 0: it truncates nothing either way)."""
    groups, n = gp.group_max.shape
    last_bit = _last_bits(models)  # (C, 1)
    group_max = np.maximum(gp.group_max, _SMALLEST_NORMAL)  # (G, n)
    guessed, sums = [], []  # (G, C, n): each model's guess of 2^floor(log2(top)), its groups' sums for that guess
    for c, m in enumerate(models):
        every = (m.promote_every or groups * m.group) // m.group  # groups per promotion interval
        parts = np.pad(gp.group_sums, ((0, -groups % every), (0, 0))).reshape(-1, every, n)
        before = (np.cumsum(parts, 1) - parts).reshape(-1, n)[:groups]  # the exact sum before each group
        guess = _power(np.maximum(group_max, np.abs(before)))
        guessed.append(guess)
        sums.append(gp.truncated_sums(guess * last_bit[c]))
    guessed, sums = np.stack(guessed, 1), np.stack(sums, 1)
    # where the guessed ulp is above the group's largest product, the guess truncates the whole group to 0
    guessed_zero = guessed * last_bit[None] > group_max[:, None]  # (G, C, n)
    acc, total = _start(models, n)
    for g, promoted in enumerate(_promotions(models, groups)):
        top = _power(np.maximum(group_max[g], np.abs(acc)))  # (C, n)
        ulp = top * last_bit
        group_sum = sums[g]
        wrong = top != guessed[g]
        if wrong.any():  # a wrong guess matters unless both ulps drop the whole group (a saturated accumulator)
            wrong &= (ulp <= group_max[g]) | ~guessed_zero[g]
        if wrong.any():  # sum those groups again for the ulp the accumulator reached
            c, r = np.nonzero(wrong)
            right = ulp[c, r][:, None]
            group_sum = group_sum.copy()
            group_sum[c, r] = (np.trunc(gp.groups[g, r] / right) * right).sum(-1)
        acc = np.trunc(acc / ulp)
        acc *= ulp
        acc += group_sum
        _promote(total, acc, promoted)
    return total


def _walk_group(models: list[AccumulatorModel], gp: GroupedProducts) -> np.ndarray:
    """The "group" alignment's walk for all `models` (same group) at once: (C, n) float32. Each group's sum depends
    on its own products only: summed ahead of the walk, once per mantissa width."""
    groups, n = gp.group_max.shape
    top = _power(np.maximum(gp.group_max, _SMALLEST_NORMAL))
    widths = {bits: gp.truncated_sums(np.ldexp(top, -bits)) for bits in {m.mantissa_bits for m in models}}
    sums = np.stack([widths[m.mantissa_bits] for m in models], 1)  # (G, C, n)
    last_bit = _last_bits(models)  # (C, 1)
    acc, total = _start(models, n)
    for g, promoted in enumerate(_promotions(models, groups)):
        acc += sums[g]
        ulp = _power(np.maximum(np.abs(acc), _SMALLEST_NORMAL))
        ulp *= last_bit
        acc = np.trunc(acc / ulp)
        acc *= ulp
        _promote(total, acc, promoted)
    return total


def accumulation_errors(
    ks: Sequence[int],
    accumulation: AccumulatorModel | None = None,
    distribution: str = "uniform",
    size: int = 8,
    measure: str = "frobenius",
) -> list[float]:
    """[accumulation_error(k, accumulation, distribution, size, measure=measure) for k in ks], the same floats,
    with the accumulator model walking all the K at once (one pass over the largest): accumulation_curves with one
    model."""
    if accumulation is None:
        return [accumulation_error(k, None, distribution, size, measure=measure) for k in ks]
    return accumulation_curves(ks, [accumulation], distribution, size, (measure,))[measure][0]


def accumulation_curves(
    ks: Sequence[int],
    models: Sequence[AccumulatorModel],
    distribution: str = "uniform",
    size: int = 8,
    measures: Sequence[str] = MEASURES,
) -> dict[str, list[list[float]]]:
    """{measure: [accumulation_errors(ks, model, distribution, size, measure) for model in models]} for each of
    `measures`, the same floats, all the models walking all the K at once (accumulate_all), once for every measure.

    Each K's products are padded with zeros in front: the model's accumulator stays exactly 0
    through them (a zero group truncates nothing) and adds 0 at each promotion, so the padded
    walk is the unpadded one, provided the padding is a whole number of groups and, where a
    promotion falls inside a K, of promotion intervals (true for the powers of two the panels
    use; other K are walked one by one). tests/gemm/test_gemm.py checks the equality bit for bit."""
    if distribution not in ("uniform", "normal"):
        raise ValueError(f"unknown distribution {distribution!r}; valid: uniform, normal")
    for measure in measures:
        if measure not in MEASURES:
            raise ValueError(f"unknown measure {measure!r}; valid: {', '.join(MEASURES)}")
    ks, models = list(ks), list(models)
    got: list[dict[int, torch.Tensor]] = [{} for _ in models]  # per model: K -> the GEMM's output [size, size]
    for model, outputs in zip(models, got, strict=True):
        for k in ks:
            if not _aligned(model, k, max(ks)):  # walked alone, as accumulation_error walks it
                a_q, b_q, _ = accumulation_operands(k, distribution, size)
                outputs[k] = emulated_mm(a_q, b_q, emulation="reference", accumulation=model)
    batches: dict[tuple, list[int]] = {}  # the K walked together, per group: the models sharing them
    for i, model in enumerate(models):
        together = tuple(k for k in ks if k not in got[i])
        if together:
            batches.setdefault((together, model.group), []).append(i)
    for (together, group), which in batches.items():
        outs = accumulate_all([models[i] for i in which], _padded_products(together, distribution, size, group))
        for i, out in zip(which, outs, strict=True):  # out: (len(together), size, size)
            for k, out_k in zip(together, out, strict=True):
                a_q, b_q, _ = accumulation_operands(k, distribution, size)
                got[i][k] = scale_output(out_k, a_q, b_q)
    exact = {k: accumulation_operands(k, distribution, size)[2] for k in ks}
    return {measure: [[_relative_error(outputs[k], exact[k], measure) for k in ks] for outputs in got]
            for measure in measures}


def _aligned(model: AccumulatorModel, k: int, longest: int) -> bool:
    """Whether K's products padded in front to `longest` promote where the unpadded ones do."""
    pad = longest - k
    if pad % model.group:
        return False
    every = model.promote_every
    if every is None or pad % every == 0:
        return True
    return every > k and (longest % every == 0 or every > longest)  # no promotion inside K either way


@lru_cache(maxsize=8)
def _padded_products(ks: tuple[int, ...], distribution: str, size: int, group: int) -> GroupedProducts:
    """The products of accumulation_operands(k) for each K, padded with zeros in front to the longest K, stacked
    (len(ks), size, size, max(ks)) and cut into groups."""
    longest = max(ks)
    products = torch.stack([torch.nn.functional.pad(scaled_products(*accumulation_operands(k, distribution, size)[:2]),
                                                    (longest - k, 0)) for k in ks])
    return GroupedProducts(products, group)


@lru_cache(maxsize=64)
def accumulation_operands(k: int, distribution: str, size: int):
    """a_q[size, K], b_q[size, K] (tensorwise, drawn from a generator seeded by K) and their exact product a_q @ b_q.T
    (float64): the operands notebook 05's accumulation panel sums."""
    # seeded by k: the same operands every time (cached, as a panel asks for them again and again)
    a_q, b_q, _ = _accumulation_inputs(k, distribution, size)
    return a_q, b_q, a_q.dequantize().double() @ b_q.dequantize().double().t()


@lru_cache(maxsize=64)
def _accumulation_inputs(k: int, distribution: str, size: int):
    """The unquantized a[size, K] and b[K, size] drawn from a generator seeded by K, quantized tensorwise, and
    their exact unquantized product (float64)."""
    g = torch.Generator().manual_seed(k)
    draw = torch.rand if distribution == "uniform" else torch.randn
    a, b = draw(size, k, generator=g), draw(k, size, generator=g)
    a_q, b_q = quantize_operands(a, b, "tensorwise")
    return a_q, b_q, a.double() @ b.double()


def operand_rounding_error(k: int, distribution: str = "uniform", size: int = 8, measure: str = "frobenius") -> float:
    """What rounding the inputs to E4M3 (tensorwise) costs on accumulation_error's inputs: the exact product of the
    quantized operands against the exact product of the unquantized ones, in `measure` (MEASURES). The
    accumulation errors are measured against the first, so the two add up to what a GEMM of these inputs loses."""
    if measure not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}; valid: {', '.join(MEASURES)}")
    _, _, exact = accumulation_operands(k, distribution, size)
    _, _, unquantized = _accumulation_inputs(k, distribution, size)
    return _relative_error(exact, unquantized, measure)


def accumulation_error(
    k: int,
    accumulation: AccumulatorModel | None = None,
    distribution: str = "uniform",
    size: int = 8,
    gemm: Callable[[QuantizedTensor, QuantizedTensor], torch.Tensor] | None = None,
    measure: str = "frobenius",
) -> float:
    """Relative error of a GEMM of FP8 operands against their exact product (measure: MEASURES).

    a[size, K] @ b[K, size], drawn uniform in [0, 1) (same sign: the sum grows like K, the
    worst case for a short accumulator) or normal (mixed signs), quantized tensorwise. The
    GEMM is the emulation with `accumulation` unless `gemm(a_q, b_q)` is given (the GPU's).
    measure "frobenius": ||got - exact|| / ||exact|| over the size x size output; "max": the largest
    |got - exact| / |exact| of one element (with mixed signs an output near zero decides it).
    """
    if distribution not in ("uniform", "normal"):
        raise ValueError(f"unknown distribution {distribution!r}; valid: uniform, normal")
    if measure not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}; valid: {', '.join(MEASURES)}")
    a_q, b_q, exact = accumulation_operands(k, distribution, size)
    if gemm is None:
        got = emulated_mm(a_q, b_q, emulation="reference", accumulation=accumulation)
    else:
        got = gemm(a_q, b_q)
    return _relative_error(got, exact, measure)


def _relative_error(got: torch.Tensor, exact: torch.Tensor, measure: str = "frobenius") -> float:
    """||got - exact|| / ||exact|| (Frobenius), or max |got - exact| / |exact| over the elements ("max"),
    in float64 on the CPU."""
    got = got.double().cpu()
    if measure == "max":
        return ((got - exact).abs() / exact.abs()).max().item()
    return (torch.linalg.norm(got - exact) / torch.linalg.norm(exact)).item()


# DeepSeek-V3 (section 3.3.2): "a maximum relative error of nearly 2%" at K = 4096 with the limited accumulator
DEEPSEEK_ERROR, DEEPSEEK_K = 0.02, 4096
NEAR = 1.5  # "nearly 2%": within this factor of it (1.33% to 3%)


def deepseek_check(bits: int = 14, k: int = DEEPSEEK_K, size: int = 8):
    """Both readings of the accumulator (ALIGNMENTS), `bits` bits, no promotion (the fast mode DeepSeek-V3
    measured), at K = `k`, on both inputs of accumulation_error and in both MEASURES, beside what rounding the same
    inputs to E4M3 costs: a DataFrame with columns alignment, inputs, measure, error, operand_rounding,
    vs_deepseek (error / 2%) and meets (within NEAR of 2%)."""
    import pandas as pd

    models = [AccumulatorModel(bits - 1, 32, None, alignment) for alignment in ALIGNMENTS]
    errors = {distribution: accumulation_curves([k], models, distribution, size)  # accumulation_error's floats
              for distribution in ("uniform", "normal")}
    rows = []
    for i, alignment in enumerate(ALIGNMENTS):
        for distribution in ("uniform", "normal"):
            for measure in MEASURES:
                err = errors[distribution][measure][i][0]
                ratio = err / DEEPSEEK_ERROR
                rows.append({"alignment": alignment, "inputs": distribution, "measure": measure, "error": err,
                             "operand_rounding": operand_rounding_error(k, distribution, size, measure),
                             "vs_deepseek": ratio, "meets": 1 / NEAR <= ratio <= NEAR})
    return pd.DataFrame(rows)
