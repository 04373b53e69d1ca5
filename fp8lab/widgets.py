"""ipywidgets panels: controls wired to fp8lab's functions and plots. No maths here.

Public: one Panel per notebook figure (TimingPanel, BitsPanel, NumberLinePanel,
PerTensorPanel, DelayedPanel, BlockPanel, BlockSweepPanel, GemmPanel, AccumulationPanel,
TrainingPanel, DistributedPanel, ExportPanel, CostPanel), PANELS, bench_widgets.
A panel exposes `controls` (name -> widget), `update(**values)` (set controls, recompute,
redraw; returns the data it plotted, so tests can drive it without a browser) and
`widget` (what the notebook shows). Plots are PNGs in an ipywidgets.Image, rendered
without pyplot, so a background thread (notebook 06's live training) can redraw them.
"""

from __future__ import annotations

import html
import math
import threading
import time
from collections.abc import Callable

import ipywidgets as W
import pandas as pd
import torch

from fp8lab import plots
from fp8lab.data import DISTRIBUTIONS, activation_stream, sample
from fp8lab.formats import FORMATS, get_format
from fp8lab.gemm import AccumulatorModel, accumulation_error, matmul, quantize_operands, resolve_backend
from fp8lab.metrics import quantization_report, row_overflow, row_sqnr, sqnr
from fp8lab.quantize import quantize
from fp8lab.recipes import RECIPES
from fp8lab.scaling import AmaxHistory, PerRow, PerTensor, parse_granularity
from fp8lab.settings import SMOKE, size
from fp8lab.timing import timed

__all__ = [
    "PANELS",
    "AccumulationPanel",
    "BitsPanel",
    "BlockPanel",
    "BlockSweepPanel",
    "CostPanel",
    "DelayedPanel",
    "DistributedPanel",
    "ExportPanel",
    "GemmPanel",
    "NumberLinePanel",
    "Panel",
    "PerTensorPanel",
    "TimingPanel",
    "TrainingPanel",
    "bench_widgets",
]

OUTLIERS = (0.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6)
BLOCKS = ("1x16", "1x32", "1x64", "1x128", "32x32", "128x128", "per-row", "per-tensor")
ELEMENT_FORMATS = ("e4m3", "e5m2", "e2m1")
RULES = ("exact", "rceil", "floor")
SCALE_FORMATS = ("fp32", "e8m0", "e4m3")


def _metrics_html(rows: dict[str, str]) -> str:
    cells = "".join(f"<tr><td style='padding-right:12px'>{html.escape(k)}</td><td><b>{html.escape(v)}</b></td></tr>"
                    for k, v in rows.items())
    return f"<table style='font-size:13px'>{cells}</table>"


def _pct(v: float) -> str:
    return f"{100 * v:.3g}%"


