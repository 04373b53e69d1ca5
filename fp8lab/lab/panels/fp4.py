"""Notebook 09's panels on the 4-bit training recipe, one per part, and the training runs that weigh them.

Public: TwoDWeightPanel (2-D weight blocks: one set of codes for fprop and dgrad), HadamardPanel (a block before and
after the random Hadamard transform), RoundingPanel (stochastic rounding against round to nearest: the mean and one
step), HighPrecisionPanel (which layers stay in high precision, and what that costs), PartsPanel (final losses with
the parts switched on and off, shipped runs, one combination trained live). Wiring only: the numbers come from
fp8lab's numerics (nn.layer_gemms, numerics.hadamard, quantize), fp8lab.training.parts and measured_fp4.
"""

from __future__ import annotations

import html
import math
from dataclasses import replace

import ipywidgets as W
import numpy as np
import torch

from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.figures import fp4 as figs
from fp8lab.figures.plots import PALETTE, block_grid, heatmap
from fp8lab.gemm import emulated_mm
from fp8lab.lab import redraw
from fp8lab.lab.panels.base import Panel, dropdown, memo, metrics_html, percent, selection_slider
from fp8lab.lab.panels.weights import weight_copies
from fp8lab.numerics.formats import E2M1, cast
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import NVFP4_HADAMARD, SCALE_PRESETS, get_recipe, nvfp4_with
from fp8lab.training.capstone import make_case
from fp8lab.training.capture import capture
from fp8lab.training.cost import PUBLISHED
from fp8lab.training.layers import layer_gemms
from fp8lab.training.measured_fp4 import PARTS_ON, parts
from fp8lab.training.models import TeacherTask, make_model
from fp8lab.training.parts import flops_speedup, layer_costs, part_label, train_parts

__all__ = ["HadamardPanel", "HighPrecisionPanel", "PartsPanel", "RoundingPanel", "TwoDWeightPanel"]

NVFP4 = SCALE_PRESETS["nvfp4"].scaling("e2m1", "1x16")  # NVFP4: E2M1 elements, 1x16 blocks, E4M3 scales, two levels
OUTLIERS = (1.0, 3.0, 10.0, 30.0, 100.0, 1000.0)


def _lesson_weight(rows: int = 256, cols: int = 256) -> torch.Tensor:
    """A corner of the lesson MLP's fc2 weight at its initial values (fp8lab.training.models, seed 0)."""
    return make_model("mlp", 0).fc2.weight.detach()[:rows, :cols].clone()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-300))


def _snr_db(x: torch.Tensor, y: torch.Tensor) -> float:
    noise = float((x.double() - y.double()).square().sum())
    return math.inf if noise == 0 else 10 * math.log10(float(x.double().square().sum()) / noise)


# ---- 2-D weight blocks ---------------------------------------------------------------------------------------------


