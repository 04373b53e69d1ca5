"""Synthetic tensors for the notebooks: distributions, outlier channels, spikes over steps.

Public: DISTRIBUTIONS, sample(distribution, shape, outliers, seed, ...), activation_stream, FLOAT32_CPU (the
keywords every lab tensor is made with: the toys, the panels and the exercises name them too).
All generated in code from a seed, float32 CPU tensors whatever torch's default dtype (the same numbers in every
notebook); nothing is downloaded. Notebooks 02-05 draw from here.
"""

from __future__ import annotations

import torch

__all__ = ["DISTRIBUTIONS", "FLOAT32_CPU", "OUTLIER_PLACEMENTS", "OUTLIER_TOKENS", "activation_stream", "sample"]

DISTRIBUTIONS: tuple[str, ...] = ("normal", "laplace", "lognormal", "uniform", "channel scales")
# where the outliers sit in x[M, K] (rows: tokens): their channels in every token, or in the first OUTLIER_TOKENS
# tokens only, or both kinds in different channels (as fp8lab.training.models.PLACEMENTS: outlier features,
# massive activations, both)
OUTLIER_PLACEMENTS: tuple[str, ...] = ("channels", "tokens", "both")
OUTLIER_TOKENS = 2
# every tensor made here (and the lab's models and exercises): the activations' dtype and the generator's device,
# whatever torch.set_default_dtype or set_default_device says
FLOAT32_CPU = {"dtype": torch.float32, "device": "cpu"}


def sample(
    distribution: str = "normal",
    shape: tuple[int, int] = (256, 1024),
    outliers: float = 0.0,
    outlier_channels: int = 4,
    seed: int = 0,
    normalize: bool = False,
    return_outliers: bool = False,
    placement: str = "channels",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A float32 tensor x[M, K] drawn from `distribution`, with optional outlier channels.

    normal / laplace (heavy tails) / lognormal (positive, skewed) / uniform [-1, 1] /
    "channel scales" (each of the K channels has its own scale, 10^-3..10^3, as
    un-normalized features do). outliers > 0 multiplies `outlier_channels` channels by it
    (LLM activation outliers). normalize=True standardizes each channel (column) to mean 0,
    std 1 first - the "normalize your data" practice. return_outliers=True also returns the
    outlier channels' indices (empty without outliers), to measure the other channels alone.
    placement "tokens" multiplies those channels in the first OUTLIER_TOKENS rows only, "both" does both in
    `outlier_channels` channels each (every token in some, the first tokens in others); for these two
    return_outliers returns a bool mask of x's shape (True at the outliers) instead: what fp8lab.metrics takes.
    """
    if placement not in OUTLIER_PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; valid: {', '.join(OUTLIER_PLACEMENTS)}")
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r}; valid: {', '.join(DISTRIBUTIONS)}")
    if outliers < 0:
        raise ValueError(f"outliers is a magnitude multiplier >= 0, got {outliers}")
    g = torch.Generator().manual_seed(seed)
    m, k = shape
    if distribution == "normal":
        x = torch.randn(m, k, generator=g, **FLOAT32_CPU)
    elif distribution == "laplace":
        u = torch.rand(m, k, generator=g, **FLOAT32_CPU) - 0.5
        x = -torch.sign(u) * torch.log1p(-2 * u.abs())
    elif distribution == "lognormal":
        x = torch.exp(torch.randn(m, k, generator=g, **FLOAT32_CPU) * 1.5)
    elif distribution == "uniform":
        x = torch.rand(m, k, generator=g, **FLOAT32_CPU) * 2 - 1
    else:  # channel scales
        x = torch.randn(m, k, generator=g, **FLOAT32_CPU)  # (drawn before the channels' order)
        x = x * torch.logspace(-3, 3, k, **FLOAT32_CPU)[torch.randperm(k, generator=g, device="cpu")]
    if normalize:
        x = (x - x.mean(0)) / x.std(0).clamp(min=1e-12)
    perm = torch.randperm(k, generator=g, device="cpu")
    idx = perm[:outlier_channels].sort().values  # the channel outliers' (or the token outliers') channels
    other = perm[outlier_channels:2 * outlier_channels].sort().values  # "both": the token outliers' channels
    rows = slice(None) if placement == "channels" else slice(0, OUTLIER_TOKENS)
    if not (outliers > 0 and outlier_channels > 0):
        idx, other = idx[:0], other[:0]
    if placement == "both":
        x[:, idx] *= outliers  # channel outliers, every token
        x[rows, other] *= outliers  # token outliers, the first tokens
    elif len(idx):
        x[rows, idx] *= outliers
    if placement == "channels":
        return (x, idx) if return_outliers else x
    mask = torch.zeros(m, k, dtype=torch.bool, device="cpu")  # the outliers' positions
    if placement == "both":
        mask[:, idx] = True
        mask[rows, other] = True
    else:
        mask[rows, idx] = True
    return (x, mask) if return_outliers else x


def activation_stream(
    steps: int = 60,
    shape: tuple[int, int] = (64, 256),
    spike_step: int | None = 30,
    spike: float = 20.0,
    drift: float = 0.0,
    seed: int = 0,
) -> list[torch.Tensor]:
    """Activations over training steps: N(0, 1) with a one-step spike and an optional drift.

    spike multiplies the tensor at spike_step (an outlier batch); drift > 0 grows the
    scale by (1 + drift) per step. Notebook 03 feeds these to delayed scaling.
    """
    g = torch.Generator().manual_seed(seed)
    out = []
    for step in range(steps):
        x = torch.randn(*shape, generator=g, **FLOAT32_CPU) * (1 + drift) ** step
        if spike_step is not None and step == spike_step:
            x = x * spike
        out.append(x)
    return out
