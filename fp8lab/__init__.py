"""fp8lab: learn and compare FP8 scaling strategies.

The map (imports flow down this list): formats -> scaling -> quantize -> recipes -> gemm
-> nn -> train; metrics, plots and widgets only consume. Start with notebook 00.
fp8lab.inspect(model, batch, loss_fn) reports any model's FP8 readiness per layer (readiness.py, notebook 08).
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
    reuse). Returns the status line (also printed unless quiet)."""
    import gc

    import torch

    from fp8lab.kernels import keep_freed_memory
    from fp8lab.kernels import status as kernels_status
    from fp8lab.plots import use_theme
    from fp8lab.settings import SMOKE

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
    if SMOKE:
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
