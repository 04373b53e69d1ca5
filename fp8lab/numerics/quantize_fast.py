"""quantize's fast twins: the same bits as the definition in quantize.py, computed faster.

Public: kernel_parameters(spec) (the C kernels' parameter block, kept on the spec), kernel_input(x2d, spec,
amax) (x as the C kernel takes it, or None where the torch code runs), plain_pass(x, spec, values, amax) (a
GEMM operand's pass in one kernel call), draws(x2d, spec, generator) (stochastic rounding's draws for that call),
folds(block, shape, spec), scale_and_cast
(the definition's cast a bounded chunk of block rows at a time), CHUNK_ELEMENTS, GPU_CHUNK_ELEMENTS.
quantize.quantize_with is the one place that chooses between them; tests/test_quantize.py checks both
against quantize.quantize_definition bit for bit.
"""

from __future__ import annotations

import math

import torch

from fp8lab.numerics import kernels
from fp8lab.numerics.formats import FloatFormat, cast, round_stochastic, uniform_draws
from fp8lab.numerics.scaling import TensorScaling, padded_blocks

__all__ = ["CHUNK_ELEMENTS", "GPU_CHUNK_ELEMENTS", "draws", "folds", "kernel_input", "kernel_parameters",
           "plain_pass", "scale_and_cast"]

# rows of blocks handled per step of the scale-and-cast loop: ~1 MiB of float32 at a time
# stays in cache, so x is read once and the fp8 result written once
CHUNK_ELEMENTS = 1 << 18
GPU_CHUNK_ELEMENTS = 1 << 24  # (64 MiB of float32 per temporary)


def kernel_parameters(spec: TensorScaling) -> bytes | None:
    """fp8lab.numerics.kernels' parameter block for these settings (the formats and the rule as data),
    made once and kept on the spec; None where the kernels don't store this format (the torch code runs).
    Either rounding: stochastic rounding's draws reach the kernel with each call."""
    memo = spec.__dict__  # a frozen dataclass's own dict: a cache beside its fields, as cached_property keeps
    if "kernel_parameters" not in memo:
        # (one block per settings, shared by every spec that has them: quantize() makes a spec per call)
        key = (spec.fmt, spec.scale_rule, spec.margin, spec.scale_fmt, spec.two_level, spec.scale_floor)
        if key not in _PARAMETERS:
            _PARAMETERS[key] = kernels.parameters(spec)
        memo["kernel_parameters"] = _PARAMETERS[key]
    return memo["kernel_parameters"]


_PARAMETERS: dict[tuple, bytes | None] = {}  # kernel_parameters' blocks, by settings (a few dozen at most)


def kernel_input(x2d: torch.Tensor, spec: TensorScaling, amax: torch.Tensor | None) -> torch.Tensor | None:
    """x[M, K] as float32 for the C kernel, where it runs: on the CPU, with the kernels on (kernels.engine(),
    decided once per process), for settings it stores (kernel_parameters) and tensors it reads (accepts).
    None: the torch code runs."""
    if kernel_parameters(spec) is None or x2d.device.type != "cpu" or not kernels.engine().kernels:
        return None
    x32 = x2d if x2d.dtype == torch.float32 else x2d.to(torch.float32)  # (the kernel reads float32)
    return x32 if kernels.accepts(x32) and (amax is None or kernels.accepts(amax)) else None


