"""fp8lab: learn and compare FP8 scaling strategies. Start with notebook 00.

fp8lab.quantize(x, fmt, granularity) -> QuantizedTensor; fp8lab.matmul(a, b, recipe);
fp8lab.nn.convert(model, recipe); fp8lab.inspect(model, batch, loss_fn) reports any model's
FP8 readiness per layer (notebook 08). The folders are the layers; a folder imports only
the ones below it (the import-linter contract in pyproject.toml):

  harness/    `python -m fp8lab answers | measured`: the answer key, the shipped runs measured again
  bench/      `python -m fp8lab bench ...`: the benchmarks; with harness/, the project's tools, not the lesson
  lab/        what the notebooks show: panels, predictions, exercises, doctor, launcher
  training/   FP8Linear and convert (layers), toy models, the training step, distributed,
              readiness (inspect), export, cost, the capstone, the shipped measured runs
  gemm/       FP8 GEMMs: emulation, the real path (torch scaled_mm), the backend, accumulation
  figures/    plots (data in, ax out) and the PNG renderer
  numerics/   formats, scaling, quantize (+ its C fast path), metrics, recipes, anatomy
  data/       synthetic tensors and the real data shipped with Python
  settings, timing, _version: environment settings, timing helpers, the version (no fp8lab imports)
  threads: the CPUs fp8lab may use and OpenMP's wait policy, decided here before torch is imported
  extras, progress: the optional extras and how to add one, progress bars (no fp8lab imports)

What `import fp8lab` changes in this process (docs/internals.md, "What importing fp8lab changes", says why):
  OMP_WAIT_POLICY=PASSIVE    unless set (or GOMP_SPINCOUNT is), and only before torch is imported
  OMP_NUM_THREADS=N          only under a CPU quota below the cores, unless set, and only before torch is imported
  torch.set_num_threads(N)   only where torch was imported first, under such a quota, and no user count is seen
  FP8LAB_THREADS_SET         names the variables above that fp8lab set (a child process decides them again)
  MKL_CBWR=AUTO,STRICT       unless set: MKL's GEMMs give the same bits on any thread count
  TORCHINDUCTOR_CACHE_DIR    torch's own, set when its compiler loads (the C kernels are marked compiler-disabled)
Nothing else: no seed, dtype, matmul precision or plotting style; setup() changes those a notebook needs.
"""

import gc

from fp8lab import threads
from fp8lab.settings import keep_freed_memory, pin_blas_reproducibility, smoke

threads.apply()  # before torch loads OpenMP: threads sized to the CPU quota, OpenMP waits passively (threads.py)
pin_blas_reproducibility()  # before torch multiplies a matrix: MKL GEMMs give the same bits on any thread count

import torch

from fp8lab import nn
from fp8lab._version import __version__
from fp8lab.gemm import AccumulatorModel, matmul
from fp8lab.numerics import kernels
from fp8lab.numerics.formats import BF16, E2M1, E4M3, E5M2, E8M0, FORMATS, FP16, FloatFormat, cast, get_format
from fp8lab.numerics.metrics import (
    overflow_fraction,
    quantization_report,
    relative_error,
    sqnr,
    subnormal_fraction,
    underflow_fraction,
)
from fp8lab.numerics.quantize import QuantizedTensor, quantize, quantize_delayed
from fp8lab.numerics.recipes import RECIPES, Recipe, TensorScaling, get_recipe
from fp8lab.numerics.scaling import SCALE_RULES, AmaxHistory, PerBlock, PerRow, PerTensor, parse_granularity
from fp8lab.training.export import export
from fp8lab.training.readiness import inspect


def status_line() -> str:
    """The lab's status line: versions, where FP8 GEMMs run, the CPU kernels, the threads (threads.py)."""
    if torch.cuda.is_available():
        cc = torch.cuda.get_device_capability()
        where = f"GPU {torch.cuda.get_device_name()} (sm_{cc[0]}{cc[1]}): real FP8 GEMMs where the kernel exists"
    else:
        where = "no GPU: FP8 GEMMs are emulated exactly on the CPU"
    fused = "CPU kernels on" if kernels.status()[0] else "CPU kernels off (python -m fp8lab doctor says why)"
    line = f"fp8lab {__version__} | torch {torch.__version__} | {where} | {fused}"
    if smoke():
        line += " | smoke mode"
    return f"{line}\n{threads.decision().line()}"


def setup(seed: int = 0, quiet: bool = False) -> None:
    """The first cell of every notebook: the lab's plot theme, a fixed seed, the status line printed.

    What it changes, for the whole kernel process (a notebook's): matplotlib's style (the lab's
    seaborn theme); torch's global random seed (`seed`); the garbage collector (the objects
    imported so far are frozen, gc.freeze(), so that full collections don't stall a redraw);
    glibc's malloc thresholds (settings.keep_freed_memory: freed blocks up to 32 MiB are kept for
    reuse); and it decides the CPU kernels once for the process (kernels.status: built or loaded
    from the cache and loaded into the process, or off, reading FP8LAB_KERNELS now). It changes
    no numerics setting of torch (no matmul precision, no oneDNN mode). The threads were decided
    when fp8lab was imported (fp8lab.threads); the status line's second line says how and why.
    Prints status_line() unless quiet; returns None, so that a cell ending in setup() shows the
    line once."""
    # matplotlib and seaborn (the theme) load here, not at `import fp8lab`: a script that never plots does not pay
    # for them (about 1.5-2 s of CPU)
    from fp8lab.figures.plots import use_theme

    use_theme()
    torch.manual_seed(seed)
    # everything imported so far lives for the whole session: move it out of the garbage
    # collector's sight, so that its full collections don't stall a widget's redraw
    gc.collect()
    gc.freeze()
    keep_freed_memory()  # emulated FP8 reuses its temporaries' pages instead of faulting fresh ones
    line = status_line()
    if not quiet:
        print(line)


__all__ = [
    "BF16",
    "E2M1",
    "E4M3",
    "E5M2",
    "E8M0",
    "FORMATS",
    "FP16",
    "RECIPES",
    "SCALE_RULES",
    "AccumulatorModel",
    "AmaxHistory",
    "FloatFormat",
    "PerBlock",
    "PerRow",
    "PerTensor",
    "QuantizedTensor",
    "Recipe",
    "TensorScaling",
    "__version__",
    "cast",
    "export",
    "get_format",
    "get_recipe",
    "inspect",
    "matmul",
    "nn",
    "overflow_fraction",
    "parse_granularity",
    "quantization_report",
    "quantize",
    "quantize_delayed",
    "relative_error",
    "setup",
    "sqnr",
    "status_line",
    "subnormal_fraction",
    "underflow_fraction",
]
