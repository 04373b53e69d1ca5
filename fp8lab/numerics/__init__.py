"""The numbers: FP8 formats, scales, quantization and how to measure what it loses.

  formats.py   FloatFormat as data (E4M3, E5M2, E8M0, E2M1, bf16, fp16) and the cast (with its teaching twin)
  granularity.py  which elements share a scale (PerTensor, PerRow, PerBlock) and what that means for a GEMM
  scaling.py   TensorScaling (every scaling setting, checked once), amax per block, the scale rules, delayed scaling
  quantize.py  quantize(x, fmt, granularity, scale_rule) -> QuantizedTensor: the definition first, dequantize
               (rounding: nearest or stochastic)
  quantize_fast.py  quantize's fast twins (the C kernel's call, the chunked torch cast), chosen in quantize_with
  hadamard.py  the random Hadamard transform (NVFP4's, on the weight gradient's operands)
  kernels.py   quantize's fast path on the CPU: the calls into _kernels.c, chosen once per process
  kernels_gemm.py  the emulated GEMM's C kernels: codes widened to values, the exact segments' loop, the epilogue
  kernels_build.py  building, caching and loading _kernels.c (first use; a checked cache)
  metrics.py   SQNR, relative error, overflow / underflow / subnormal fractions
  recipes.py   the named recipes: format, granularity and scale rule per tensor role and GEMM; the named
               ways of storing block scales (SCALE_PRESETS)
  anatomy.py   one value in a format: its neighbours, the gap, what rounding did
Notebooks 01-04 introduce them; 09 the Hadamard transform and stochastic rounding.
"""
