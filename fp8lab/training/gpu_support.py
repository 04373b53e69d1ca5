"""Which GEMMs of each recipe run real on which GPU generation, and why: the support table.

Public: GPU_GENERATIONS, gemm_table(arch, cuda) (per recipe and GEMM of a linear layer: real or
emulated, with the reason), gpu_support_markdown (the table docs/gpu.md shows; a test keeps it
current). The decision is fp8lab.gemm.GemmBackend's, for the operands layer_gemms builds.
`python -m fp8lab doctor` prints it for this machine and per generation.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.gemm import GemmBackend, default_backend
from fp8lab.numerics.recipes import RECIPES, VARIANTS
from fp8lab.training.layers import layer_gemms

__all__ = ["GPU_GENERATIONS", "gemm_table", "gpu_support_markdown"]

GPU_GENERATIONS: dict[str, tuple[int, int]] = {
    "Ada (sm_89: L4, L40S, RTX 4090)": (8, 9),
    "Hopper (sm_90: H100, H200)": (9, 0),
    "Blackwell (sm_100: B200, GB200)": (10, 0),
}


def gemm_table(arch: tuple[int, int] | None = None, cuda: str | None = None,
               recipes: Iterable[str] | None = None, shape: tuple[int, int, int] = (256, 512, 384)) -> list[dict]:
    """Per recipe and GEMM (fprop, dgrad, wgrad): real or emulated on a GPU of compute capability
    `arch` with CUDA `cuda` (None, None: this machine, probing the kernels where there is a GPU),
    and why. The operands are layer_gemms' for a linear layer of `shape` (M, K, N): the decision
    is fp8lab.gemm.GemmBackend's, the one every FP8Linear and matmul asks."""
    names = list(recipes) if recipes is not None else [*RECIPES, *VARIANTS]
    device = torch.device("cuda") if arch is None and torch.cuda.is_available() else torch.device("cpu")
    backend = default_backend("auto") if arch is None else GemmBackend("auto", arch, cuda or "12.9", probe=False)
    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    x, w, dy = (torch.randn(*s, generator=g, **FLOAT32_CPU) for s in ((m, k), (n, k), (m, n)))
    rows = []
    for name in names:
        pairs = layer_gemms(x.to(device), w.to(device), dy.to(device), name)
        for gemm, pair in pairs.items():
            if pair is None:
                rows.append({"recipe": name, "gemm": gemm, "backend": "high precision",
                             "kernel": "-", "reason": "the recipe keeps this GEMM in high precision"})
                continue
            choice = backend.choose(*pair)
            rows.append({"recipe": name, "gemm": gemm, "backend": choice.backend,
                         "kernel": choice.plan.kind if choice.plan else "-", "reason": choice.reason})
    return rows


def gpu_support_markdown(cuda: str = "12.9") -> str:
    """The README's "What changes on a GPU" table, generated from gemm_table (a test keeps them equal)."""
    lines = ["| GPU (compute capability) | real FP8 GEMMs (fprop, dgrad, wgrad) | still emulated, and why |",
             "|---|---|---|", "| none, or older than sm_89 | none | everything (FP8 GEMMs need sm_89 or newer) |"]
    for label, arch in GPU_GENERATIONS.items():
        rows = gemm_table(arch, cuda)
        real, emulated = [], {}
        for recipe in dict.fromkeys(r["recipe"] for r in rows):
            mine = [r for r in rows if r["recipe"] == recipe]
            if all(r["backend"] in ("scaled_mm", "high precision") for r in mine):
                hp = [r["gemm"] for r in mine if r["backend"] == "high precision"]
                real.append(recipe + (f" ({'/'.join(hp)} in high precision)" if hp else ""))
            else:
                why = next(r["reason"] for r in mine if r["backend"] == "emulated").split(": ", 1)[-1]
                why = why.split(", this is sm_")[0]
                emulated.setdefault(why, []).append(recipe)
        still = "; ".join(f"{', '.join(names)}: {why}" for why, names in emulated.items()) or "none"
        lines.append(f"| {label} | {', '.join(real)} | {still} |")
    return "\n".join(lines)