class TwoDWeightPanel(Panel):
    """A weight quantized as fprop reads it (w[N, K] along K) and as dgrad reads it (w^T[K, N] along N): with 1 x c
    blocks those are two sets of codes, with c x c blocks one. The map shows where the copies differ; the text what
    it does to dgrad's gradient (the chain rule differentiates the forward's weight, dgrad multiplies by the other)."""
    title = "2-D weight blocks: does dgrad multiply by the weight the forward used?"
    _drawn: tuple | None  # (image, points, diagonal) of the last drawing: what a drag moves
    ncols, width, height = 2, 4.2, 3.3
    keep_axes = True  # the map's colorbar kept

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.weight = _lesson_weight()
        # a gradient for dx = dy @ w
        self.dy = torch.randn(32, self.weight.shape[0], generator=g, **FLOAT32_CPU)
        spots = torch.randperm(self.weight.numel(), generator=g, device="cpu")[:8]  # where the outlier weights go
        self.spots = spots
        self._computed: dict[tuple, dict] = {}  # compute's result per (recipe, blocks, outliers): a drag back reuses it
        super().__init__(
            recipe=dropdown([("NVFP4 (E2M1, blocks of 16)", "nvfp4"), ("MXFP8 (E4M3, blocks of 32)", "mxfp8")],
                           "nvfp4", "format"),
            blocks=dropdown([("1 x c: fprop's copy and dgrad's copy", False), ("c x c (2-D): one copy", True)], False,
                           "weight blocks"),
            outliers=selection_slider([(f"{v:g}x" if v > 1 else "none", v) for v in OUTLIERS], 1.0, "8 weights grown"),
        )

    def compute(self, recipe, blocks, outliers) -> dict:
        key = (recipe, blocks, outliers)
        return dict(memo(self._computed, key, lambda: self._copies(recipe, blocks, outliers)))

    def _copies(self, recipe, blocks, outliers) -> dict:
        w = self.weight.clone()
        w.view(-1)[self.spots] *= outliers
        r = get_recipe(recipe).with_2d_weight(blocks)
        c = weight_copies(w, r)  # as FP8Linear builds them (notebook 06's panel computes the same)
        wf, wd = c["fprop"], c["dgrad"]  # (N, K) both: fprop's copy, dgrad's copy of w^T read back as w
        dx_chain = self.dy.double() @ wf.double()  # the gradient of the forward that ran
        dx_dgrad = self.dy.double() @ wd.double()  # what dgrad computes
        return {"wf": wf, "wd": wd, "w": w, "differ": c["share"], "copies": c["gap"], "dx": _rel(dx_dgrad, dx_chain),
                "err_f": c["fprop_error"], "err_d": c["dgrad_error"], "block": r.weight.granularity.label,
                "recipe": r.weight.fmt.name, "two_d": blocks}

    @staticmethod
    def _shown(data) -> dict:
        """What the plots show: the map's grid (the top-left 48 x 48 weights), its title, the first 4000 weights'
        two copies (a, b) and the scatter's limit."""
        diff = (data["wd"] - data["wf"]).abs() / data["w"].abs().max()
        n = 4000
        a, b = data["wf"].flatten()[:n].numpy(), data["wd"].flatten()[:n].numpy()
        return {"grid": block_grid(diff[:48, :48], 48), "title": f"dgrad's copy minus fprop's ({data['block']} blocks)",
                "a": a, "b": b, "lim": float(max(abs(a).max(), abs(b).max())) * 1.05}

    def draw(self, data, axes) -> None:
        shown = self._shown(data)
        heatmap(axes[0], shown["grid"], "magma_r", "|difference| / max |w|", vmin=0,
                 vmax=0.2, shape=(48, 48), colorbar=redraw.kept_colorbar(axes[0]))
        axes[0].set_xlabel("K (input channel)")
        axes[0].set_ylabel("N (output channel)")
        axes[0].set_title(shown["title"], fontsize=9)
        lim = shown["lim"]
        # (a colour of its own: kept axes keep their cycle)
        points = axes[1].scatter(shown["a"], shown["b"], s=3, alpha=0.4, color=PALETTE[0])
        diagonal, = axes[1].plot([-lim, lim], [-lim, lim], color="grey", lw=0.6, ls=":")
        axes[1].set_xlim(-lim, lim)
        axes[1].set_ylim(-lim, lim)
        axes[1].set_xlabel("weight as fprop reads it")
        axes[1].set_ylabel("weight as dgrad reads it")
        axes[1].set_title("each weight's two copies (off the diagonal: they differ)", fontsize=9)
        self._drawn = (axes[0].images[-1], points, diagonal)

    def draw_in_place(self, data) -> bool:
        """Other settings: the map's image and title, the points, the diagonal and the limits set again on the
        artists drawn (the map's colour range and everything else stay what draw makes)."""
        if self._drawn is None:
            return False
        image, points, diagonal = self._drawn
        shown = self._shown(data)
        axes = self._figure[1]
        image.set_data(shown["grid"])
        axes[0].set_title(shown["title"], fontsize=9)
        lim = shown["lim"]
        redraw.move_points(points, shown["a"], shown["b"])
        diagonal.set_data([-lim, lim], [-lim, lim])
        axes[1].set_xlim(-lim, lim)
        axes[1].set_ylim(-lim, lim)
        return True

    def describe(self, data) -> str:
        rows = {"weights whose two copies differ": percent(data["differ"]),
                "dgrad's copy against fprop's (relative)": f"{data['copies']:.3g}",
                "dgrad's dx against the chain rule's (dy @ fprop's copy)": f"{data['dx']:.3g}",
                "each copy's error against the weight": f"fprop {data['err_f']:.3g}, dgrad {data['err_d']:.3g}"}
        return metrics_html(rows)


