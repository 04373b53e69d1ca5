"""The mutation check fp8lab keeps (`make mutate`; not part of `make test`).

Each mutation below is a plausible bug, one edit to the core (formats, scaling, quantize, the C
kernels and their build, gemm, nn, metrics, recipes, exercises, inspect, export, distributed, train).
For each, a copy of the working tree gets the edit and runs the fast tests that guard that code (no
slow, browser or GPU tests); the mutation is killed if they fail. The lessons' mutations (a recipe's
scale rule, the sinks' effect) run notebook 06's trained claims instead (slow: about 40 s each).
Reports the score and the time; exits 1 if any mutation survives.

    python tools/mutate.py                 # all of them
    python tools/mutate.py -k cast -v      # those whose name contains "cast", with pytest's output
    python tools/mutate.py --list
    python tools/mutate.py --shard 1/2 & python tools/mutate.py --shard 2/2   # two halves side by side
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAST = "not slow and not browser and not gpu"
TRAINED = "not browser and not gpu"  # the lessons' claims train the toy: slow tests


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest arguments: files, ::names or -k expressions
    markers: str = FAST  # pytest's -m: which of those tests run


def m(name: str, path: str, old: str, new: str, *tests: str) -> Mutation:
    """A mutation; the hardening tests (quick, aimed) run first. A folder as `path` means the one
    file in it that holds `old`."""
    if path.endswith("/"):
        holders = [f for f in sorted((ROOT / path).glob("*.py")) if old in f.read_text()]
        path = str(holders[0].relative_to(ROOT)) if len(holders) == 1 else path + "(not found once)"
    return Mutation(name, path, old, new, tuple(sorted(tests, key=lambda t: t != HARD)))


def lesson(name: str, path: str, old: str, new: str) -> Mutation:
    """A mutation that notebook 06's lessons must notice: the claims trained on the toy, and the
    shipped runs against a run trained now (tests/notebooks/test_lessons.py, slow)."""
    return Mutation(name, path, old, new, (T + "notebooks/test_lessons.py",), TRAINED)


NUM = "fp8lab/numerics/"
F, S, Q, K, C = NUM + "formats.py", NUM + "scaling.py", NUM + "quantize.py", NUM + "kernels.py", NUM + "_kernels.c"
KG = NUM + "kernels_gemm.py"
KB, SET, TH = NUM + "kernels_build.py", "fp8lab/settings.py", "fp8lab/threads.py"
FLOOR = ("tests/numerics/test_fp4_numerics.py::"
         "test_nvfp4_block_scale_floors_are_bit_exact_against_a_numpy_ml_dtypes_reference")
G, N, MT, R = "fp8lab/gemm/", "fp8lab/training/layers.py", NUM + "metrics.py", NUM + "recipes.py"
ARM = "fp8lab/training/armour.py"
X = "fp8lab/lab/exercises/scaling.py"
PUB = "fp8lab/training/published.py"
PUB_DATA = "fp8lab/training/sources/published.json"
RD, EX, RUN, TR = ("fp8lab/training/" + f for f in ("readiness.py", "export.py", "torchrun.py", "train.py"))
CV, DL, AT, CAP = ("fp8lab/training/" + f for f in ("convert.py", "delayed.py", "attention.py", "capture.py"))
T = "tests/"
HARD = T + "numerics/test_hardening.py"
TRUTH = T + "training/test_convert.py"
MODELS, CACHE = T + "training/test_hardening_models.py", T + "numerics/test_kernels_build.py"
REAL = T + "gemm/test_real.py"
FP4 = T + "numerics/test_fp4_numerics.py"
EXPL = T + "notebooks/test_explanations.py"
KERN = T + "numerics/test_kernels.py"
KG_TESTS = T + "numerics/test_kernels_gemm.py"
DRAWS = KERN + "::test_the_draws_twin_gives_torch_rands_numbers_and_moves_the_generator_as_torch_rand_does"
QUANT = T + "numerics/test_quantize.py"
WIDGETS = T + "lab/test_widgets.py"
PARTS = T + "training/test_fp4_parts.py"
DRAG = T + "lab/panels/test_base.py::test_a_drag_on_a_loaded_machine_never_queues_stale_frames"
ON_THE_CPU = T + "lab/panels/test_base.py::test_a_panel_computes_on_the_cpu_whatever_device_its_thread_defaults_to"
ANY_DEFAULTS = T + "lab/panels/test_base.py::test_every_panel_draws_the_labs_picture_whatever_torchs_defaults"
PLAIN_AMAX = QUANT + "::test_the_plain_pass_takes_delayed_scalings_one_amax_as_the_kernel_branch_does"

MUTATIONS = [
    # ---- formats: the cast and the format's numbers
    m("cast_reference: ties away from zero", F, "bits = (bits + ((1 << (drop - 1)) - 1) + kept_lsb)",
      "bits = (bits + ((1 << (drop - 1)) - 1) + 1)", T + "numerics/test_formats.py"),
    m("cast: no saturation before torch's cast", F,
      "codes = x.clamp(-fmt.max_value, fmt.max_value).to(fmt.torch_dtype)", "codes = x.to(fmt.torch_dtype)",
      T + "numerics/test_formats.py"),
    m("cast: no subnormal floor on the grid", F, "(e - 1).clamp(min=emin) - fmt.mantissa_bits",
      "(e - 1) - fmt.mantissa_bits", T + "numerics/test_formats.py"),
    m("min_subnormal off by one binade", F, "return math.ldexp(1.0, 1 - self.bias - self.mantissa_bits)",
      "return math.ldexp(1.0, -self.bias - self.mantissa_bits)", T + "numerics/test_formats.py"),
    m("widen: E4M3 scaled by 128, not 256", F, ".to(torch.float32).mul_(256.0)", ".to(torch.float32).mul_(128.0)",
      T + "numerics/test_formats.py"),
    m("clip threshold: a whole step above max", F, "self.max_value + 0.5 * 2.0 ** (self.max_exponent",
      "self.max_value + 1.0 * 2.0 ** (self.max_exponent", T + "numerics/test_scaling_metrics_recipes.py",
      QUANT),
    # ---- scaling: amax, the scale rules, delayed scaling, blocks
    m("amax ignores negative values", S, "amax = torch.maximum(hi, lo.neg())", "amax = hi",
      T + "numerics/test_scaling_metrics_recipes.py", KERN),
    m("margin ignored", S, "return self.fmt.max_value / 2**self.margin", "return self.fmt.max_value",
      QUANT),
    m("rceil: an exact power of two rounds up", S, "e = exp - max_exp + (mant > max_mant).to(exp.dtype)",
      "e = exp - max_exp + (mant >= max_mant).to(exp.dtype)", QUANT),
    m("floor rule: ceil of log2(max)", S, "e = log2_floor_amax - math.floor(math.log2(max_eff))",
      "e = log2_floor_amax - math.ceil(math.log2(max_eff))", QUANT),
    m("an all-zero block gets no scale 1", S, "        inverse = torch.where(zero, 1.0, inverse)\n", "",
      QUANT),
    m("E4M3 block scales not kept above E4M3's smallest normal (torchao's inference floor)", S,
      "cast(ideal.clamp(min=args.floor, max=args.scale_fmt.max_value)",
      "cast(ideal.clamp(max=args.scale_fmt.max_value)", QUANT, FLOOR),
    m("the training engines' NVFP4 floor back at 2^-6", S,
      'return self.scale_fmt.min_normal if self.scale_floor == "min_normal" and self.scale_fmt else 0.0',
      "return self.scale_fmt.min_normal if self.scale_fmt else 0.0", FLOOR),
    m("a zero NVFP4 block scale gets an infinite inverse", S,
      "        inverse = torch.where(scale == 0, 0.0, inverse)\n", "", FLOOR),
    m("the C kernel's NVFP4 floor at E4M3's smallest normal whatever the setting", C,
      "float lo = p->scale_floor, hi", "float lo = ldexpf(1.0f, p->scale_format.min_exponent), hi",
      FLOOR),
    m("an unknown scale floor accepted", S,
      "    if not isinstance(scale_floor, str) or scale_floor not in SCALE_FLOORS:\n", "    if False:\n",
      FP4 + "::test_the_scale_floor_is_a_setting_of_the_recipe_and_bad_floors_are_refused"),
    m("a recipe's fprop in high precision still quantized", R,
      '        if gemm == "fprop" and self.fprop_high_precision:\n            return None\n', "",
      FP4 + "::test_a_layer_with_its_forward_in_high_precision_computes_fp32_forward_and_the_"
      "recipes_backward"),
    m("fprop in high precision accepted with delayed scaling", R,
      "        if self.fprop_high_precision and self.delayed is not None:\n", "        if False:\n",
      FP4 + "::test_one_gemm_in_high_precision_is_refused_where_it_cannot_be"),
    m("exercise 09b accepts any measurement", "fp8lab/lab/exercises/fp4.py",
      "SPLIT_TOLERANCE = 0.1  #", "SPLIT_TOLERANCE = 10.0  #",
      T + "lab/exercises/test_exercises.py::test_exercise_09b_is_graded_against_the_measured_split_with_its_tolerance"),
    m("exercise 09b's shares read against the wrong run", "fp8lab/training/parts.py",
      'runs = {"whole": FC1_SPLIT[2].label, "forward": FC1_SPLIT[3].label, "wgrad": FC1_SPLIT[4].label}',
      'runs = {"whole": FC1_SPLIT[2].label, "forward": FC1_SPLIT[4].label, "wgrad": FC1_SPLIT[3].label}',
      T + "lab/exercises/test_exercises.py::test_exercise_09b_is_graded_against_the_measured_split_with_its_tolerance"),
    m("NVFP4 tensor scale without the E4M3 max", S, "divisor = args.scale_fmt.max_value * fmt.max_value",
      "divisor = fmt.max_value", KERN + "::test_scale_from_amax_twins_agree_on_every_kind_of_amax"),
    m("replay counts the current amax", S, "used.append(a if past is None else past)",
      "used.append(a if past is None else max(past, a))", T + "numerics/test_scaling_metrics_recipes.py", HARD),
    m("amax history drops or keeps NaN by its place", S,
      "return math.nan if any(math.isnan(a) for a in self._history) else max(self._history)",
      "return max(self._history)", T + "numerics/test_scaling_metrics_recipes.py", HARD),
    m("blocks not clamped to the tensor", NUM + "granularity.py",
      "return (min(self.rows, max(shape[0], 1)), min(self.cols, max(shape[1], 1)))", "return (self.rows, self.cols)",
      QUANT, HARD),
    m("margin not bounded by the format", S, "    if margin > _largest_margin(fmt):", "    if False:",
      QUANT, HARD),
    # ---- quantize
    m("the torch code lets infinities through", Q,
      "    if bool(torch.isinf(own).any()) or (bool(torch.isnan(own).any())"
      " and bool(torch.isinf(x2d).any())):\n        _refuse_inf(x2d)", "    pass",
      QUANT, T + "numerics/test_fuzz.py"),
    m("a negative amax is accepted", Q, "bad = (a < 0) | torch.isinf(a)", "bad = torch.isinf(a)", HARD),
    m("QuantizedTensor does not check its scale's shape", Q, "or tuple(t.shape) != shape:", ":",
      QUANT, HARD),
    m("dequantize forgets the tensor scale", Q,
      "return out * self.tensor_scale if self.tensor_scale is not None else out", "return out", QUANT),
    m("the cliff panel builds only the default placement's tables when made", "fp8lab/lab/panels/per_tensor.py",
      "            for key in self.keys():", "            for key in self.keys()[:4]:",
      T + "lab/panels/test_per_tensor.py"),
    m("the Hadamard tile's stretch of x takes the first sign for every element", C,
      "for (int64_t i = 0; i < HADAMARD_TILE; i++) v[k][i] = column[i] * signs[k];",
      "for (int64_t i = 0; i < HADAMARD_TILE; i++) v[k][i] = column[i] * signs[0];", KERN),
    m("the kernels split small tensors though OpenMP waits passively", TH,
      "PARALLEL_MIN_PASSIVE, PARALLEL_MIN_SPINNING = 1 << 18, 1 << 15",
      "PARALLEL_MIN_PASSIVE, PARALLEL_MIN_SPINNING = 1 << 15, 1 << 15", KERN),
    m("the library splits from its own default whatever the policy", K,
      "        lib.fp8lab_set_parallel_min(threads.parallel_min())\n", "        pass\n", KERN),
    m("the plain pass writes unfolded values where the blocks fold", NUM + "quantize_fast.py",
      "    fused = kernels.quantize(x, block, template, amax, fold=fold, values=values)\n",
      "    fused = kernels.quantize(x, block, template, amax, fold=False, values=values)\n", QUANT),
    m("the plain pass keeps an infinity beside a NaN", NUM + "quantize_fast.py",
      "    if fused is None or (fused.nan and bool(torch.isinf(x).any())):", "    if fused is None:", QUANT),
    m("C scale_outer leaves the output unscaled where one side has no scales", C,
      "    if (a == NULL) a = &one, a_step = 0;\n", "    if (a == NULL) return;\n", KG_TESTS),
    m("C add_row adds each row's own element instead of the column's", C,
      "out[m * N + n] = out[m * N + n] + row[n];", "out[m * N + n] = out[m * N + n] + row[m % N];", KG_TESTS),
    m("a weight's 2-D blocks folded only where they split both dims", NUM + "quantize_fast.py",
      "    return r < m or c < k\n", "    return r < m and c < k\n", T + "numerics/test_quantize_fast.py"),
    m("power-of-two scales folded though a sum could pass 2^126", G + "emulation.py",
      " and hi_a * hi_b * a_q.shape[1] < 2.0**126):\n        return None\n    return a_q.scaled_values()",
      "):\n        return None\n    return a_q.scaled_values()", T + "gemm/test_emulation.py"),
    m("power-of-two scales folded where a folded value is not normal", G + "emulation.py",
      "    if not (min(lo_a, lo_b) >= 2.0**-126 and lo_a * lo_b", "    if not (lo_a * lo_b",
      T + "gemm/test_emulation.py"),
    m("per-row output scales applied in the wrong order", G + "emulation.py",
      "post = q.scale.reshape(()) if q.scale.dim() == 0 else q.scale.reshape(-1)\n",
      "post = q.scale.reshape(()) if q.scale.dim() == 0 else q.scale.reshape(-1).flip(0)\n",
      T + "gemm/test_emulation.py"),
    m("torch scale-and-cast reuses the first chunk's inverses", NUM + "quantize_fast.py",
      "(inv if inv.dim() == 0 else inv[start:stop])",
      "(inv if inv.dim() == 0 else inv[: stop - start])",
      KERN + "::test_large_tensors_split_over_threads_give_the_same_bits"),
    m("torch-folded values of a transposed operand in another layout", Q,
      "                scaled = scaled.t().contiguous().t()  # a transposed view, laid out as the kernel writes it\n",
      "", KERN + "::test_matmul_of_transposed_weights_matches_with_and_without_kernels"),
    # ---- the C kernels
    m("C cast turns an overflowing product into NaN", C, "uint32_t nan = ab > 0x7F800000u;",
      "uint32_t nan = ab >= 0x7F800000u;", HARD),
    m("C exact rule: no floor on the inverse", C, "q = q > (double)FLT_MAX ? (double)FLT_MAX : (q < lo ? lo : q);",
      "q = q > (double)FLT_MAX ? (double)FLT_MAX : q;", HARD,
      KERN + "::test_scale_from_amax_twins_agree_on_every_kind_of_amax"),
    m("C amax of 32-wide blocks read 16 wide", C, "if (c == 32 && K % 32 == 0) { AMAX_ROWS(32) return; }",
      "if (c == 32 && K % 32 == 0) { AMAX_ROWS(16) return; }", KERN + "::test_block_amax_twins_agree"),
    m("C two-level tensor scale not held above its minimum", C,
      "t = t < p->min_tensor_scale ? p->min_tensor_scale : t;", "", HARD),
    m("C scale range: the largest scale as the smallest", C,
      "smallest = scale_bits[i] < smallest ? scale_bits[i] : smallest;",
      "smallest = scale_bits[i] > smallest ? scale_bits[i] : smallest;",
      KERN + "::test_quantize_matches_the_torch_code_bit_for_bit"),
    m("C counts zeros that were zero as flushed", C, "fl += (xr[k] != 0.0f) & ((cr[k] & magnitude) == 0);",
      "fl += (cr[k] & magnitude) == 0;", KERN + "::test_monitor_counts_match_the_metrics"),
    m("C does not check the parameter block's size", C,
      "if (p == NULL || p->size != (int64_t)sizeof(fp8lab_params)) return BAD_SIZE;", "if (p == NULL) return BAD_SIZE;",
      HARD),
    m("C narrow blocks index rows from the part, not the tensor", C,
      "if (m == 0 || (row0 + m) % r == 0) {\n                    expand_row(inv + ((row0 + m) / r) * KB",
      "if (m == 0 || m % r == 0) {\n                    expand_row(inv + ((row0 + m) / r) * KB",
      KERN + "::test_parts_may_split_a_block_row_and_any_thread_count_gives_the_same_bits"),
    m("C per-row epilogue multiplies in another order", C,
      "float factor = am * b[n];\n                    row[n] = row[n] * factor;", "row[n] = row[n] * am * b[n];",
      KERN + "::test_per_row_scales_of_both_operands_match_with_and_without_kernels"),
    m("C K segment's sum adds the partial sums before the scales", C,
      "float product = prow[n] * factor;\n                    row[n]", "float product = prow[n] * am * b[n];\n row[n]",
      KG_TESTS + "::test_the_reference_gemms_segments_match_with_and_without_kernels"),
    m("C segment_mm adds the segments' scaled sums last one first", C,
      "        for (int64_t s = 0; s < S; s++) {\n            const float *as",
      "        for (int64_t s = S - 1; s >= 0; s--) {\n            const float *as",
      KG_TESTS + "::test_the_reference_gemms_exact_segments_run_in_one_call_with_the_loops_bits"),
    m("C segment_mm skips zero scales beside infinite ones", C, "        if (!isfinite(y[j])) return 0;\n", "",
      KG_TESTS + "::test_segment_mm_skips_only_the_segments_that_add_nothing"),
    m("C segment_mm reads a row-major whatever its strides", C, "a_value(a, a_table, arow[r] + k * col_stride)",
      "a_value(a, a_table, arow[r] + k)", KG_TESTS + "::test_segment_mm_skips_only_the_segments_that_add_nothing"),
    m("C stochastic rounding's inverse step twice too large", C, "a * float_of(0x7F000000u - bits_of(step))",
      "a * float_of(0x7F800000u - bits_of(step))",
      KERN + "::test_stochastic_rounding_split_over_threads_gives_the_same_bits"),
    m("C amax of NVFP4's 16-wide blocks over their first half", C,
      "if (c == 16 && K % 16 == 0) { AMAX_ROWS(16) return; }",
      "if (c == 16 && K % 16 == 0) { AMAX_ROWS(8) return; }", KERN + "::test_block_amax_twins_agree"),
    m("C narrow blocks round to nearest where asked to round stochastically", C,
      "run_cast_per_element(x + m * K, draws ? draws + m * K : NULL,", "run_cast_per_element(x + m * K, NULL,",
      KERN + "::test_stochastic_rounding_split_over_threads_gives_the_same_bits"),
    m("C draws: the twist's second run reads the word one on", C, "mt_mix(s[i], s[i + 1], s[i + MT_M - MT_N]);",
      "mt_mix(s[i], s[i + 1], s[i + MT_M - MT_N + 1]);", DRAWS),
    m("C draws: a draw from the top 24 bits", C, "return (float)(y & 0xFFFFFFu) * 0x1p-24f;",
      "return (float)(y >> 8) * 0x1p-24f;", DRAWS),
    m("C draws: the generator's counter left where it was", C, "    memcpy(state + 8, &left, 4);\n", "",
      DRAWS),
    m("the kernel's draws from torch's default generator too", NUM + "quantize_fast.py",
      "    if generator is not None and generator.device.type == \"cpu\" and kernels.draws_like_torch():",
      "    if kernels.draws_like_torch():", T + "numerics/test_quantize_fast.py::"
      "test_the_kernels_draws_come_from_torchs_generator_in_c_where_it_gives_torchs_numbers"),
    m("C segment_mm reads a code's value without its sign", C, "table[((const uint8_t *)a)[i]]",
      "table[((const uint8_t *)a)[i] & 0x7F]", KG_TESTS + "::test_segment_mm_reads_fp8_codes_as_their_values"),
    m("segment_mm widens b's codes as E4M3 whatever their format", KG, "widen_codes(panels.view(codes_b))",
      "widen_codes(panels.view(torch.float8_e4m3fn))", KG_TESTS + "::test_segment_mm_reads_fp8_codes_as_their_values"),
    m("C hadamard reads x row-major whatever its strides", C, "xr[(b + k) * col_stride]", "xr[b + k]",
      KERN + "::test_the_hadamard_twin_gives_the_torch_codes_bits"),
    m("segment_mm takes operands whose partial sums are not exact", G,
      "<= 2.0**24 * fa.min_subnormal * fb.min_subnormal", "<= 2.0**80 * fa.min_subnormal * fb.min_subnormal",
      KG_TESTS + "::test_the_reference_gemms_exact_segments_run_in_one_call_with_the_loops_bits"),
    m("kernels.py: E8M0 scales' exponent range as float32's", K,
      "exponent_min=lo, exponent_max=hi", "exponent_min=-126, exponent_max=hi",
      KERN + "::test_scale_from_amax_twins_agree_on_every_kind_of_amax"),
    m("the float32 buffers C writes take torch's default dtype", K,
      "own, scale, inverse = _FLOAT32.new_empty(mb, kb), _FLOAT32.new_empty(mb, kb), _FLOAT32.new_empty(mb, kb)",
      "own, scale, inverse = torch.empty(mb, kb), torch.empty(mb, kb), torch.empty(mb, kb)",
      KERN + "::test_every_kernel_writes_cpu_float32_whatever_the_defaults",
      T + "training/test_layers.py::test_defaults_set_after_conversion_change_no_step"),
    m("the buffers C writes on torch's default device", K, "    out = _FLOAT32.new_empty(p.M, p.K) if eager else None",
      "    out = torch.empty(p.M, p.K, dtype=torch.float32) if eager else None",
      KERN + "::test_every_kernel_writes_cpu_float32_whatever_the_defaults"),
    m("fp8lab.data's normal draws in torch's default dtype", "fp8lab/data/synthetic.py",
      '        x = torch.randn(m, k, generator=g, **FLOAT32_CPU)\n    elif distribution == "laplace":',
      '        x = torch.randn(m, k, generator=g)\n    elif distribution == "laplace":',
      T + "data/test_synthetic.py::test_every_tensor_is_the_seeds_float32_cpu_tensor_whatever_torchs_defaults"),
    m("a redraw makes its tensors on the thread's default device", "fp8lab/lab/panels/base.py",
      "        with self._lock, torch_threads(self.redraw_threads), on_the_cpu():\n",
      "        with self._lock, torch_threads(self.redraw_threads):\n", ON_THE_CPU),
    m("a run the kernel waits for makes its tensors on the thread's default device", "fp8lab/lab/panels/base.py",
      "                with on_the_cpu():\n                    work()",
      "                if True:\n                    work()", ON_THE_CPU),
    m("the lab's models and tasks in torch's default dtype", "fp8lab/data/synthetic.py",
      'FLOAT32_CPU = {"dtype": torch.float32, "device": "cpu"}', 'FLOAT32_CPU = {"device": "cpu"}',
      T + "training/test_models.py::"
      "test_the_toys_and_tasks_are_the_seeds_float32_cpu_tensors_whatever_torchs_defaults"),
    m("the gradient panel's sampled rows in torch's default dtype", "fp8lab/lab/panels/gradients.py",
      "min(self.SAMPLE_ROWS, dy.shape[0]), dtype=torch.float32,\n", "min(self.SAMPLE_ROWS, dy.shape[0]),\n",
      ANY_DEFAULTS + "[gradients]"),
    m("the NVFP4 panel's flushed share divided in torch's default dtype", "fp8lab/lab/panels/nvfp4.py",
      "flushed[clean].sum().float() / nonzero[clean].sum().clamp(min=1).float()",
      "flushed[clean].sum() / nonzero[clean].sum().clamp(min=1)", ANY_DEFAULTS + "[nvfp4]"),
    m("the draws check compares with torch.rand in torch's default dtype", K,
      'torch.rand(n, generator=theirs, dtype=torch.float32, device="cpu"))', "torch.rand(n, generator=theirs))",
      DRAWS),
    m("the reference GEMM's segment starts on torch's default device", G,
      "            starts = torch.arange(0, k, seg, device=sa.device)\n",
      "            starts = torch.arange(0, k, seg)\n",
      KERN + "::test_every_kernel_writes_cpu_float32_whatever_the_defaults"),
    # ---- the emulated GEMM
    m("b's block scales indexed with a's block width", G,
      "scale_(out, sa_k[start // wa], sb_k[start // wb], part)",
      "scale_(out, sa_k[start // wa], sb_k[start // wa], part)", T + "gemm/test_gemm.py", HARD),
    m("accumulator drops the last partial promotion interval", G,
      "if end % interval == 0 or end >= k:", "if end % interval == 0:", T + "gemm/test_gemm.py", HARD),
    m("the accumulators' fast walk drops the last partial promotion interval", G,
      "if g == groups - 1 or ((g + 1) * m.group)", "if ((g + 1) * m.group)", T + "gemm/test_accumulation.py"),
    m("the background's key counts the ticks made so far", "fp8lab/figures/render.py",
      "    ticks = made[:len(locs)] + made[:1] * max(0, len(locs) - len(made))", "    ticks = made",
      T + "figures/test_render.py::test_the_first_change_after_the_first_drawing_keeps_the_background"),
    m("the background's key reads the first tick's styles only", "fp8lab/figures/render.py",
      "    ticks = made[:len(locs)] + made[:1] * max(0, len(locs) - len(made))", "    ticks = made[:1]",
      T + "figures/test_render.py::test_a_tick_styled_alone_after_the_first_drawing_draws_the_background_again"),
    m("the kept line height leaves out the font's line gap", "fp8lab/figures/render.py",
      "-table[descent] * scale, table[gap] * scale)", "-table[descent] * scale, 0.0)",
      T + "figures/test_render.py::test_kept_line_heights_lay_text_out_as_matplotlib_does"),
    m("the kept line height is kept for one size whatever the text's", "fp8lab/figures/render.py",
      "               size, prop.get_file(), self.dpi,", "               prop.get_file(), self.dpi,",
      T + "figures/test_render.py::test_kept_line_heights_lay_text_out_as_matplotlib_does"),
    m("a redrawn axes leaves out the axes whose regions overlap it", "fp8lab/figures/render.py",
      "redrawn, grown = set(changed), True", "redrawn, grown = set(changed), False",
      T + "figures/test_render.py::test_a_redrawn_axes_takes_the_axes_whose_regions_overlap_it_along"),
    m("a redrawn axes clears only the changed axes' regions", "fp8lab/figures/render.py",
      "        for i in redrawn:  # the figure's face", "        for i in changed:  # the figure's face",
      T + "figures/test_render.py::test_a_redrawn_axes_takes_the_axes_whose_regions_overlap_it_along"),
    m("overlapping regions that take every axes are still redrawn in part", "fp8lab/figures/render.py",
      "        if len(redrawn) == len(axes):\n            return False", "        if False:\n            return False",
      T + "figures/test_render.py::test_when_overlapping_regions_take_every_axes_the_figure_is_drawn_whole"),
    m("an earlier background is restored for any axes' key", "fp8lab/figures/render.py",
      "if bg[:2] == (figure_part, axes_parts)), None)", "if bg[0] == figure_part), None)",
      T + "figures/test_render.py::test_a_background_shown_before_is_restored_and_the_oldest_is_dropped"),
    m("the earlier backgrounds are kept in the order they were first drawn", "fp8lab/figures/render.py",
      "            self._earlier.insert(0, kept)", "            self._earlier.append(kept)",
      T + "figures/test_render.py::test_a_background_shown_before_is_restored_and_the_oldest_is_dropped"),
    m("bench load's probe reports getrusage's peak (a large parent's)", "fp8lab/bench/kernelrun.py",
      '"peak_mb": _peak_mb(),', '"peak_mb": _self.ru_maxrss / 1024,',
      T + "bench/test_kernelrun.py::test_the_probe_reports_the_kernels_own_peak_not_the_large_process_that_started_it"),
    m("clearing an axes' data keeps its bar containers", "fp8lab/lab/redraw.py",
      "    ax.containers.clear()", "    pass", T + "lab/test_redraw.py"),
    m("the ticks laid out once a drawing are kept at new limits", "fp8lab/figures/render.py",
      "key = (tuple(axis.get_view_interval()), axis.major.locator,", "key = (axis.major.locator,",
      T + "figures/test_render.py::test_ticks_laid_out_once_a_drawing_are_laid_out_again_at_new_limits"),
    m("the tick label boxes kept for any ticks", "fp8lab/figures/render.py",
      "key = (id(ticks), id(renderer))  #", "key = id(renderer)  #",
      T + "figures/test_render.py::test_ticks_laid_out_once_a_drawing_are_laid_out_again_at_new_limits"),
    m("the PNG keeps a band of the last image without comparing its rows", "fp8lab/figures/png.py",
      "np.array_equal(band, kept_rows[start:start + PNG_BAND_ROWS])", "True", T + "figures/test_png.py"),
    m("fast GEMM drops a's per-row scale beside a folded b", G,
      "    if post_a is not None or post_b is not None:", "    if post_b is not None:", T + "gemm/test_gemm.py", HARD),
    m("tensor scales: b's forgotten", G, "    return ta * tb\n", "    return ta\n", T + "gemm/test_gemm.py"),
    m("K segments of the larger block width", G,
      "return math.gcd(width_a, width_b) if width_a < k or width_b < k else k",
      "return max(width_a, width_b) if width_a < k or width_b < k else k", T + "gemm/test_gemm.py", HARD),
    # ---- nn
    m("delayed FP8Linear scales with the current amax", DL,
      "        return None if past is None else torch.tensor(past, dtype=torch.float32, device=device)",
      "        return None", T + "test_nn.py", HARD),
    m("delayed FP8Linear records the amax it used", N, "        state.delayed.observe(role, current)",
      "        state.delayed.observe(role, amax)", T + "test_nn.py", HARD,
      T + "training/test_layers.py::test_every_recipes_training_steps_equal_the_pinned_ones_bit_for_bit"),
    m("delayed records the history's amax, not the tensor's own", N, "        state.delayed.observe(role, own)",
      "        state.delayed.observe(role, past)", T + "test_nn.py",
      T + "training/test_layers.py::test_every_recipes_training_steps_equal_the_pinned_ones_bit_for_bit"),
    m("delayed reads a forward operand's amax in a pass of its own", N,
      "    past = None if current is not None or state.delayed is None else",
      "    past = None if True else",
      T + "training/test_layers.py::test_delayed_scaling_reads_each_forward_operand_once"),
    m("the quantize kernel returns the given amax as x's own", K,
      "    return Fused(codes, out, scale, own, tensor_scale,",
      "    return Fused(codes, out, scale, own if given is None else given, tensor_scale,", QUANT + "::"
      "test_quantize_observing_is_quantize_with_a_given_amax_and_reads_xs_own_amax"),
    m("transposed blocks keep their orientation", NUM + "granularity.py",
      "return PerBlock(self.cols, self.rows)", "return PerBlock(self.rows, self.cols)",
      KERN + "::test_transposed_operands_equal_quantizing_the_transposed_copy", T + "test_nn.py"),
    # ---- metrics
    m("SQNR in amplitude dB", MT, "return 10.0 * math.log10(signal / noise)",
      "return 20.0 * math.log10(signal / noise)", T + "numerics/test_scaling_metrics_recipes.py"),
    m("underflow counts values that were zero", MT, "flushed = (x.detach() != 0) & (q.values() == 0)",
      "flushed = q.values() == 0", T + "numerics/test_scaling_metrics_recipes.py"),
    m("operand_losses measures every GEMM, whatever was asked", "fp8lab/training/operands.py",
      "(gemm for gemm in GEMM_ROLES if gemm in gemms)", "GEMM_ROLES", T + "training/test_operands.py"),
    m("the flushed fraction divides by every channel, outliers too", MT,
      "        ordinary = int(keep.sum()) * (x2.numel() // max(x2.shape[-1], 1))", "        ordinary = x2.numel()",
      T + "numerics/test_metrics.py"),
    m("the flushed fraction counts the outliers' flushes", MT,
      "return int((flushed & keep).sum()) / ordinary", "return int(flushed.sum()) / ordinary",
      T + "numerics/test_metrics.py"),
    # ---- recipes
    m("mxfp8 inputs with the OCP floor rule", R,
      '"mxfp8",\n            TensorScaling(E4M3, PerBlock(1, 32), "rceil", E8M0)',
      '"mxfp8",\n            TensorScaling(E4M3, PerBlock(1, 32), "floor", E8M0)',
      T + "numerics/test_scaling_metrics_recipes.py", T + "training/test_export.py"),
    # ---- exercises
    m("check_scale accepts the reciprocal", X, "        if math.isclose(got, want, rel_tol=1e-5):\n",
      "        if math.isclose(got, want, rel_tol=1e-5) or (want > 0 and math.isclose(got * want, 1, rel_tol=1e-4)):\n",
      T + "lab/exercises/test_exercises.py", HARD),
    # ---- models as users handle them: compile, copy, save, empty batches
    m("the fused quantize is traced by torch.compile", K,
      "@opaque_to_compile\ndef quantize(x2d", "def quantize(x2d",
      MODELS + "::test_torch_compile_runs_with_the_c_kernels_on"),
    m("a pickled format is a new object", F,
      "        if FORMATS.get(self.name) == self:\n            return (get_format",
      "        if False:\n            return (get_format",
      MODELS + "::test_copied_or_reloaded_formats_are_the_formats"),
    m("blockwise plans compare formats by identity", G,
      'if fa != E4M3 or fb != E4M3:\n            raise KernelUnavailable(f"1x128',
      'if fa is not E4M3 or fb is not E4M3:\n            raise KernelUnavailable(f"1x128',
      MODELS + "::test_formats_equal_to_the_constants_are_treated_as_them"),
    m("E2M1 codes by identity", Q, "        if self.fmt != E2M1:\n            return self.data.view(torch.uint8)",
      "        if self.fmt is not E2M1:\n            return self.data.view(torch.uint8)",
      MODELS + "::test_formats_equal_to_the_constants_are_treated_as_them"),
    m("amax histories left out of state_dict", N, "        save_histories(self.delayed, destination, prefix)\n", "",
      MODELS + "::test_a_converted_model_round_trips_with_identical_outputs_and_kernels"),
    m("an empty batch is quantized as it is", ARM, "    return t if m else t.new_zeros(1, t.shape[1])", "    return t",
      MODELS + "::test_an_empty_batch_gives_what_nn_linear_gives"),
    m("matmul quantizes empty operands", G, "        if a.numel() == 0 or b.numel() == 0:", "        if False:",
      MODELS + "::test_an_empty_batch_gives_what_nn_linear_gives"),
    m("inspect measures calls with no rows", CAP,
      "kept = [c for c in calls if c.grad_output is not None and c.x.shape[0] > 0]",
      "kept = [c for c in calls if c.grad_output is not None]", MODELS + "::test_inspect_skips_a_call_with_no_rows"),
    # ---- what the C code reads
    m("a pending negation reaches the C code", K, "    t = t.resolve_conj().resolve_neg().contiguous()",
      "    t = t.contiguous()", HARD + "::test_views_the_c_code_cannot_read_as_memory_give_the_values"),
    m("the C code reads any CPU float32 tensor", K,
      "    return t.dtype == torch.float32 and own_memory(t)", "    return t.is_cpu and t.dtype == torch.float32",
      HARD + "::test_tensors_without_memory_of_their_own_run_in_torch"),
    m("the torch code lets an infinity beside a NaN through", Q,
      " or (bool(torch.isnan(own).any()) and bool(torch.isinf(x2d).any())):", ":",
      HARD + "::test_an_infinity_beside_a_nan_is_refused"),
    m("the kernel path lets an infinity beside a NaN through", Q,
      "        if fused is None or (fused.nan and bool(torch.isinf(x32).any())):",
      "        if fused is None:", HARD + "::test_an_infinity_beside_a_nan_is_refused"),
    m("a bf16 operand is widened whole before quantizing", Q,
      "x32 = x.detach().to(torch.float32) if x.dtype not in _EXACT_IN_FLOAT32 else x.detach()",
      "x32 = x.detach().to(torch.float32)", HARD + "::test_quantizing_a_bf16_operand_makes_no_full_size_float32_copy"),
    m("E2M1 codes index with int64", Q, "torch.index_select(table, 0, part.to(torch.int32),",
      "torch.index_select(table, 0, part.long(),", HARD + "::test_e2m1_codes_make_no_int64_index_per_element"),
    # ---- the kernel cache and the compiler
    m("a cached library is loaded whatever its bytes", KB,
      '    return "" if recorded == _sha256(path) else "its bytes are not those its build wrote'
      ' (cut short or changed)"',
      '    return ""', CACHE + "::test_truncated_or_unrecorded_libraries_are_never_intact",
      CACHE + "::test_a_truncated_cached_library_is_rebuilt_never_loaded"),
    m("a library lacking fp8lab's functions is used", KB,
      "    missing = [name for name in EXPORTED if not hasattr(lib, name)]", "    missing = []",
      CACHE + "::test_a_library_without_fp8labs_functions_falls_back_to_torch"),
    m("C entry points take the compiler's default visibility", C,
      '#define FP8LAB_API __attribute__((visibility("default")))', "#define FP8LAB_API",
      CACHE + "::test_a_compiler_that_hides_symbols_still_exports_the_kernels"),
    m("threads asking together each load", KB, "        with _LOCK:", "        with contextlib.nullcontext():",
      CACHE + "::test_threads_asking_together_build_once"),
    m("CC taken as one file name", KB, "            argv = shlex.split(cc)", "            argv = [cc]",
      CACHE + "::test_cc_is_a_command_line"),
    m("a stopped compiler leaves its children", KB, "os.killpg(proc.pid, signal.SIGKILL)  # its session's group",
      "os.kill(proc.pid, signal.SIGKILL)  # its session's group",
      CACHE + "::test_a_hanging_compiler_is_stopped_with_its_children_and_said"),
    m("an FP8LAB_KERNELS value that means nothing means on", SET, "    if value not in _ON + _OFF:", "    if False:",
      CACHE + "::test_an_fp8lab_kernels_value_that_means_nothing_is_said"),
    # ---- the real path: plan what runs, probe what is planned
    m("fast accumulation planned for block scaling", G, "FAST_ACCUM_KINDS = (TENSORWISE, ROWWISE)",
      "FAST_ACCUM_KINDS = (TENSORWISE, ROWWISE, *BLOCKWISE_KINDS)",
      REAL + "::test_fast_accumulation_where_the_kernel_takes_it_and_a_clear_error_elsewhere"),
    m("the stand-in lets cuBLAS take fast accumulation with blocks", T + "scaled_mm_standin.py",
      "            check(not use_fast_accum, f\"scaled_gemm doesn't support fast accum"
      " with {size} blockwise scaling\")", "            pass",
      REAL + "::test_fast_accumulation_where_the_kernel_takes_it_and_a_clear_error_elsewhere"),
    m("rowwise planned with a bf16 output", G,
      "out = torch.float32 if cublas or _cutlass_rowwise_float32() else torch.bfloat16", "out = torch.bfloat16",
      REAL + "::test_rowwise_writes_float32_where_torch_does"),
    m("an NVFP4 pair with one tensor scale planned real", G,
      "        if (a_q.tensor_scale is None) != (b_q.tensor_scale is None):", "        if False:",
      REAL + "::test_an_nvfp4_pair_with_one_tensor_scale_is_planned_emulated"),
    m("the probe runs E4M3 whatever was planned", G, "    return quantize(x.to(device), q.fmt, q.granularity",
      '    return quantize(x.to(device), "e4m3", q.granularity', REAL + "::test_the_probe_runs_the_planned_formats"),
    m("train says nothing of its GEMMs", TR, "            if announce:\n", "            if False:\n",
      REAL + "::test_train_announces_which_gemms_ran_real_or_emulated_and_why"),
    m("the emulation inherits TF32 / bf16 matmuls", G, '                    m.fp32_precision = "ieee"',
      "                    pass",
      T + "gemm/test_gemm.py::test_the_emulation_sets_ieee_float32_for_its_matmuls_and_gives_the_setting_back",
      T + "gemm/test_gemm.py::test_the_emulation_stays_ieee_float32_whatever_the_matmul_precision"),
    m("the accumulation model takes every product at once", G,
      "    rows = max(1, _PRODUCTS_PER_CHUNK // max(n * k, 1))", "    rows = max(m, 1)",
      T + "gemm/test_gemm.py::test_the_accumulation_model_has_a_size_limit_and_works_in_chunks"),
    m("the accumulation model has no size limit", G, "    if m * n * k > MAX_ACCUMULATED_PRODUCTS:", "    if False:",
      T + "gemm/test_gemm.py::test_the_accumulation_model_has_a_size_limit_and_works_in_chunks"),
    # ---- the lab's explanations: the accumulator's two readings, NVFP4's floor, the weight's copies, real outliers
    m("the accumulator's default reading is the group one", G, '    alignment: str = "running"',
      '    alignment: str = "group"',
      EXPL + "::test_both_readings_of_deepseeks_sentence_side_by_side_against_2_percent_and_the_"
      "inputs_rounding"),
    m("the accumulator's two readings swapped", G, '            if self.alignment == "running":',
      '            if self.alignment != "running":',
      T + "gemm/test_gemm.py::test_both_readings_of_the_accumulator_are_the_written_out_model_bit_for_bit"),
    m("blockwise's weights in 1-D blocks", R, "TensorScaling(E4M3, PerBlock(128, 128)),",
      "TensorScaling(E4M3, PerBlock(1, 128)),",
      EXPL + "::test_2d_weight_blocks_give_both_gemms_the_same_weight_and_1d_blocks_differ_by_"
      "rounding"),
    m("published markers at the ratio, not at the ratio times the median", PUB, "    v = ratio * lesson_median()",
      "    v = ratio", EXPL + "::test_the_published_ratios_are_their_sources_words_placed_at_ratio_"
      "times_the_median"),
    m("the massive activations' ratio is not its source's", PUB_DATA, '    "ratio": 100000.0,',
      '    "ratio": 10000.0,',
      EXPL + "::test_the_published_ratios_are_their_sources_words_placed_at_ratio_times_the_median"),
    m("the massive activations placed on the channel cliff", PUB_DATA, '    "placement": "tokens"',
      '    "placement": "channels"',
      EXPL + "::test_the_published_ratios_are_their_sources_words_placed_at_ratio_times_the_median"),
    m("notebook 02's markers placed against the median alone", PUB,
      "    return ratio * float(x[:, keep].abs().median()) / float(x[mask].abs().max())",
      "    return ratio * float(x[:, keep].abs().median())",
      EXPL + "::test_the_published_ratios_are_their_sources_words_placed_at_ratio_times_the_median"),
    # ---- the sinks by placement: every token's channels, a few tokens' channels, both
    m("the token sinks sit in every token", "fp8lab/training/models.py",
      "        h[..., : self.tokens, self.token_index] = self.magnitude",
      "        h[..., self.token_index] = self.magnitude", T + "data/test_placements.py"),
    m("an unknown placement accepted", "fp8lab/training/models.py", "        if placement not in PLACEMENTS:",
      "        if False:", T + "data/test_placements.py"),
    m("a fractional count of sink tokens accepted", "fp8lab/training/models.py",
      "        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:", "        if tokens < 1:",
      T + "data/test_placements.py"),
    m("an outlier mask of another shape accepted", MT, "        if tuple(outliers.shape) != (m, k):",
      "        if False:", T + "data/test_placements.py"),
    m("notebook 02's token outliers in every token", "fp8lab/data/synthetic.py",
      '    rows = slice(None) if placement == "channels" else slice(0, OUTLIER_TOKENS)', "    rows = slice(None)",
      T + "data/test_placements.py"),
    # ---- inspect, convert, export, distributed
    m("inspect copies into buffers the forward replaced", CAP,
      "                m._buffers.clear()\n                m._buffers.update(objects)\n", "",
      T + "training/test_readiness.py::test_a_buffer_the_forward_replaces_is_given_back"),
    m("inspect runs a meta model", CAP, "    if meta:\n", "    if False:\n",
      T + "training/test_readiness.py::test_a_model_on_the_meta_device_gets_a_clear_error"),
    m("convert skips FP8Linear layers", CV, "_forward_owner(type(module)) in (nn.Linear, FP8Linear)",
      "_forward_owner(type(module)) in (nn.Linear,)",
      T + "test_nn.py::test_converting_again_changes_the_recipe_and_keeps_what_it_should"),
    # ---- a model of your own, converted truthfully
    m("convert leaves a bare layer alone", CV, "        if isinstance(m, nn.Linear):\n            if name in bypassed:",
      "        if isinstance(m, nn.Linear) and name:\n            if name in bypassed:", TRUTH),
    m("convert keeps torch's fused evaluation paths", CV, "        report.fast_paths_off = _fast_paths_off(model)",
      "        report.fast_paths_off = []", TRUTH),
    m("convert takes exact nn.Linear only", CV, "    return isinstance(module, nn.Linear) and _forward_owner(type",
      "    return type(module) in (nn.Linear, FP8Linear) and _forward_owner(type", TRUTH),
    m("a lazy layer becomes a plain Linear at its first forward", CV,
      "        m.cls_to_become = FP8Linear  # at its first forward", "        pass  # at its first forward", TRUTH),
    m("a conversion that rebuilds the layer drops its hooks", CV, "    m.__class__ = fp8_class(type(m))\n",
      "    m.__class__ = fp8_class(type(m))\n    m._forward_pre_hooks.clear()\n    m._forward_hooks.clear()\n",
      TRUTH),
    m("attention's in-projection stays in high precision", AT,
      "                return _split_packed(project(\"qkv\", q, w, b), 3, e)",
      "                return _split_packed(F.linear(q, w, b), 3, e)", TRUTH),
    m("attention scales q by the head width, not its root", AT,
      "        q_scaled = q * math.sqrt(1.0 / float(q.shape[-1]))", "        q_scaled = q * (1.0 / float(q.shape[-1]))",
      TRUTH + "::test_attention_forward_equals_torchs_slow_path_bit_for_bit"),
    m("a second derivative drops its terms silently", ARM, "    if not torch.is_grad_enabled():\n        return False",
      "    if True:\n        return False", TRUTH),
    m("autocast ignored", ARM, "    if torch.is_autocast_enabled(device_type):\n        dtype",
      "    if False:\n        dtype", TRUTH),
    m("a recompute ends the step of record='forward'", DL,
      'if training and self.policy == "forward" and not in_recompute():',
      'if training and self.policy == "forward":', TRUTH),
    m("every training forward ends a step", DL, 'if training and self.policy == "forward" and not in_recompute():',
      "if training and not in_recompute():", TRUTH),
    m("evaluation forwards record their amax", DL, "        records = training and torch.is_grad_enabled()",
      "        records = True", TRUTH),
    m("a NaN amax enters the history", DL, "        if math.isnan(value):\n            self.skipped",
      "        if False:\n            self.skipped", TRUTH),
    m("delayed passes an infinite amax to quantize", N,
      "    if math.isinf(float(current.max())):  # quantize refuses it", "    if False:  # quantize refuses it",
      TRUTH),
    m("torchao takes every width", CV, "        elif m.in_features % 16 or m.out_features % 16:",
      "        elif False:", TRUTH + "::test_torchao_names_the_layers_its_kernels_cannot_take"),
    m("inspect measures a converted model", CAP, "    if converted:\n        raise", "    if False:\n        raise",
      TRUTH),
    m("inspect keeps every operand at once", CAP,
      "            if budget is not None and taken and used[0] + size > budget:", "            if False:", TRUTH),
    m("fp8lab.nn needs its own import", "fp8lab/__init__.py", "from fp8lab import nn\n", "",
      TRUTH + "::test_fp8lab_nn_is_there_after_import_fp8lab"),
    m("torchtitan flags outside a comment", EX, "#   {_comment(line)}\n#   --float8.filter_fqns output",
      "{line}\n#   --float8.filter_fqns output", T + "training/test_export.py::test_every_snippet_is_python"),
    m("torchtitan flags unquoted", EX,
      '            flags += ["--float8.filter_fqns", ",".join(skip)]\n        line = shlex.join(flags)',
      '            flags += ["--float8.filter_fqns", ",".join(skip)]\n        line = " ".join(flags)',
      T + "training/test_export.py::test_the_reports_skip_list_is_python_and_quoted_for_every_target"),
    m("distributed writes through a predictable temporary", RUN,
      '    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)',
      '    tmp = str(path.with_name(f".{path.name}.{os.getpid()}.tmp"))\n'
      "    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)",
      T + "training/test_distributed.py::test_out_is_written_through_a_private_temporary_never_a_planted_link"),
    m("distributed takes any timeout", RUN, "    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):",
      "    if not (math.isfinite(value) and 0 < value):",
      T + "training/test_distributed.py::test_a_timeout_beyond_thirty_days_is_refused_before_any_rank_starts"),
    # ---- notebook 09: the 4-bit training recipe's parts
    m("the Hadamard transform without its random signs", NUM + "hadamard.py",
      "blocks = self.block_view(x) * self.signs.to(x.device)", "blocks = self.block_view(x)", FP4),
    m("the Hadamard transform's inverse without its signs", NUM + "hadamard.py",
      "return (blocks * self.signs.to(y.device)).reshape(*y.shape[:-1], -1)",
      "return blocks.reshape(*y.shape[:-1], -1)", FP4),
    m("stochastic rounding biased up by 2^-8 of a step", F, "(draws < units - low).to(torch.float32)",
      "(draws < units - low + 2.0**-8).to(torch.float32)", FP4),
    m("quantize's stochastic rounding ignores its generator", Q,
      'return uniform_draws(x2d, generator) if spec.rounding == "stochastic" else None',
      'return uniform_draws(x2d, None) if spec.rounding == "stochastic" else None', FP4),
    m("a layer's stochastic rounding draws from torch's default generator", N,
      'draws = state.draws.generator(t.device) if scaling.rounding == "stochastic" and state.draws else None',
      "draws = None", FP4),
    m("2-D weight blocks as 1 x c", R, "weight = replace(w, granularity=PerBlock(c, c) if on else PerBlock(1, c))",
      "weight = replace(w, granularity=PerBlock(1, c))", FP4),
    m("wgrad reads its operands without the Hadamard transform", N,
      "    t = transformed(t, scaling)  # the operand as its GEMM reads it",
      "    t = t  # the operand as its GEMM reads it", FP4,
      T + "test_nn.py::test_gradients_equal_the_float64_reference_of_the_quantized_operands"),
    m("the high-precision share keeps the first layers", R, "return list(names[len(names) - keep:]) if keep else []",
      "return list(names[:keep]) if keep else []", FP4),
    m("export spells nvfp4_training with the Hadamard transform off", EX,
      '"NVFP4BlockScaling(disable_rht=False, disable_stochastic_rounding=False, "',
      '"NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=False, "', T + "training/test_export.py"),
    m("the GEMM-sum view swaps its nearest and stochastic curves", "fp8lab/lab/panels/fp4_parts.py",
      'figs.sum_error(s["ks"], s["sum"]["nearest"], s["sum"]["stochastic"],',
      'figs.sum_error(s["ks"], s["sum"]["stochastic"], s["sum"]["nearest"],',
      PARTS + "::test_the_sum_view_draws_nearest_as_nearest"),
    m("the depth view's 2-D weight blocks fall back to 1-D", "fp8lab/lab/panels/fp4_parts.py",
      '"2d": depth_drift(DEPTHS[-1], two_d=True,', '"2d": depth_drift(DEPTHS[-1], two_d=False,',
      PARTS + "::test_the_depth_view_draws_2d_blocks_as_2d"),
    m("a backward-only recipe's forward quantized all the same", N,
      'elif state.recipe.scaling("input", "fprop") is None:', "elif False:", PARTS),
    m("the dy control quantizes dgrad all the same", R,
      '        if gemm == "dgrad" and self.dgrad_high_precision:\n            return None\n', "", PARTS),
    m("the high-precision switches take any value", R, "            if not isinstance(getattr(self, flag), bool):",
      "            if False:", PARTS),
    m("exercise 09 accepts round to nearest", "fp8lab/lab/exercises/fp4.py", "    if torch.equal(got, want):",
      "    if torch.equal(got, want) or torch.equal(got, cast(x, E2M1)):", T + "lab/test_fp4_panels.py"),
    m("panels: per_tensor's left margin as matplotlib's defaults need, not the lab's theme",
      "fp8lab/lab/panels/per_tensor.py", "    left = 1.0  # the counts' labels reach 100000\n", "",
      WIDGETS + "::test_every_axis_is_legible"),
    # ---- the thread policy, the extras' torch, the hosted first cell
    m("threads: the cgroup quota is not read", TH, "    if not found:\n        return None, \"no CPU quota\"",
      "    if True:\n        return None, \"no CPU quota\"", T + "test_threads.py"),
    m("threads: OMP_NUM_THREADS of the user overridden", TH,
      '    if in_env is not None and "OMP_NUM_THREADS" not in ours:', "    if False:", T + "test_threads.py"),
    m("threads: OpenMP left spinning", TH, '        variables["OMP_WAIT_POLICY"] = PASSIVE', "        pass",
      T + "test_threads.py"),
    m("threads: the quota rounded up", TH, "math.floor(quota + 1e-9)", "math.ceil(quota - 1e-9)",
      T + "test_threads.py"),
    m("threads: the lab server's kernels get no policy", "fp8lab/lab/launcher.py",
      "    env.update(threads.environment(env))\n", "", T + "test_threads.py"),
    m("kernels: a new thread runs OpenMP's default count", K, "    _torch_threads_here()\n    function = getattr(",
      "    function = getattr(", T + "test_threads.py"),
    m("panels: training_cliff's point drawn afresh on every drag", "fp8lab/lab/panels/training.py",
      "        if self._mark is None or self._drawn != self._drawing(data):",
      "        if True:", WIDGETS + "::test_dragging_the_sink_cliffs_point_moves_its_line_in_place_and_other_"
      "controls_redraw"),
    m("bench load: the busy processes in the kernel's group", "fp8lab/bench/load.py",
      '            others = kernel if condition == "shared" else stack.enter_context(CpuGroup("busy"))',
      "            others = kernel", T + "bench/test_load.py"),
    m("bench --quota: the quota's period left at 100 ms", "fp8lab/bench/cgroups.py",
      '                (self.folder / "cpu.cfs_period_us").write_text(str(self.period))',
      '                (self.folder / "cpu.cfs_period_us").write_text(str(PERIOD))', T + "bench/test_quota.py"),
    m("bench --quota: what the child leaves running keeps the group", "fp8lab/bench/quota.py",
      "        _end_leftovers(Path(group.procs))\n", "", T + "bench/test_quota.py"),
    m("bench tables: the machine line without the reference speed", "fp8lab/bench/table.py",
      '        extra.append(f"reference: {reference_speed()}")', "        pass", T + "bench/test_table.py"),
    m("bench widgets: a slider swept from its first value, not dragged", "fp8lab/bench/widgets.py",
      "            drags[name] = drag_path(values, start)", "            drags[name] = values",
      T + "bench/test_widgets.py"),
    m("bench train: a step without its backward pass timed as a step", "fp8lab/bench/train.py",
      "                        skipped[label] = skipped.get(label, 0) + 1", "                        pass",
      T + "bench/test_train.py"),
    m("extras: torchao beside an old torch counts as usable", "fp8lab/extras.py",
      "    if _version(have) >= _version(floor):", "    if True:", T + "test_extras.py"),
    m("first cell: the source goes through a shell", "tools/links.py",
      "'    pip = subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"-q\", \"--\", source],\\n'\n"
      "        \"                         capture_output=True, text=True)  # one argument, no shell\\n\"",
      "'    pip = subprocess.run(f\"{sys.executable} -m pip install -q -- {source}\",\\n'\n"
      "        \"                         shell=True, capture_output=True, text=True)  # one argument, no shell\\n\"",
      T + "hygiene/test_first_cell.py"),
    m("first cell: PyPI's name as the default source", "tools/links.py",
      '    return f"fp8lab[{EXTRAS}] @ git+{url}" if url else None',
      '    return f"fp8lab[{EXTRAS}] @ git+{url}" if url else f"fp8lab[{EXTRAS}]"', T + "hygiene/test_first_cell.py"),
    m("panels: a drag's values redrawn in the change handler", "fp8lab/lab/panels/base.py",
      "        if self.sync:\n            self.redraws += 1", "        if True:\n            self.redraws += 1",
      DRAG),
    m("panels: a redraw leaves the panel stale (frames queue on)", "fp8lab/lab/panels/base.py",
      "                    self._stale = False\n", "", DRAG),
    # ---- a mixed-precision loop's overflow, a learner's slip, arguments refused at the door
    m("layers: an infinite gradient is quantized (quantize's error re-raised in the backward)", N,
      '    if role == "grad_output" and state.passes_nonfinite:',
      '    if role == "grad_output" and False:',
      T + "training/test_layers.py::test_one_fp16_step_that_overflows_is_skipped_for_every_recipe"),
    m("layers: a rank decides a gradient's overflow from its own amax, not the reduced one", N,
      "        return all_finite(current)",
      "        return all_finite(t)",
      T + "training/test_layers.py::test_a_non_finite_reduced_amax_decides_on_every_rank"),
    m("delayed: an overflowing backward pass's gradient amaxes kept", DL, "        state.drop_gradients(task)",
      "        pass",
      T + "training/test_layers.py::test_a_backward_pass_that_overflows_midway_records_no_gradient_amax_in_any_layer"),
    m("exercises: a string taken for a number (float('abc') raises in the checker)", "fp8lab/lab/exercises/base.py",
      "    if isinstance(value, numbers.Real) and not isinstance(value, bool):",
      "    if isinstance(value, numbers.Real | str) and not isinstance(value, bool):",
      T + "lab/exercises/test_exercises.py::test_every_checker_answers_every_wrong_answer_with_feedback"),
    m("exercises: a name checker looks a list up in its table", "fp8lab/lab/exercises/blocks.py",
      "    if not isinstance(label, str):", "    if isinstance(label, bytes):",
      T + "lab/exercises/test_exercises.py::test_every_checker_answers_every_wrong_answer_with_feedback"),
    m("inspect: a NaN loss measured and blamed on FP8", CAP, "    if not bool(torch.isfinite(loss.detach()).all()):",
      "    if False:", T + "training/test_readiness.py"),
    m("inspect: one recipe's name iterated letter by letter", RD,
      "    if isinstance(recipes, str | Recipe):  # one recipe, not its letters", "    if False:",
      T + "training/test_readiness.py"),
    m("convert: a share that keeps every linear layer says nothing", CV,
      "            and len(recipe.high_precision_layers([s.name for s in sites])) == len(sites)):",
      "            and False):", TRUTH),
    m("doctor: a broken torchao listed by its version", "fp8lab/lab/doctor.py",
      "        elif broken := import_error(extra, quiet=True):", "        elif broken := None:",
      T + "test_extras.py::test_doctor_imports_the_extras_it_reports_and_calls_a_broken_one_broken"),
    m("hadamard: a float size accepted", NUM + "hadamard.py",
      "isinstance(self.size, bool) or not isinstance(self.size, int) or self.size not in SIZES",
      "isinstance(self.size, bool) or self.size not in SIZES", FP4),
    m("bench: a size of 0 accepted", "fp8lab/bench/__init__.py", "    if value < least:", "    if value < least - 1:",
      T + "test_cli.py::test_a_bench_argument_out_of_range_gets_the_usage_line_not_a_traceback"),
    m("bench room: no memory check before the kernels start", "fp8lab/bench/room.py",
      "    if check_memory and (floor := own_memory_mb()) is not None:", "    if False:", T + "bench/test_room.py"),
    m("kernels_build: a build starts without a word", KB, "            cc.announce()\n            cc.run(",
      "            cc.run(", CACHE),
    # ---- the step's calls: the plain pass for delayed scaling's amax, torch's op where it runs alone
    m("the plain pass scales with x's own amax where delayed scaling gives one", NUM + "quantize_fast.py",
      "fused = kernels.quantize(x, block, template, amax, fold=fold, values=values)",
      "fused = kernels.quantize(x, block, template, None, fold=fold, values=values)", PLAIN_AMAX),
    m("the plain pass takes a negative or infinite amax", NUM + "quantize_fast.py",
      "    return not (value < 0 or math.isinf(value))", "    return True", PLAIN_AMAX),
    m("the plain pass records x's own amax as the one it scaled with", Q,
      "scaled_from = fused.amax if amax is None else amax.reshape(())", "scaled_from = fused.amax", PLAIN_AMAX),
    m("all_finite takes one infinite value for finite", ARM, "return t.numel() == 0 or math.isfinite(float(t))",
      "return t.numel() == 0 or not math.isnan(float(t))",
      T + "training/test_armour.py::test_all_finite_says_what_isfinite_says"),
    m("torch_runs_alone forgets torch's one thread", K,
      "    return t.numel() < TORCH_GRAIN or torch.get_num_threads() == 1", "    return t.numel() < TORCH_GRAIN",
      KERN + "::test_torch_runs_an_elementwise_op_alone_below_its_grain_or_on_one_thread"),
    m("a one-value output scale is always the kernel's", G + "emulation.py",
      "if all(t is None or t.dim() == 0 for t in (a, b)) and kernels.torch_runs_alone(out):",
      "if all(t is None or t.dim() == 0 for t in (a, b)) and False:",
      T + "gemm/test_emulation.py::test_a_one_value_output_scale_is_torchs_multiply_where_torch_runs_it_alone"),
    m("a bias is always the kernel's", N, "and not kernels.torch_runs_alone(out) and kernels.enabled(out, bias)",
      "and kernels.enabled(out, bias)",
      T + "training/test_layers.py::test_the_bias_is_torchs_add_where_torch_runs_it_alone_else_the_kernels"),
    m("a gradient's quantizing pass takes a NaN for finite", ARM, "    return q if all_finite(q.amax) else None",
      "    return q", T + "training/test_armour.py::"
      "test_a_gradient_quantized_where_finite_is_quantize_with_and_none_where_it_holds_an_inf_or_nan",
      T + "training/test_layers.py::test_a_non_finite_gradient_gives_high_precisions_gradients_from_the_same_operands"),
    m("quantize_if_finite takes every refusal for an infinity", ARM, "        if all_finite(t):\n            raise",
      "        if False:\n            raise", T + "training/test_armour.py::"
      "test_a_gradient_quantized_where_finite_is_quantize_with_and_none_where_it_holds_an_inf_or_nan"),
    m("a gradient read in its quantizing pass is kept as finite whatever the pass found", N,
      "            state.finite_gradient = (t, q is not None)", "            state.finite_gradient = (t, True)",
      T + "training/test_layers.py::test_a_non_finite_gradient_gives_high_precisions_gradients_from_the_same_operands"),
    m("bench train --parts counts the GEMMs in C as passes", "fp8lab/bench/train.py",
      "    return sum(seconds for name, seconds in tally.items() if name not in GEMM_KERNELS)",
      "    return sum(seconds for name, seconds in tally.items())",
      T + "bench/test_train.py::test_c_passes_are_the_kernels_time_but_their_gemms"),
    m("bench train --parts: a recipe's floor without its passes", "fp8lab/bench/train.py",
      '"floor x fp32": (fp32_ms + passes_ms) / fp32_ms if held', '"floor x fp32": fp32_ms / fp32_ms if held',
      T + "bench/test_train.py::test_parts_time_each_steps_c_passes_and_give_each_recipes_floor"),
    m("kernel_times stays open after its block", K, "    finally:\n        _tally = None\n",
      "    finally:\n        pass\n",
      KERN + "::test_kernel_times_tallies_each_c_function_by_name_while_open_and_one_at_a_time"),
    m("kernel_times tallies every call under one name", K, "        _tally[name] += time.perf_counter() - start",
      '        _tally["fp8lab_quantize"] += time.perf_counter() - start',
      KERN + "::test_kernel_times_tallies_each_c_function_by_name_while_open_and_one_at_a_time"),
    # ---- notebook 06's lessons, trained
    lesson("the sinks have no effect", "fp8lab/training/models.py", "        h = self.sink(h)", "        h = h"),
    lesson("tensorwise scales to a power of two", R, '"tensorwise", _E4M3_TENSOR, _E4M3_TENSOR, _E5M2_TENSOR,',
           '"tensorwise", TensorScaling(E4M3, PerTensor(), "rceil"), TensorScaling(E4M3, PerTensor(), "rceil"), '
           "_E5M2_TENSOR,"),
    lesson("tensorwise scales its input per 1x128 block", R, '"tensorwise", _E4M3_TENSOR, _E4M3_TENSOR, _E5M2_TENSOR,',
           '"tensorwise", TensorScaling(E4M3, PerBlock(1, 128)), _E4M3_TENSOR, _E5M2_TENSOR,'),
]


def _tree() -> list[str]:
    """The working tree's files as git sees them (tracked, and untracked but not ignored)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if (ROOT / line).is_file()]


