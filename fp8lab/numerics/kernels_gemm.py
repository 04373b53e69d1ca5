"""The emulated GEMM's C kernels: its operands' values from their codes, its definition's loop, its epilogue.

Public: widens(data) and widen_codes(data) (formats.widen's twin: FP8 codes' float32 values, by a table), segment_mm(a,
b, sa, sb, seg) (the definition's whole loop in one call, where every partial sum is exact), scale_outer_(out, a, b,
part) (both operands' scales, per row or one, applied to a GEMM's output, or to one K segment's partial sums added to
it), add_row_(out, row) (a bias); GEMM_KERNELS (the C functions, of all the kernels', that compute a GEMM itself).
Each computes its torch twin's bits (formats.widen, the loop and _scale_outer_ in fp8lab.gemm.emulation, torch's add_;
tests/numerics/test_kernels_gemm.py compares each pair); what C may read, the buffers it writes and the calls
themselves are fp8lab.numerics.kernels'.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from fp8lab.numerics import kernels
from fp8lab.numerics.formats import widen

__all__ = ["GEMM_KERNELS", "add_row_", "scale_outer_", "segment_mm", "widen_codes", "widens"]

# the C functions that compute a GEMM itself (work a torch matmul does where they do not run); every other kernel is
# a pass over an operand or an output (quantize, transform, draws, widen, scales): `bench train --parts` sums those
GEMM_KERNELS = frozenset({"fp8lab_segment_mm"})

_BYTE_CODES = (torch.float8_e4m3fn, torch.float8_e5m2)


def widens(data: torch.Tensor) -> bool:
    """Whether widen_codes (below) may read `data`: the kernels on, one-byte FP8 codes in a plain CPU tensor with
    memory of its own, contiguous or a 2-D transposed view of contiguous codes (else formats.widen runs)."""
    return (kernels.engine().kernels and data.dtype in _BYTE_CODES and kernels.own_memory(data) and data.numel() > 0
            and (data.is_contiguous() or (data.dim() == 2 and data.t().is_contiguous())))


@lru_cache(maxsize=len(_BYTE_CODES))
def _widen_table(dtype: torch.dtype) -> torch.Tensor:
    """The float32 value of each of a byte format's 256 codes, as formats.widen gives it (NaN bits included)."""
    return widen(torch.arange(256, dtype=torch.uint8, device="cpu").view(dtype)).contiguous()


@kernels.opaque_to_compile
def widen_codes(data: torch.Tensor) -> torch.Tensor:
    """formats.widen(data), by the kernel: each code's float32 value looked up in a table of formats.widen's
    own 256 values (the same bits), data's shape and layout (a transposed view's values are one too: a GEMM's
    summation order may follow the layout). data: what widens() allows."""
    if not widens(data):
        raise ValueError(f"fp8lab.numerics.kernels_gemm.widen_codes takes float8 CPU codes, contiguous or transposed, "
                         f"got a {type(data).__name__} of {data.dtype} on {data.device}")
    if not data.is_contiguous():  # (M, K) viewing contiguous (K, M) codes
        return widen_codes(data.t()).t()
    table = _widen_table(data.dtype)
    out = kernels.empty_float32(*data.shape)
    kernels.call("fp8lab_widen", data.data_ptr(), data.numel(), table.data_ptr(), out.data_ptr())
    return out


_SEGMENT_COLS = 64  # the columns of segment_mm's tiles of outputs: _kernels.c's SEGMENT_COLS