# ---- the random Hadamard transform ---------------------------------------------------------------------------------

SOURCES = {
    "a Gaussian block with one outlier": "outlier",
    "heavy tails (Student-t, 2 degrees of freedom)": "heavy",
    "notebook 06's sinks: fc2's input along channels (fprop's blocks)": "sinks_fprop",
    "notebook 06's sinks: fc2's input along tokens (wgrad's blocks)": "sinks_wgrad",
}


def _fc2_input() -> torch.Tensor:
    """fc2's input x[M, K] in the lesson MLP without sinks, one batch, initial weights (GELU(fc1(x) + b1))."""
    model = make_model("mlp", 0)
    x, _ = TeacherTask(seed=0).batch(torch.Generator().manual_seed(1_000), 128)
    with torch.no_grad():
        return torch.nn.functional.gelu(model.fc1(x) + model.b1)


class HadamardPanel(Panel):
    """A tensor's blocks of 16 along the contraction, before and after the random Hadamard transform (d = 16), and
    what NVFP4 keeps of each: one block drawn, the whole tensor's SQNR and a GEMM's error in the text."""
    title = "the random Hadamard transform: a block before and after, in NVFP4"
    ncols, width, height = 2, 4.2, 3.2
    keep_axes = True

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.base = torch.randn(64, 256, generator=g, **FLOAT32_CPU)
        # Student-t with 2 degrees of freedom, from the generator: z / sqrt(chi2_2 / 2), chi2_2 = -2 log(u)
        self.heavy = torch.randn(64, 256, generator=g, **FLOAT32_CPU) / torch.sqrt(
            -torch.log1p(-torch.rand(64, 256, generator=g, **FLOAT32_CPU)))
        self.fc2_input = _fc2_input()  # (tokens, channels); the lesson's 4 sink channels are channels 0-3
        self.other = torch.randn(32, 256, generator=g, **FLOAT32_CPU)  # the GEMM's other operand
        super().__init__(
            source=dropdown(list(SOURCES.items()), "outlier", "tensor"),
            outlier=selection_slider([(f"{v:g}x", v) for v in OUTLIERS], 30.0, "outlier size"),
            block=selection_slider(list(range(8)), 0, "block shown"),
        )
        self._tensors: dict[tuple[str, float], dict] = {}  # _whole per (source, outlier): a block drag reuses it

    def _tensor(self, source: str, outlier: float) -> torch.Tensor:
        """The tensor, its contraction along its rows: blocks of 16 consecutive values of a row."""
        if source == "outlier":
            t = self.base.clone()
            t[:, ::16] *= 0  # one element per block ...
            t[:, ::16] += outlier  # ... becomes the outlier (in units of the others' typical size)
            return t
        if source == "heavy":
            return self.heavy
        x = self.fc2_input.clone()
        x[:, :4] = outlier  # the sink channels, at the slider's magnitude (notebook 06 sets them alike)
        return x[:64, :256] if source == "sinks_fprop" else x.t()[:64, :128].contiguous()

    def compute(self, source, outlier, block) -> dict:
        whole = memo(self._tensors, (source, outlier), lambda: self._whole(source, outlier))
        sl = slice(16 * block, 16 * block + 16)
        return {"before": whole["t"][0, sl], "kept_before": whole["q0"][0, sl], "after": whole["rotated"][0, sl],
                "kept_after": whole["q1"][0, sl], **whole["numbers"], "block": block, "source": source}

    def _whole(self, source: str, outlier: float) -> dict:
        """The tensor as it is ("t") and transformed ("rotated"), what NVFP4 keeps of each ("q0", "q1"), and the
        whole tensor's numbers ("numbers": SQNRs, flushed shares, a GEMM's errors)."""
        t = self._tensor(source, outlier)
        k = t.shape[1]
        rotated = NVFP4_HADAMARD.apply(t)
        q0 = quantize(t, NVFP4).dequantize()
        q1 = quantize(rotated, NVFP4).dequantize()
        back = NVFP4_HADAMARD.inverse(q1)[:, :k]
        b = self.other[:, :k]
        exact = t.double() @ b.double().t()
        gemm_plain = quantize(b, NVFP4).dequantize().double()
        gemm_rot = quantize(NVFP4_HADAMARD.apply(b), NVFP4).dequantize().double()
        ordinary = t.abs() < t.abs().amax(1, keepdim=True) / 8  # the values well below their row's largest
        return {"t": t, "rotated": rotated, "q0": q0, "q1": q1, "numbers": {
                "sqnr_plain": _snr_db(t, q0), "sqnr_rot": _snr_db(t, back),
                "ordinary_plain": _snr_db(t[ordinary], q0[ordinary]), "ordinary_rot": _snr_db(t[ordinary],
                                                                                              back[ordinary]),
                "flushed_plain": float(((t != 0) & (q0 == 0)).double().mean()),
                "flushed_rot": float(((rotated != 0) & (q1 == 0)).double().mean()),
                "gemm_plain": _rel(q0.double() @ gemm_plain.t(), exact),
                "gemm_rot": _rel(q1.double() @ gemm_rot.t(), exact)}}

    @staticmethod
    def _blocks(data) -> tuple[float, list[tuple]]:
        """The y limit both plots share, and each plot's (values, what NVFP4 keeps, title)."""
        top = 1.1 * max(float(data["before"].abs().max()), float(data["after"].abs().max()), 1e-30)
        return top, [(data["before"], data["kept_before"], f"block {data['block']}, as it is"),
                     (data["after"], data["kept_after"], f"block {data['block']}, transformed (d = 16)")]

    def draw(self, data, axes) -> None:
        top, blocks = self._blocks(data)
        for ax, (values, kept, title) in zip(axes, blocks, strict=True):
            figs.block_bars(values, kept, ax, title, top)
        self._drawn = [(list(ax.patches), *ax.collections) for ax in axes]  # bars, kept dots, flushed crosses

    def draw_in_place(self, data) -> bool:
        """Another block, outlier size or source: the same 16 bars and two sets of points, moved; the limits and
        titles set again (what block_bars draws for these values)."""
        drawn = self._drawn
        if drawn is None:
            return False
        top, blocks = self._blocks(data)
        for ax, (bars, kept, flushed), (values, kept_values, title) in zip(self._figure[1], drawn, blocks,
                                                                           strict=True):
            d = figs.block_bars_data(values, kept_values, top)
            if len(bars) != len(d["values"]):
                return False
            redraw.move_bars(bars, d["values"])
            redraw.move_points(kept, *d["kept"])
            redraw.move_points(flushed, *d["flushed"])
            ax.set_ylim(-d["top"], d["top"])
            ax.set_title(title, fontsize=9)
        return True

    def describe(self, data) -> str:
        rows = {"SQNR of the tensor, NVFP4": f"as it is {data['sqnr_plain']:.1f} dB, transformed "
                                               f"{data['sqnr_rot']:.1f} dB (measured back in the original values)",
                "SQNR of its ordinary values (under 1/8 of their row's largest)":
                    f"as it is {data['ordinary_plain']:.1f} dB, transformed {data['ordinary_rot']:.1f} dB",
                "elements whose NVFP4 code is 0 (nonzero before)": f"as it is {percent(data['flushed_plain'])}, "
                                                                   f"transformed {percent(data['flushed_rot'])}",
                "a GEMM over these blocks, relative error": f"as it is {data['gemm_plain']:.3g}, both operands "
                                                           f"transformed {data['gemm_rot']:.3g}"}
        return metrics_html(rows)


