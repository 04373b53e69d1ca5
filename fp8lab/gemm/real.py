"""The real FP8 GEMM: torch's scaled matmuls, called as each GPU generation accepts them.

Public: real_mm(a_q, b_q, arch, cuda) (a_q @ b_q.T on the tensors' device, or KernelUnavailable
with the reason), plan_gemm (which kernel, decided from the two operands and the GPU generation),
KernelPlan, prepare_real_mm, PreparedGemm, operand_scaling, swizzle_scales, KERNEL_KINDS.
Tested on the CPU against a stand-in of torch's CUDA checks (tests/scaled_mm_standin.py) and
torch's own meta kernels. `python -m fp8lab doctor` prints what runs real on this machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fp8lab.gemm.emulation import k_blocks
from fp8lab.numerics.formats import E2M1, E4M3, E5M2, E8M0, e8m0_codes
from fp8lab.numerics.quantize import QuantizedTensor

__all__ = [
    "FAST_ACCUM_KINDS",
    "KERNEL_KINDS",
    "Arch",
    "KernelPlan",
    "KernelUnavailable",
    "PreparedGemm",
    "check_fast_accum",
    "operand_scaling",
    "pair_kind",
    "plan_gemm",
    "prepare_real_mm",
    "real_mm",
    "resolve_target",
    "sm_name",
    "swizzle_scales",
]


# ---- the real backend: torch's scaled matmuls, as each GPU generation accepts them ----------------------
#
# What torch's CUDA kernels accept (aten/src/ATen/native/cuda/ScaledBlas.cpp, RowwiseScaledMM.cu):
#   - mat_a [M, K] row-major and mat_b [K, N] column-major (cuBLASLt FP8 multiplies "TN" only;
#     CUTLASS rowwise checks a.stride(1) == 1 and b.stride(0) == 1): a transposed view is not
#     contiguous, so operands are copied into that layout; M, N, K divisible by 16;
#   - TensorWise: one float32 scale each; never two E5M2 operands;
#   - RowWise: scale_a (M, 1), scale_b (1, N), float32, contiguous; cuBLAS on sm_90 with
#     cuBLAS >= 12.9, else CUTLASS (sm_89, sm_100+), which wants an E4M3 b (RowwiseScaledMM.cu,
#     check_inputs: bf16, fp16 or fp32 outputs in current torch; bf16 only in CUTLASS kernels
#     before torch 2.13);
#   - use_fast_accum: TensorWise and RowWise take it; cuBLAS refuses it with 1x128 / 128x128 block
#     scaling (aten/src/ATen/cuda/CUDABlas.cpp, get_scale_mode), the MX kernel ignores it (torch
#     passes false), and NVFP4 refuses it (ScaledBlas.cpp, Float4_e2m1fn_x2);
#   - BlockWise1x128 / 128x128 (DeepSeek-V3): sm_90 only, cuBLAS >= 12.9, E4M3 both; a 1x128
#     operand's scales (rows, ceil(K/128)) outer-dim-major (strides (1, rows)); a 128x128
#     operand's scales (round_up(ceil(K/128), 4), ceil(rows/128)) with strides (1, round_up(...));
#   - BlockWise1x32 (MX: E4M3 elements, E8M0 scales) and BlockWise1x16 (NVFP4: packed E2M1,
#     E4M3 scales, with a float32 tensor scale on both operands or on neither: ScaledBlasUtils.cpp
#     check_nvfp4_recipe, check_nvfp4_recipe_single_scale): sm_100+, scales in the 32x4x4
#     swizzled (128-row x 4-column tile) layout, one scale per row per K block, contiguous.

Arch = tuple[int, int]


class KernelUnavailable(RuntimeError):
    """No torch scaled_mm kernel takes this pair of operands on this GPU; str() is the reason."""


# how one operand [rows, K] is scaled, in scaled_mm's vocabulary
TENSORWISE, ROWWISE = "TensorWise", "RowWise"
B1X128, B128X128, B1X32, B1X16 = "BlockWise1x128", "BlockWise128x128", "BlockWise1x32", "BlockWise1x16"
BLOCKWISE_KINDS = (f"{B1X128} x {B128X128}", f"{B128X128} x {B1X128}", f"{B1X128} x {B1X128}")
KERNEL_KINDS = (TENSORWISE, ROWWISE, *BLOCKWISE_KINDS, B1X32, B1X16)
_OUT_DTYPE = {TENSORWISE: torch.float32, ROWWISE: torch.float32, B1X32: torch.bfloat16, B1X16: torch.bfloat16,
              **dict.fromkeys(BLOCKWISE_KINDS, torch.float32)}
FAST_ACCUM_KINDS = (TENSORWISE, ROWWISE)  # the kernels that take use_fast_accum (see above)
_K_MULTIPLE = {TENSORWISE: 16, ROWWISE: 16, B1X32: 32, B1X16: 32, **dict.fromkeys(BLOCKWISE_KINDS, 128)}


def _describe(q: QuantizedTensor) -> str:
    scales = q.scale_fmt.name if q.scale_fmt is not None else "float32"
    extra = ", +tensor scale" if q.tensor_scale is not None else ""
    return f"{q.fmt.name} {q.granularity.label} ({scales} scales{extra})"


def operand_scaling(q: QuantizedTensor) -> str | None:
    """How scaled_mm would name the scaling of an operand q[rows, K], or None if it has no name.

    PerTensor -> TensorWise; PerRow -> RowWise; float32 blocks 128 wide along K -> BlockWise1x128
    (BlockWise128x128 for 128x128 blocks); E8M0-scaled blocks 32 wide -> BlockWise1x32 and
    E4M3-scaled E2M1 blocks 16 wide -> BlockWise1x16. Blocks taller than one row (NVFP4's 16x16
    weight blocks, say) reach the kernel as one scale per row per K block: the same numbers.
    """
    g = q.granularity
    if g.whole_rows:  # per tensor or per row
        return g.scaled_mm_name if q.scale_fmt is None and q.tensor_scale is None else None
    if q.scale_fmt is None and q.tensor_scale is None and q.fmt in (E4M3, E5M2) and g.cols == 128:
        return B128X128 if g.rows == 128 else B1X128
    if q.scale_fmt == E8M0 and q.tensor_scale is None and g.cols == 32 and q.fmt in (E4M3, E5M2):
        return B1X32
    if q.scale_fmt == E4M3 and q.fmt == E2M1 and g.cols == 16:
        return B1X16
    return None


def pair_kind(a_q: QuantizedTensor, b_q: QuantizedTensor) -> str:
    """The kernel family for a pair, or KernelUnavailable naming both scalings.

    Where a coarser operand meets a finer one, its scales are restated at the finer grain, all
    equal within each old block (exact): per tensor beside per row -> RowWise; per tensor or per
    row beside 1x128/128x128 blocks -> 1x128; two 128x128 operands -> a as 1x128 (torch has no
    128x128 x 128x128 kernel)."""
    sa, sb = operand_scaling(a_q), operand_scaling(b_q)
    coarse, deepseek = {TENSORWISE, ROWWISE}, {B1X128, B128X128}
    if sa in coarse and sb in coarse:
        return TENSORWISE if sa == sb == TENSORWISE else ROWWISE
    if sa in coarse | deepseek and sb in coarse | deepseek:
        ka = B128X128 if sa == B128X128 and sb != B128X128 else B1X128
        kb = B128X128 if sb == B128X128 else B1X128
        return f"{ka} x {kb}"
    if sa == sb and sa in (B1X32, B1X16):
        return sa
    raise KernelUnavailable(
        f"no scaled_mm kernel multiplies {_describe(a_q)} by {_describe(b_q)} (torch's kernels take "
        "per-tensor/per-row pairs, 1x128 with 128x128 or 1x128 float32 blocks, 1x32 E8M0 pairs, 1x16 NVFP4 pairs)")


def _scales_along_k(q: QuantizedTensor, width: int) -> torch.Tensor:
    """q's scales as one per row per `width`-wide K block: (R, ceil(K/width)) float32. Valid where
    q's own scales are constant on each such block (per tensor, per row, blocks whose width is a
    multiple of `width` or spans K); rows of taller blocks repeat their block's scale."""
    s, w = k_blocks(q)  # (R, K blocks of q), q's block width along K
    k = q.shape[1]
    if w < k and w % width:
        raise KernelUnavailable(f"{_describe(q)}: scales {w} wide cannot be restated {width} wide")
    reps = -(-w // width)
    return s.float().repeat_interleave(reps, 1)[:, : -(-k // width)]


def sm_name(arch: Arch) -> str:
    """An architecture as CUDA names it: (9, 0) -> "sm_90"."""
    return f"sm_{arch[0]}{arch[1]}"


def _version(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(text).split(".")[:2])
    except ValueError:
        return ()


@dataclass(frozen=True)
class KernelPlan:
    """How fp8lab calls torch's scaled matmul for one pair of operands on one GPU generation.

    kind: the kernel family (KERNEL_KINDS); entry: "torch._scaled_mm" (TensorWise, RowWise) or
    "torch.nn.functional.scaled_mm" (block scalings); k_multiple: K is zero-padded to a multiple
    of it (M and N to 16); out_dtype: what the kernel writes (float32 where the kernel offers
    it, else bfloat16); fast_accum: whether the kernel takes use_fast_accum; library: "cuBLASLt" or
    "CUTLASS"; formats: the two operands' element formats (the dtypes the kernel runs on);
    two_level: NVFP4 with tensor scales. Two calls with equal plans run the same kernel.
    """

    kind: str
    arch: Arch
    entry: str
    k_multiple: int
    out_dtype: torch.dtype
    fast_accum: bool
    library: str
    formats: tuple[str, str] = ("e4m3", "e4m3")
    two_level: bool = False

    @property
    def label(self) -> str:
        return f"{self.kind} {self.formats[0]} x {self.formats[1]} on {sm_name(self.arch)} ({self.library})"


def check_fast_accum(kind: str) -> None:
    """ValueError unless the kernel family `kind` takes use_fast_accum=True (FAST_ACCUM_KINDS)."""
    if kind not in FAST_ACCUM_KINDS:
        raise ValueError(f"use_fast_accum=True applies to the {' and '.join(FAST_ACCUM_KINDS)} kernels only, not "
                         f"{kind}: cuBLAS refuses it with 1x128 / 128x128 block scaling, the MX kernel ignores it "
                         "and torch refuses it for NVFP4; pass use_fast_accum=False")


def _cutlass_rowwise_float32() -> bool:
    """Whether this torch's CUTLASS rowwise kernel writes float32 (torch 2.13 on; bf16 only before)."""
    return _version(torch.__version__.split("+")[0]) >= (2, 13)


def plan_gemm(a_q: QuantizedTensor, b_q: QuantizedTensor, arch: Arch, cuda: str | None) -> KernelPlan:
    """The kernel call for a_q[M, K] @ b_q[N, K].T on a GPU of compute capability `arch` with
    torch built for CUDA `cuda`; raises KernelUnavailable with the reason where there is none.
    Decided from the two operands (their scalings and formats), never from a recipe name."""
    arch = (int(arch[0]), int(arch[1]))
    if a_q.shape[1] != b_q.shape[1]:
        raise ValueError(f"operands must share K: a_q is {tuple(a_q.shape)} (M, K), b_q is {tuple(b_q.shape)} (N, K)")
    if arch < (8, 9):
        raise KernelUnavailable(f"FP8 GEMMs need sm_89 or newer, this is {sm_name(arch)}")
    kind = pair_kind(a_q, b_q)
    fa, fb = a_q.fmt, b_q.fmt
    formats = (fa.name, fb.name)
    if fa == E5M2 and fb == E5M2:
        raise KernelUnavailable("cuBLASLt has no E5M2 x E5M2 FP8 GEMM")
    v2 = "torch.nn.functional.scaled_mm"
    has_v2 = hasattr(torch.nn.functional, "scaled_mm")
    cublas_129 = _version(cuda) >= (12, 9)
    if kind == TENSORWISE:
        return KernelPlan(kind, arch, "torch._scaled_mm", 16, torch.float32, True, "cuBLASLt", formats)
    if kind == ROWWISE:
        cublas = arch[0] == 9 and cublas_129  # torch: cuBLAS from 12.9 on sm_90, CUTLASS elsewhere
        if not cublas and fb != E4M3:
            raise KernelUnavailable(f"the CUTLASS rowwise kernel ({sm_name(arch)}) needs an E4M3 b, got {fb.name}")
        out = torch.float32 if cublas or _cutlass_rowwise_float32() else torch.bfloat16
        return KernelPlan(kind, arch, "torch._scaled_mm", 16, out, True, "cuBLASLt" if cublas else "CUTLASS", formats)
    if kind in BLOCKWISE_KINDS:
        if arch[0] != 9:
            raise KernelUnavailable(
                f"DeepSeek-style 1x128/128x128 scaling runs on sm_90 (Hopper) only, this is {sm_name(arch)}")
        if not cublas_129:
            raise KernelUnavailable(f"1x128/128x128 scaling needs cuBLAS >= 12.9, this torch has CUDA {cuda}")
        if fa != E4M3 or fb != E4M3:
            raise KernelUnavailable(f"1x128/128x128 scaling needs E4M3 operands, got {fa.name} and {fb.name}")
    elif kind == B1X32:
        if arch < (10, 0):
            raise KernelUnavailable(
                f"MX block scaling (1x32, E8M0) needs sm_100 (Blackwell) or newer, this is {sm_name(arch)}")
        if fa != E4M3 or fb != E4M3:
            raise KernelUnavailable(f"torch's MXFP8 kernel takes E4M3 operands, got {fa.name} and {fb.name}")
    elif kind == B1X16:
        if arch < (10, 0):
            raise KernelUnavailable(f"NVFP4 block scaling (1x16, E4M3 scales) needs sm_100 (Blackwell) or newer, "
                                    f"this is {sm_name(arch)}")
        if (a_q.tensor_scale is None) != (b_q.tensor_scale is None):
            raise KernelUnavailable("torch's NVFP4 kernels take a tensor scale on both operands (two-level) or on "
                                    "neither; this pair has one on one operand only")
    if not has_v2:
        raise KernelUnavailable(f"{kind} needs torch.nn.functional.scaled_mm (torch >= 2.9), this is torch "
                                f"{torch.__version__}")
    return KernelPlan(kind, arch, v2, _K_MULTIPLE[kind], _OUT_DTYPE[kind], kind in FAST_ACCUM_KINDS, "cuBLASLt",
                      formats, kind == B1X16 and a_q.tensor_scale is not None)


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


def _padded(t: torch.Tensor, rows: int, cols: int, value: float, device: torch.device) -> torch.Tensor:
    """t[r, c] in a fresh contiguous [rows, cols] tensor on `device`, the rest `value`."""
    if tuple(t.shape) == (rows, cols) and t.is_contiguous() and t.device == device:
        return t
    out = torch.full((rows, cols), value, dtype=t.dtype, device=device)
    out[: t.shape[0], : t.shape[1]].copy_(t)
    return out


def _codes(q: QuantizedTensor, rows: int, k: int, device: torch.device) -> torch.Tensor:
    """q's FP8 codes as a row-major contiguous [rows, k] tensor (zero-padded) on `device`."""
    return _padded(q.data.view(torch.uint8), rows, k, 0, device).view(q.data.dtype)


def _fp4_packed(q: QuantizedTensor, rows: int, k: int, device: torch.device) -> torch.Tensor:
    """q's E2M1 codes zero-padded to [rows, k], two per byte along K (low nibble first)."""
    codes = _padded(q.codes(), rows, k, 0, device)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous().view(torch.float4_e2m1fn_x2)


def _row_scales(q: QuantizedTensor, rows: int, device: torch.device) -> torch.Tensor:
    """One float32 scale per row, [rows, 1] contiguous, 1 in padding (per tensor: repeated)."""
    s = q.scale.float()
    s = s.reshape(1, 1).expand(q.shape[0], 1) if s.dim() == 0 else s.reshape(q.shape[0], 1)
    return _padded(s, rows, 1, 1.0, device)


def _swizzled(codes: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Scale codes (rows, K blocks) as uint8 -> the 32x4x4 layout, viewed as `dtype`, on device."""
    return swizzle_scales(codes.to(device)).view(dtype)


@dataclass
class PreparedGemm:
    """One scaled_mm call with every argument made: run() replays the kernel alone (what a
    benchmark times), result() runs it and returns a @ b.T unpadded, in the kernel's dtype."""

    plan: KernelPlan
    fn: Callable[..., torch.Tensor]
    args: tuple
    kwargs: dict
    m: int
    n: int

    def run(self) -> torch.Tensor:
        return self.fn(*self.args, **self.kwargs)

    def result(self) -> torch.Tensor:
        return self.run()[: self.m, : self.n]


def prepare_real_mm(a_q: QuantizedTensor, b_q: QuantizedTensor, plan: KernelPlan, device: torch.device,
                    use_fast_accum: bool = False) -> PreparedGemm:
    """Make every argument of the scaled_mm call `plan` describes, on `device`.

    Operands: a as mat_a [M, K] row-major; b [N, K] row-major, so that mat_b = b.t() is the
    column-major [K, N] the kernels want (transposed views are copied into that layout).
    M and N are zero-padded to multiples of 16 and K to plan.k_multiple; padded rows get
    scale 1 (zero codes contribute nothing whatever their scale)."""
    if use_fast_accum:
        check_fast_accum(plan.kind)
    if plan.kind == B1X16 and {a_q.tensor_scale is not None, b_q.tensor_scale is not None} != {plan.two_level}:
        raise ValueError("this NVFP4 plan was made for operands " + ("with" if plan.two_level else "without")
                         + " tensor scales: plan these operands with plan_gemm")
    m, k = a_q.shape
    n = b_q.shape[0]
    mp, np_, kp = _up(m, 16), _up(n, 16), _up(k, plan.k_multiple)
    kind = plan.kind
    if kind == B1X16:
        mat_a, b_rows = _fp4_packed(a_q, mp, kp, device), _fp4_packed(b_q, np_, kp, device)
    else:
        mat_a, b_rows = _codes(a_q, mp, kp, device), _codes(b_q, np_, kp, device)
    mat_b = b_rows.t()  # (K, N), column-major
    if kind in (TENSORWISE, ROWWISE):
        if kind == TENSORWISE:
            sa, sb = (q.scale.float().reshape(1).to(device) for q in (a_q, b_q))
        else:
            sa, sb = _row_scales(a_q, mp, device), _row_scales(b_q, np_, device).t().contiguous()  # (M, 1), (1, N)
        kwargs = {"scale_a": sa, "scale_b": sb, "out_dtype": plan.out_dtype, "use_fast_accum": use_fast_accum}
        return PreparedGemm(plan, torch._scaled_mm, (mat_a, mat_b), kwargs, m, n)
    ST, SW = F.ScalingType, F.SwizzleType
    if kind in BLOCKWISE_KINDS:
        kb = kp // 128
        l4 = _up(kb, 4)

        def outer_major(q: QuantizedTensor, rows: int) -> torch.Tensor:  # 1x128: (rows, K/128), strides (1, rows)
            return _padded(_scales_along_k(q, 128), rows, kb, 1.0, device).t().contiguous().t()

        def k_major(q: QuantizedTensor, rows: int) -> torch.Tensor:  # 128x128: (L4, rows/128), strides (1, L4)
            return _padded(q.scale.float(), _up(rows, 128) // 128, l4, 1.0, device).t()

        kinds = kind.split(" x ")
        sa = outer_major(a_q, mp) if kinds[0] == B1X128 else k_major(a_q, mp)
        sb = outer_major(b_q, np_) if kinds[1] == B1X128 else k_major(b_q, np_)
        args = (mat_a, mat_b, sa, getattr(ST, kinds[0]), sb, getattr(ST, kinds[1]))
        kwargs = {"output_dtype": plan.out_dtype, "use_fast_accum": use_fast_accum}
        return PreparedGemm(plan, F.scaled_mm, args, kwargs, m, n)
    if kind == B1X32:
        sa = _swizzled(e8m0_codes(_scales_along_k(a_q, 32)), torch.float8_e8m0fnu, device)
        sb = _swizzled(e8m0_codes(_scales_along_k(b_q, 32)), torch.float8_e8m0fnu, device)
        kwargs = {"swizzle_a": SW.SWIZZLE_32_4_4, "swizzle_b": SW.SWIZZLE_32_4_4, "output_dtype": plan.out_dtype}
        return PreparedGemm(plan, F.scaled_mm, (mat_a, mat_b, sa, ST.BlockWise1x32, sb, ST.BlockWise1x32), kwargs, m, n)
    # BlockWise1x16 (NVFP4): E4M3 block scales, one per row per 16 elements, and the tensor scales
    sa, sb = (_swizzled(_scales_along_k(q, 16).to(torch.float8_e4m3fn).view(torch.uint8), torch.float8_e4m3fn, device)
              for q in (a_q, b_q))
    if not plan.two_level:
        args = (mat_a, mat_b, sa, ST.BlockWise1x16, sb, ST.BlockWise1x16)
        kwargs = {"swizzle_a": SW.SWIZZLE_32_4_4, "swizzle_b": SW.SWIZZLE_32_4_4, "output_dtype": plan.out_dtype}
    else:
        ta, tb = (q.tensor_scale.float().reshape(()).to(device) for q in (a_q, b_q))
        recipe = [ST.BlockWise1x16, ST.TensorWise]
        args = (mat_a, mat_b, [sa, ta], recipe, [sb, tb], recipe)
        kwargs = {"swizzle_a": [SW.SWIZZLE_32_4_4, SW.NO_SWIZZLE], "swizzle_b": [SW.SWIZZLE_32_4_4, SW.NO_SWIZZLE],
                  "output_dtype": plan.out_dtype}
    return PreparedGemm(plan, F.scaled_mm, args, kwargs, m, n)


def resolve_target(a_q: QuantizedTensor, arch: Arch | None, cuda: str | None) -> tuple[Arch, str | None, torch.device]:
    """(arch, CUDA version, device) a real GEMM of a_q plans for: the given ones, else a_q's own GPU's."""
    device = a_q.data.device
    if arch is None:
        if device.type != "cuda":
            raise KernelUnavailable(
                "no CUDA device" if not torch.cuda.is_available() else f"the operands are on {device.type}, not a GPU")
        arch = torch.cuda.get_device_capability(device)
    return (int(arch[0]), int(arch[1])), (torch.version.cuda if cuda is None else cuda), device


def real_mm(a_q: QuantizedTensor, b_q: QuantizedTensor, arch: Arch | None = None, cuda: str | None = None,
            use_fast_accum: bool = False) -> torch.Tensor:
    """a_q[M, K] @ b_q[N, K].T through torch's scaled matmul, called exactly as on a GPU of
    compute capability `arch` ((9, 0) ...; None: the tensors' own device) with torch built for
    CUDA `cuda` ("12.9"; None: torch.version.cuda), on the tensors' own device.

    Returns [M, N] unpadded in the kernel's output dtype (KernelPlan.out_dtype). Raises
    KernelUnavailable, whose message is the reason doctor shows, where that architecture has no
    kernel for the pair. See plan_gemm for the choice and prepare_real_mm for the call.
    """
    arch, cuda, device = resolve_target(a_q, arch, cuda)
    plan = plan_gemm(a_q, b_q, arch, cuda)
    return prepare_real_mm(a_q, b_q, plan, device, use_fast_accum).result()


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """Block scales [R, KB] in cuBLAS's tiled layout for 1x32 / 1x16 block scaling.

    The matrix is padded (zeros) to 128-row x 4-column tiles; tiles are stored one after
    another (row tiles outer); inside a tile, element (r, c) with r = 32 i + j sits at offset
    16 j + 4 i + c. Returns a flat contiguous tensor of ceil(R/128)*128 * ceil(KB/4)*4.
    Works on any dtype by moving bytes: float8 scales (E8M0, E4M3) are permuted as uint8.
    """
    if scales.dtype.is_floating_point and scales.element_size() == 1:  # float8: E8M0 (torch >= 2.7), E4M3, E5M2
        return swizzle_scales(scales.view(torch.uint8)).view(scales.dtype)
    r, kb = scales.shape
    rt, ct = math.ceil(r / 128), math.ceil(kb / 4)
    padded = torch.zeros(rt * 128, ct * 4, dtype=scales.dtype, device=scales.device)
    padded[:r, :kb] = scales
    # (row tile, 4 row groups of 32, 32 rows, col tile, 4 cols) -> (row tile, col tile, 32, 4 groups, 4 cols)
    tiles = padded.reshape(rt, 4, 32, ct, 4).permute(0, 3, 2, 1, 4)
    return tiles.contiguous().flatten()
