"""FP8 GEMMs: real (torch scaled_mm on a GPU that has the kernel) or emulated (anywhere).

One concept per file:
  emulation.py     emulated_mm: the same codes and scales as the hardware, exact products, fp32 sums
  accumulation.py  AccumulatorModel: a ~14-bit tensor-core accumulator and promotion to fp32
  real.py          real_mm, plan_gemm: torch's scaled matmuls as each GPU generation accepts them
  backend.py       matmul and GemmBackend: the one switch between real and emulated, counted
Shapes: a[M, K] @ b[K, N] -> out[M, N]; operands are quantized in their [rows, K] layout (b as
b^T[N, K], like w[N, K] in nn.Linear). Notebook 05 introduces them.
"""

from fp8lab.gemm.accumulation import AccumulatorModel, accumulation_curves, accumulation_error, accumulation_errors
from fp8lab.gemm.backend import (
    BACKENDS,
    BackendChoice,
    GemmBackend,
    agrees_with_emulation,
    default_backend,
    matmul,
    resolve_backend,
)
from fp8lab.gemm.emulation import EMULATIONS, emulated_mm, quantize_operands
from fp8lab.gemm.real import (
    KERNEL_KINDS,
    KernelPlan,
    KernelUnavailable,
    PreparedGemm,
    operand_scaling,
    plan_gemm,
    prepare_real_mm,
    real_mm,
    swizzle_scales,
)

__all__ = [
    "BACKENDS",
    "EMULATIONS",
    "KERNEL_KINDS",
    "AccumulatorModel",
    "BackendChoice",
    "GemmBackend",
    "KernelPlan",
    "KernelUnavailable",
    "PreparedGemm",
    "accumulation_curves",
    "accumulation_error",
    "accumulation_errors",
    "agrees_with_emulation",
    "default_backend",
    "emulated_mm",
    "matmul",
    "operand_scaling",
    "plan_gemm",
    "prepare_real_mm",
    "quantize_operands",
    "real_mm",
    "resolve_backend",
    "swizzle_scales",
]