# ---- stochastic rounding -------------------------------------------------------------------------------------------

DRAWS = (1, 4, 16, 64, 256, 1024)  # the left plot's draws (a slider)
GEMM_DRAWS = (1, 2, 4, 8, 16, 32, 64)  # the weight gradient's: each a quantization of dy (the right plot)


class RoundingPanel(Panel):
    """Stochastic rounding against round to nearest, on E2M1: the rounded value's mean over n draws (left), and the
    lesson MLP's weight gradient (fc2's, one batch) in NVFP4, one draw against the mean of n (right)."""
    title = "stochastic rounding: no bias on average; per value, more noise in one step"
    _drawn: tuple | None  # (the mean's line, its legend entry): what a drag moves
    ncols, width, height = 2, 4.2, 3.2
    keep_axes = True

    def __init__(self) -> None:
        self.x = torch.linspace(0.0, 6.0, 241, **FLOAT32_CPU)
        self._gemm = None
        # every draw the slider can average, made once: row i is the i-th stochastic rounding of x; the mean of the
        # first n rows is what n draws give (a cumulative sum: a redraw divides one row of it)
        g = torch.Generator().manual_seed(0)
        draws = cast(self.x.repeat(DRAWS[-1], 1), E2M1, rounding="stochastic", generator=g)  # (draws, x)
        self._sums = draws.double().cumsum(0)
        super().__init__(draws=selection_slider(DRAWS, 16, "draws averaged"))

    def _wgrad(self) -> dict:
        """fc2's weight gradient dW = dy^T x of the lesson MLP at its initial weights (its first 64 output channels),
        in NVFP4 with dy rounded to nearest and stochastically (x to nearest; no Hadamard transform): the error of
        one draw and of the mean of n draws, for every n in GEMM_DRAWS (computed once)."""
        if self._gemm is None:

            model = make_model("mlp", 0)
            task = TeacherTask(seed=0)
            x, y = task.batch(torch.Generator().manual_seed(1_000), 128)
            keep = {}
            model.fc2.register_forward_hook(lambda m, i, o: keep.update(x=i[0].detach(), o=o))
            loss = task.loss(model(x), y)
            dy = torch.autograd.grad(loss, keep["o"])[0].detach()[:, :64]  # (M, 64)
            exact = dy.t().double() @ keep["x"].double()
            xq = quantize(keep["x"].t().contiguous(), NVFP4).dequantize().double()

            def dw(rounding: str, seed: int = 0):
                q = quantize(dy.t().contiguous(), replace(NVFP4, rounding=rounding),
                             generator=torch.Generator().manual_seed(seed))
                return q.dequantize().double() @ xq.t()

            nearest = dw("nearest")
            total, means = torch.zeros_like(exact), {}
            for i in range(GEMM_DRAWS[-1]):
                total += dw("stochastic", i)
                if i + 1 in GEMM_DRAWS:
                    means[i + 1] = _rel(total / (i + 1), exact)
            self._gemm = {"nearest": _rel(nearest, exact), "means": means, "positive": float((dy > 0).double().mean())}
        return self._gemm

    def compute(self, draws) -> dict:
        sr = (self._sums[draws - 1] / draws).float()  # the mean of the first `draws` stochastic roundings
        nearest = cast(self.x, E2M1)
        gemm = self._wgrad()
        bias_rtn = float((nearest - self.x).abs().mean())
        bias_sr = float((sr - self.x).abs().mean())
        return {"sr": sr, "nearest": nearest, "draws": draws, "gemm": gemm, "bias_rtn": bias_rtn,
                "bias_sr": bias_sr}

    def draw(self, data, axes) -> None:
        grid = [v for v in E2M1.values().tolist() if v >= 0]
        figs.rounding_means(self.x, data["nearest"], data["sr"], data["draws"], grid, axes[0])
        gemm = data["gemm"]
        ns = list(gemm["means"])
        figs.error_vs_draws(ns, [gemm["means"][n] for n in ns], gemm["nearest"], gemm["means"][1], axes[1])
        line = next(line for line in axes[0].lines if line.get_gid() == "stochastic")
        legend = axes[0].get_legend()
        entry = next(t for t in legend.get_texts() if t.get_text() == line.get_label())
        self._drawn = (line, entry)

    def draw_in_place(self, data) -> bool:
        """Another number of draws: the mean's line and its legend entry change, limits from the data again (the
        weight gradient's plot does not depend on it), as rounding_means draws them."""
        if self._drawn is None:
            return False
        line, entry = self._drawn
        label = figs.stochastic_label(data["draws"])
        line.set_ydata(data["sr"].double().numpy())
        line.set_label(label)
        entry.set_text(label)
        redraw.rescale(self._figure[1][0])
        return True

    def describe(self, data) -> str:
        gemm = data["gemm"]
        rows = {f"x from 0 to 6, mean |error| of the mean of {data['draws']} draws":
                f"round to nearest {data['bias_rtn']:.3f}, stochastic {data['bias_sr']:.3f}",
                "fc2's weight gradient, one step": f"round to nearest {gemm['nearest']:.3g}, stochastic "
                                                   f"{gemm['means'][1]:.3g} (relative error)",
                f"... averaged over {GEMM_DRAWS[-1]} draws": f"stochastic {gemm['means'][GEMM_DRAWS[-1]]:.3g}",
                "fc2's dy values that are positive": percent(gemm["positive"])}
        return metrics_html(rows)