def _pytest(copy: Path, mu: Mutation, env: dict, timeout: float) -> tuple[int, str, float]:
    start = time.perf_counter()
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", mu.markers, *mu.tests]
    try:
        proc = subprocess.run(argv, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        code, out = -1, f"timed out after {timeout:.0f} s\n{err.stdout or ''}"
    return code, out, time.perf_counter() - start


def _first_failure(out: str) -> str:
    for line in out.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            return line.split(" - ")[0].replace("FAILED ", "").replace("ERROR ", "")[:90]
    return out.strip().splitlines()[-1][:90] if out.strip() else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only mutations whose name contains this")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutation's test run")
    parser.add_argument("-v", "--verbose", action="store_true", help="print pytest's output of each run")
    parser.add_argument("--shard", default="1/1", metavar="I/N",
                        help="only every N-th mutation from the I-th on (1/2 and 2/2: two halves to run side by side)")
    parser.add_argument("--no-baseline", action="store_true", help="skip running the tests on the unmutated copy")
    args = parser.parse_args(argv)
    try:
        shard, shards = (int(part) for part in args.shard.split("/"))
        if not 1 <= shard <= shards:
            raise ValueError
    except ValueError:
        parser.error(f"--shard takes I/N with 1 <= I <= N (such as 1/2), not {args.shard!r}")
    chosen = [mu for mu in MUTATIONS if args.k.lower() in mu.name.lower()][shard - 1::shards]
    if args.list:
        for mu in chosen:
            print(f"{mu.path:<32} {mu.name}  [{' '.join(mu.tests)}]")
        return 0
    for mu in chosen:  # every edit must apply exactly once, or the list has gone stale
        target = ROOT / mu.path
        count = target.read_text().count(mu.old) if target.is_file() else 0
        if count != 1:
            print(f"stale mutation {mu.name!r}: its text occurs {count} times in {mu.path}", file=sys.stderr)
            return 2
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fp8lab-mutate-") as tmp:
        copy, cache = Path(tmp) / "tree", Path(tmp) / "cache"
        for rel in _tree():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, copy / rel)
        # the copy's fp8lab (not the editable install's), its own kernel cache, no bytecode left behind
        env = {**os.environ, "PYTHONPATH": str(copy), "XDG_CACHE_HOME": str(cache), "PYTHONDONTWRITEBYTECODE": "1"}
        if not args.no_baseline:
            selections = list({(mu.tests, mu.markers): mu for mu in chosen}.values())
            print(f"baseline: the {len(selections)} test selections on the unmutated copy ...", flush=True)
            for mu in selections:
                code, out, secs = _pytest(copy, mu, env, args.timeout)
                if code != 0:
                    print(f"the unmutated tree fails {' '.join(mu.tests)} ({secs:.0f} s):\n{out[-3000:]}",
                          file=sys.stderr)
                    return 2
        rows, survivors = [], []
        for i, mu in enumerate(chosen, 1):
            target = copy / mu.path
            original = target.read_text()
            target.write_text(original.replace(mu.old, mu.new, 1))
            try:
                code, out, secs = _pytest(copy, mu, env, args.timeout)
            finally:
                target.write_text(original)
            killed = code not in (0, 5)  # 5: no tests collected, which kills nothing
            (rows if killed else survivors).append(mu)
            verdict = "killed " if killed else "SURVIVED"
            why = f"  ({_first_failure(out)})" if killed else ""
            print(f"[{i:2}/{len(chosen)}] {verdict} {secs:6.1f} s  {mu.name}{why}", flush=True)
            if args.verbose:
                print(out)
    total = time.perf_counter() - start
    print(f"\nmutation score: {len(rows)}/{len(chosen)} killed by the tests that guard them in {total / 60:.1f} min"
          + (f"; survivors: {', '.join(mu.name for mu in survivors)}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
