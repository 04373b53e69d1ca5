"""What this machine runs real and what it emulates, and why: `python -m fp8lab doctor`.

Public: report() -> str (with the threads fp8lab decided: fp8lab.threads), versions() -> dict,
cast_behaviour() -> dict, cpu_name() -> str (from timing),
hosted_gpu_lines() (the GPUs of Colab, Kaggle and cloud JupyterHubs, from the support table),
nvidia_smi() and cuda_mismatch() (why torch sees no GPU where the machine has one, and what to install).
Notebook 00 shows the same report.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess

import torch

from fp8lab import threads
from fp8lab._version import __version__
from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.extras import EXTRAS, available, import_error, unusable
from fp8lab.numerics import kernels
from fp8lab.settings import smoke
from fp8lab.timing import cpu_name
from fp8lab.training.gpu_support import GPU_GENERATIONS, gemm_table

__all__ = ["HOSTED_GPUS", "cast_behaviour", "cpu_name", "cuda_mismatch", "gemm_lines", "hosted_gpu_lines",
           "nvidia_smi", "report", "versions"]

PACKAGES = ("torch", "torchao", "scikit-learn", "numpy", "pandas", "matplotlib", "seaborn", "ipywidgets",
            "jupyterlab", "ml_dtypes")
# the GPUs a hosted notebook gets, and their compute capability; what each runs real comes from gemm_table
HOSTED_GPUS: dict[str, tuple[int, int]] = {
    "P100 (Kaggle)": (6, 0),
    "T4 (Colab's free GPU, Kaggle)": (7, 5),
    "A100 (Colab)": (8, 0),
    "L4 (Colab)": (8, 9),
    "H100, H200 (cloud JupyterHubs)": (9, 0),
    "B200 (cloud JupyterHubs)": (10, 0),
}
# the oldest NVIDIA Linux driver each CUDA major version runs on (NVIDIA's CUDA release notes, table 3:
# minor-version compatibility); nvidia-smi's header says the newest CUDA a driver serves
DRIVER_FLOOR = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def versions() -> dict[str, str]:
    """Installed versions of the packages the lab uses ('not installed' where missing, with the
    extra that brings it). An optional extra is imported to be reported (extras.import_error): one that
    is installed but fails at import reads "broken", with the error, not as its version."""
    extra_of = {dist: extra for extra, (_, dist) in EXTRAS.items()}
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in PACKAGES[1:]:
        extra = extra_of.get(name)
        if extra is not None and not available(extra, installed_only=True):
            out[name] = f'not installed (optional: pip install "fp8lab[{extra}]")'
            continue
        try:  # the other packages by their metadata (the lab imports them anyway)
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
        if extra is None:
            continue
        if problem := unusable(extra):
            out[name] += f" (cannot run here: {problem}; fp8lab's own engine runs everything it needs)"
        elif broken := import_error(extra, quiet=True):
            out[name] = (f"BROKEN: `import {EXTRAS[extra][0]}` fails with {broken} (installed: {out[name]}; "
                         f'reinstall with pip install --force-reinstall "fp8lab[{extra}]", or uninstall it: '
                         "fp8lab's own engine runs everything it needs)")
    return out


def nvidia_smi() -> dict | None:
    """What the NVIDIA driver reports: {"gpus": [names], "driver": "550.54.15", "cuda": "12.4"} (cuda:
    the newest CUDA this driver serves), or None where there is no nvidia-smi or it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        header = subprocess.run([exe], capture_output=True, text=True, timeout=20).stdout
        listing = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(header, listing)


def parse_nvidia_smi(header: str, listing: str) -> dict | None:
    """nvidia-smi's plain output (its header) and `--query-gpu=name,driver_version --format=csv,noheader`."""
    rows = [[part.strip() for part in line.split(",")] for line in listing.splitlines() if line.strip()]
    if not rows or len(rows[0]) < 2:
        return None
    cuda = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", header)
    return {"gpus": [r[0] for r in rows], "driver": rows[0][1], "cuda": cuda[1] if cuda else None}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"[0-9]+", text))


