"""fp8lab.lab.doctor: what `python -m fp8lab doctor` reads and says, from canned nvidia-smi output (the command
itself runs in the command-line tests)."""

from __future__ import annotations

import torch

from fp8lab.lab.doctor import cast_behaviour, cuda_mismatch, gemm_lines, parse_nvidia_smi

HEADER = "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |"


def test_nvidia_smi_output_is_read_into_gpus_driver_and_cuda():
    smi = parse_nvidia_smi(HEADER, "NVIDIA L4, 535.104.05\nNVIDIA L4, 535.104.05\n")
    assert smi == {"gpus": ["NVIDIA L4", "NVIDIA L4"], "driver": "535.104.05", "cuda": "12.2"}
    assert parse_nvidia_smi(HEADER, "") is None
    assert parse_nvidia_smi("no header", "T4, 470.1")["cuda"] is None


def test_why_torch_sees_no_gpu():
    smi = {"gpus": ["NVIDIA L4"], "driver": "535.104.05", "cuda": "12.2"}
    assert cuda_mismatch(None, "12.1") == [] and cuda_mismatch({"gpus": []}, None) == []
    hidden = cuda_mismatch(smi, "12.1", visible="")
    assert "CUDA_VISIBLE_DEVICES" in hidden[-1]
    cpu = cuda_mismatch(smi, None)
    assert "CPU build" in cpu[-1] and "cu122" in cpu[-1]
    newer = cuda_mismatch(smi, "13.0")  # CUDA 13 needs driver >= 580.65.06
    assert "newer than the driver serves" in newer[-1] and "580.65.06" in newer[-1]
    fine = cuda_mismatch(smi, "12.1")
    assert "/dev/nvidia" in fine[-1]


def test_this_torchs_casts_of_an_overflow_as_torch_does_them():
    out = cast_behaviour()
    e4m3 = float(torch.tensor([1e6]).to(torch.float8_e4m3fn).float())
    assert out["float8_e4m3fn"].startswith(f"1e6 -> {e4m3:g}")
    assert out["float8_e5m2"] == "1e6 -> inf (does not saturate)"


def test_gemm_lines_collapse_a_recipe_whose_gemms_agree():
    rows = [{"recipe": "a", "gemm": g, "reason": "same"} for g in ("fprop", "dgrad", "wgrad")]
    rows += [{"recipe": "b", "gemm": "fprop", "reason": "x"}, {"recipe": "b", "gemm": "wgrad", "reason": "y"}]
    lines = gemm_lines(rows)
    assert len(lines) == 1 + 2
    assert "fprop/dgrad/wgrad" in lines[0]
