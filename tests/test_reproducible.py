"""On one machine a run repeats bit for bit whatever the thread count: importing fp8lab asks MKL for
reproducible sums (MKL_CBWR=AUTO,STRICT) unless the user chose otherwise, before torch multiplies."""

import os
import subprocess
import sys

CHILD = r"""
import hashlib, os, sys
import fp8lab
import torch
from fp8lab.training.train import train
print("MKL_CBWR", os.environ.get("MKL_CBWR"))
g = torch.Generator().manual_seed(0)
x, w = torch.randn(128, 1024, generator=g), torch.randn(1024, 1024, generator=g) / 32
digests = []
for threads in (1, 2):
    torch.set_num_threads(threads)
    gemm = (x @ w).numpy().tobytes()
    run = train(("tensorwise",), steps=int(sys.argv[1]), progress=False, monitor_every=None).history["loss"]
    digests.append(hashlib.sha256(gemm + run.to_numpy().tobytes()).hexdigest())
print("SAME", digests[0] == digests[1])
"""


def _child(env: dict, steps: int = 12) -> str:
    return subprocess.run([sys.executable, "-c", CHILD, str(steps)], env=env, capture_output=True, text=True,
                          timeout=600, check=True).stdout


def test_importing_fp8lab_makes_gemms_and_fp8_runs_repeat_on_any_thread_count():
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    out = _child(env)
    assert "MKL_CBWR AUTO,STRICT" in out and "SAME True" in out, out


def test_a_users_own_mkl_setting_is_kept():
    out = _child({**os.environ, "MKL_CBWR": "COMPATIBLE"}, steps=1)
    assert "MKL_CBWR COMPATIBLE" in out, out