class Panel:
    """Controls, a figure and a text area; `update(**values)` recomputes and redraws."""

    title = ""
    width, height, ncols = 6.0, 3.2, 1

    def __init__(self, **controls: W.Widget) -> None:
        self.controls: dict[str, W.Widget] = controls
        self.image = W.Image(format="png", layout=W.Layout(max_width="100%"))
        self.text = W.HTML()
        self.data: dict = {}
        self._busy = False
        self._figure = None  # (figure, axes), reused: creating axes costs more than clearing them
        self._lock = threading.RLock()  # a background thread (live training) may redraw too
        self._thread: threading.Thread | None = None
        for ctl in controls.values():
            if hasattr(ctl, "value"):
                ctl.observe(self._on_change, names="value")
            ctl.style.description_width = "initial"
        boxes = [W.HBox(list(controls.values())[i : i + 3]) for i in range(0, len(controls), 3)]
        self.widget = W.VBox([W.HTML(f"<b>{html.escape(self.title)}</b>"), *boxes, self.image, self.text])

    # -- the public surface ----------------------------------------------------------------
    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items() if hasattr(c, "value")}

    def update(self, **values) -> dict:
        """Set these controls (names as in `controls`), recompute, redraw; return the data."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(
                f"{type(self).__name__} has no control {sorted(unknown)}; controls: {sorted(self.controls)}"
            )
        self._busy = True
        try:
            for k, v in values.items():
                self.controls[k].value = v
        finally:
            self._busy = False
        return self.refresh()

    def _axes(self):
        if self._figure is None:
            fig, axes = plots.figure(self.ncols, 1, self.width, self.height, pyplot=False)
            own = axes if isinstance(axes, list) else [axes]
            self._figure = (fig, axes, [ax.get_position() for ax in own])
        fig, axes, boxes = self._figure
        own = axes if isinstance(axes, list) else [axes]
        for ax in list(fig.axes):
            if not any(ax is a for a in own):
                fig.delaxes(ax)  # colorbars and twin axes of the last drawing
        for ax, box in zip(own, boxes, strict=True):
            ax.clear()
            ax.set_position(box)  # a colorbar had taken part of it
        return fig, axes

    def refresh(self) -> dict:
        with self._lock:
            return self._refresh()

    def _refresh(self) -> dict:
        try:
            self.data = self.compute(**self.values())
            fig, axes = self._axes()
            self.draw(self.data, axes)
            self.image.value = plots.to_png(fig, keep=True)
            self.text.value = self.describe(self.data)
        except ValueError as err:  # bad combinations are explained, never raised into the notebook
            self.data = {"error": str(err)}
            self.text.value = f"<span style='color:#d55e00'><b>Not possible:</b> {html.escape(str(err))}</span>"
        return self.data

    def _launch(self, work: Callable[[], None], blocking: bool):
        """Run `work` now (blocking), or in a background thread so that the kernel keeps
        answering widget messages (Stop, redraws) meanwhile; one run at a time."""
        if self._thread is not None and self._thread.is_alive():
            return None
        if blocking:
            work()
            return None
        self._thread = threading.Thread(target=work, daemon=True)
        self._thread.start()
        return self._thread

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if not self.data:
            self.refresh()
        display(self.widget)

    # -- what subclasses fill in ------------------------------------------------------------
    def compute(self, **values) -> dict:
        raise NotImplementedError

    def draw(self, data: dict, axes) -> None:
        raise NotImplementedError

    def describe(self, data: dict) -> str:
        return ""

    def _on_change(self, change) -> None:
        if not self._busy:
            self.refresh()


def _select(options, value, description: str) -> W.Dropdown:
    return W.Dropdown(options=list(options), value=value, description=description)


def _slider(options, value, description: str) -> W.SelectionSlider:
    return W.SelectionSlider(options=list(options), value=value, description=description, continuous_update=False)


def _outlier_options():
    return [(("none" if v == 0 else f"{v:g}x"), v) for v in OUTLIERS]


# ---- 00 setup check ---------------------------------------------------------------------------


class TimingPanel(Panel):
    """fp32 and bf16 matmul beside the FP8 GEMM of a recipe, real or emulated, on this machine."""

    title = "GEMM timing on this machine"

    def __init__(self) -> None:
        sizes = [64, 128, 256] if SMOKE else [128, 256, 512]
        super().__init__(
            n=_slider(sizes, sizes[1], "matrix size n (n x n x n)"),
            recipe=_select(RECIPES, "tensorwise", "recipe"),
        )

    def compute(self, n: int, recipe: str) -> dict:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        a_q, b_q = quantize_operands(a, b, recipe)
        ab, bb = a.bfloat16(), b.bfloat16()
        choice = resolve_backend(recipe)
        candidates = {
            "fp32 matmul": lambda: a @ b,
            "bf16 matmul": lambda: ab @ bb,
            f"FP8 {recipe} ({choice.backend})": lambda: matmul(a_q, b_q, recipe, verbose=False),
        }
        times = {name: sorted(timed(fn, 3))[1] * 1e3 for name, fn in candidates.items()}
        return {"times_ms": times, "reason": choice.reason, "n": n}

    def draw(self, data, ax) -> None:
        plots.bars(data["times_ms"], ax, ylabel="milliseconds (median of 3)", title=f"{data['n']}^3 GEMM")

    def describe(self, data) -> str:
        return _metrics_html({"FP8 backend": data["reason"]})


# ---- 01 formats -----------------------------------------------------------------------------------


class BitsPanel(Panel):
    """Click the bits of a code and see its value; type a value and see its code."""

    title = "bits -> value (click a bit) and value -> bits (type a number)"
    height = 1.8

    def __init__(self, fmt: str = "e4m3") -> None:
        self.bits = [W.ToggleButton(value=False, description="0", layout=W.Layout(width="34px")) for _ in range(8)]
        super().__init__(
            fmt=_select(("e4m3", "e5m2", "e2m1", "e8m0"), fmt, "format"),
            code=W.BoundedIntText(value=0x38, min=0, max=255, description="code (0-255)"),
            value=W.FloatText(value=1.0, description="type a value"),
        )
        for i, b in enumerate(self.bits):
            b.observe(lambda change, i=i: self._on_bit(i, change), names="value")
        self.bit_row = W.HBox(self.bits)
        self.widget.children = (self.widget.children[0], self.widget.children[1], self.bit_row,
                                *self.widget.children[2:])
        self._sync = False

    def _on_bit(self, i: int, change) -> None:
        if self._sync:
            return
        fmt = get_format(self.controls["fmt"].value)
        code = sum(1 << (fmt.bits - 1 - j) for j, b in enumerate(self.bits[: fmt.bits]) if b.value)
        self.update(code=code)

    def update(self, **values) -> dict:
        if "value" in values and "code" not in values:  # a typed value selects its rounded code
            fmt = get_format(values.get("fmt", self.controls["fmt"].value))
            try:
                values["code"] = fmt.encode(values["value"])
            except ValueError:  # e.g. a NaN typed into a format without NaN
                pass
        return super().update(**values)

    def _on_change(self, change) -> None:
        if self._busy:
            return
        if change["owner"] is self.controls["value"]:
            self.update(value=change["new"])
        else:
            self.refresh()

    def compute(self, fmt: str, code: int, value: float) -> dict:
        f = get_format(fmt)
        code = code % (2**f.bits)
        fields = f.fields(code)
        v = f.decode(code)
        m, e, bias = f.mantissa_bits, fields["exponent"], f.bias
        if math.isnan(v) or math.isinf(v):
            formula = "special code"
        elif e == 0 and f.has_subnormals:
            formula = f"(-1)^{fields['sign']} x 2^(1-{bias}) x {fields['mantissa']}/{2**m}   (subnormal)"
        else:
            formula = f"(-1)^{fields['sign']} x 2^({e}-{bias}) x (1 + {fields['mantissa']}/{2**m})"
        return {"fmt": f.name, "code": code, "bits": format(code, f"0{f.bits}b"), "fields": fields, "value": v,
                "formula": formula, "typed": value}

    def refresh(self) -> dict:
        data = super().refresh()
        if "bits" in data:  # show the code on the toggles (and only the format's bits)
            self._sync = True
            try:
                n = len(data["bits"])
                for j, b in enumerate(self.bits):
                    b.layout.display = None if j < n else "none"
                    if j < n:
                        b.value = data["bits"][j] == "1"
                        b.description = data["bits"][j]
            finally:
                self._sync = False
            if self.controls["code"].value != data["code"]:
                self._busy = True
                self.controls["code"].value = data["code"]
                self._busy = False
        return data

    def draw(self, data, ax) -> None:
        f = get_format(data["fmt"])
        v = data["value"]
        lo = math.floor(math.log2(f.min_subnormal)) - 1
        hi = math.ceil(math.log2(f.max_value)) + 1
        plots.number_line([f], ax, lo=lo, hi=hi, mark=abs(v) if math.isfinite(v) and v != 0 else None)

    def describe(self, data) -> str:
        f = get_format(data["fmt"])
        b = data["bits"]
        s = 1 if f.signed else 0
        colored = (f"<span style='color:#d55e00'>{b[:s]}</span>" if s else "") + \
            f"<span style='color:#0072b2'>{b[s:s + f.exponent_bits]}</span>" + \
            f"<span style='color:#009e73'>{b[s + f.exponent_bits:]}</span>"
        return _metrics_html({"bits (sign | exponent | mantissa)": b, "value": f"{data['value']:g}",
                              "formula": data["formula"], "code": f"{data['code']} (0x{data['code']:02X})"}) + \
            f"<div style='font-family:monospace;font-size:18px'>{colored}</div>"


class NumberLinePanel(Panel):
    """Where each format's values sit: dense near 1, sparse at the ends, and how far they reach."""

    title = "number lines: E4M3 vs E5M2 vs bf16 (and FP4, fp16)"
    height = 2.6

    def __init__(self) -> None:
        super().__init__(
            formats=W.SelectMultiple(options=["e4m3", "e5m2", "e2m1", "bf16", "fp16"], value=["e4m3", "e5m2", "bf16"],
                                     description="formats", rows=5),
            window=W.IntRangeSlider(value=(-17, 17), min=-30, max=30, description="log2 range",
                                    continuous_update=False),
        )

    def compute(self, formats, window) -> dict:
        if not formats:
            raise ValueError("pick at least one format")
        rows = {f: {"max": FORMATS[f].max_value, "min subnormal": FORMATS[f].min_subnormal,
                    "binades": FORMATS[f].dynamic_range_binades,
                    "values in range": int(((FORMATS[f].values() > 0) & (FORMATS[f].values() >= 2.0 ** window[0])
                                            & (FORMATS[f].values() <= 2.0 ** window[1])).sum())}
                for f in formats}
        return {"formats": list(formats), "window": window, "rows": rows}

    def draw(self, data, ax) -> None:
        plots.number_line(data["formats"], ax, lo=data["window"][0], hi=data["window"][1])

    def describe(self, data) -> str:
        return _metrics_html({f: f"max {r['max']:g}, smallest {r['min subnormal']:g}, {r['binades']:.1f} binades"
                              for f, r in data["rows"].items()})


