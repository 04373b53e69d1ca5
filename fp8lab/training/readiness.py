"""FP8 readiness of any model: which recipe for which layer, measured on one batch of yours.

Public: inspect (exported as fp8lab.inspect), ReadinessReport, DEFAULT_RECIPES, COST_ORDER.
fp8lab.training.capture keeps every linear GEMM site's input x[M, K], weight w[N, K] and output
gradient dy[M, N] (the sites fp8lab.nn.convert converts); inspect() quantizes each for each recipe
exactly as FP8Linear does (fp8lab.nn.layer_gemms: fprop x, w along K; dgrad dy, w^T along N; wgrad
dy^T, x^T along M) and reports, per layer x GEMM x operand x recipe, how much survived.
The model is left as it was (parameters, .grad, requires_grad, train/eval, buffers, hooks, RNG).
Notebook 08 introduces it.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fp8lab.numerics.metrics import db, overflow_fraction
from fp8lab.numerics.quantize import QuantizedTensor
from fp8lab.numerics.recipes import Recipe, get_recipe
from fp8lab.progress import progress_bar
from fp8lab.training.capture import MAX_CAPTURE_MB, LinearCall, captures
from fp8lab.training.convert import convert
from fp8lab.training.export import TARGETS, export
from fp8lab.training.layers import layer_gemms

__all__ = ["COST_ORDER", "DEFAULT_RECIPES", "ReadinessReport", "inspect"]

# delayed is left out by default: on one batch its fresh history calibrates on this batch's amax,
# so it quantizes exactly as tensorwise does (its difference shows only over steps: notebook 03)
DEFAULT_RECIPES: tuple[str, ...] = ("tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4")

# Cheapest first. Bits moved per element first (NVFP4: 4 + 0.5 of block scales, against 8 +
# 0..1 for the FP8 recipes), then the published GEMM speed-ups over bf16 (fp8lab.cost.PUBLISHED:
# TransformerEngine on H200 delayed 1.69x > current 1.57x > block 1.41x; torchao Llama3-8B
# tensorwise +25% > mxfp8 +16-20% > rowwise +4-10%). The order is hardware-dependent (NVFP4 and
# MXFP8 need Blackwell, blockwise Hopper): pass your own cost_order for your GPU.
COST_ORDER: tuple[str, ...] = ("nvfp4", "delayed", "tensorwise", "rowwise", "rowwise_with_gw_hp", "mxfp8",
                               "blockwise")
HIGH_PRECISION = "keep in high precision"
_OPERANDS = {  # gemm -> ((role, source, transposed), (role, source, transposed)): operand = source or source^T
    "fprop": (("input", "x", False), ("weight", "w", False)),
    "dgrad": (("grad_output", "g", False), ("weight", "w", True)),
    "wgrad": (("grad_output", "g", True), ("input", "x", True)),
}
COLUMNS = ["layer", "call", "gemm", "operand", "recipe", "format", "granularity", "shape", "amax", "span_binades",
           "binades_used", "sqnr_db", "sqnr_ordinary_db", "underflow", "overflow", "subnormal", "outlier_channels"]


# ---- the statistics of one operand --------------------------------------------------------------------------


@dataclass
class _Source:
    """A high-precision tensor t[R, C] (x, w or dy) and what every recipe's row about it shares.
    Channels are its columns C (features of x, output channels of dy, input channels of w)."""

    t: torch.Tensor
    weights: torch.Tensor  # (C, 2) float64: columns (1, ordinary): sums all columns' and ordinary columns' noise
    zeros: int  # elements that are exactly 0 (they stay 0: not underflow)
    amax: float
    span: float
    signal: float
    signal_ordinary: float
    outliers: int

    @classmethod
    def of(cls, t: torch.Tensor, outlier_ratio: float) -> _Source:
        a = t.abs()
        col = a.amax(0)  # (C,) each channel's amax
        live = col[col > 0]
        ordinary = col <= outlier_ratio * live.median() if live.numel() else torch.ones_like(col, dtype=torch.bool)
        nonzero = a > 0
        amax = float(col.max())
        smallest = float(torch.where(nonzero, a, math.inf).min())
        span = math.log2(amax / smallest) if 0 < smallest < math.inf and math.isfinite(amax) else 0.0
        weights = torch.stack([torch.ones_like(ordinary, dtype=torch.float64), ordinary.double()], 1)  # (C, 2)
        signal, signal_ordinary = (t.square().sum(0, dtype=torch.float64) @ weights).tolist()
        return cls(t, weights, t.numel() - int(nonzero.sum()), amax, span, signal, signal_ordinary,
                   int((~ordinary).sum()))


_CODE_TABLES: dict[tuple[torch.dtype, float], tuple[list[int | None], list[bool]]] = {}


def _code_tables(dtype: torch.dtype, min_normal: float) -> tuple[list[int | None], list[bool]]:
    """For the 128 magnitude codes of an 8-bit storage dtype: each code's binade (floor(log2 value);
    None for zero, NaN and inf) and whether it is a subnormal of a format whose min_normal is given."""
    key = (dtype, min_normal)
    if key not in _CODE_TABLES:
        values = torch.arange(128, dtype=torch.uint8).view(dtype).float().tolist()
        ok = [math.isfinite(v) and v > 0 for v in values]
        _CODE_TABLES[key] = ([math.floor(math.log2(v)) if k else None for v, k in zip(values, ok, strict=True)],
                             [k and v < min_normal for v, k in zip(values, ok, strict=True)])
    return _CODE_TABLES[key]


def _stats(src: _Source, q: QuantizedTensor, transposed: bool) -> dict[str, float]:
    """How much of src survived as q (q quantizes src, or src^T when transposed).

    sqnr_db over all of src and over its ordinary columns (float32 errors, float64 sums);
    underflow: nonzero in src, zero in q; subnormal: q's elements below fmt.min_normal;
    binades_used: distinct binades of q's nonzero elements. The last three are read off a
    histogram of the 8-bit magnitude codes (E2M1 values are kept in an E4M3 container, each
    exactly); overflow: metrics.overflow_fraction, skipped where no block's amax exceeds
    its clip limit (then nothing can clip).
    """
    deq = q.dequantize()
    codes = q.data.view(torch.uint8) & 0x7F  # magnitude codes
    if transposed:  # back to src's [R, C] orientation
        deq = deq.t()
    col_noise = (src.t - deq).square().sum(0, dtype=torch.float64)  # (C,)
    noise, noise_ordinary = (col_noise @ src.weights).tolist()
    sqnr = db(src.signal, noise)
    n = src.t.numel()
    binade, subnormal = _code_tables(q.data.dtype, q.fmt.min_normal)
    hist = torch.bincount(codes.reshape(-1), minlength=128).tolist()  # (128,) counts of each magnitude code
    return {
        "sqnr_db": sqnr,
        "sqnr_ordinary_db": db(src.signal_ordinary, noise_ordinary) if src.outliers else sqnr,
        "underflow": (hist[0] - src.zeros) / n,  # a zero of src is a zero code too: the rest flushed
        "overflow": _overflow(src, q, transposed),
        "subnormal": sum(c for c, sub in zip(hist, subnormal, strict=True) if sub) / n,
        "binades_used": len({b for c, b in zip(hist, binade, strict=True) if c and b is not None}),
    }


def _overflow(src: _Source, q: QuantizedTensor, transposed: bool) -> float:
    if q.amax is not None:
        scale = q.scale if q.tensor_scale is None else q.scale * q.tensor_scale
        if bool((q.amax <= q.fmt.clip_threshold * scale).all()):
            return 0.0  # every block's largest |x| fits: no element clipped
    return overflow_fraction(src.t.t() if transposed else src.t, q)


def _granularity_label(q: QuantizedTensor) -> str:
    r, c = q.block_shape
    rows, cols = q.shape
    if (r, c) == (rows, cols):
        return "per-tensor"
    if (r, c) == (1, cols):
        return "per-row"
    return f"{r}x{c}"


def _rows_for_call(call: LinearCall, recipes: Sequence[Recipe], outlier_ratio: float,
                   device: torch.device | None) -> list[dict]:
    x, w, g = call.x, call.weight.float(), call.grad_output
    if device is not None:
        x, w, g = x.to(device), w.to(device), g.to(device)
    sources = {"x": _Source.of(x, outlier_ratio), "w": _Source.of(w, outlier_ratio), "g": _Source.of(g, outlier_ratio)}
    rows = []
    for recipe in recipes:
        gemms = layer_gemms(x, w, g, recipe)
        for gemm, operands in _OPERANDS.items():
            pair = gemms[gemm]
            for i, (role, key, transposed) in enumerate(operands):
                src = sources[key]
                scaling = recipe.scaling(role, gemm)
                if scaling is not None and scaling.hadamard is not None:  # the operand its GEMM reads: transformed
                    src = _Source.of(scaling.transform(src.t.t() if transposed else src.t).t() if transposed
                                     else scaling.transform(src.t), outlier_ratio)
                shape = tuple(src.t.shape[::-1]) if transposed else tuple(src.t.shape)
                base = {"layer": call.layer, "call": call.call, "gemm": gemm, "operand": role, "recipe": recipe.name,
                        "shape": f"{shape[0]}x{shape[1]}", "amax": src.amax, "span_binades": src.span,
                        "outlier_channels": src.outliers}
                if pair is None:  # this GEMM runs in high precision in this recipe
                    rows.append({**base, "format": "high precision", "granularity": "-", "binades_used": math.nan,
                                 "sqnr_db": math.inf, "sqnr_ordinary_db": math.inf, "underflow": 0.0,
                                 "overflow": 0.0, "subnormal": 0.0})
                    continue
                q = pair[i]
                rows.append({**base, "format": q.fmt.name, "granularity": _granularity_label(q),
                             **_stats(src, q, transposed)})
    return rows


# ---- the report -------------------------------------------------------------------------------------------------


@dataclass
class ReadinessReport:
    """What inspect() measured, and what follows from it.

    frame: one row per layer x call x GEMM x operand x recipe (COLUMNS): the operand's amax,
        span_binades (log2 of amax over its smallest nonzero |value|), binades_used (binades the
        quantized elements occupy), sqnr_db, sqnr_ordinary_db (SQNR of the columns that are not
        outlier channels: whole-tensor SQNR hides values flushed beside a large outlier),
        underflow / overflow / subnormal shares, outlier_channels (columns whose amax exceeds
        outlier_ratio x the median column's).
    A layer passes a recipe when its worst operand (lowest of sqnr_db and sqnr_ordinary_db over
    its GEMMs, operands and calls) is at or above target_db.
    """

    frame: Any
    target_db: float
    recipes: tuple[str, ...]
    cost_order: tuple[str, ...]
    not_covered: Any
    notes: list[str] = field(default_factory=list)
    loss: float = math.nan
    seconds: float = 0.0

    # -- derived tables ---------------------------------------------------------------------------
    @property
    def layers(self) -> list[str]:
        return list(dict.fromkeys(self.frame["layer"]))

    def _by_cost(self) -> list[str]:
        rank = {name: i for i, name in enumerate(self.cost_order)}
        return sorted(self.recipes, key=lambda r: (rank.get(r, len(rank)), self.recipes.index(r)))

    def worst(self):
        """DataFrame layers x recipes (cheapest first): each layer's worst operand SQNR in dB."""
        df = self.frame.assign(score=self.frame[["sqnr_db", "sqnr_ordinary_db"]].min(axis=1).fillna(-math.inf))
        table = df.pivot_table(index="layer", columns="recipe", values="score", aggfunc="min", sort=False)
        return table.reindex(index=self.layers, columns=self._by_cost())

    def recommendation(self, target_db: float | None = None):
        """Per layer: the cheapest recipe whose worst operand is >= target_db, else 'keep in high precision'.

        DataFrame columns: layer, recipe, worst_db (of that recipe; of the best recipe where
        none passes), worst_operand ("gemm operand" where it is lowest).
        """
        import pandas as pd

        target = self.target_db if target_db is None else target_db
        worst = self.worst()
        df = self.frame.assign(score=self.frame[["sqnr_db", "sqnr_ordinary_db"]].min(axis=1).fillna(-math.inf))
        rows = []
        for layer in self.layers:
            scores = worst.loc[layer]
            passing = [r for r in scores.index if scores[r] >= target]
            chosen = passing[0] if passing else HIGH_PRECISION
            judged = chosen if passing else scores.idxmax()
            part = df[(df.layer == layer) & (df.recipe == judged)]
            at = part.loc[part["score"].idxmin()]
            rows.append({"layer": layer, "recipe": chosen, "worst_db": float(scores[judged]),
                         "worst_operand": f"{at.gemm} {at.operand}" + ("" if passing else f" (best: {judged})")})
        return pd.DataFrame(rows, columns=["layer", "recipe", "worst_db", "worst_operand"])

    def skip(self, recipe: str | None = None, target_db: float | None = None) -> list[str]:
        """Layers to keep in high precision: those where `recipe` misses target_db, or (recipe=None)
        where no inspected recipe reaches it. Pass it to fp8lab.nn.convert(model, recipe, skip=...)."""
        target = self.target_db if target_db is None else target_db
        worst = self.worst()
        if recipe is None:
            return [layer for layer in self.layers if not (worst.loc[layer] >= target).any()]
        name = get_recipe(recipe).name
        if name not in worst.columns:
            raise ValueError(f"recipe {name!r} was not inspected; inspected: {', '.join(self.recipes)}")
        return [layer for layer in self.layers if not worst.loc[layer, name] >= target]

    def best_recipe(self, target_db: float | None = None) -> str:
        """One recipe for the whole model: the one that keeps the fewest layers in high precision,
        the cheapest among those (convert takes one recipe and a skip list)."""
        return min(self._by_cost(), key=lambda r: len(self.skip(r, target_db)))

    # -- presentation ---------------------------------------------------------------------------------
    def heatmap(self, ax=None, target_db: float | None = None):
        """Layers x recipes, coloured by the worst operand's SQNR; each layer's recommendation boxed."""
        # matplotlib and seaborn load on the first heatmap, not at `import fp8lab` (which imports this module):
        # about 1.5-2 s of CPU that a script which never plots does not pay
        from fp8lab.figures.plots import readiness_heatmap

        target = self.target_db if target_db is None else target_db
        chosen = dict(self.recommendation(target)[["layer", "recipe"]].itertuples(index=False))
        return readiness_heatmap(self.worst(), target, chosen, ax=ax)

    def convert(self, model: nn.Module, recipe: str | None = None, **kw) -> nn.Module:
        """fp8lab.training.layers.convert(model, recipe, skip=self.skip(recipe)); recipe defaults to best_recipe()."""
        recipe = recipe or self.best_recipe()
        return convert(model, recipe, skip=self.skip(recipe), **kw)

    def export(self, target: str, recipe: str | None = None) -> str:
        """fp8lab.export(recipe, target, skip=...)'s text: this report's skip list spelled for that target."""
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}; valid targets: {', '.join(TARGETS)}")
        recipe = recipe or self.best_recipe()
        return export(recipe, target, skip=self.skip(recipe)).text

    def summary(self) -> str:
        rec = self.recommendation()
        n = len(self.layers)
        best = self.best_recipe()
        lines = [f"{n} linear layer(s) inspected with {', '.join(self.recipes)} in {self.seconds:.2f} s; "
                 f"target {self.target_db:g} dB (worst operand of fprop, dgrad and wgrad).",
                 f"one recipe for the whole model: {best}, keeping {len(self.skip(best))} layer(s) in high "
                 f"precision: {self.skip(best) or 'none'}"]
        counts = rec["recipe"].value_counts()
        lines.append("per layer, the cheapest passing recipe: " + ", ".join(f"{k} x{v}" for k, v in counts.items()))
        for d in self.not_covered.to_dict("records"):
            lines.append(f"not covered: {d['module'] or '(model)'} ({d['type']}): {d['reason']}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ReadinessReport\n{self.summary()}"

    def _repr_html_(self) -> str:
        return "<pre style='white-space:pre-wrap'>" + html.escape(self.summary()) + "</pre>"


def inspect(
    model: nn.Module,
    batch: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    recipes: str | Recipe | Iterable[str | Recipe] = DEFAULT_RECIPES,
    target_db: float = 20.0,
    outlier_ratio: float = 10.0,
    cost_order: Sequence[str] = COST_ORDER,
    mode: str | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
    max_capture_mb: float | None = MAX_CAPTURE_MB,
) -> ReadinessReport:
    """An FP8 readiness report for `model` on `batch`: every linear GEMM's operands, each recipe.

    One high-precision forward and backward (fp8lab.training.capture) keeps every site's x[M, K], w[N, K]
    and dy[M, N] (the sites fp8lab.nn.convert converts: linear layers and MultiheadAttention's
    in-projections); each recipe quantizes them as FP8Linear would (fp8lab.nn.layer_gemms):
    fprop x, w along K; dgrad dy, w^T along N; wgrad dy^T, x^T along M.
    recipes: a recipe name or a Recipe, or a list of them (delayed equals tensorwise on one batch: it is
        left out by default).
    target_db: a layer passes a recipe when its worst operand SQNR (the lower of whole-tensor and
        ordinary-channel SQNR) is >= target_db. 20 dB: noise power 1% of the signal (E4M3 on
        well-scaled data gives ~31 dB, E5M2 ~25 dB, NVFP4's E2M1 less).
    outlier_ratio: a column (channel) is an outlier when its amax exceeds this times the median column's.
    cost_order: recipe names, cheapest first (COST_ORDER: NVFP4, then per-tensor, per-row, blocks).
    mode: "train" / "eval" for the captured pass (None: as the model is). device: where the
        quantization statistics are computed (None: where the model ran).
    progress: a progress bar over the linear calls (fp8lab.progress: shown after a few seconds).
    max_capture_mb: the float32 copies of x and dy one pass may keep; beyond it the sites are captured
        over several passes (the same forward each time), so memory stays bounded on a large model or
        batch (None: one pass, no bound).
    The model is not changed (see capture); a converted model is refused (inspect the original, or
    fp8lab.nn.unwrap(model)), and so is a pass whose loss or captured tensors are not finite (a NaN
    loss would make every gradient NaN and blame FP8 for it) and a call under torch.inference_mode()
    (which allows no backward pass). Returns a ReadinessReport.
    """
    import pandas as pd

    t0 = time.perf_counter()
    if isinstance(recipes, str | Recipe):  # one recipe, not its letters
        recipes = (recipes,)
    try:
        recipes = tuple(get_recipe(r) for r in recipes)
    except TypeError:
        raise TypeError(f"recipes takes a recipe name, a Recipe, or a list of them (e.g. fp8lab.RECIPES), got "
                        f"{type(recipes).__name__}") from None
    if not recipes:
        raise ValueError("recipes is empty: name at least one (e.g. fp8lab.RECIPES)")
    names = [r.name for r in recipes]
    if len(set(names)) != len(names):
        raise ValueError(f"each recipe once, please: got {names}")
    if outlier_ratio <= 1:
        raise ValueError(f"outlier_ratio must be > 1 (a multiple of the median channel's amax), got {outlier_ratio}")
    dev = torch.device(device) if device is not None else None
    rows: list[dict] = []
    for cap in captures(model, batch, loss_fn, mode, max_capture_mb):  # (one pass unless the operands pass the bound)
        calls = progress_bar(cap.calls, desc=f"inspect: {len(cap.calls)} linear calls", unit="call") if progress \
            else cap.calls
        for call in calls:
            rows += _rows_for_call(call, recipes, outlier_ratio, dev)
            call.x = call.grad_output = None  # (freed as it goes: the capture holds only the calls still to do)
    if not rows:
        raise ValueError("no linear GEMM reached the loss: nothing to inspect. "
                         + "; ".join(f"{d['module']}: {d['reason']}" for d in cap.not_covered))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    not_covered = pd.DataFrame(cap.not_covered, columns=["module", "type", "reason"])
    return ReadinessReport(frame, float(target_db), tuple(names), tuple(cost_order), not_covered, cap.notes, cap.loss,
                           time.perf_counter() - t0)
