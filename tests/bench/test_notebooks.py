"""fp8lab.bench.notebooks: which notebooks run and how their rows read, with the nbclient run replaced
(running the notebooks is tests/notebooks/test_notebooks.py's)."""

import sys
import types

import pytest

import fp8lab.bench.table
from fp8lab.bench import notebooks


@pytest.fixture(autouse=True)
def _no_reference_matmul(monkeypatch):
    """The table's machine line times a 2048^3 matmul (seconds): not what these tests check."""
    monkeypatch.setattr(fp8lab.bench.table, "reference_speed", lambda: "not measured")


def test_notebook_dir_holds_the_ten_notebooks():
    names = sorted(p.stem[:2] for p in notebooks.notebook_dir().glob("0*.ipynb"))
    assert names == [f"{i:02d}" for i in range(10)]


def test_rows_say_whether_each_run_was_under_a_minute(monkeypatch):
    monkeypatch.setitem(sys.modules, "nbclient", types.ModuleType("nbclient"))  # (importing it takes seconds)
    ran = []

    def fake_run(path, timeout):
        ran.append(path.stem)
        return (30.0 if path.stem.startswith("01") else 61.0), 512.4

    monkeypatch.setattr(notebooks, "_run", fake_run)
    rows = notebooks.bench_notebooks(("01", "06"))
    assert [r["notebook"][:2] for r in rows] == ["01", "06"] and len(ran) == 2
    assert [r["under a minute"] for r in rows] == ["yes", "NO"]
    assert rows[0]["kernel peak MB"] == 512 and rows[1]["run all s"] == 61.0


def test_the_peak_is_the_kernels_own_not_the_large_process_that_started_it():
    """A kernel forked from a process holding a gigabyte (pytest late in a run, a user's notebook server) reports
    its own peak: getrusage's ru_maxrss survives fork and exec and would report the parent's."""
    import subprocess

    import torch

    held = torch.ones(2**28)  # 1 GiB, touched
    # preexec_fn makes Python fork (not vfork or posix_spawn), as jupyter_client's kernel launch can
    r = subprocess.run([sys.executable, "-c", notebooks.PEAK_PROBE], capture_output=True, text=True, check=True,
                       preexec_fn=lambda: None)
    del held
    assert 1 < float(r.stdout.split()[-1]) < 512, r.stdout