# ---- 02 per-tensor scaling -------------------------------------------------------------------------


class PerTensorPanel(Panel):
    """One scale for the whole tensor: the histogram of |x| against the format's window."""

    title = "per-tensor scaling: what lands in the window, what clips, what flushes"

    def __init__(self) -> None:
        super().__init__(
            distribution=_select(DISTRIBUTIONS, "normal", "distribution"),
            outliers=_slider(_outlier_options(), 0.0, "outlier channels"),
            fmt=_select(ELEMENT_FORMATS, "e4m3", "format"),
            rule=_select(RULES, "exact", "scale rule"),
            margin=W.IntSlider(value=0, min=0, max=6, description="margin (powers of 2)", continuous_update=False),
            normalize=W.Checkbox(value=False, description="normalize each channel first"),
        )
        self.shape = (size(128, 64), size(1024, 256))

    def compute(self, distribution, outliers, fmt, rule, margin, normalize) -> dict:
        x = sample(distribution, self.shape, outliers, normalize=normalize)
        q = quantize(x, fmt, PerTensor(), rule, margin)
        return {"x": x, "q": q, "report": quantization_report(x, q)}

    def draw(self, data, ax) -> None:
        plots.histogram_log2(data["x"], data["q"], ax=ax)

    def describe(self, data) -> str:
        r = data["report"]
        return _metrics_html({"amax": f"{r['amax']:.4g}", "scale": f"{float(data['q'].scale):.4g}",
                              "SQNR": f"{r['sqnr_db']:.1f} dB", "overflow (clipped)": _pct(r["overflow"]),
                              "underflow (flushed to 0)": _pct(r["underflow"]), "subnormal": _pct(r["subnormal"])})


