"""fp8lab: learn and compare FP8 scaling strategies. Start with notebook 00.

fp8lab.quantize(x, fmt, granularity) -> QuantizedTensor; fp8lab.matmul(a, b, recipe);
fp8lab.nn.convert(model, recipe); fp8lab.inspect(model, batch, loss_fn) reports any model's
FP8 readiness per layer (notebook 08). The map, bottom layer first: a module imports only
modules listed before it (tests/test_architecture.py checks it; this file imports last).

  no fp8lab imports
    settings     FP8LAB_SMOKE and FP8LAB_KERNELS, read from the environment when asked
    _watchdog    ends a torchrun job whose launcher died (standard library only)
  numbers
    formats      FloatFormat as data (E4M3, E5M2, E8M0, E2M1), the reference cast
    scaling      granularities, amax per block, the scale rules, delayed scaling
    kernels      the C fast path of quantize (formats and rules passed as data), chosen once
    timing       timing helpers, the machine a measurement ran on
    quantize     quantize(x, ...) -> QuantizedTensor, dequantize
  FP8 training
    metrics      SQNR, relative error, overflow / underflow / subnormal fractions
    recipes      named recipes: format, granularity and scale rule per tensor role and GEMM
    gemm         real (torch scaled_mm) and emulated FP8 GEMMs, the accumulation model
    nn           FP8Linear, convert(model, recipe), the torchao bridge, the Monitor
    train        toy models and tasks, train_step (the one step), recipes side by side
  data and figures
    data         synthetic tensors: distributions, outlier channels, spikes
    realdata     real data shipped with Python: text, digits
    anatomy      one value in a format: neighbours, gap, rounding
    render       Agg that keeps rendered glyphs (the panels' PNGs, byte for byte)
    plots        figures: take data and an optional ax, return the ax
  built on training
    export       a recipe written for torchao, TransformerEngine, torchtitan
    readiness    fp8lab.inspect: any model's FP8 readiness per layer
    cost         what each recipe costs: scale storage, amax, scale multiplies
    distributed  FSDP2 under torchrun: the toy transformer on several processes
    capstone     notebook 08's three models and the seed's claims
    measured     training results shipped with the lab (the sink cliff, delayed recovery)
  the edges
    doctor       what this machine runs real and emulated, and why
    exercises    check_*, hint_*, solution_* for the notebooks' exercises
    widgets      ipywidgets panels: wiring only, no maths
    answers      the answer key, computed from the panels; the prediction widget
    bench        `python -m fp8lab bench ...`: the project's benchmarks
    lab          `make lab`: start JupyterLab
    __main__     `python -m fp8lab doctor | lab | bench`
"""

from fp8lab.export import export
from fp8lab.formats import BF16, E2M1, E4M3, E5M2, E8M0, FORMATS, FP16, FloatFormat, cast, get_format
from fp8lab.gemm import AccumulatorModel, matmul
from fp8lab.metrics import (
    overflow_fraction,
    quantization_report,
    relative_error,
    sqnr,
    subnormal_fraction,
    underflow_fraction,
)
from fp8lab.quantize import QuantizedTensor, quantize, quantize_delayed
from fp8lab.readiness import inspect
from fp8lab.recipes import RECIPES, Recipe, TensorScaling, get_recipe
from fp8lab.scaling import SCALE_RULES, AmaxHistory, PerBlock, PerRow, PerTensor, parse_granularity

__version__ = "0.1.0"


def setup(seed: int = 0, quiet: bool = False) -> str:
    """The first cell of every notebook: the lab's plot theme, a fixed seed, one status line.

    What it changes, for the whole kernel process (a notebook's): matplotlib's style (the lab's
    seaborn theme); torch's global random seed (`seed`); the garbage collector (the objects
    imported so far are frozen, gc.freeze(), so that full collections don't stall a redraw);
    glibc's malloc thresholds (kernels.keep_freed_memory: freed blocks up to 32 MiB are kept for
    reuse); and it decides the CPU kernels once for the process (kernels.status: built or loaded
    from the cache and loaded into the process, or off, reading FP8LAB_KERNELS now). It changes
    no numerics setting of torch (no matmul precision, no oneDNN mode, no thread count).
    Returns the status line (also printed unless quiet)."""
    import gc

    import torch

    from fp8lab.kernels import keep_freed_memory
    from fp8lab.kernels import status as kernels_status
    from fp8lab.plots import use_theme
    from fp8lab.settings import smoke

    use_theme()
    torch.manual_seed(seed)
    # everything imported so far lives for the whole session: move it out of the garbage
    # collector's sight, so that its full collections don't stall a widget's redraw
    gc.collect()
    gc.freeze()
    keep_freed_memory()  # emulated FP8 reuses its temporaries' pages instead of faulting fresh ones
    if torch.cuda.is_available():
        cc = torch.cuda.get_device_capability()
        where = f"GPU {torch.cuda.get_device_name()} (sm_{cc[0]}{cc[1]}): real FP8 GEMMs where the kernel exists"
    else:
        where = "no GPU: FP8 GEMMs are emulated exactly on the CPU"
    kernels = "CPU kernels on" if kernels_status()[0] else "CPU kernels off (python -m fp8lab doctor says why)"
    line = f"fp8lab {__version__} | torch {torch.__version__} | {where} | {kernels}"
    if smoke():
        line += " | smoke mode"
    if not quiet:
        print(line)
    return line


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
    "cast",
    "export",
    "get_format",
    "get_recipe",
    "inspect",
    "matmul",
    "overflow_fraction",
    "parse_granularity",
    "quantization_report",
    "quantize",
    "quantize_delayed",
    "relative_error",
    "setup",
    "sqnr",
    "subnormal_fraction",
    "underflow_fraction",
]
