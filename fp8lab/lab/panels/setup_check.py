"""Notebook 00's panel: a GEMM timed in fp32, bf16 and FP8 on this machine (TimingPanel).

Public: TimingPanel. Wiring only: the numbers come from fp8lab's functions.
"""


from __future__ import annotations

import ipywidgets as W
import torch

from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.figures import plots
from fp8lab.gemm import matmul, quantize_operands, resolve_backend
from fp8lab.lab.panels.base import (
    TORCH_THREADS,
    Panel,
    dropdown,
    metrics_html,
    selection_slider,
    torch_threads,
)
from fp8lab.numerics.recipes import RECIPES
from fp8lab.settings import smoke
from fp8lab.timing import timed

__all__ = ["TimingPanel"]


class TimingPanel(Panel):
    """fp32 and bf16 matmul beside the FP8 GEMM of a recipe, real or emulated, on this machine.

    Timing is a measurement, not a redraw: the controls set up the next one and the Time button
    runs it (with every thread torch uses; the first runs when the panel first draws). Until then
    the plot keeps the last timing and names what changed."""

    title = "GEMM timing on this machine"
    live_sliders = False  # its controls set up the next timing; Time runs it
    bottom = 0.75

    def __init__(self) -> None:
        # a GPU's FP8 kernels pull ahead of bf16 only at sizes that fill it; a CPU's emulation is timed small
        sizes = [64, 128, 256] if smoke() else [1024, 2048, 4096, 8192] if torch.cuda.is_available() \
            else [128, 256, 512]
        self.time_button = W.Button(description="Time", button_style="success", icon="clock-o")
        super().__init__(
            n=selection_slider(sizes, sizes[1], "matrix size n (n x n x n)"),
            recipe=dropdown(RECIPES, "tensorwise", "recipe"),
        )
        self.time_button.on_click(lambda _: self.run(blocking=False))
        self.widget.children = (*self.widget.children[:-2], W.HBox([self.time_button]), *self.widget.children[-2:])
        self.result: dict | None = None  # the last timing: times_ms, reason, n, recipe

    def run(self, blocking: bool = True):
        """Time the three GEMMs at the controls' values (median of 3 calls each), then redraw."""
        if self._thread is not None and self._thread.is_alive():
            return None
        v = self.values()

        def work() -> None:
            self.time_button.disabled = True
            try:
                self._time(**v)
            finally:
                self.time_button.disabled = False
                self.refresh()

        thread = self._launch(work, blocking)
        return self.result if blocking else thread

    def _time(self, n: int, recipe: str) -> None:
        with torch_threads(TORCH_THREADS):  # this machine's GEMMs, with every thread torch uses
            self.result = self.measure(n, recipe)

    @staticmethod
    def measure(n: int, recipe: str, device: str | None = None) -> dict:
        """The three GEMMs on one device: the GPU where torch sees one (fp32 and bf16 there too, each call
        waited for), else the CPU."""
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(n, n, generator=g, **FLOAT32_CPU).to(dev) for _ in range(2))
        a_q, b_q = quantize_operands(a, b, recipe)
        ab, bb = a.bfloat16(), b.bfloat16()
        choice = resolve_backend(recipe, dev)
        candidates = {
            "fp32 matmul": lambda: a @ b,
            "bf16 matmul": lambda: ab @ bb,
            f"FP8 {recipe} ({choice.backend})": lambda: matmul(a_q, b_q, recipe, verbose=False),
        }
        if dev.type == "cuda":  # a GPU call returns before it ends: time it to its end
            candidates = {name: lambda fn=fn: (fn(), torch.cuda.synchronize(dev)) for name, fn in candidates.items()}
        times = {name: sorted(timed(fn, 3))[1] * 1e3 for name, fn in candidates.items()}
        where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "this CPU"
        return {"times_ms": times, "reason": choice.reason, "n": n, "recipe": recipe, "device": where}

    def compute(self, n: int, recipe: str) -> dict:
        if self.result is None:  # the first drawing times the default settings
            self._time(n, recipe)
        shown = {"n": self.result["n"], "recipe": self.result["recipe"]}
        pending = {k: v for k, v in {"n": n, "recipe": recipe}.items() if shown[k] != v}
        return {**self.result, "pending": pending}

    def draw(self, data, ax) -> None:
        plots.bars(data["times_ms"], ax, ylabel="milliseconds (median of 3)", title=f"{data['n']}^3 GEMM")
        if data["pending"]:
            note = "\n".join(["Changed since this timing (press Time):",
                              *(f"{k}: {v}" for k, v in data["pending"].items())])
            ax.text(0.03, 0.96, note, transform=ax.transAxes, fontsize=8, color=plots.CLIP, va="top",
                    bbox={"facecolor": "white", "alpha": 0.9, "edgecolor": plots.CLIP, "lw": 0.5})

    def describe(self, data) -> str:
        rows = {"FP8 backend": data["reason"], "all three on": data["device"]}
        if data["pending"]:
            rows["press Time to time"] = ", ".join(f"{k} = {v}" for k, v in data["pending"].items())
        return metrics_html(rows)