# ---- 03 delayed scaling -------------------------------------------------------------------------------


class DelayedPanel(Panel):
    """Delayed scaling over a stream of activations with a spike: the history's lag."""

    title = "delayed vs current scaling over training steps"
    ncols, width = 2, 4.0

    def __init__(self) -> None:
        super().__init__(
            history=_slider([1, 2, 4, 8, 16, 32, 64], 16, "history length"),
            algo=_select(AmaxHistory.ALGOS, "max", "amax algo"),
            spike=_slider([1, 2, 5, 20, 100, 1000], 20, "spike (x)"),
            drift=_slider([0.0, 0.02, 0.05, 0.1], 0.0, "drift per step"),
            fmt=_select(("e4m3", "e5m2"), "e4m3", "format"),
            margin=W.IntSlider(value=0, min=0, max=4, description="margin", continuous_update=False),
        )
        self.steps = 80  # longer than the longest history after the spike, so every length shows

    def compute(self, history, algo, spike, drift, fmt, margin) -> dict:
        # every step as one row: per-row scaling of the stack is per-tensor scaling of each step
        steps = torch.stack(activation_stream(self.steps, (16, 128), spike_step=self.steps // 4, spike=spike,
                                              drift=drift)).reshape(self.steps, -1)  # (steps, 32 * 128)
        current = quantize(steps, fmt, PerRow(), "exact", margin)  # each step's own amax
        amax = current.amax.flatten()
        used = torch.tensor(AmaxHistory(history, algo).replay(amax.tolist()))
        delayed = quantize(steps, fmt, PerRow(), "exact", margin, amax=used[:, None])
        rows = {"step": range(self.steps), "amax": amax.tolist(), "scale amax (delayed)": used.tolist(),
                "overflow (delayed)": row_overflow(steps, delayed).tolist(),
                "sqnr delayed": row_sqnr(steps, delayed).tolist(), "sqnr current": row_sqnr(steps, current).tolist()}
        return {"df": pd.DataFrame(rows)}

    def draw(self, data, axes) -> None:
        df = data["df"]
        plots.amax_over_steps(df[["step", "amax", "scale amax (delayed)", "overflow (delayed)"]], axes[0])
        axes[1].plot(df["step"], df["sqnr current"], color=plots.PALETTE[0])
        axes[1].plot(df["step"], df["sqnr delayed"], color=plots.PALETTE[1])
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("SQNR (dB)")
        axes[1].set_title("SQNR: current (blue), delayed (orange)")

    def describe(self, data) -> str:
        df = data["df"]
        bad = df[df["overflow (delayed)"] > 0]
        low = df[df["sqnr delayed"] < df["sqnr current"] - 3]
        return _metrics_html({"steps that clipped": str(len(bad)),
                              "steps > 3 dB worse than current scaling": str(len(low)),
                              "worst SQNR (delayed)": f"{df['sqnr delayed'].min():.1f} dB"})


# ---- 04 per-block scaling ---------------------------------------------------------------------------------


class BlockPanel(Panel):
    """One block size at a time: where the scales are and where the error is."""

    title = "per-block scaling: scales and error per block"
    ncols, width, height = 2, 4.0, 3.2

    def __init__(self) -> None:
        super().__init__(
            block=_slider(BLOCKS, "1x128", "block"),
            fmt=_select(ELEMENT_FORMATS, "e4m3", "format"),
            scale_fmt=_select(SCALE_FORMATS, "fp32", "scale format"),
            rule=_select(RULES, "exact", "scale rule"),
            distribution=_select(DISTRIBUTIONS, "normal", "distribution"),
            outliers=_slider(_outlier_options(), 1e5, "outlier channels"),
        )
        self.shape = (size(128, 64), size(1024, 256))

    def compute(self, block, fmt, scale_fmt, rule, distribution, outliers) -> dict:
        x = sample(distribution, self.shape, outliers)
        sf = None if scale_fmt == "fp32" else scale_fmt
        q = quantize(x, fmt, parse_granularity(block), rule, scale_fmt=sf, two_level=sf == "e4m3")
        return {"x": x, "q": q, "report": quantization_report(x, q)}

    def draw(self, data, axes) -> None:
        plots.scale_heatmap(data["q"], axes[0])
        plots.block_error_heatmap(data["x"], data["q"], axes[1])

    def describe(self, data) -> str:
        r = data["report"]
        return _metrics_html({"SQNR": f"{r['sqnr_db']:.1f} dB", "underflow": _pct(r["underflow"]),
                              "overflow": _pct(r["overflow"]), "scale overhead": f"{r['scale_bits_per_element']:.3g} "
                              "bits / element", "scales": str(tuple(data["q"].scale.shape))})


