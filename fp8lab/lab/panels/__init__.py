"""ipywidgets panels, one file per notebook: controls wired to fp8lab's functions and plots.

  base.py         Panel: controls, a figure, a text; redraws coalesced on one drawing thread
  setup_check.py  00: TimingPanel          formats.py   01: BitsPanel, NumberLinePanel
  per_tensor.py   02: PerTensorPanel, CliffPanel        delayed.py   03: DelayedPanel
  blocks.py       04: BlockPanel, BlockSweepPanel       gemm.py      05: GemmOperandsPanel, GemmPanel,
  nvfp4.py        04: Nvfp4ScalesPanel                               AccumulationPanel
  training.py     06: TrainingPanel, TrainingCliffPanel mismatch.py  06: MismatchPanel
  weights.py      06: WeightCopiesPanel         placement.py 06: PlacementPanel
  distributed.py  07: DistributedPanel, ExportPanel
  cost.py         05, 08: CostPanel
  gradients.py    09: GradientPanel             fp4.py       09: TwoDWeightPanel, HadamardPanel, RoundingPanel,
  split.py        09: fc1_split_table                        HighPrecisionPanel, PartsPanel
  fp4_parts.py    09: SumRoundingPanel, HadamardContrastPanel, DepthPanel, BackwardOnlyPanel
A panel exposes `controls` (name -> widget), `update(**values)` (set controls, recompute, redraw;
returns the data it plotted, so tests drive it without a browser) and `widget` (what the notebook shows).
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as W

from fp8lab.lab.panels.base import Panel
from fp8lab.lab.panels.blocks import BlockPanel, BlockSweepPanel
from fp8lab.lab.panels.cost import CostPanel
from fp8lab.lab.panels.delayed import DelayedPanel
from fp8lab.lab.panels.distributed import DistributedPanel, ExportPanel
from fp8lab.lab.panels.formats import BitsPanel, NumberLinePanel
from fp8lab.lab.panels.fp4 import HadamardPanel, HighPrecisionPanel, PartsPanel, RoundingPanel, TwoDWeightPanel
from fp8lab.lab.panels.fp4_parts import BackwardOnlyPanel, DepthPanel, HadamardContrastPanel, SumRoundingPanel
from fp8lab.lab.panels.gemm import AccumulationPanel, GemmOperandsPanel, GemmPanel
from fp8lab.lab.panels.gradients import GradientPanel
from fp8lab.lab.panels.mismatch import MismatchPanel
from fp8lab.lab.panels.nvfp4 import Nvfp4ScalesPanel
from fp8lab.lab.panels.per_tensor import CliffPanel, PerTensorPanel
from fp8lab.lab.panels.placement import PlacementPanel
from fp8lab.lab.panels.setup_check import TimingPanel
from fp8lab.lab.panels.split import fc1_split_table
from fp8lab.lab.panels.training import TrainingCliffPanel, TrainingPanel
from fp8lab.lab.panels.weights import WeightCopiesPanel

__all__ = [
    "LIVE_PANELS",
    "PANELS",
    "AccumulationPanel",
    "BackwardOnlyPanel",
    "BitsPanel",
    "BlockPanel",
    "BlockSweepPanel",
    "CliffPanel",
    "CostPanel",
    "DelayedPanel",
    "DepthPanel",
    "DistributedPanel",
    "ExportPanel",
    "GemmOperandsPanel",
    "GemmPanel",
    "GradientPanel",
    "HadamardContrastPanel",
    "HadamardPanel",
    "HighPrecisionPanel",
    "MismatchPanel",
    "NumberLinePanel",
    "Nvfp4ScalesPanel",
    "Panel",
    "PartsPanel",
    "PerTensorPanel",
    "PlacementPanel",
    "RoundingPanel",
    "SumRoundingPanel",
    "TimingPanel",
    "TrainingCliffPanel",
    "TrainingPanel",
    "TwoDWeightPanel",
    "WeightCopiesPanel",
    "fc1_split_table",
    "sweep_values",
]

PANELS: dict[str, Callable[[], Panel]] = {
    "timing": TimingPanel, "bits": BitsPanel, "number_line": NumberLinePanel, "per_tensor": PerTensorPanel,
    "cliff": CliffPanel, "delayed": DelayedPanel, "block": BlockPanel, "block_sweep": BlockSweepPanel,
    "nvfp4": Nvfp4ScalesPanel,
    "gemm_operands": GemmOperandsPanel, "gemm": GemmPanel, "accumulation": AccumulationPanel,
    "training": TrainingPanel, "training_cliff": TrainingCliffPanel, "mismatch": MismatchPanel,
    "placement": PlacementPanel,
    "weight_copies": WeightCopiesPanel,
    "distributed": DistributedPanel, "export": ExportPanel,
    "cost": CostPanel,
    "gradients": GradientPanel, "two_d_weights": TwoDWeightPanel, "hadamard": HadamardPanel,
    "rounding": RoundingPanel, "high_precision": HighPrecisionPanel, "parts": PartsPanel,
    "sum_rounding": SumRoundingPanel, "hadamard_contrast": HadamardContrastPanel, "depth": DepthPanel,
    "backward_only": BackwardOnlyPanel,
}


def sweep_values(panel: Panel) -> dict[str, list]:
    """Every value of every control (a few per numeric range), for tests and the benchmark."""
    out = {}
    for name, ctl in panel.controls.items():
        if isinstance(ctl, W.SelectMultiple):
            opts = list(ctl.options)
            out[name] = [tuple(opts[:1]), tuple(opts[:3]), tuple(ctl.value)]
        elif isinstance(ctl, W.IntRangeSlider):
            out[name] = [(ctl.min, ctl.max), (-10, 10), tuple(ctl.value)]
        elif hasattr(ctl, "options"):
            opts = [o[1] if isinstance(o, tuple) else o for o in ctl.options]
            out[name] = opts
        elif isinstance(ctl, W.Checkbox):
            out[name] = [not ctl.value, ctl.value]
        elif isinstance(ctl, W.IntSlider | W.BoundedIntText):
            lo, hi = ctl.min, ctl.max
            out[name] = sorted({lo, (lo + hi) // 2, hi, ctl.value})
        elif isinstance(ctl, W.FloatText):
            out[name] = [0.3, 1000.0, -2.5, ctl.value]
    return out


# the panels whose sliders redraw while dragged
LIVE_PANELS: tuple[str, ...] = tuple(name for name, make in PANELS.items() if make.live_sliders)
