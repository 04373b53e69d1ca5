"""The Monitor: per layer, GEMM and operand, what each quantization did during training.

Public: Monitor. FP8 layers (fp8lab.training.layers) record into it as their GEMMs run; train() keeps one per
run, and notebook 06's per-layer plots read its frame().
"""

from __future__ import annotations

import torch

from fp8lab.numerics.metrics import overflow_underflow
from fp8lab.numerics.quantize import QuantizedTensor

__all__ = ["Monitor"]


class Monitor:
    """Per layer and tensor role, each step: amax, scale, overflow and underflow fractions.

    Rows are recorded as the GEMMs run; `frame()` returns a tidy pandas DataFrame with
    columns step, layer, gemm, role, amax, scale_max, scale_min, overflow, underflow.
    `every` records one step in `every` (1: all) to keep the cost down.
    A gradient with an inf or NaN (a loss scaler's overflow step) is not quantized, so it has no
    statistics: it gets no row in frame(); `nonfinite` lists it instead (step, layer, gemm, role, amax:
    inf or NaN), at every step, and nonfinite_frame() returns that list as a DataFrame.
    """

    def __init__(self, every: int = 1) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        self.every = every
        self.step = 0
        self.rows: list[dict] = []
        self.nonfinite: list[dict] = []

    def active(self) -> bool:
        return self.step % self.every == 0

    def record(self, layer: str, gemm: str, role: str, x: torch.Tensor, q: QuantizedTensor) -> None:
        scale = q.scale if q.tensor_scale is None else q.scale * q.tensor_scale
        overflow, underflow = overflow_underflow(x, q)
        scale_min, scale_max = (float(v) for v in torch.aminmax(scale))
        self.rows.append({
            "step": self.step, "layer": layer, "gemm": gemm, "role": role,
            "amax": float(q.amax.max()) if q.amax is not None else float(x.abs().max()),
            "scale_max": scale_max, "scale_min": scale_min, "overflow": overflow, "underflow": underflow,
        })

    def record_nonfinite(self, layer: str, gemm: str, role: str, amax: float) -> None:
        """A gradient that held an inf or NaN: its GEMM ran in high precision (nothing quantized)."""
        self.nonfinite.append({"step": self.step, "layer": layer, "gemm": gemm, "role": role, "amax": amax})

    def frame(self):
        import pandas as pd

        cols = ["step", "layer", "gemm", "role", "amax", "scale_max", "scale_min", "overflow", "underflow"]
        return pd.DataFrame(self.rows, columns=cols)

    def nonfinite_frame(self):
        """The gradients that held an inf or NaN: DataFrame (step, layer, gemm, role, amax)."""
        import pandas as pd

        return pd.DataFrame(self.nonfinite, columns=["step", "layer", "gemm", "role", "amax"])

    def clear(self) -> None:
        self.rows.clear()
        self.nonfinite.clear()