def cuda_mismatch(smi: dict | None, torch_cuda: str | None, visible: str | None = None) -> list[str]:
    """Why torch sees no GPU although nvidia-smi lists one, and what to install; [] where nvidia-smi
    lists none. smi: nvidia_smi()'s dict; torch_cuda: torch.version.cuda (None: a CPU build);
    visible: CUDA_VISIBLE_DEVICES."""
    if not smi or not smi["gpus"]:
        return []
    gpus = ", ".join(dict.fromkeys(smi["gpus"]))
    lines = [f"nvidia-smi lists {len(smi['gpus'])} GPU(s) ({gpus}; driver {smi['driver']}"
             + (f", serving CUDA up to {smi['cuda']}" if smi["cuda"] else "") + "), but torch sees none:"]
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return [*lines, f"  CUDA_VISIBLE_DEVICES={visible!r} hides them: unset it and restart the kernel"]
    index = "https://download.pytorch.org/whl/cu" + (smi["cuda"] or "12.6").replace(".", "")
    if torch_cuda is None:
        return [*lines, f"  this torch ({torch.__version__}) is a CPU build. Install a CUDA build of the same version "
                        f"that this driver serves, e.g. pip install torch=={torch.__version__.split('+')[0]} "
                        f"--index-url {index} (pytorch.org/get-started lists the builds)"]
    major = _version(torch_cuda)[0]
    floor = DRIVER_FLOOR.get(major)
    too_new = (smi["cuda"] is not None and _version(torch_cuda)[:1] > _version(smi["cuda"])[:1]) or (
        floor is not None and _version(smi["driver"]) < _version(floor))
    if too_new:
        return [*lines, f"  this torch is built for CUDA {torch_cuda}, newer than the driver serves"
                        + (f" (CUDA {major}.x needs driver >= {floor})" if floor else "") + ". Either update the "
                        f"NVIDIA driver, or install a torch built for the driver's CUDA: pip install "
                        f"torch=={torch.__version__.split('+')[0]} --index-url {index} (pytorch.org/get-started lists "
                        "the builds; on a hosted notebook, keep the torch the service installed)"]
    return [*lines, f"  torch is built for CUDA {torch_cuda} and the driver should serve it: check that the kernel "
                    "sees /dev/nvidia* (a container needs --gpus all) and restart the kernel"]


def hosted_gpu_lines(cuda: str = "12.9") -> list[str]:
    """One line per GPU a hosted notebook gets: the recipes it runs real, the ones it emulates."""
    lines = []
    for label, arch in HOSTED_GPUS.items():
        rows = gemm_table(arch, cuda)
        recipes = list(dict.fromkeys(r["recipe"] for r in rows))
        real = [r for r in recipes if all(x["backend"] != "emulated" for x in rows if x["recipe"] == r)]
        arch_name = f"sm_{arch[0]}{arch[1]}"
        if not real:
            why = rows[0]["reason"].split(": ", 1)[-1].split(", this is")[0]
            lines.append(f"  {label}, {arch_name}: everything emulated ({why})")
        else:
            emulated = [r for r in recipes if r not in real]
            lines.append(f"  {label}, {arch_name}: real {', '.join(real)}; emulated {', '.join(emulated) or 'none'}")
    return lines


def cast_behaviour() -> dict[str, str]:
    """How this torch casts an overflowing float32 to each FP8 dtype (fp8lab always clamps first)."""
    probe = torch.tensor([1e6], **FLOAT32_CPU)
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
    lines = [f"fp8lab {__version__} doctor", ""]
    lines.append("versions")
    lines += [f"  {k:<12} {v}" for k, v in versions().items()]
    lines.append("")
    lines.append("machine")
    chosen = threads.decision()
    lines.append(f"  CPU         {cpu_name()}; {os.cpu_count()} cores on the machine, {chosen.cores} for this process, "
                 f"torch uses {torch.get_num_threads()} threads")
    lines.append(f"  threads     {chosen.line().removeprefix('threads: ')}")
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
        lines += ["  " + line for line in cuda_mismatch(nvidia_smi(), torch.version.cuda,
                                                        os.environ.get("CUDA_VISIBLE_DEVICES"))]
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
    lines.append("hosted notebooks' GPUs (Colab, Kaggle, cloud JupyterHubs): the same numbers, real or emulated")
    lines += hosted_gpu_lines()
    lines.append("")
    lines.append(f"smoke mode   {'ON (FP8LAB_SMOKE=1: small sizes for CI)' if smoke() else 'off (workshop sizes)'}")
    return "\n".join(lines)
