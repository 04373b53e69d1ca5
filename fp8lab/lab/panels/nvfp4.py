"""Notebook 04's NVFP4 panel: the E4M3 block scales NVFP4's blocks need, under its per-tensor scale, against E4M3's
range and the two floors engines put under it, per outlier magnitude (Nvfp4ScalesPanel).

Public: Nvfp4ScalesPanel, nvfp4_blocks_of (a tensor's blocks: the scales they need, the floor, what flushes),
nvfp4_blocks (the same for notebook 04's tensor),
nvfp4_collapse (those shares at every outlier magnitude). Wiring only: the numbers come from fp8lab's quantize.
NVFP4 (fp8lab.RECIPES["nvfp4"]): E2M1 values in 1x16 blocks, each with an E4M3 scale, under one float32 tensor
scale amax / (448 * 6). Below, the block scales stop where the engine says (scaling.SCALE_FLOORS): the training
engines (TransformerEngine, torchao's NVFP4 training path; fp8lab's recipes) clamp only the top, so a scale reaches
E4M3's subnormals and rounds to 0 below 2^-10; torchao's inference NVFP4Tensor clamps it at 2^-6.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import torch
from matplotlib.patches import StepPatch

from fp8lab.data.synthetic import sample
from fp8lab.figures import scales
from fp8lab.lab.panels.base import OUTLIERS, Panel, metrics_html, outlier_options, percent, selection_slider
from fp8lab.lab.panels.blocks import activation_shape
from fp8lab.numerics.formats import E2M1, E4M3
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import RECIPES

__all__ = ["Nvfp4ScalesPanel", "nvfp4_blocks", "nvfp4_blocks_of", "nvfp4_collapse"]

BLOCK = 16  # NVFP4's block: 16 consecutive values along K
SHARES = ("clean_flushed", "clean_flushed_min_normal", "at_floor", "below_subnormals", "tensor_scale")


def nvfp4_blocks(outliers: float, seed: int = 0, shape: tuple[int, int] | None = None) -> dict:
    """nvfp4_blocks_of notebook 04's tensor (normal, 4 outlier channels at `outliers` x; `shape`: another size)."""
    x, idx = sample("normal", shape or activation_shape(), outliers, seed=seed, return_outliers=True)
    return nvfp4_blocks_of(x, idx)


def nvfp4_blocks_of(x: torch.Tensor, outlier_channels: torch.Tensor | list[int]) -> dict:
    """x[M, K] (K a multiple of 16) quantized as NVFP4's activations are, under each floor. Per 1x16 block: "ideal"
    (block amax / 6 / tensor scale: the E4M3 scale the block needs, before E4M3 rounds it), "stored" (the E4M3
    scale the training engines give it: no lower clamp), "stored_min_normal" (torchao's inference floor, 2^-6),
    "clean" (the block holds no outlier channel). Shares over the clean blocks: "clean_flushed" (of their nonzero
    values, flushed to 0 under the training engines' floor), "clean_flushed_min_normal" (the same under torchao's
    inference floor), "at_floor" (of the blocks, needing a scale below E4M3's smallest normal, 2^-6: torchao's
    inference tensor clamps them up to it, the training engines store an E4M3 subnormal), "below_subnormals"
    (needing one below 2^-10, where even an E4M3 subnormal scale rounds to 0). Also "tensor_scale", "x" and
    "outlier_channels"."""
    idx = torch.as_tensor(outlier_channels, dtype=torch.long, device="cpu")
    x = x.detach().float()
    scaling = RECIPES["nvfp4"].input  # scale_floor "zero": the training engines'
    q = quantize(x, scaling)
    q_inference = quantize(x, replace(scaling, scale_floor="min_normal"))
    deq = q.dequantize()
    m, k = x.shape
    nb = k // BLOCK
    amax = x.abs().reshape(m, nb, BLOCK).amax(-1)  # (M, K/16)
    tensor_scale = float(q.tensor_scale)
    ideal = amax / E2M1.max_value / tensor_scale
    holds = torch.zeros(k, dtype=torch.bool, device="cpu")
    holds[idx] = True
    clean = (~holds.reshape(nb, BLOCK).any(-1)).expand(m, nb)  # (M, K/16)
    nonzero = (x != 0).reshape(m, nb, BLOCK)

    def share_flushed(d: torch.Tensor) -> float:
        flushed = ((x != 0) & (d == 0)).reshape(m, nb, BLOCK)
        # (counts divided in float32, not in torch's default dtype)
        return float(flushed[clean].sum().float() / nonzero[clean].sum().clamp(min=1).float())

    return {"x": x, "outlier_channels": idx.tolist(), "ideal": ideal, "stored": q.scale.reshape(m, nb),
            "stored_min_normal": q_inference.scale.reshape(m, nb), "clean": clean, "tensor_scale": tensor_scale,
            "clean_flushed": share_flushed(deq), "clean_flushed_min_normal": share_flushed(q_inference.dequantize()),
            "at_floor": float((ideal[clean] < E4M3.min_normal).float().mean()),
            "below_subnormals": float((ideal[clean] < E4M3.min_subnormal / 2).float().mean())}