@kernels.opaque_to_compile
def segment_mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, seg: int) -> torch.Tensor:
    """The emulated GEMM's definition in one call, where every partial sum is exact: out[M, N] float32, the sum
    over K segments of seg columns, in order from 0, of (a[:, s] @ b[:, s].T) * (sa[s, :, None] * sb[s, None, :]),
    each product and sum rounded to float32 as the loop in fp8lab.gemm.emulation forms them with scale_outer_.
    a[M, K] and b[N, K] float32 values, or FP8 codes that widens() allows (their values, widen_codes', are read
    on the way: no float32 copy of a), sa[S, M] and sb[S, N] each segment's scales, S = ceil(K / seg). The
    kernel adds each partial sum's products in its own order: the caller passes operands whose partial sums
    are exact in float32 whatever the order (E2M1 values), so the bits are the loop's. Each tile of outputs
    is one thread's (the same bits for any number of threads); without OpenMP it runs on the calling thread."""
    # a read in its own layout (wgrad's operands are transposed views), b copied once into the kernel's panels
    a_table = _widen_table(a.dtype) if widens(a) else None
    codes_b = b.dtype if widens(b) else None
    a = a if a_table is not None else kernels.resolved(a, "a")
    b = kernels.resolved(b, "b") if codes_b is None else b.view(torch.uint8)  # (codes laid out as bytes, widened once)
    sa, sb = kernels.readable(sa, "sa"), kernels.readable(sb, "sb")
    m, k = a.shape if a.dim() == 2 else (0, 0)
    n = b.shape[0] if b.dim() == 2 else 0
    segments = -(-k // seg) if seg >= 1 else 0
    if not (a.dim() == 2 and b.dim() == 2 and b.shape[1] == k and k >= 1 and seg >= 1
            and tuple(sa.shape) == (segments, m) and tuple(sb.shape) == (segments, n)):
        raise ValueError(f"segment_mm takes a[M, K], b[N, K], sa[S, M], sb[S, N] with S = ceil(K / seg), seg >= 1: "
                         f"got {tuple(a.shape)}, {tuple(b.shape)}, {tuple(sa.shape)}, {tuple(sb.shape)}, seg {seg}")
    # b in panels of 64 columns, each transposed, (NP / 64, K, 64), NP = N rounded up to 64 with zero columns: the
    # kernel's partial sums run along n, 64 columns of a tile at a time
    cols = -(-n // _SEGMENT_COLS) * _SEGMENT_COLS
    b, sb = (F.pad(b, (0, 0, 0, cols - n)), F.pad(sb, (0, cols - n))) if cols > n else (b, sb)
    panels = b.reshape(cols // _SEGMENT_COLS, _SEGMENT_COLS, k).transpose(1, 2).contiguous()
    panels = panels if codes_b is None else widen_codes(panels.view(codes_b))  # (code 0 pads: +0 in both formats)
    out = kernels.empty_float32(m, n)
    kernels.call("fp8lab_segment_mm", a.data_ptr(), kernels.pointer(a_table), a.stride(0), a.stride(1),
                 panels.data_ptr(), m, n, k, seg, sa.data_ptr(), sb.data_ptr(), out.data_ptr())
    return out


@kernels.opaque_to_compile
def scale_outer_(out: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor | None, part: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """out[M, N] *= a[m] * b[n], or with part[M, N], out += part * (a[m] * b[n]): in place, without
    the [M, N] factor and product matrices, the same bits as its torch twin in fp8lab.gemm.emulation
    (_scale_outer_). a: a scale per row [M], one value for every row, or None (no row scales, the factor is b[n]);
    b likewise per column [N]; not both None. out is written in place (_writable)."""
    m, n = out.shape if out.dim() == 2 else (-1, -1)
    a, b = (None if t is None else kernels.readable(t.to(torch.float32), name) for t, name in ((a, "a"), (b, "b")))
    part = None if part is None else kernels.readable(part, "part")
    if not (_writable(out) and (part is None or part.shape == out.shape) and (a is not None or b is not None)
            and all(t is None or t.numel() in (1, size) for t, size in ((a, m), (b, n)))):
        raise ValueError(f"scale_outer_ takes out[M, N] float32 contiguous (a plain CPU tensor), a[M] or one value "
                         f"or None, b[N] or one value or None (not both None) and part None or [M, N]: got "
                         f"{tuple(out.shape)}, {None if a is None else a.numel()}, {None if b is None else b.numel()}, "
                         f"{None if part is None else tuple(part.shape)}")
    a_step, b_step = (0 if t is None or t.numel() == 1 else 1 for t in (a, b))  # (0: one value for all)
    kernels.call("fp8lab_scale_outer", out.data_ptr(), kernels.pointer(part), m, n, kernels.pointer(a), a_step,
                 kernels.pointer(b), b_step)
    return out


@kernels.opaque_to_compile
def add_row_(out: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """out[M, N] += row[N] in place (a layer's bias): torch's out.add_(row), the same bits, on the calling thread
    below parallel_min's count (where torch would wake its threads for a few microseconds of work)."""
    row = kernels.readable(row.to(torch.float32), "row")
    if not (_writable(out) and row.numel() == out.shape[1]):
        raise ValueError(f"add_row_ takes out[M, N] float32 contiguous (a plain CPU tensor) and row[N]: got "
                         f"{tuple(out.shape)}, {row.numel()}")
    kernels.call("fp8lab_add_row", out.data_ptr(), out.shape[0], out.shape[1], row.data_ptr())
    return out


def _writable(out: torch.Tensor) -> bool:
    """Whether C may write out[M, N] in place as it lies: kernels.accepts() it, 2-D, row-major contiguous, no pending
    negation or conjugation, 4-byte aligned."""
    return (kernels.accepts(out) and out.dim() == 2 and out.is_contiguous() and not out.is_neg() and not out.is_conj()
            and out.data_ptr() % 4 == 0)
