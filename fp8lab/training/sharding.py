"""An FP8 all-gather of a sharded tensor: where ranks must agree on one amax, shown in one process.

Public: all_gather_fp8(t, ranks, agree) -> GatherResult, all_gather_table(t, ranks), example_weight().
FSDP shards each weight over the ranks by rows and gathers it before the layer runs; sequence parallelism
splits activations by tokens and gathers them before a GEMM. Sent in FP8, each rank casts its own shard
(per tensor: scale = amax / fmt.max_value) and the gathered codes feed one per-tensor GEMM, which takes ONE
scale for the whole tensor. So the ranks agree on the amax first (an all-reduce of one number): with it,
the gathered codes are the unsharded tensor's, code for code; without it, each shard's codes mean
something else. Under plain data parallelism nothing is gathered: each rank's GEMMs read only its own
tensors, and per-rank current scales are what a single process would compute for that slice.
TransformerEngine reduces the amax for exactly these gathered tensors (sequence-parallel inputs and
gradients, FP8 weights sharded by FSDP) and for delayed scaling's histories. Notebook 07 shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.numerics.formats import E4M3, FloatFormat
from fp8lab.numerics.metrics import relative_error
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.scaling import PerTensor

__all__ = ["GatherResult", "all_gather_fp8", "all_gather_table", "example_weight"]


@dataclass(frozen=True)
class GatherResult:
    """One FP8 all-gather: ranks, whether they agreed on the amax, each shard's scale, whether the gathered
    codes equal the unsharded tensor's per-tensor cast, and the relative error of the gathered tensor read
    with one scale (a per-tensor GEMM's only choice: the agreed one, else rank 0's)."""

    ranks: int
    agree: bool
    scales: tuple[float, ...]
    same_codes: bool
    error: float


def example_weight(rows: int = 512, cols: int = 256, seed: int = 0) -> torch.Tensor:
    """A weight w[rows, cols] whose rows differ in size, as trained weights' output neurons do: normal values,
    each row scaled by 2^u with u uniform in [-2, 2], and the last eighth of the rows 8x larger (one shard
    of 8 holds the largest rows)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g, **FLOAT32_CPU)
    w = w * 2.0 ** (torch.rand(rows, 1, generator=g, **FLOAT32_CPU) * 4 - 2) * 0.02
    w[rows - rows // 8:] *= 8
    return w


def all_gather_fp8(t: torch.Tensor, ranks: int, agree: bool, fmt: FloatFormat = E4M3) -> GatherResult:
    """Shard t[R, C] by rows over `ranks` (R divisible by ranks), cast each shard to `fmt` per tensor (with the
    amax all-reduced over the ranks if `agree`, else the shard's own), gather the codes, and read them with
    one scale. Returns a GatherResult."""
    if ranks < 1 or t.shape[0] % ranks:
        raise ValueError(f"ranks must divide the {t.shape[0]} rows, got {ranks}")
    shards = t.detach().float().chunk(ranks, dim=0)
    agreed = max(float(s.abs().max()) for s in shards)  # the all-reduce (max) of the ranks' amaxes
    qs = [quantize(s, fmt, PerTensor(), amax=agreed if agree else None) for s in shards]
    codes = torch.cat([q.data.float() for q in qs])  # what the all-gather sends: codes only
    whole = quantize(t.detach().float(), fmt, PerTensor())
    one_scale = float(qs[0].scale)  # the gathered tensor's single scale
    return GatherResult(ranks, agree, tuple(float(q.scale) for q in qs),
                        bool(torch.equal(codes, whole.data.float())), relative_error(t.float(), codes * one_scale))


def all_gather_table(t: torch.Tensor | None = None, ranks: tuple[int, ...] = (1, 2, 4, 8)):
    """all_gather_fp8 for each rank count, with and without the agreed amax: DataFrame (ranks, amax, distinct
    scales, codes as one process casts them, relative error read with one scale)."""
    import pandas as pd

    t = example_weight() if t is None else t
    rows = []
    for n in ranks:
        for agree in (True, False):
            r = all_gather_fp8(t, n, agree)
            rows.append({"ranks": n, "amax": "all-reduced" if agree else "each rank's own",
                         "distinct scales": len(set(r.scales)), "codes as one process casts them": r.same_codes,
                         "relative error, one scale": r.error})
    return pd.DataFrame(rows)