def nvfp4_collapse(seed: int = 0, shape: tuple[int, int] | None = None) -> pd.DataFrame:
    """nvfp4_blocks' shares at every outlier magnitude of the panels (0: none): columns outliers, clean_flushed,
    clean_flushed_min_normal, at_floor, below_subnormals, tensor_scale."""
    keys = SHARES
    return pd.DataFrame([{"outliers": m, **{k: nvfp4_blocks(m, seed, shape)[k] for k in keys}} for m in OUTLIERS])


class Nvfp4ScalesPanel(Panel):
    """NVFP4's collapse: as the outlier channels grow, the per-tensor scale amax / (448 * 6) grows with them, and
    the blocks without an outlier need E4M3 scales below E4M3's smallest normal: clamped there (torchao's inference
    tensor), their values flush; stored as E4M3 subnormals (the training engines), they flush only once the scale
    they need falls below 2^-10, where even a subnormal rounds to 0."""

    title = "NVFP4: the block scales each block needs, against E4M3's range"
    ncols, width, height, right = 2, 4.4, 3.2, 0.3
    keep_axes = True

    def __init__(self) -> None:
        super().__init__(outliers=selection_slider(outlier_options(), 1e5, "outlier channels"))
        self.blocks = {m: nvfp4_blocks(m) for m in OUTLIERS}  # every magnitude, once: a drag only draws
        for b in self.blocks.values():
            b["counts"] = scales.scale_histogram(b["ideal"], b["clean"])
        self.curve = pd.DataFrame([{"outliers": m, **{k: b[k] for k in SHARES}} for m, b in self.blocks.items()])
        self.ymax = int(1.05 * max(max(c.max() for c in b["counts"]) for b in self.blocks.values()))

    def compute(self, outliers) -> dict:
        return {**self.blocks[outliers], "curve": self.curve, "outliers": outliers}

    def draw(self, data, axes) -> None:
        scales.nvfp4_block_scales(data["counts"], axes[0], ymax=self.ymax)
        scales.shares_vs_magnitude(data["curve"], {"clean_flushed": "values flushed: training engines (no floor)",
                                                   "clean_flushed_min_normal": "values flushed: torchao inference "
                                                                               "(floor 2^-6)",
                                                   "at_floor": "needing a scale under 2^-6",
                                                   "below_subnormals": "needing a scale under 2^-10"},
                                   axes[1], mark=data["outliers"], title="blocks without an outlier channel")
        steps = [p for p in axes[0].patches if isinstance(p, StepPatch)]  # the two histograms, in counts' order
        mark = next(line for line in axes[1].lines if line.get_gid() == "mark")
        self._drawn = (steps, mark)

    def draw_in_place(self, data) -> bool:
        """Another magnitude: the histograms' counts and the marked magnitude move; the axes (their limits fixed
        over every magnitude), the curves and the E4M3 range stay, as nvfp4_block_scales and
        shares_vs_magnitude draw them."""
        moving = self._drawn
        if moving is None:
            return False
        steps, mark = moving
        for patch, counts in zip(steps, data["counts"], strict=True):
            patch.set_data(counts)
        x = data["outliers"] if data["outliers"] > 0 else 1.0
        mark.set_xdata([x, x])
        return True

    def describe(self, data) -> str:
        ts = data["tensor_scale"]
        return metrics_html({
            "tensor scale, amax / (448 x 6)": f"{ts:.4g}",
            "a clean block's largest value that still gets a normal E4M3 scale": f"{6 * E4M3.min_normal * ts:.3g} "
            "(6 x 2^-6 x the tensor scale)",
            "clean blocks needing a scale below 2^-6 (torchao's inference tensor clamps them there; the training "
            "engines store an E4M3 subnormal)": percent(data["at_floor"]),
            "clean blocks needing a scale below 2^-10 (0 even as an E4M3 subnormal)": percent(data["below_subnormals"]),
            "clean blocks' values flushed to 0, training engines (no floor)": percent(data["clean_flushed"]),
            "the same, torchao's inference NVFP4Tensor (floor 2^-6)": percent(data["clean_flushed_min_normal"])})
