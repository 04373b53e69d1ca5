"""The command line: doctor, bench (small sizes), and the lab launcher's command."""

import os
import subprocess
import sys

import pytest

from fp8lab.bench.gemm import bench_gemm
from fp8lab.bench.quantize import bench_quantize
from fp8lab.lab.launcher import CONFIG_DIR, find_free_port, jupyter_command, lab_environment


def _run(*args):
    return subprocess.run([sys.executable, "-m", "fp8lab", *args], capture_output=True, text=True, timeout=300)


def test_doctor_reports_versions_devices_and_the_backend_table():
    r = _run("doctor")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for needle in ("torch", "torchao", "ISA", "GPU", "float8_e5m2", "tensorwise", "nvfp4", "smoke mode"):
        assert needle in out
    if "no CUDA device" in out:  # one line per recipe (rowwise_with_gw_hp: fprop, dgrad; wgrad in high precision)
        assert out.count("emulated: no CUDA device") == 9  # (the 6 recipes and 3 variants, nvfp4_training among them)
        assert "rowwise_with_gw_hp wgrad             the recipe keeps this GEMM in high precision" in out
    for generation in ("sm_89", "sm_90", "sm_100"):  # what each GPU generation runs real
        assert generation in out
    assert "Hopper (sm_90: H100, H200): real tensorwise, delayed, rowwise, blockwise, rowwise_with_gw_hp" in out


