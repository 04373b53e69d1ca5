"""The random Hadamard transform: a block's outliers spread over its values before they are scaled.

Public: RandomHadamard(size, seed) (.signs, .matrix(), .apply(x), .inverse(y), .block_view(x)),
hadamard_matrix(size), SIZES. Q = diag(s) H / sqrt(d): Sylvester's Walsh-Hadamard matrix H (entries
+-1, d a power of 4) with its rows' signs flipped by a seeded random sign vector s. apply(x) is
x[..., C] @ Q on each block of d along the last dim (the contraction dim of a GEMM operand); Q Q^T = I,
so (a Q)(b Q)^T = a b^T: a GEMM over both transformed operands computes the same product.
Notebook 09 (NVFP4's weight-gradient GEMM; TransformerEngine's NVFP4 recipe, d = 16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

__all__ = ["MAX_SEED", "SIZES", "RandomHadamard", "hadamard_matrix"]

# Sizes whose 1/sqrt(d) is a power of two (d a power of 4): every entry of Q is +-2^-k, so Q Q^T = I
# holds bit for bit in floating point and the inverse is exactly the transpose
SIZES: tuple[int, ...] = (4, 16, 64, 256)
MAX_SEED = 2**64 - 1  # the largest seed torch.Generator.manual_seed takes


def hadamard_matrix(size: int) -> torch.Tensor:
    """Sylvester's Hadamard matrix H[size, size], float64, entries +-1: H_1 = [1],
    H_2n = [[H_n, H_n], [H_n, -H_n]]; H H^T = size * I."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"a Hadamard matrix here has a power-of-two size, got {size}")
    h = torch.ones(1, 1, dtype=torch.float64, device="cpu")  # (whatever torch.set_default_device says)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@dataclass(frozen=True)
class RandomHadamard:
    """A random Hadamard transform of `size` (d), its sign vector drawn from `seed`.

    Q = diag(s) H_d / sqrt(d) (TransformerEngine's H = S_d H_d / sqrt(d)); apply(x) = x @ Q on each
    block of d consecutive elements along x's last dim. The transform is a fast Walsh-Hadamard
    butterfly in float32 (additions in a fixed order, then an exact power-of-two scale), so its bits
    are the same on every machine. A last dim that d does not divide is padded with zeros to a
    multiple of d (the result is that wide): padding both operands of a GEMM alike leaves their
    product unchanged. One sign vector serves every layer, as the NVFP4 paper describes.
    """

    size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        # (an int: 16.0 == 16, but a float size would fail deep inside, at the first reshape)
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size not in SIZES:
            raise ValueError(f"Hadamard size must be one of the integers {', '.join(map(str, SIZES))} (a power of "
                             f"4, so that 1/sqrt(size) is a power of two and the transform is exactly "
                             f"orthonormal), got {self.size!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be an integer from 0 to 2**64 - 1 (torch.Generator's seeds), got "
                             f"{self.seed!r}")

    @cached_property
    def signs(self) -> torch.Tensor:
        """s[d]: +-1.0 (float32, CPU), drawn from `seed` with torch's CPU generator (the same on every machine)."""
        bits = torch.randint(0, 2, (self.size,), generator=torch.Generator().manual_seed(self.seed), device="cpu")
        return (bits * 2 - 1).to(torch.float32)

    def matrix(self) -> torch.Tensor:
        """Q[d, d] = diag(s) H_d / sqrt(d), float64 (exact: entries +-2^-k)."""
        return self.signs.double()[:, None] * hadamard_matrix(self.size) / math.sqrt(self.size)

    def block_view(self, x: torch.Tensor) -> torch.Tensor:
        """x[..., C] -> (n, d), float32: its blocks of d along the last dim, zero-padded to a multiple of d."""
        pad = -x.shape[-1] % self.size
        x = x.to(torch.float32)
        if pad:
            x = F.pad(x, (0, pad))
        return x.reshape(-1, self.size)

    def _butterfly(self, blocks: torch.Tensor) -> torch.Tensor:
        """blocks[n, d] @ H_d (Sylvester order), unnormalized, as log2(d) stages of sums and differences."""
        n, d = blocks.shape
        h = 1
        while h < d:
            pairs = blocks.reshape(n, d // (2 * h), 2, h)  # (n, groups, 2, h)
            a, b = pairs[:, :, 0], pairs[:, :, 1]
            blocks = torch.stack((a + b, a - b), dim=2).reshape(n, d)
            h *= 2
        return blocks

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x[..., C] @ Q per block of d along the last dim -> float32 [..., ceil(C/d) * d]."""
        blocks = self.block_view(x) * self.signs.to(x.device)  # (n, d): x diag(s)
        out = self._butterfly(blocks) * (1.0 / math.sqrt(self.size))  # (an exact power of two)
        return out.reshape(*x.shape[:-1], -1)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """y[..., C] @ Q^T per block of d: apply's inverse (Q^T = H_d diag(s) / sqrt(d)), float32."""
        blocks = self._butterfly(self.block_view(y)) * (1.0 / math.sqrt(self.size))
        return (blocks * self.signs.to(y.device)).reshape(*y.shape[:-1], -1)

    @property
    def label(self) -> str:
        return f"random Hadamard d={self.size} (seed {self.seed})"