# ---- the layers kept in high precision -----------------------------------------------------------------------------

SHARES = (0.0, 0.15, 0.3, 0.5)


def _wgrad_errors(model: str) -> dict[str, float]:
    """Each linear layer's weight-gradient GEMM in NVFP4 (1x16, no parts), relative error against the exact product,
    on one batch at the initial weights (the paper's sign of a layer to keep: a large wgrad error)."""
    if model == "mlp":

        net, task = make_model("mlp", 0), TeacherTask(seed=0)
        x, y = task.batch(torch.Generator().manual_seed(1_000), 128)
        loss = task.loss
    else:

        case = make_case("llm_like", 0)
        net, (x, y), loss = case.make_model(), case.batch(torch.Generator().manual_seed(0)), case.loss
    out = {}
    recipe = nvfp4_with([])
    for call in capture(net, x, lambda o: loss(o, y)).calls:
        pair = layer_gemms(call.x, call.weight.float(), call.grad_output, recipe)["wgrad"]
        exact = call.grad_output.double().t() @ call.x.double()
        out[call.layer] = _rel(emulated_mm(*pair).double(), exact)
    return out


class HighPrecisionPanel(Panel):
    """Which linear layers a share kept in high precision means (the last ones: fp8lab's choice for nvfp4_training),
    their weight-gradient error in NVFP4 and their share of the GEMM work, and the speed-up left (Amdahl, with
    NVFP4's published GEMM speed-up)."""
    title = "layers kept in high precision: which ones, and what they cost"
    _drawn: tuple | None  # (model, each plot's bars): what a drag recolours
    ncols, width, height = 2, 4.0, 3.4
    bottom = 1.2  # layer names under the bars, upright
    keep_axes = True

    def __init__(self) -> None:
        self._errors: dict[str, dict[str, float]] = {}
        self._costs: dict[tuple[str, float], object] = {}  # layer_costs per (model, share): it builds the model
        super().__init__(
            model=dropdown([("lesson MLP (notebook 06)", "mlp"), ("LLM-like transformer (notebook 08)", "llm_like")],
                          "llm_like", "model"),
            share=selection_slider([(f"{100 * s:g}%", s) for s in SHARES], 0.15, "share kept"),
        )

    def compute(self, model, share) -> dict:
        if not self._errors:  # both models and every share at the first draw (the cell's run): a change only draws
            self._errors = {name: _wgrad_errors(name) for name in ("mlp", "llm_like")}
            self._costs = {(name, s): self._layer_costs(name, s) for name in ("mlp", "llm_like") for s in SHARES}
        if (model, share) not in self._costs:
            self._costs[model, share] = self._layer_costs(model, share)
        df = self._costs[model, share].copy()
        speed = float(PUBLISHED["nvfp4"][0].value.rstrip("x"))
        high = float(df.loc[df["kept in high precision"], "share of flops"].sum())
        return {"df": df, "share": share, "high": high, "speedup": flops_speedup(high, speed),
                "all": speed, "kept": [n for n in df.index if df.loc[n, "kept in high precision"]], "model": model,
                "worst": df["error"].idxmax()}

    def _layer_costs(self, model: str, share: float):
        """fp8lab.training.parts.layer_costs for NVFP4 with `share` kept in high precision, with each layer's wgrad
        error (column "error")."""
        df = layer_costs(model, nvfp4_with([]).with_high_precision_layers(share))
        df["error"] = [self._errors[model].get(layer, math.nan) for layer in df.index]
        return df

    COLUMNS = ("error", "share of flops")  # each plot's column of the table

    def draw(self, data, axes) -> None:
        figs.layer_bars(data["df"], "error", axes[0], "wgrad relative error, NVFP4",
                        "weight-gradient error (kept: vermillion)")
        figs.layer_bars(data["df"], "share of flops", axes[1], "share of the GEMM work", "work per step",
                        percent=True)
        self._drawn = (data["model"], [list(ax.patches) for ax in axes])

    def draw_in_place(self, data) -> bool:
        """Another share, the same model: the same bars (checked), the kept layers' colour moved, as layer_bars
        colours them."""
        if self._drawn is None or self._drawn[0] != data["model"]:
            return False
        df, colors = data["df"], figs.layer_colors(data["df"])
        for bars, column in zip(self._drawn[1], self.COLUMNS, strict=True):
            heights = np.array([bar.get_height() for bar in bars], float)
            if not np.array_equal(heights, df[column].to_numpy(float), equal_nan=True):
                return False
        for bars in self._drawn[1]:
            for bar, color in zip(bars, colors, strict=True):
                bar.set_facecolor(color)
        return True

    def describe(self, data) -> str:
        p = PUBLISHED["nvfp4"][0]
        kept = ", ".join(data["kept"]) or "none"
        rows = {"kept in high precision": f"{kept} ({percent(data['high'])} of the GEMM work)",
                "largest wgrad error in NVFP4": f"{data['worst']} ({data['df']['error'].max():.3g})",
                "GEMM speed-up left over BF16": f"{data['speedup']:.2f}x of NVFP4's {data['all']:.2f}x "
                                                f"({p.hardware}, {html.escape(p.what)})"}
        return metrics_html(rows) + f"<p style='font-size:11px'>speed-up: {html.escape(p.source)}</p>"


