"""Which elements of x[M, K] share a scale: the granularity types, and x seen as [M, K] blocks.

Public: Granularity, PerTensor, PerRow, PerBlock(rows, cols), parse_granularity, MAX_BLOCK, as_2d,
padded_blocks. Shapes: x[M, K] -> scale[ceil(M/rows), ceil(K/cols)]; PerRow is PerBlock(1, K) and
PerTensor is PerBlock(M, K); a block larger than the tensor is clamped to it.
Notebooks 02 (per tensor) and 04 (per block) introduce them; scaling.py re-exports them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["MAX_BLOCK", "Granularity", "PerBlock", "PerRow", "PerTensor", "as_2d", "padded_blocks",
           "parse_granularity", "shape_2d"]

# ---- granularity ---------------------------------------------------------------------------


class Granularity:
    """Which region of x[M, K] shares one scale. Subclasses are frozen dataclasses; what a granularity
    means for a GEMM (its transpose, its scales along K, the tokens a scale covers) is a method here.

    whole_tensor  one scale covers all of x (a reduction over the whole tensor; delayed scaling's kind)
    whole_rows    each scale spans whole rows, all of K (per tensor or per row: no block width along K)
    """

    whole_tensor: bool = False
    whole_rows: bool = False

    def block_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        """(rows, cols) of one block for a 2-D tensor of `shape`, never larger than the tensor."""
        raise NotImplementedError

    def transposed(self) -> Granularity | None:
        """The blocks of x^T[K, M] that these blocks of x[M, K] become (None: per-row scales would be
        per column, which no granularity here describes)."""
        return self

    def down_columns(self, rows: int) -> Granularity:
        """The granularity of x[rows, cols] whose transpose x^T[cols, rows] has these blocks: per row of
        x^T is one block per column of x, PerBlock(rows, 1); a 1x32 block of x^T is a 32x1 block of x."""
        return self

    def row_scales(self, scale: torch.Tensor, shape: tuple[int, int]) -> tuple[torch.Tensor, int]:
        """The scales of q[R, K] (shape) as (R, K blocks) float32, each row's own, and the block width
        along K: per tensor and per row (R, 1) with width K; per block (r, c) (R, ceil(K/c)), each block's
        scale repeated over its r rows, width min(c, K)."""
        return scale.reshape(-1, 1).expand(shape[0], 1), shape[1]

    def tokens_per_scale(self, gemm: str) -> int | None:
        """How many tokens one scale of an activation or gradient operand covers in `gemm` (None: all of
        them): tokens are the rows in fprop and dgrad and the contraction in wgrad."""
        return None

    @property
    def scaled_mm_name(self) -> str:
        """How torch's scaled_mm names this scaling (its float32-scale kinds): TensorWise, RowWise,
        BlockWise{rows}x{cols}."""
        raise NotImplementedError

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the scale tensor fp8lab returns for a tensor of `shape`."""
        rows, cols = self.block_shape(shape_2d(shape))
        m, k = shape_2d(shape)
        return (math.ceil(m / rows), math.ceil(k / cols))

    @property
    def label(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class PerTensor(Granularity):
    """One scale for the whole tensor: x[...] -> scale[] (a 0-d tensor)."""

    whole_tensor = True
    whole_rows = True
    scaled_mm_name = "TensorWise"

    def block_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        return (max(shape[0], 1), max(shape[1], 1))

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return ()

    @property
    def label(self) -> str:
        return "per-tensor"


@dataclass(frozen=True)
class PerRow(Granularity):
    """One scale per row: x[M, K] -> scale[M, 1] (each row's amax over K)."""

    whole_rows = True
    scaled_mm_name = "RowWise"

    def block_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        return (1, max(shape[1], 1))

    def transposed(self) -> None:
        return None

    def down_columns(self, rows: int) -> PerBlock:
        return PerBlock(rows, 1)

    def tokens_per_scale(self, gemm: str) -> int | None:
        return None if gemm == "wgrad" else 1

    @property
    def label(self) -> str:
        return "per-row"


# the largest block side PerBlock takes (a block is clamped to the tensor anyway; sides beyond
# this are typos, and C's int64 would wrap them)
MAX_BLOCK = 2**31 - 1


@dataclass(frozen=True)
class PerBlock(Granularity):
    """One scale per rows x cols tile: x[M, K] -> scale[ceil(M/rows), ceil(K/cols)].

    Examples: PerBlock(1, 128) is DeepSeek-V3's activation tile, PerBlock(128, 128) its
    weight block, PerBlock(1, 32) the MX block, PerBlock(1, 16) the NVFP4 block. Shapes
    that do not divide are padded with zeros internally (zeros never change an amax).
    A block larger than the tensor is clamped to it: PerBlock(128, 128) on x[1, K] is
    PerBlock(1, 128) there, and PerBlock(10**6, 10**6) on x[64, 256] is one block, per-tensor
    in effect (the scale's shape says so: (1, 1); QuantizedTensor.block_shape gives the block
    used). rows and cols: integers in 1..MAX_BLOCK (2**31 - 1).
    """

    rows: int
    cols: int

    def __post_init__(self) -> None:
        for name in ("rows", "cols"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_BLOCK:
                raise ValueError(f"PerBlock {name} must be a positive integer up to 2**31 - 1, got {v!r}")

    def block_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        return (min(self.rows, max(shape[0], 1)), min(self.cols, max(shape[1], 1)))

    def transposed(self) -> PerBlock:
        return PerBlock(self.cols, self.rows)

    def down_columns(self, rows: int) -> PerBlock:
        return self.transposed()

    def row_scales(self, scale: torch.Tensor, shape: tuple[int, int]) -> tuple[torch.Tensor, int]:
        return scale.repeat_interleave(self.rows, 0)[:shape[0]], min(self.cols, shape[1])  # (R, KB)

    def tokens_per_scale(self, gemm: str) -> int:
        return self.cols if gemm == "wgrad" else self.rows

    @property
    def scaled_mm_name(self) -> str:
        return f"BlockWise{self.rows}x{self.cols}"

    @property
    def label(self) -> str:
        return f"{self.rows}x{self.cols}"


def parse_granularity(spec: Granularity | str) -> Granularity:
    """A Granularity from itself or a label: 'per-tensor', 'per-row', '1x128', '128x128', ..."""
    if isinstance(spec, Granularity):
        return spec
    if isinstance(spec, str):
        s = spec.strip().lower().replace("_", "-").replace(" ", "")
        if s in ("per-tensor", "tensor", "tensorwise"):
            return PerTensor()
        if s in ("per-row", "row", "rowwise"):
            return PerRow()
        parts = s.split("x")
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            return PerBlock(int(parts[0]), int(parts[1]))
    raise ValueError(
        f"unknown granularity {spec!r}; use PerTensor(), PerRow(), PerBlock(rows, cols) "
        "or a label: 'per-tensor', 'per-row', 'ROWSxCOLS' (e.g. '1x128', '128x128', '1x32')"
    )


# ---- shapes -----------------------------------------------------------------------------------


def shape_2d(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        return (1, shape[0])
    if len(shape) == 2:
        return (shape[0], shape[1])
    return (math.prod(shape[:-1]), shape[-1])


def as_2d(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """View x as the 2-D [M, K] the granularity talks about, or explain what to reshape.

    Per-tensor scaling accepts any shape (flattened to rows of its last dim). Per-row and
    per-block need a 2-D tensor: a batch of activations x[B, T, K] is x.reshape(-1, K).
    """
    if x.dim() == 2:
        return x
    if granularity.whole_tensor:
        return x.reshape(shape_2d(tuple(x.shape)))
    if x.dim() < 2:
        raise ValueError(
            f"{granularity.label} scaling needs a 2-D tensor [M, K], got shape {tuple(x.shape)}; "
            "use x.reshape(1, -1) for a single row"
        )
    raise ValueError(
        f"{granularity.label} scaling needs a 2-D tensor [M, K], got {x.dim()}-D shape "
        f"{tuple(x.shape)}; reshape it with x.reshape(-1, {x.shape[-1]}) so that the "
        "reduced (K) dimension is last"
    )


def padded_blocks(x2d: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """x[M, K] as a 4-D view (MB, rows, KB, cols), zero-padded when the block doesn't divide."""
    m, k = x2d.shape
    r, c = block
    mb, kb = math.ceil(m / r), math.ceil(k / c)
    if (mb * r, kb * c) != (m, k):
        x2d = F.pad(x2d, (0, kb * c - k, 0, mb * r - m))
    return x2d.reshape(mb, r, kb, c)  # (M/r, r, K/c, c)