def test_unknown_command_is_refused():
    r = _run("frobnicate")
    assert r.returncode == 2 and "usage" in r.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (("quantize", "--size", "-5"), "argument --size: -5 is not a positive integer"),
    (("gemm", "--size", "0"), "argument --size: 0 is not a positive integer"),
    (("room", "0"), "argument count: 0 is not a positive integer"),
    (("room", "-1"), "argument count: -1 is not a positive integer"),
    (("room", "four"), "argument count: 'four' is not an integer"),
    (("train", "--rounds", "0"), "argument --rounds: 0 is not a positive integer"),
    (("threads", "--steps", "-3"), "argument --steps: -3 is not a positive integer"),
    (("load", "--weight", "-1"), "argument --weight: -1 is not an integer of 0 or more"),
])
def test_a_bench_argument_out_of_range_gets_the_usage_line_not_a_traceback(args, needle):
    r = _run("bench", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("usage: python -m fp8lab bench") and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_bench_room_refuses_a_room_that_cannot_fit_in_memory_saying_the_arithmetic():
    """1000 kernels on this machine: each holds at least what a process that imported torch and fp8lab holds
    (hundreds of MB), which no machine the lab runs on has 1000 times: refused before anything starts."""
    r = _run("bench", "room", "1000")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("usage: python -m fp8lab bench"), r.stderr
    assert "bench room 1000: 1000 kernels x " in r.stderr and " GB available (" in r.stderr, r.stderr
    assert "they cannot all fit" in r.stderr and "--ignore-memory" in r.stderr
    assert "Traceback" not in r.stderr and "round 1" not in r.stdout  # no kernel started


def test_bench_quantize_and_gemm_run_small(capsys):
    rows = bench_quantize(size=256, rounds=2)
    names = [r["what"] for r in rows]
    assert "fp8lab 1x128 E4M3" in names and "copy: x.clone() (allocates)" in names
    assert all(r["median ms"] > 0 for r in rows)
    rows = bench_gemm(size=128, rounds=1, recipes=("tensorwise", "blockwise"))
    assert {"torch.mm fp32", "fp8lab blockwise reference", "fp8lab blockwise fast", "torch.mm bf16 (bf16 output)"} \
        <= {r["what"] for r in rows}
    # the natural call with its quantization, both layouts of b, at size^3 and at a shape not tuned for
    for shape in ("128x128x128", "96x192x48"):
        mine = {r["what"] for r in rows if r["M x K x N"] == shape}
        assert {"torch.mm fp32", "fp8lab blockwise matmul(a, b[K,N]) + quantize",
                "fp8lab tensorwise matmul(a, w.t()) + quantize"} <= mine, (shape, mine)
    out = capsys.readouterr().out
    assert "GEMM 128^3" in out and "torch.mm bf16:" in out


def test_bench_notebooks_times_a_notebook_and_its_kernels_peak(capsys):
    from fp8lab.bench.notebooks import bench_notebooks

    (row,) = bench_notebooks(("03",))
    assert row["notebook"] == "03_delayed_scaling" and row["run all s"] > 0 and 100 < row["kernel peak MB"] < 1536
    assert "03_delayed_scaling" in capsys.readouterr().out


def test_bench_blas_shows_strict_mkl_repeats_its_bits_on_any_thread_count():
    """The same GEMM with 1 and 2 threads, in processes that read MKL_CBWR: with fp8lab's setting the
    bits agree (on any machine); MKL's own default is only timed beside it."""
    from fp8lab.bench.blas import bench_blas

    rows = {r["MKL_CBWR"]: r for r in bench_blas(size=256, rounds=1, steps=2)}
    assert rows["AUTO,STRICT (fp8lab's)"]["same bits, 1 and 2 threads"] == "1/1 processes"
    assert all(r["fp32 256^3 GEMM ms"] > 0 for r in rows.values())


def test_lab_command_binds_loopback_and_holds_no_token():
    port = find_free_port()
    cmd = jupyter_command(port)
    assert "--ip=127.0.0.1" in cmd and f"--port={port}" in cmd
    assert not any("token" in c.lower() for c in cmd), cmd  # the token goes in the environment
    assert any(c.startswith("--LabApp.default_url=/lab/tree/notebooks/00_setup_check.ipynb") for c in cmd)
    assert ("--allow-root" in cmd) == (os.geteuid() == 0)
    env = lab_environment("secret-token", {"JUPYTER_CONFIG_PATH": "/elsewhere"})
    assert env["JUPYTER_TOKEN"] == "secret-token"
    assert env["JUPYTER_CONFIG_PATH"].split(os.pathsep) == [str(CONFIG_DIR), "/elsewhere"]
    with pytest.raises(ValueError, match="token"):
        lab_environment("")


# ---- doctor: hosted GPUs, and a GPU that torch does not see -------------------------------------------------------


def test_doctor_names_the_hosted_gpus_from_the_support_table():
    from fp8lab.lab.doctor import HOSTED_GPUS, hosted_gpu_lines
    from fp8lab.training.gpu_support import gemm_table

    lines = dict(zip(HOSTED_GPUS, hosted_gpu_lines(), strict=True))
    assert "T4" in next(k for k in lines if HOSTED_GPUS[k] == (7, 5))
    for label, line in lines.items():
        rows = gemm_table(HOSTED_GPUS[label], "12.9")
        real = {r["recipe"] for r in rows} - {r["recipe"] for r in rows if r["backend"] == "emulated"}
        if not real:
            assert "everything emulated (FP8 GEMMs need sm_89 or newer)" in line, line
        else:
            assert line.split(": real ")[1].split(";")[0].split(", ") == [r for r in dict.fromkeys(
                x["recipe"] for x in rows) if r in real], line
    by_arch = {HOSTED_GPUS[k]: v for k, v in lines.items()}
    assert "everything emulated" in by_arch[(7, 5)] and "everything emulated" in by_arch[(8, 0)]
    assert "real tensorwise" in by_arch[(8, 9)] and "blockwise" in by_arch[(8, 9)].split("emulated")[1]
    assert "blockwise" in by_arch[(9, 0)].split(";")[0]
    assert "mxfp8, nvfp4" in by_arch[(10, 0)].split(";")[0]


SMI_HEADER = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+"""


def test_doctor_explains_a_cuda_build_newer_than_the_driver():
    from fp8lab.lab.doctor import cuda_mismatch, parse_nvidia_smi

    smi = parse_nvidia_smi(SMI_HEADER, "Tesla T4, 550.54.15\nTesla T4, 550.54.15\n")
    assert smi == {"gpus": ["Tesla T4", "Tesla T4"], "driver": "550.54.15", "cuda": "12.4"}
    too_new = "\n".join(cuda_mismatch(smi, "13.0"))
    assert "nvidia-smi lists 2 GPU(s) (Tesla T4; driver 550.54.15, serving CUDA up to 12.4)" in too_new
    assert "built for CUDA 13.0, newer than the driver serves (CUDA 13.x needs driver >= 580.65.06)" in too_new
    assert "--index-url https://download.pytorch.org/whl/cu124" in too_new and "update the NVIDIA driver" in too_new
    old_driver = parse_nvidia_smi("", "NVIDIA L4, 515.65.01\n")  # no CUDA Version in the header
    assert "CUDA 12.x needs driver >= 525.60.13" in "\n".join(cuda_mismatch(old_driver, "12.8"))
    cpu_build = "\n".join(cuda_mismatch(smi, None))
    assert "is a CPU build" in cpu_build and "whl/cu124" in cpu_build
    assert "CUDA_VISIBLE_DEVICES=''" in "\n".join(cuda_mismatch(smi, "12.4", visible=""))
    assert "should serve it" in "\n".join(cuda_mismatch(smi, "12.4"))
    assert cuda_mismatch(None, "13.0") == [] and parse_nvidia_smi("", "") is None


def test_doctor_reports_the_extras():
    from fp8lab.lab.doctor import versions

    v = versions()
    assert "torchao" in v and "scikit-learn" in v