class BlockSweepPanel(Panel):
    """SQNR against block size for each scale strategy, with the scales' memory cost."""

    title = "SQNR vs block size (higher is better), with the scales' memory under each block"
    width, height = 7.0, 3.4

    def __init__(self) -> None:
        super().__init__(
            fmt=_select(ELEMENT_FORMATS, "e4m3", "format"),
            distribution=_select(DISTRIBUTIONS, "normal", "distribution"),
            outliers=_slider(_outlier_options(), 1e5, "outlier channels"),
            measure=_select(("ordinary channels", "all values"), "ordinary channels", "SQNR of"),
            threshold=W.IntSlider(value=20, min=5, max=45, description="target SQNR (dB)", continuous_update=False),
        )
        self.shape = (size(16, 16), size(1024, 256))

    def compute(self, fmt, distribution, outliers, measure, threshold) -> dict:
        # "ordinary channels": the SQNR of every channel but the outliers. Over all values the
        # outliers' energy dominates and hides what happens to everything else.
        x, idx = sample(distribution, self.shape, outliers, return_outliers=True)
        keep = torch.ones(x.shape[1], dtype=torch.bool)
        if measure == "ordinary channels":
            keep[idx] = False
        strategies = {"fp32 scales, exact": ("exact", None), "E8M0 scales, rceil": ("rceil", "e8m0"),
                      "E8M0 scales, floor (OCP)": ("floor", "e8m0")}
        rows = []
        for name, (rule, sf) in strategies.items():
            for block in BLOCKS:
                q = quantize(x, fmt, parse_granularity(block), rule, scale_fmt=sf)
                rows.append({"strategy": name, "block": block, "sqnr_db": sqnr(x[:, keep], q.dequantize()[:, keep]),
                             "scale_bits_per_element": q.scale_bits_per_element})
        df = pd.DataFrame(rows)
        ok = df[(df.strategy == "fp32 scales, exact") & (df.sqnr_db >= threshold)]
        best = ok.sort_values("scale_bits_per_element").iloc[0]["block"] if len(ok) else None
        return {"df": df, "threshold": threshold, "cheapest": best}

    def draw(self, data, ax) -> None:
        plots.metric_vs_block(data["df"], ax=ax, threshold=data["threshold"])

    def describe(self, data) -> str:
        return _metrics_html({f"cheapest block with fp32 scales >= {data['threshold']} dB":
                              str(data["cheapest"] or "none reaches it")})


# ---- 05 GEMM -------------------------------------------------------------------------------------------------


class GemmPanel(Panel):
    """The error of an FP8 GEMM per recipe, against the fp32 product."""

    title = "FP8 GEMM error per recipe (relative to the fp32 product)"

    def __init__(self) -> None:
        super().__init__(
            k=_slider([64, 256, 1024, 4096], 1024, "K"),
            outliers=_slider(_outlier_options(), 0.0, "outlier channels in a"),
            distribution=_select(DISTRIBUTIONS, "normal", "distribution"),
        )
        self.m = size(128, 32)

    def compute(self, k, outliers, distribution) -> dict:
        a = sample(distribution, (self.m, k), outliers, seed=1)
        b = sample("normal", (k, 64), 0.0, seed=2)
        true = a.double() @ b.double()
        errs = {}
        for name in RECIPES:
            out = matmul(a, b, name, verbose=False).double()
            errs[name] = (torch.linalg.norm(out - true) / torch.linalg.norm(true)).item()
        return {"errors": errs, "backend": {n: resolve_backend(n).reason for n in RECIPES}}

    def draw(self, data, ax) -> None:
        errs = data["errors"]
        plots.bars(errs, ax, ylabel="relative error (log)", log=True, highlight=max(errs, key=errs.get),
                   title="error of each recipe's GEMM")

    def describe(self, data) -> str:
        return _metrics_html({n: f"{100 * e:.2f}%  ({data['backend'][n]})" for n, e in data["errors"].items()})


