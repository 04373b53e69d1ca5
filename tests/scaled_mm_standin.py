"""A CPU stand-in for torch's CUDA scaled matmuls: the checks the kernels make, then the product.

Written from PyTorch's source (pytorch main):
  aten/src/ATen/native/cuda/ScaledBlas.cpp      (_scaled_mm_out_cuda, _scaled_mm_cuda_v2_out and
                                                 the per-recipe functions it dispatches to: MX passes
                                                 use_fast_accum=false whatever it is given; FP4 operands
                                                 refuse use_fast_accum)
  aten/src/ATen/native/ScaledBlasUtils.cpp      (check_*_recipe: which (dtype, recipe, scale dtype)
                                                 combinations the v2 entry dispatches; NVFP4 with a
                                                 tensor scale on both operands or on neither)
  aten/src/ATen/cuda/CUDABlas.cpp               (get_scale_mode: cuBLAS refuses use_fast_accum with
                                                 1x128 and 128x128 block scaling)
  aten/src/ATen/native/cuda/RowwiseScaledMM.cu  (check_inputs of the CUTLASS rowwise kernel: an E4M3
                                                 or E5M2 a, an E4M3 b; bf16, fp16 or fp32 output)
  aten/src/ATen/native/cuda/cuBlasCommonArgs.h  (how operand layouts reach cuBLASLt, whose FP8
                                                 GEMM multiplies a row-major A by a column-major B)
It is not torch's code and does not run it: it applies the checks that decide whether torch
accepts a call on a GPU of compute capability `arch` (and with cuBLAS >= 12.9 or not), raising
the exception type torch raises, and computes what the kernel defines in float64, rounded
once to the output dtype. fp8lab is not imported here: the stand-in is the tests' oracle of
what torch accepts, independent of the code under test.

    with StandIn((9, 0)).installed(monkeypatch): ...   # torch._scaled_mm, F.scaled_mm replaced
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FP4 = torch.float4_e2m1fn_x2
E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def check(cond: bool, msg: str, exc: type[Exception] = RuntimeError) -> None:
    """TORCH_CHECK (RuntimeError), TORCH_CHECK_VALUE (ValueError), TORCH_CHECK_NOT_IMPLEMENTED."""
    if not cond:
        raise exc(msg)


# ---- decoding what the kernel reads ------------------------------------------------------------------


def unswizzle(scale: torch.Tensor, rows: int, kblocks: int) -> torch.Tensor:
    """The 32x4x4 layout (128-row x 4-column tiles, row tiles outer) back to (rows, kblocks), float64.

    cuBLAS block-scaling docs: element (r, c) sits at tile (r // 128, c // 4), offset inside the
    tile (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4.
    """
    flat = scale.reshape(-1)
    col_tiles = ceil_div(kblocks, 4)
    r = torch.arange(rows)[:, None]
    c = torch.arange(kblocks)[None, :]
    offset = 512 * ((r // 128) * col_tiles + c // 4) + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    picked = flat[offset.reshape(-1)]
    if picked.dtype == torch.float8_e8m0fnu:
        codes = picked.view(torch.uint8).to(torch.float64)
        values = torch.where(codes == 255, torch.nan, torch.exp2(codes - 127))
    else:
        values = picked.to(torch.float64)
    return values.reshape(rows, kblocks)


def unpack_fp4(t: torch.Tensor) -> torch.Tensor:
    """Packed E2M1 pairs (low nibble first) along the last dim -> float64 values, twice as wide."""
    u = t.view(torch.uint8).to(torch.int64)
    codes = torch.stack([u & 0xF, u >> 4], dim=-1).reshape(*u.shape[:-1], -1)
    magnitude = E2M1_MAGNITUDES[codes & 7]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def is_row_major(t: torch.Tensor) -> bool:
    return t.stride(1) == 1 and t.stride(0) >= max(1, t.size(1))


def is_col_major(t: torch.Tensor) -> bool:
    return t.stride(0) == 1 and t.stride(1) >= max(1, t.size(0))


class StandIn:
    """torch._scaled_mm and torch.nn.functional.scaled_mm as a GPU of `arch` would answer them."""

    def __init__(self, arch: tuple[int, int] = (9, 0), cublas_129: bool = True) -> None:
        self.arch = arch
        self.cublas_129 = cublas_129
        self.calls: list[tuple[str, str]] = []  # (entry, kernel) per accepted call
        self.dtypes: list[tuple[torch.dtype, torch.dtype, torch.dtype]] = []  # (mat_a, mat_b, output) per call
        self.fail_next: Exception | None = None  # raise this once, from the next call (a transient failure)
        self._operands: tuple = (None, None)  # the current call's (mat_a, mat_b) dtypes

    @contextlib.contextmanager
    def installed(self, monkeypatch):
        monkeypatch.setattr(torch, "_scaled_mm", self.scaled_mm_v1)
        monkeypatch.setattr(F, "scaled_mm", self.scaled_mm_v2)
        yield self

    # ---- shared pieces --------------------------------------------------------------------------------
    def _arch_allowed(self, exc: type[Exception]) -> None:
        check(self.arch >= (8, 9), "torch._scaled_mm is only supported on CUDA devices with compute capability "
              ">= 9.0 or 8.9, or ROCm MI300+", exc)

    def _transient(self) -> None:
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err

    def _cublas_layout(self, a: torch.Tensor, b: torch.Tensor) -> None:
        # cuBlasCommonArgs: a layout that is neither row- nor column-major is copied contiguous
        # (row-major); cuBLASLt's FP8 GEMM then needs A row-major ("t") and B column-major ("n")
        a_ok = is_row_major(a) or not is_col_major(a)
        b_ok = is_col_major(b)
        check(a_ok and b_ok, "Only multiplication of row-major and column-major matrices is supported by cuBLASLt "
              f"(a strides {a.stride()}, b strides {b.stride()})")

    def _out(self, a_values: torch.Tensor, b_values: torch.Tensor, out_dtype: torch.dtype,
             alpha: float = 1.0) -> torch.Tensor:
        self.dtypes.append((self._operands[0], self._operands[1], out_dtype))
        return (alpha * (a_values @ b_values)).to(out_dtype)

    def _deepseek_support(self) -> None:
        check(self.arch[0] == 9, "DeepSeek style (1x128, 128x128) scaling only supported in CUDA for SM90",
              NotImplementedError)
        check(self.cublas_129, "DeepSeek style (1x128, 128x128) scaling requires cublasLt >= 12.9",
              NotImplementedError)

    def _rowwise(self, a, b, scale_a, scale_b, out_dtype, use_fast_accum) -> torch.Tensor:
        m, n = a.size(0), b.size(1)
        cutlass = self.arch[0] < 9 or not self.cublas_129 or self.arch[0] >= 10
        if cutlass:  # at::cuda::detail::f8f8bf16_rowwise -> check_inputs
            check(out_dtype in (torch.bfloat16, torch.float16, torch.float32),
                  "Only bf16, fp16, and fp32 high precision output types are supported for row-wise scaling.",
                  ValueError)
            check(a.dtype in FP8, "Expected a.dtype() == at::kFloat8_e4m3fn || a.dtype() == at::kFloat8_e5m2")
            check(b.dtype == torch.float8_e4m3fn, "Expected b.dtype() == at::kFloat8_e4m3fn to be true, but got false.")
            check(scale_a.dtype == torch.float32 and scale_b.dtype == torch.float32, "scales must be float")
            check(scale_a.dim() == 2 and scale_b.dim() == 2, "scale_a.dim() == 2 && scale_b.dim() == 2")
            check(tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n), "scale shapes (M, 1) and (1, N)")
            check(a.stride(1) == 1 and a.stride(0) >= a.size(1), f"CUTLASS rowwise: a.stride() {a.stride()}")
            check(b.stride(0) == 1 and b.stride(1) >= b.size(0), f"CUTLASS rowwise: b.stride() {b.stride()}")
            check(scale_a.stride(0) == 1 and scale_b.stride(1) == 1, "CUTLASS rowwise: scale strides")
        else:
            self._cublas_layout(a, b)
        self.calls.append(("rowwise", "CUTLASS" if cutlass else "cuBLASLt"))
        av = a.to(torch.float64) * scale_a.to(torch.float64).reshape(m, 1)
        bv = b.to(torch.float64) * scale_b.to(torch.float64).reshape(1, n)
        return self._out(av, bv, out_dtype)

    # ---- torch._scaled_mm ---------------------------------------------------------------------------------
    def scaled_mm_v1(self, mat1, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                     use_fast_accum=False):
        self._transient()
        self._operands = (mat1.dtype, mat2.dtype)
        self._arch_allowed(RuntimeError)
        check(mat1.dim() == 2 and mat2.dim() == 2, "mat1 and mat2 must be matrices")
        check(mat1.size(1) == mat2.size(0), "mat1 and mat2 shapes cannot be multiplied")
        m, k, n = mat1.size(0), mat1.size(1), mat2.size(1)
        tensorwise = scale_a.dtype == torch.float32 and scale_a.numel() == 1 and \
            scale_b.dtype == torch.float32 and scale_b.numel() == 1
        sbt = scale_b.t() if scale_b.dim() == 2 else scale_b
        rowwise = (scale_a.dtype == torch.float32 and scale_a.dim() == 2 and tuple(scale_a.shape) == (m, 1)
                   and scale_a.is_contiguous() and scale_b.dtype == torch.float32 and sbt.dim() == 2
                   and tuple(sbt.shape) == (n, 1) and sbt.is_contiguous())
        check(tensorwise or rowwise, "Invalid scaling configuration (this stand-in models TensorWise and RowWise "
              f"for torch._scaled_mm): scale_a {tuple(scale_a.shape)}, scale_b {tuple(scale_b.shape)}")
        check(k % 16 == 0, f"Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: ({m}x{k}).")
        check(mat2.size(0) % 16 == 0 and n % 16 == 0, f"mat2 shape ({mat2.size(0)}x{n}) must be divisible by 16")
        check(mat1.dtype in FP8 and mat2.dtype in FP8, "Expected mat1 and mat2 to be Float8 matrices")
        check(not (mat1.dtype == torch.float8_e5m2 and mat2.dtype == torch.float8_e5m2),
              "Multiplication of two Float8_e5m2 matrices is not supported", ValueError)
        out_dtype = out_dtype or mat1.dtype
        if rowwise and not tensorwise:
            return self._rowwise(mat1, mat2, scale_a, scale_b, out_dtype, use_fast_accum)
        self._cublas_layout(mat1, mat2)
        self.calls.append(("v1", "tensorwise"))
        av = mat1.to(torch.float64) * float(scale_a.reshape(()))
        bv = mat2.to(torch.float64) * float(scale_b.reshape(()))
        return self._out(av, bv, out_dtype)

    # ---- torch.nn.functional.scaled_mm --------------------------------------------------------------------
    def scaled_mm_v2(self, mat_a, mat_b, scale_a, scale_recipe_a, scale_b, scale_recipe_b, swizzle_a=None,
                     swizzle_b=None, bias=None, output_dtype=torch.bfloat16, contraction_dim=(),
                     use_fast_accum=False):
        self._transient()
        self._operands = (mat_a.dtype, mat_b.dtype)
        ST, SW = F.ScalingType, F.SwizzleType

        def as_list(v):
            return [] if v is None else list(v) if isinstance(v, list | tuple) else [v]

        sa, sb = as_list(scale_a), as_list(scale_b)
        ra, rb = as_list(scale_recipe_a), as_list(scale_recipe_b)
        wa, wb = as_list(swizzle_a), as_list(swizzle_b)
        self._arch_allowed(NotImplementedError)
        km = 2 if mat_a.dtype == FP4 else 1
        m, k, n = mat_a.size(0), km * mat_a.size(1), mat_b.size(1)
        check(k % 16 == 0, f"Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: ({m}x{k}).",
              ValueError)
        check((km * mat_b.size(0)) % 16 == 0 and n % 16 == 0,
              f"mat2 shape ({mat_b.size(0)}x{n}) must be divisible by 16", ValueError)
        check((mat_a.dtype in FP8 or mat_a.dtype == FP4) and (mat_b.dtype in FP8 or mat_b.dtype == FP4),
              "Expected mat_a and mat_b to be Float8 or Float4_x2 matrices", ValueError)
        check(not (mat_a.dtype == torch.float8_e5m2 and mat_b.dtype == torch.float8_e5m2),
              "Multiplication of two Float8_e5m2 matrices is not supported", ValueError)
        if use_fast_accum:
            check(FP4 not in (mat_a.dtype, mat_b.dtype), "`use_fast_accum` is not supported when `mat_a` or `mat_b` "
                  "tensors have the `Float4_e2m1fn_x2` dtype.", ValueError)
        devices = {t.device for t in (mat_a, mat_b, *sa, *sb)}
        check(len(devices) == 1, f"Expected all tensors to be on the same device, got {devices}")
        e4, f32 = torch.float8_e4m3fn, torch.float32
        single = len(sa) == len(sb) == len(ra) == len(rb) == 1
        both_fp8 = mat_a.dtype in FP8 and mat_b.dtype in FP8

        # find_scaled_gemm_impl: the (dtype, recipe, scale dtype) combinations ScaledBlasUtils accepts
        if single and both_fp8 and ra == rb == [ST.TensorWise] and sa[0].dtype == sb[0].dtype == f32:
            check(sa[0].numel() == 1, "scale_a must have 1 Float element", ValueError)
            check(sb[0].numel() == 1, "scale_b must have 1 Float element", ValueError)
            self._cublas_layout(mat_a, mat_b)
            self.calls.append(("v2", "tensorwise"))
            return self._out(mat_a.to(torch.float64) * float(sa[0].reshape(())),
                             mat_b.to(torch.float64) * float(sb[0].reshape(())), output_dtype)
        if single and both_fp8 and ra == rb == [ST.RowWise] and sa[0].dtype == sb[0].dtype == f32:
            s_a, s_b = sa[0], sb[0]
            check(s_a.numel() == m, f"scale_a must have {m} Float elements, got {s_a.numel()}", ValueError)
            check(s_b.numel() == n, f"scale_b must have {n} Float elements, got {s_b.numel()}", ValueError)
            check(s_a.dim() == 2 and s_a.size(0) == m and s_a.size(1) == 1,
                  f"scale_a must have shape [{m}, 1], got {list(s_a.shape)}", ValueError)
            check(s_b.dim() == 2 and s_b.stride(1) == 1,
                  f"expected scale_b.stride(1) to be 1, but got {s_b.stride(-1)}", ValueError)
            return self._rowwise(mat_a, mat_b, s_a, s_b, output_dtype, use_fast_accum)
        deepseek = {(ST.BlockWise1x128, ST.BlockWise128x128), (ST.BlockWise128x128, ST.BlockWise1x128),
                    (ST.BlockWise1x128, ST.BlockWise1x128)}
        if (single and mat_a.dtype == e4 and mat_b.dtype == e4 and (ra[0], rb[0]) in deepseek
                and sa[0].dtype == sb[0].dtype == f32):
            return self._deepseek(mat_a, mat_b, sa[0], ra[0], sb[0], rb[0], output_dtype, use_fast_accum)
        if (single and mat_a.dtype == e4 and mat_b.dtype == e4 and ra == rb == [ST.BlockWise1x32]
                and sa[0].dtype == sb[0].dtype == torch.float8_e8m0fnu):
            check(len(wa) == 1, f"swizzle_a must have 1 value, got {len(wa)}", ValueError)
            check(len(wb) == 1, f"swizzle_b must have 1 value, got {len(wb)}", ValueError)
            kb = ceil_div(k, 32)
            want_a, want_b = round_up(m, 128) * round_up(kb, 4), round_up(n, 128) * round_up(kb, 4)
            check(sa[0].numel() == want_a, f"For Blockwise scaling scale_a should have {want_a} elements, got: "
                  f"{sa[0].numel()}", ValueError)
            check(sb[0].numel() == want_b, f"For Blockwise scaling scale_b should have {want_b} elements, got: "
                  f"{sb[0].numel()}", ValueError)
            check(wa[0] == SW.SWIZZLE_32_4_4, "scale_a must be swizzled to SWIZZLE_32_4_4 format", ValueError)
            check(wb[0] == SW.SWIZZLE_32_4_4, "scale_b must be swizzled to SWIZZLE_32_4_4 format", ValueError)
            check(sa[0].is_contiguous() and sb[0].is_contiguous(),
                  "For Blockwise scaling both scales should be contiguous", ValueError)
            check(self.arch >= (10, 0), "CUBLAS_STATUS_NOT_SUPPORTED: block-scaled (MX) matmul needs sm_100+")
            self._cublas_layout(mat_a, mat_b)
            self.calls.append(("v2", "mxfp8"))
            ea = unswizzle(sa[0], m, kb).repeat_interleave(32, 1)[:, :k]
            eb = unswizzle(sb[0], n, kb).repeat_interleave(32, 1)[:, :k]
            return self._out(mat_a.to(torch.float64) * ea, (mat_b.t().to(torch.float64) * eb).t(), output_dtype)
        fp4 = mat_a.dtype == FP4 and mat_b.dtype == FP4
        two_level = (len(sa) == len(sb) == len(ra) == len(rb) == 2 and ra == rb == [ST.BlockWise1x16, ST.TensorWise]
                     and sa[0].dtype == sb[0].dtype == e4 and sa[1].dtype == sb[1].dtype == f32)
        one_level = single and ra == rb == [ST.BlockWise1x16] and sa[0].dtype == sb[0].dtype == e4
        if fp4 and (two_level or one_level):
            need = 2 if two_level else 1
            check(len(wa) == need, f"swizzle_a must have {need} value{'s' if need > 1 else ''}, got {len(wa)}",
                  ValueError)
            check(len(wb) == need, f"swizzle_b must have {need} value{'s' if need > 1 else ''}, got {len(wb)}",
                  ValueError)
            kb = ceil_div(k, 16)
            want_a, want_b = round_up(m, 128) * round_up(kb, 4), round_up(n, 128) * round_up(kb, 4)
            check(sa[0].numel() == want_a, f"For Blockwise scaling scale_a should have {want_a} elements, got: "
                  f"{sa[0].numel()}", ValueError)
            check(sb[0].numel() == want_b, f"For Blockwise scaling scale_b should have {want_b} elements, got: "
                  f"{sb[0].numel()}", ValueError)
            check(wa[0] == SW.SWIZZLE_32_4_4, "scale_a must be swizzled to SWIZZLE_32_4_4 format", ValueError)
            check(wb[0] == SW.SWIZZLE_32_4_4, "scale_b must be swizzled to SWIZZLE_32_4_4 format", ValueError)
            check(sa[0].is_contiguous() and sb[0].is_contiguous(),
                  "For Blockwise scaling both scales should be contiguous", ValueError)
            check(self.arch >= (10, 0), "CUBLAS_STATUS_NOT_SUPPORTED: NVFP4 block scaling needs sm_100+")
            self._cublas_layout(mat_a, mat_b)
            self.calls.append(("v2", "nvfp4"))
            a_vals = unpack_fp4(mat_a) * unswizzle(sa[0], m, kb).repeat_interleave(16, 1)[:, :k]  # (M, K)
            b_vals = unpack_fp4(mat_b.t()) * unswizzle(sb[0], n, kb).repeat_interleave(16, 1)[:, :k]  # (N, K)
            alpha = float(sa[1]) * float(sb[1]) if two_level else 1.0
            return self._out(a_vals, b_vals.t(), output_dtype, alpha)
        raise ValueError(f"Invalid scaling configuration: recipes {ra} x {rb}, dtypes {mat_a.dtype} x {mat_b.dtype}, "
                         f"scale dtypes {[s.dtype for s in sa]} x {[s.dtype for s in sb]}")

    def _deepseek(self, mat_a, mat_b, s_a, ra, s_b, rb, out_dtype, use_fast_accum):
        ST = F.ScalingType
        self._deepseek_support()
        # cuBLAS's scale mode of a, then b (CUDABlas.cpp, get_scale_mode): no fast accumulation with blocks
        for recipe in (ra, rb):
            size = "1x128" if recipe == ST.BlockWise1x128 else "128x128"
            check(not use_fast_accum, f"scaled_gemm doesn't support fast accum with {size} blockwise scaling")
        m, k, n = mat_a.size(0), mat_a.size(1), mat_b.size(1)
        kb, l4 = ceil_div(k, 128), round_up(ceil_div(k, 128), 4)

        def check_1x128(s, rows, name):
            check(tuple(s.shape) == (rows, kb), f"{name} must have shape {rows} x {kb} Float elements, got "
                  f"{tuple(s.shape)}", ValueError)
            check(s.stride(0) == 1 and (s.stride(1) == rows or (s.size(1) == 1 and s.stride(1) == 1)),
                  f"{name} strides must be (1, {rows}); got: {s.stride()}", ValueError)
            return s.to(torch.float64).repeat_interleave(128, 1)[:, :k]  # (rows, K)

        def check_128x128(s, rows, name):
            rb_ = ceil_div(rows, 128)
            check(tuple(s.shape) == (l4, rb_), f"{name} must have shape {l4} x {rb_} Float elements, got "
                  f"{tuple(s.shape)}", ValueError)
            check(s.stride(0) == 1 and (s.stride(1) == l4 or (s.size(1) == 1 and s.stride(1) == 1)),
                  f"{name} must have strides (1, {l4}); got {s.stride()}", ValueError)
            per_block = s.to(torch.float64)[:kb].t()  # (rows/128, K/128)
            return per_block.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :k]  # (rows, K)

        ea = check_1x128(s_a, m, "scale_a") if ra == ST.BlockWise1x128 else check_128x128(s_a, m, "scale_a")
        eb = check_1x128(s_b, n, "scale_b") if rb == ST.BlockWise1x128 else check_128x128(s_b, n, "scale_b")
        self._cublas_layout(mat_a, mat_b)
        self.calls.append(("v2", f"{ra.name} x {rb.name}"))
        return self._out(mat_a.to(torch.float64) * ea, (mat_b.t().to(torch.float64) * eb).t(), out_dtype)
