"""`python -m fp8lab bench notebooks`: each notebook's run time top to bottom and its kernel's peak memory.

Each notebook runs once with nbclient at workshop size (FP8LAB_SMOKE unset) in a fresh kernel, as
a learner's Run All does: the time is from the first cell to the last (kernel start excluded), the
peak is the kernel process's maximum resident memory. The lab's target is under a minute and under
1.5 GB per notebook on 2 cores; the tests only check that each notebook finishes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fp8lab.bench.table import print_table

__all__ = ["NOTEBOOK_TARGET_S", "PEAK_MB", "PEAK_PROBE", "bench_notebooks", "notebook_dir"]

NOTEBOOK_TARGET_S = 60.0
# code that defines _peak_mb(), the kernel's own peak, in the kernel: Linux's VmHWM belongs to the process's address
# space, made new at exec; getrusage's ru_maxrss survives fork and exec, so a kernel started by a large process (pytest
# late in a run, a notebook server) would report its parent's peak (ru_maxrss: where there is no /proc)
PEAK_MB = """
def _peak_mb():
    import pathlib, resource, sys
    status = pathlib.Path("/proc/self/status")
    hwm = [line for line in status.read_text().splitlines() if line.startswith("VmHWM:")] if status.exists() else []
    maxrss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)
    return int(hwm[0].split()[1]) / 1024 if hwm else maxrss_mb
"""
PEAK_PROBE = PEAK_MB + "print(_peak_mb())\n"  # (a cell that prints it)


def notebook_dir() -> Path:
    """The notebooks: the repository's notebooks/ beside the package."""
    return Path(__file__).resolve().parents[2] / "notebooks"


def _run(path: Path, timeout: float) -> tuple[float, float]:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = {k: v for k, v in os.environ.items() if k != "FP8LAB_SMOKE"}
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    with client.setup_kernel(env=env):
        start = time.perf_counter()
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        seconds = time.perf_counter() - start
        probe = nbformat.v4.new_code_cell(PEAK_PROBE)
        nb.cells.append(probe)  # (the client executes the notebook's own cells)
        client.execute_cell(probe, len(nb.cells) - 1)
        peak = float("".join(o.get("text", "") for o in probe.outputs).split()[-1])
    return seconds, peak


def bench_notebooks(names: tuple[str, ...] | None = None, timeout: float = 900.0) -> list[dict]:
    """Run each notebook (all of them, or those whose name contains one of `names`); one row each."""
    try:
        import nbclient  # noqa: F401
    except ImportError as err:
        raise SystemExit("bench notebooks needs nbclient: pip install nbclient (it comes with `make setup`)") from err
    paths = sorted(notebook_dir().glob("0*.ipynb"))
    if names:
        paths = [p for p in paths if any(n in p.stem for n in names)]
    rows = []
    for path in paths:
        seconds, peak = _run(path, timeout)
        rows.append({"notebook": path.stem, "run all s": round(seconds, 1), "kernel peak MB": round(peak),
                     "under a minute": "yes" if seconds < NOTEBOOK_TARGET_S else "NO"})
        print(f"{path.stem}: {seconds:.1f} s, {peak:.0f} MB", flush=True)
    print_table("bench notebooks: Run All at workshop size, nbclient, kernel start excluded", rows,
                f"target: under {NOTEBOOK_TARGET_S:g} s and 1.5 GB per notebook on 2 cores")
    return rows