class AccumulationPanel(Panel):
    """Limited-precision accumulation (Hopper's ~14 bits) and DeepSeek-V3's promotion fix."""

    title = "accumulation precision: error vs K"

    def __init__(self) -> None:
        super().__init__(
            bits=W.IntSlider(value=14, min=8, max=24, description="accumulator bits", continuous_update=False),
            promote=_slider([("never", 0), ("32", 32), ("64", 64), ("128", 128), ("256", 256), ("512", 512)], 128,
                            "promote to fp32 every"),
            distribution=_select(("uniform", "normal"), "uniform", "inputs"),
        )
        self.ks = [128, 256, 512, 1024] if SMOKE else [128, 256, 512, 1024, 2048, 4096]
        self._fp32: dict[str, list[float]] = {}

    def compute(self, bits, promote, distribution) -> dict:
        settings = {f"{bits}-bit, no promotion": AccumulatorModel(bits - 1, 32, None)}
        if promote:
            settings[f"{bits}-bit, promoted every {promote}"] = AccumulatorModel(bits - 1, 32, promote)
        if distribution not in self._fp32:  # the fp32 curve depends on nothing else: compute it once
            self._fp32[distribution] = [max(accumulation_error(k, None, distribution), 1e-9) for k in self.ks]
        rows = [{"accumulation": "fp32 accumulation", "K": k, "relative error": e}
                for k, e in zip(self.ks, self._fp32[distribution], strict=True)]
        rows += [{"accumulation": label, "K": k,
                  "relative error": max(accumulation_error(k, model, distribution), 1e-9)}
                 for label, model in settings.items() for k in self.ks]
        return {"df": pd.DataFrame(rows)}

    def draw(self, data, ax) -> None:
        plots.gemm_error_vs_k(data["df"], ax)

    def describe(self, data) -> str:
        df = data["df"]
        last = df[df.K == df.K.max()].set_index("accumulation")["relative error"]
        return _metrics_html({f"{k} at K={df.K.max()}": f"{100 * v:.3g}%" for k, v in last.items()})


# ---- 06 live training -------------------------------------------------------------------------------------