def plain_pass(x: torch.Tensor, spec: TensorScaling, values: bool | None,
               amax: torch.Tensor | float | None = None) -> tuple[kernels.Fused, bool] | None:
    """quantize_with's kernel pass for the tensor it meets most, a GEMM operand: x a plain 2-D float32 CPU tensor,
    nothing counted, rounding to nearest, no amax given or one for the whole tensor (delayed scaling's, per
    tensor: a float32 CPU value, finite and >= 0, or NaN), so nothing to check, widen, draw or restore but what the
    kernel call checks itself. (The kernel's answer, whether it folded), the same call and bits as quantize_with's
    general kernel branch; None (that branch decides, and explains) for anything else, and where x holds an
    infinity."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 2 or spec.rounding != "nearest":
        return None
    if amax is not None and not _one_amax(amax, spec):
        return None
    shape = tuple(x.shape)
    template = kernel_parameters(spec)
    if template is None or 0 in shape or not kernels.engine().kernels or not kernels.accepts(x):
        return None
    block = spec.granularity.block_shape(shape)
    fold = folds(block, shape, spec)
    fused = kernels.quantize(x, block, template, amax, fold=fold, values=values)
    if fused is None or (fused.nan and bool(torch.isinf(x).any())):  # (a NaN propagates to its block)
        return None
    return fused, fold


def _one_amax(amax: torch.Tensor | float, spec: TensorScaling) -> bool:
    """Whether `amax` is one amax the plain pass takes as it is: per tensor scaling's, a float32 CPU tensor of one
    value, finite and >= 0, or NaN (quantize's general branch refuses the others, with its reasons)."""
    if not (spec.granularity.whole_tensor and isinstance(amax, torch.Tensor) and amax.dtype == torch.float32
            and amax.numel() == 1 and kernels.accepts(amax)):
        return False
    value = float(amax)
    return not (value < 0 or math.isinf(value))


def draws(x2d: torch.Tensor, spec: TensorScaling, generator: torch.Generator | None) -> torch.Tensor | None:
    """Stochastic rounding's draws for the C kernel's pass over x[M, K] (a CPU tensor), one per element in order:
    formats.uniform_draws' numbers, by kernels.uniform_draws (torch's generator in C, ten times torch.rand's speed)
    where a CPU generator is given and kernels.draws_like_torch(), else by torch.rand itself (torch's default
    generator, which any thread may draw from at once, stays torch.rand's). None: rounding to nearest draws none."""
    if spec.rounding != "stochastic":
        return None
    if generator is not None and generator.device.type == "cpu" and kernels.draws_like_torch():
        return kernels.uniform_draws(tuple(x2d.shape), generator)
    return uniform_draws(x2d, generator)


def folds(block: tuple[int, int], shape: tuple[int, int], spec: TensorScaling) -> bool:
    """Whether the kernel writes values * block scale instead of the values: where a GEMM that reads the tensor
    contracts along a dim its scales vary on, and so multiplies the folded values. 1 x c blocks are read as they
    lie (folded where narrower than K); r x 1 blocks (quantized down the columns) are read transposed (folded where
    shorter than M); 2-D blocks (a weight's, read both ways) where they split either dim: the GEMM that reads them
    along one scale per row widens the codes instead (QuantizedTensor.values). Power-of-two scales are always
    folded: a GEMM folds them exactly (gemm.emulation). Blocks spanning a whole row or column otherwise have one
    scale per row or column, which a GEMM applies to its output."""
    (r, c), (m, k) = block, shape
    if spec.powers_of_two:
        return True
    if r == 1 or c == 1:
        return c < k if r == 1 else r < m
    return r < m or c < k


def scale_and_cast(x2d: torch.Tensor, block: tuple[int, int], inverse: torch.Tensor, fmt: FloatFormat,
                   draws: torch.Tensor | None = None) -> torch.Tensor:
    """data[M, K] = cast(x * inverse[block], fmt) in fmt.storage_dtype, in chunks of block rows.

    x2d: [M, K] float32, bfloat16 or float16 (widened to float32 a chunk at a time: every value
    is exact there); inverse: [ceil(M/r), ceil(K/c)] float32 (or one value). draws: None (round to
    nearest) or [M, K] uniform draws for stochastic rounding, cut into chunks alongside x.
    """
    m, k = x2d.shape
    if inverse.numel() == 1:  # one scale: any layout will do, so cut x into rows that chunk well
        width = 1024 if x2d.numel() % 1024 == 0 else k
        blocks, inv = x2d.reshape(-1, 1, 1, width), inverse.reshape(())  # (rows, 1, 1, width)
        noise = None if draws is None else draws.reshape(-1, 1, 1, width)
    else:
        blocks, inv = padded_blocks(x2d, block), inverse[:, None, :, None]  # (MB, r, KB, c), (MB, 1, KB, 1)
        noise = None if draws is None else padded_blocks(draws, block)
    out = torch.empty(blocks.shape, dtype=fmt.storage_dtype, device=x2d.device)
    mb, per_row = blocks.shape[0], max(blocks[0].numel(), 1)
    # chunks bound the float32 temporaries (x widened, times the inverse, clamped): on the CPU to
    # what stays in its cache, on a GPU to GPU_CHUNK_ELEMENTS, whatever x's size and dtype
    chunk = CHUNK_ELEMENTS if blocks.device.type == "cpu" else GPU_CHUNK_ELEMENTS
    step = max(1, chunk // per_row)
    for start in range(0, mb, step):
        stop = min(start + step, mb)
        scaled = blocks[start:stop].float() * (inv if inv.dim() == 0 else inv[start:stop])
        out[start:stop] = (cast(scaled, fmt, fmt.storage_dtype) if noise is None
                           else round_stochastic(scaled, fmt, noise[start:stop]).to(fmt.storage_dtype))
    if inverse.numel() == 1:
        return out.reshape(m, k)
    data = out.reshape(blocks.shape[0] * blocks.shape[1], -1)  # (MB * r, KB * c)
    return data if data.shape == (m, k) else data[:m, :k].contiguous()
