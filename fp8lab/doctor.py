"""What this machine runs real and what it emulates, and why: `python -m fp8lab doctor`.

Public: report() -> str, versions() -> dict, cast_behaviour() -> dict, cpu_name() -> str.
Notebook 00 shows the same table.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform

import torch

from fp8lab import kernels

__all__ = ["cast_behaviour", "cpu_name", "report", "versions"]

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


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def report(probe: bool = True) -> str:
    """The whole doctor report as text."""
    from fp8lab import __version__
    from fp8lab.gemm import backend_table, bf16_fast_path
    from fp8lab.settings import SMOKE

    lines = [f"fp8lab {__version__} doctor", ""]
    lines.append("versions")
    lines += [f"  {k:<11} {v}" for k, v in versions().items()]
    lines.append("")
    lines.append("machine")
    lines.append(f"  CPU         {cpu_name()}; {os.cpu_count()} cores, torch uses {torch.get_num_threads()} threads")
    lines.append(f"  ISA         {torch.backends.cpu.get_cpu_capability()}")
    fast, why = bf16_fast_path()
    lines.append(f"  emulation   {'bf16 inputs, fp32 accumulation' if fast else 'fp32 GEMM'}: {why}")
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
    lines.append("FP8 GEMMs (fp8lab.matmul, backend='auto')")
    table = backend_table(probe=probe)
    w = max(len(r["kernel"]) for r in table)
    for r in table:
        lines.append(f"  {r['recipe']:<11} {r['kernel']:<{w}}  {r['reason']}")
    lines.append("")
    lines.append(f"smoke mode   {'ON (FP8LAB_SMOKE=1: small sizes for CI)' if SMOKE else 'off (workshop sizes)'}")
    return "\n".join(lines)