class TrainingPanel(Panel):
    """Recipes trained side by side, live: Start runs in a background thread, Stop ends it."""

    title = "live training: recipes side by side"
    ncols, width, height = 2, 4.6, 3.2

    def __init__(self, model: str = "mlp") -> None:
        from fp8lab.train import LESSON

        self.start = W.Button(description="Start", button_style="success", icon="play")
        self.stop = W.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.progress = W.IntProgress(value=0, min=0, max=1, description="steps")
        super().__init__(
            recipes=W.SelectMultiple(options=["fp32", "bf16", *RECIPES], value=["fp32", "tensorwise", "blockwise",
                                                                                "mxfp8"],
                                     description="recipes", rows=8),
            model=_select(("mlp", "transformer"), model, "model"),
            sinks=_slider(_outlier_options(), 0.0, "sink channels (outlier knob)"),
            steps=W.IntSlider(value=size(LESSON.steps, 20), min=10, max=400, step=10, description="steps",
                              continuous_update=False),
            metric=_select(("underflow", "overflow", "amax"), "underflow", "monitor"),
            layer_input=_select(("input", "weight", "grad_output"), "input", "monitored tensor"),
        )
        self.start.on_click(lambda _: self.run(blocking=False))
        self.stop.on_click(lambda _: self._stop_event.set())
        self.widget.children = (self.widget.children[0], *self.widget.children[1:3],
                                W.HBox([self.start, self.stop, self.progress]), *self.widget.children[3:])
        self._stop_event = threading.Event()
        self.result = None
        self.messages: list[str] = []

    # redraws use the last result; only Start trains
    def compute(self, recipes, model, sinks, steps, metric, layer_input) -> dict:
        if not recipes:
            raise ValueError("pick at least one recipe")
        hist = self.result.history if self.result is not None else pd.DataFrame(columns=["step", "run", "loss"])
        mon = self.result.monitor if self.result is not None else None
        return {"history": hist, "monitor": mon, "metric": metric, "role": layer_input,
                "selection": (tuple(recipes), model, sinks, steps)}

    def draw(self, data, axes) -> None:
        plots.loss_curves(data["history"], axes[0])
        plots.monitor_lines(data["monitor"], data["metric"], axes[1], role=data["role"],
                            gemm="dgrad" if data["role"] == "grad_output" else "fprop")

    def describe(self, data) -> str:
        rows = {}
        if self.result is not None and len(self.result.history):
            for run, v in self.result.final_loss().items():
                rows[f"final loss {run}"] = f"{v:.4g}" if math.isfinite(v) else "stopped (NaN/inf)"
            rows["seconds"] = f"{self.result.seconds:.1f}"
        for m in self.messages:
            rows[m] = ""
        return _metrics_html(rows) if rows else "Press Start to train."

    def run(self, blocking: bool = True):
        """Train with the current controls; blocking=False runs in a background thread so that
        the kernel keeps answering widget messages (Stop, the plots) while it trains."""
        if self._thread is not None and self._thread.is_alive():
            return None
        from fp8lab.train import train

        v = self.values()
        self._stop_event.clear()
        self.messages = []
        self.progress.max, self.progress.value = v["steps"], 0
        self.start.disabled, self.stop.disabled = True, False

        def callback(result, step):
            self.result = result
            self.progress.value = step + 1
            self.refresh()

        def work():
            try:
                self.result = train(tuple(v["recipes"]), model=v["model"], steps=v["steps"],
                                    sink_magnitude=v["sinks"], callback=callback, every=max(v["steps"] // 20, 2),
                                    monitor_every=2, progress=False, should_stop=self._stop_event.is_set)
                self.messages = self.result.messages
            except Exception as err:  # shown in the panel; the kernel survives
                self.messages = [f"training failed: {type(err).__name__}: {err}"]
            finally:
                self.start.disabled, self.stop.disabled = False, True
                self.progress.value = self.progress.max if self.result is None else int(
                    self.result.history["step"].max() + 1 if len(self.result.history) else 0)
                self.refresh()

        thread = self._launch(work, blocking)
        return self.result if blocking else thread


# ---- 07 export ------------------------------------------------------------------------------------------------


class ExportPanel(Panel):
    """The recipe picked in the lab, written for torchao, TransformerEngine or torchtitan."""

    title = "take your recipe to a real training job"
    height = 0.6

    def __init__(self) -> None:
        from fp8lab.export import TARGETS

        super().__init__(recipe=_select([*RECIPES, "rowwise_with_gw_hp"], "mxfp8", "recipe"),
                         target=_select(TARGETS, "torchao", "target"))

    def compute(self, recipe, target) -> dict:
        from fp8lab.export import export

        e = export(recipe, target)
        return {"recipe": e.recipe, "target": e.target, "available": e.available, "text": e.text,
                "differences": e.differences, "source": e.source}

    def draw(self, data, ax) -> None:
        ax.set_axis_off()
        ax.text(0.0, 0.5, f"{data['recipe']} -> {data['target']}: "
                          f"{'available' if data['available'] else 'not available'}", fontsize=11,
                color=plots.PALETTE[2] if data["available"] else plots.CLIP, va="center")

    def describe(self, data) -> str:
        diff = f"<p><b>Differs from fp8lab:</b> {html.escape(data['differences'])}</p>" if data["differences"] else ""
        return (f"<pre style='font-size:12px'>{html.escape(data['text'])}</pre>{diff}"
                f"<p style='font-size:11px'>source: {html.escape(data['source'])}</p>")


class DistributedPanel(Panel):
    """One recipe trained in this process and on 2 processes (FSDP2 under torchrun), side by side."""

    title = "one process vs two (FSDP2): the same loss curve?"
    ncols, width = 2, 4.6

    def __init__(self) -> None:
        self.run_button = W.Button(description="Run", button_style="success", icon="play")
        self.log = W.Textarea(value="", layout=W.Layout(width="100%", height="120px"), disabled=True)
        super().__init__(
            recipe=_select([*RECIPES, "fp32"], "tensorwise", "recipe"),
            engine=_select(("fp8lab", "torchao"), "fp8lab", "engine"),
            amax_all_reduce=W.Checkbox(value=False, description="all-reduce amax over ranks"),
            steps=W.IntSlider(value=size(12, 4), min=2, max=40, description="steps", continuous_update=False),
        )
        self.run_button.on_click(lambda _: self.run(blocking=False))
        self.widget.children = (*self.widget.children[:-2], W.HBox([self.run_button]), self.log,
                                *self.widget.children[-2:])
        self.result = None

    def compute(self, recipe, engine, amax_all_reduce, steps) -> dict:
        df = self.result if self.result is not None else pd.DataFrame(columns=["step", "single", "distributed",
                                                                                  "abs_diff"])
        return {"df": df, "selection": (recipe, engine, amax_all_reduce, steps)}

    def draw(self, data, axes) -> None:
        df = data["df"]
        long = df.melt(id_vars="step", value_vars=["single", "distributed"], var_name="run", value_name="loss")
        plots.loss_curves(long, axes[0], smooth=1, title="loss: 1 process vs 2")
        if len(df):
            axes[1].semilogy(df["step"], df["abs_diff"].clip(lower=1e-9), marker="o", color=plots.PALETTE[3])
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("|difference| (log)")
        axes[1].set_title("where the two runs part")

    def run(self, blocking: bool = True):
        """Train in this process and on 2 ranks; the workers' output streams into the log."""
        if self._thread is not None and self._thread.is_alive():
            return None
        from fp8lab.distributed import DistributedRunError, compare

        v = self.values()
        lines: list[str] = []

        def stream(line: str) -> None:
            lines.append(line.rstrip())
            self.log.value = "\n".join(lines[-200:])

        def work():
            self.run_button.disabled = True
            try:
                self.result = compare(v["recipe"], nproc=2, steps=v["steps"], engine=v["engine"],
                                      amax_all_reduce=v["amax_all_reduce"], stream=stream)
            except (DistributedRunError, ValueError) as err:
                stream(f"FAILED: {err}")
            finally:
                self.run_button.disabled = False
                self.refresh()

        thread = self._launch(work, blocking)
        return self.result if blocking else thread


PANELS: dict[str, Callable[[], Panel]] = {
    "timing": TimingPanel, "bits": BitsPanel, "number_line": NumberLinePanel, "per_tensor": PerTensorPanel,
    "delayed": DelayedPanel, "block": BlockPanel, "block_sweep": BlockSweepPanel, "gemm": GemmPanel,
    "accumulation": AccumulationPanel, "training": TrainingPanel, "distributed": DistributedPanel,
    "export": ExportPanel,
}


def sweep_values(panel: Panel) -> dict[str, list]:
    """Every value of every control (a few per numeric range), for tests and the benchmark."""
    out = {}
    for name, ctl in panel.controls.items():
        if isinstance(ctl, W.SelectMultiple):
            opts = list(ctl.options)
            out[name] = [tuple(opts[:1]), tuple(opts[:3]), tuple(ctl.value)]
        elif isinstance(ctl, W.IntRangeSlider):
            out[name] = [(ctl.min, ctl.max), (-10, 10), tuple(ctl.value)]
        elif hasattr(ctl, "options"):
            opts = [o[1] if isinstance(o, tuple) else o for o in ctl.options]
            out[name] = opts
        elif isinstance(ctl, W.Checkbox):
            out[name] = [not ctl.value, ctl.value]
        elif isinstance(ctl, W.IntSlider | W.BoundedIntText):
            lo, hi = ctl.min, ctl.max
            out[name] = sorted({lo, (lo + hi) // 2, hi, ctl.value})
        elif isinstance(ctl, W.FloatText):
            out[name] = [0.3, 1000.0, -2.5, ctl.value]
    return out


def bench_widgets(size: int | None = None, rounds: int | None = None) -> list[dict]:
    """Time from a control's new value to a finished redraw, per panel (Agg, PNG rendered)."""
    import statistics

    import fp8lab
    from fp8lab.bench import print_table

    fp8lab.setup(quiet=True)  # as the first cell of every notebook does
    rows = []
    for name, make in PANELS.items():
        panel = make()
        panel.refresh()
        times = []
        sweeps = sweep_values(panel)
        defaults = panel.values()
        for _ in range(rounds or 2):
            for control, values in sweeps.items():
                panel.update(**defaults)  # each control from the default state, as the tests sweep
                for value in values:
                    t0 = time.perf_counter()
                    panel.update(**{control: value})
                    times.append(time.perf_counter() - t0)
        times.sort()
        p95 = times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)]
        rows.append({"panel": name, "updates": len(times), "median ms": statistics.median(times) * 1e3,
                     "p95 ms": p95 * 1e3, "max ms": times[-1] * 1e3})
    print_table("widget update -> finished redraw (PNG, Agg), every value of every control", rows)
    return rows


# ---- 05 / 08 the cost side ------------------------------------------------------------------------------------


class CostPanel(Panel):
    """What each recipe costs (fp8lab.cost): scale storage, scale multiplies in the GEMM, the amax,
    this machine's measured times, and published GPU speed-ups with their sources."""

    title = "the cost side: is per-tensor cheaper, and where?"
    width, height, ncols = 4.0, 3.0, 3

    def __init__(self) -> None:
        super().__init__(
            k=_slider([256, 1024, 4096, 16384], 4096, "K (contraction length)"),
            ranks=_select([1, 8, 64], 1, "data-parallel ranks"),
        )
        self.tokens = 4096  # M: rows of x in the GEMM x[M, K] @ w[K, K]^T
        self.size = size(512, 128)
        self._measured = None  # timed once per panel: the controls change nothing that is timed

    def compute(self, k, ranks) -> dict:
        from fp8lab import cost

        if self._measured is None:
            self._measured = cost.measure(size=self.size, rounds=3)
        table = cost.cost_table(k=k, m=self.tokens, ranks=ranks)
        comparison = cost.per_tensor_vs_block(table, self._measured)
        return {"table": table, "measured": self._measured, "comparison": comparison,
                "answer": cost.answer(comparison), "k": k, "ranks": ranks}

    def draw(self, data, axes) -> None:
        table, measured = data["table"], data["measured"]
        bits = (table["element bits"] + table["scale bits/element (x)"]).to_dict()
        plots.bars(bits, axes[0], ylabel="bits per element of x", title="bits moved (element + scales)")
        plots.bars(table["scale multiplies per output"].astype(float).to_dict(), axes[1], log=True,
                   ylabel="multiplies per output element", title=f"scale multiplies, K={data['k']}")
        plots.bars(measured["quantize ms"].drop("fp32 (no FP8)").to_dict(), axes[2], ylabel="ms (median of 3)",
                   title=f"quantize {self.size}x{self.size} here")

    def describe(self, data) -> str:
        table = data["table"]
        rows = "".join(
            f"<tr><td><b>{html.escape(r)}</b></td><td>{html.escape(t['amax'])}</td>"
            f"<td>{html.escape(t['published GPU speed-up'])}</td></tr>" for r, t in table.iterrows())
        sources = sorted({s for v in table["sources"] for s in v.split("; ") if s})
        from fp8lab.cost import PUBLISHED_NOTE

        return (f"<table style='font-size:12px'><tr><th>recipe</th><th>how the amax is found</th>"
                f"<th>published GPU speed-up (over BF16)</th></tr>{rows}</table>"
                f"<p style='font-size:11px'>sources: {html.escape(' | '.join(sources))}. "
                f"{html.escape(PUBLISHED_NOTE)}</p><p><b>Is per-tensor cheaper?</b> {html.escape(data['answer'])}</p>")


PANELS["cost"] = CostPanel