# ---- the parts, trained --------------------------------------------------------------------------------------------

MEASURES = {"final training loss": "final loss", "held-out loss, as trained": "heldout as trained",
            "held-out loss, trained weights in high precision": "heldout high precision"}


class PartsPanel(Panel):
    """The lesson MLP's final loss with NVFP4 and the chosen parts of its training recipe, beside NVFP4 without
    them, MXFP8 and bf16 (shipped runs: mean of 3 seeds, the seeds' spread as error bars), relative to bf16; a
    button trains the chosen combination now (seed 0)."""
    title = "the 4-bit recipe, trained: switch its parts on and off"
    live_sliders = False  # (no slider: checkboxes and a dropdown redraw the shipped runs; the button trains)
    ncols, width, height = 1, 6.5, 3.4
    bottom = 0.8
    keep_axes = True

    def __init__(self) -> None:
        self.table = parts()
        self.train_button = W.Button(description="Train this combination (seed 0)", button_style="info",
                                     icon="play", layout=W.Layout(width="260px"))
        super().__init__(
            two_d=W.Checkbox(value=False, description="2-D weight blocks"),
            hadamard=W.Checkbox(value=False, description="Hadamard on wgrad"),
            stochastic=W.Checkbox(value=False, description="stochastic rounding of dy"),
            high=W.Checkbox(value=False, description="last 15% in high precision"),
            measure=dropdown(list(MEASURES.items()), "final loss", "measure"),
        )
        self.train_button.on_click(lambda _: self.train(blocking=False))
        self.widget.children = (*self.widget.children[:-2], W.HBox([self.train_button]), *self.widget.children[-2:])
        self.live: dict[str, float] = {}

    @staticmethod
    def parts_of(two_d, hadamard, stochastic, high) -> tuple[str, ...]:
        chosen = {"2d_weights": two_d, "hadamard": hadamard, "stochastic_rounding": stochastic, "high_precision": high}
        return tuple(p for p, on in chosen.items() if on)

    def compute(self, two_d, hadamard, stochastic, high, measure) -> dict:
        label = part_label(self.parts_of(two_d, hadamard, stochastic, high))
        t = self.table[self.table.model == "mlp"]
        by = t.pivot_table(index="seed", columns="run", values=measure)
        rel = by.div(by["bf16"], axis=0) - 1  # each seed against its own bf16 run
        runs = list(dict.fromkeys(["nvfp4 1x16", label, "nvfp4 2D+RHT+SR+HP", "mxfp8", "bf16"]))
        values = {r: float(rel[r].mean()) for r in runs}
        spread = {r: float(rel[r].max() - rel[r].min()) / 2 for r in runs}
        return {"label": label, "values": values, "spread": spread, "measure": measure, "mean": by[runs].mean(),
                "live": self.live.get((label, measure))}

    def draw(self, data, ax) -> None:
        name = next(k for k, v in MEASURES.items() if v == data["measure"])
        figs.parts_bars(data["values"], data["spread"], data["label"], 0.0, ax, ylabel=f"{name} vs bf16",
                        title="mean of 3 seeds (bars: the seeds' spread); dashed: bf16")

    def describe(self, data) -> str:
        rows = {r: f"{data['mean'][r]:.4f} ({100 * data['values'][r]:+.1f}% vs bf16)" for r in data["values"]}
        if data["live"] is not None:
            rows[f"{data['label']}, trained now (seed 0)"] = f"{data['live']:+.1%} vs bf16"
        return (metrics_html(rows) + f"<p style='font-size:11px'>shipped runs measured on "
                f"{html.escape(PARTS_ON)}</p>")

    def train(self, blocking: bool = True):
        """Train bf16 and the chosen combination from seed 0 (150 steps) and show the result beside the bars."""
        if self._thread is not None and self._thread.is_alive():
            return None

        v = self.values()
        chosen = self.parts_of(v["two_d"], v["hadamard"], v["stochastic"], v["high"])

        def work():
            self.train_button.disabled = True
            try:
                res = train_parts(["bf16", chosen])
                t = res.table
                for key in MEASURES.values():
                    self.live[(t.index[1], key)] = float(t.loc[t.index[1], key] / t.loc["bf16", key] - 1)
            finally:
                self.train_button.disabled = False
                self.refresh()

        thread = self._launch(work, blocking)
        return self.live if blocking else thread
