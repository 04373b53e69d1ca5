"""What this machine runs real and what it emulates, and why: `python -m fp8lab doctor`.

Public: report() -> str, versions() -> dict, cast_behaviour() -> dict, cpu_name() -> str (from timing).
Notebook 00 shows the same table.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform

import torch

from fp8lab.numerics import kernels
from fp8lab.timing import cpu_name

__all__ = ["cast_behaviour", "cpu_name", "gemm_lines", "report", "versions"]

PACKAGES = ("torch", "torchao", "numpy", "pandas", "matplotlib", "seaborn", "ipywidgets", "jupyterlab", "ml_dtypes")


def versions() -> dict[str, str]:
    """Installed versions of the packages the lab uses ('not installed' where missing)."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in PACKAGES[1:]:
        try:  # read the metadata: importing torchao just to ask is slow and noisy
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def cast_behaviour() -> dict[str, str]:
    """How this torch casts an overflowing float32 to each FP8 dtype (fp8lab always clamps first)."""
    probe = torch.tensor([1e6])
    out = {}
    for name in ("float8_e4m3fn", "float8_e5m2"):
        value = float(probe.to(getattr(torch, name)).float())
        saturates = value == value and value != float("inf")
        out[name] = f"1e6 -> {value:g} ({'saturates' if saturates else 'does not saturate'})"
    return out


def gemm_lines(rows: list[dict]) -> list[str]:
    """gemm_table rows as text: one line per recipe where its GEMMs agree, else one per GEMM."""
    out = []
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        mine = [r for r in rows if r["recipe"] == recipe]
        if len({r["reason"] for r in mine}) == 1:
            out.append(f"  {recipe:<18} {'/'.join(r['gemm'] for r in mine):<17} {mine[0]['reason']}")
        else:
            out += [f"  {recipe:<18} {r['gemm']:<17} {r['reason']}" for r in mine]
    return out


def report(probe: bool = True) -> str:
    """The whole doctor report as text."""
    from fp8lab._version import __version__
    from fp8lab.settings import smoke
    from fp8lab.training.gpu_support import GPU_GENERATIONS, gemm_table

    lines = [f"fp8lab {__version__} doctor", ""]
    lines.append("versions")
    lines += [f"  {k:<11} {v}" for k, v in versions().items()]
    lines.append("")
    lines.append("machine")
    lines.append(f"  CPU         {cpu_name()}; {os.cpu_count()} cores, torch uses {torch.get_num_threads()} threads")
    lines.append(f"  ISA         {torch.backends.cpu.get_cpu_capability()}")
    lines.append("  emulation   fp32 GEMMs of the exact FP8 values (products exact, sums in fp32)")
    lines.append(f"  quantize    {kernels.status()[1]}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            lines.append(f"  GPU {i}       {p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB, "
                         f"CUDA {torch.version.cuda}")
    else:
        lines.append("  GPU         none (torch.cuda.is_available() is False): every FP8 GEMM is emulated, exactly")
    lines.append("")
    lines.append("torch's own FP8 casts (fp8lab clamps explicitly, so its casts saturate everywhere)")
    lines += [f"  {k:<14} {v}" for k, v in cast_behaviour().items()]
    lines.append("")
    lines.append("FP8 GEMMs on this machine (fp8lab.matmul and FP8Linear, backend='auto'; per GEMM of a linear layer)")
    lines += gemm_lines(gemm_table())
    lines.append("")
    lines.append("FP8 GEMMs on GPUs (what fp8lab runs real per generation, torch built for CUDA 12.9)")
    for label, arch in GPU_GENERATIONS.items():
        rows = gemm_table(arch, "12.9")
        real = [r for r in dict.fromkeys(x["recipe"] for x in rows)
                if all(x["backend"] != "emulated" for x in rows if x["recipe"] == r)]
        emulated = [r for r in dict.fromkeys(x["recipe"] for x in rows) if r not in real]
        lines.append(f"  {label}: real {', '.join(real)}; emulated {', '.join(emulated) or 'none'}")
    lines.append("")
    lines.append(f"smoke mode   {'ON (FP8LAB_SMOKE=1: small sizes for CI)' if smoke() else 'off (workshop sizes)'}")
    return "\n".join(lines)
