"""What each backward part of the NVFP4 training recipe does, measured on numbers a learner can move.

Public: sum_rounding (stochastic rounding against round to nearest, per value and in a GEMM's sum), signed_values
(values mostly of one sign, heavy-tailed as dy is), small_update (a weight updated by a gradient below NVFP4's
flush threshold, step by step), flush_threshold, hadamard_contrast (dy in wgrad's layout, NVFP4 against MXFP4, to
nearest and stochastic, with and without the random Hadamard transform), depth_drift (dgrad through a chain of
layers, 1-D weight copies against 2-D blocks), FOUR_BIT. Notebook 09 (fp8lab.lab.panels.fp4_parts shows these).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.numerics.formats import E2M1
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import NVFP4_HADAMARD, Recipe, get_recipe
from fp8lab.training.layers import layer_gemms

__all__ = ["FOUR_BIT", "depth_drift", "flush_threshold", "hadamard_contrast", "signed_values", "small_update",
           "sum_rounding"]

# the two 4-bit block formats, as quantize() takes them: E2M1 elements; NVFP4's 1x16 blocks with E4M3 scales under
# a float32 tensor scale; MXFP4's 1x32 blocks with power-of-two (E8M0) scales, the OCP MX rule (floor)
FOUR_BIT: dict[str, dict] = {
    "NVFP4": {"fmt": "e2m1", "granularity": "1x16", "scale_fmt": "e4m3", "two_level": True},
    "MXFP4": {"fmt": "e2m1", "granularity": "1x32", "scale_fmt": "e8m0", "scale_rule": "floor"},
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-300))


def _nvfp4(x: torch.Tensor, rounding: str = "nearest", seed: int = 0, fmt: str = "NVFP4") -> torch.Tensor:
    """x[rows, K] quantized in `fmt` (FOUR_BIT) along K and read back (float32)."""
    g = torch.Generator().manual_seed(seed) if rounding == "stochastic" else None
    return quantize(x, rounding=rounding, generator=g, **FOUR_BIT[fmt]).dequantize()


# ---- stochastic rounding in a sum ----------------------------------------------------------------------------------


def signed_values(rows: int, k: int, positive: float, seed: int = 0, spread: float = 1.5) -> torch.Tensor:
    """v[rows, k]: magnitudes exp(spread * z) (z normal: heavy-tailed, as a softmax's gradient), each positive with
    probability `positive` (0.5: signs at random; 1: all positive). The same draws for every `positive`."""
    if not 0.0 <= positive <= 1.0:
        raise ValueError(f"positive is a share in [0, 1], got {positive!r}")
    g = torch.Generator().manual_seed(seed)
    mags = torch.exp(spread * torch.randn(rows, k, generator=g, **FLOAT32_CPU))
    signs = torch.where(torch.rand(rows, k, generator=g, **FLOAT32_CPU) < positive, 1.0, -1.0)
    return mags * signs


def sum_rounding(values: torch.Tensor, ks: Sequence[int], seed: int = 0) -> dict:
    """values[rows, K] (a GEMM operand, K its contraction) quantized to NVFP4 along K, to nearest and with one
    stochastic draw; for each k in `ks`, the sums of each row's first k values against the exact sums.

    Returns "per_value" ({rounding: ||q - v|| / ||v|| over all values}), "sum" ({rounding: [||sum_q - sum|| /
    ||sum|| over the rows, one per k]}), "ks", "positive" (the share of values > 0) and "rows"."""
    k_max = values.shape[1]
    if not ks or max(ks) > k_max or min(ks) < 1:
        raise ValueError(f"ks are sums' lengths from 1 to the values' {k_max} columns, got {list(ks)}")
    v = values.double()
    out = {"per_value": {}, "sum": {}, "ks": list(ks), "positive": float((values > 0).double().mean()),
           "rows": values.shape[0]}
    for rounding in ("nearest", "stochastic"):
        q = _nvfp4(values, rounding, seed).double()
        out["per_value"][rounding] = _rel(q, v)
        qs, vs = q.cumsum(1), v.cumsum(1)  # (rows, K): every prefix sum at once
        out["sum"][rounding] = [_rel(qs[:, k - 1], vs[:, k - 1]) for k in ks]
    return out


def flush_threshold() -> float:
    """The largest share of its block's largest value that NVFP4 rounds to 0 (to nearest): half of E2M1's smallest
    positive value over its largest, 0.25 / 6 (the tie at the threshold goes to the even code, 0)."""
    smallest = min(v for v in E2M1.values().tolist() if v > 0)
    return smallest / 2 / E2M1.max_value


def small_update(ratio: float, steps: int, lr: float = 1.0, seed: int = 0) -> dict:
    """A weight, in float32, moved each step by -lr * g, where g is one value of a gradient block of 16 quantized to
    NVFP4 (the block's largest value 1, g = ratio of it, the rest 0). Returns per step (0..steps) the weight "exact"
    (g unquantized), "nearest" and "stochastic" (one draw per step), and "rate" ({rounding: the mean update per
    step, over g's exact update})."""
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio is g over its block's largest value, in (0, 1], got {ratio!r}")
    if steps < 1:
        raise ValueError(f"steps is a positive number of updates, got {steps!r}")
    block = torch.zeros(steps, 16, **FLOAT32_CPU)  # (steps, 16): one gradient block per step
    block[:, 0] = 1.0
    block[:, 1] = ratio
    out = {"ratio": ratio, "steps": steps, "rate": {}}
    start = torch.zeros(1, dtype=torch.float64, device="cpu")
    out["exact"] = torch.cat([start, -lr * ratio * torch.arange(1, steps + 1, dtype=torch.float64, device="cpu")])
    for rounding in ("nearest", "stochastic"):
        g = _nvfp4(block, rounding, seed)[:, 1].double()  # (steps,): what the GEMM sees of g each step
        out[rounding] = torch.cat([start, -lr * g.cumsum(0)])
        out["rate"][rounding] = float(g.mean() / ratio)
    return out


# ---- the Hadamard transform by contrast ----------------------------------------------------------------------------


def hadamard_contrast(dy: torch.Tensor, seed: int = 0):
    """dy[M, N] as the wgrad GEMM reads it (dy^T[N, M], blocks along the tokens M) in NVFP4 and MXFP4, to nearest and
    stochastically (one draw), without and with NVFP4's random Hadamard transform (d = 16, inverted after the cast:
    the error is measured in dy's own values). DataFrame indexed by (format, rounding), columns "without", "with"
    (relative error ||q - dy|| / ||dy||) and "change" (with / without - 1)."""
    import pandas as pd

    t = dy.detach().float().t().contiguous()  # (N, M): wgrad's layout
    m = t.shape[1]
    if m % 32:
        t = t[:, : m - m % 32]  # (whole blocks of both formats)
    rows = []
    for fmt in FOUR_BIT:
        for rounding in ("nearest", "stochastic"):
            plain = _nvfp4(t, rounding, seed, fmt)
            back = NVFP4_HADAMARD.inverse(_nvfp4(NVFP4_HADAMARD.apply(t), rounding, seed, fmt))[:, : t.shape[1]]
            without, with_ = _rel(plain, t), _rel(back, t)
            rows.append({"format": fmt, "rounding": rounding, "without": without, "with": with_,
                         "change": with_ / without - 1})
    return pd.DataFrame(rows).set_index(["format", "rounding"])


# ---- 2-D weight blocks through depth -------------------------------------------------------------------------------


def _copies(w: torch.Tensor, recipe: Recipe) -> tuple[torch.Tensor, torch.Tensor]:
    """w[N, K] as `recipe`'s fprop reads it (along K) and as its dgrad reads it (w^T along N, read back as w)."""
    n, k = w.shape
    g = torch.Generator().manual_seed(0)  # the other operands: any; only the weight's copies are kept
    x, dy = (torch.randn(16, size, generator=g, **FLOAT32_CPU) for size in (k, n))
    pairs = layer_gemms(x, w, dy, recipe)
    return pairs["fprop"][1].dequantize().reshape(n, k), pairs["dgrad"][1].dequantize().reshape(k, n).t()


def depth_drift(depth: int = 32, two_d: bool = False, recipe: Recipe | str = "nvfp4", width: int = 256,
                seed: int = 0, steps: int = 16) -> dict:
    """A chain of `depth` linear layers (w_l[width, width] normal / sqrt(width), no nonlinearity), the weights
    quantized by `recipe` with 1 x c blocks (two_d False: fprop's copy along K, dgrad's along N) or c x c blocks
    (two_d True: one copy). The chain rule of the forward that ran sends dy back through fprop's copies,
    dx = dy @ wf_L @ ... @ wf_1; dgrad sends it through its own copies. For d = 1..depth (the last d layers):
    "drift" (||dx_dgrad - dx_chain|| / ||dx_chain||) and "cosine" (between them), each the mean over `steps` dy;
    and "drift_mean" (the drift of the sum of those steps' gradients, the weights the same: a bias stays as large
    as one step's, independent noise would shrink by sqrt(steps)), all lists indexed d - 1."""
    if depth < 1:
        raise ValueError(f"depth is a positive number of layers, got {depth!r}")
    r = get_recipe(recipe).with_2d_weight(two_d)
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(width, width, generator=g, **FLOAT32_CPU) / width**0.5
               for _ in range(depth)]
    dy = torch.randn(steps, width, generator=g, dtype=torch.float64, device="cpu")  # (steps, width): one dy per step
    chain, dgrad = dy.clone(), dy.clone()
    out = {"drift": [], "cosine": [], "drift_mean": [], "two_d": two_d, "recipe": r.name,
           "block": r.weight.granularity.label}
    for w in reversed(weights):  # from the last layer back
        wf, wd = _copies(w, r)
        chain, dgrad = chain @ wf.double(), dgrad @ wd.double()  # (steps, width): dx = dy @ w
        per_step = (dgrad - chain).norm(dim=1) / chain.norm(dim=1)  # (steps,)
        out["drift"].append(float(per_step.mean()))
        out["cosine"].append(float(torch.nn.functional.cosine_similarity(dgrad, chain).mean()))
        out["drift_mean"].append(_rel(dgrad.sum(0), chain.sum(0)))
    return out
