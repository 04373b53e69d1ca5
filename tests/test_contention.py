"""Threads that follow the load (fp8lab/contention.py): the CPUs other programs used are read from planted
/proc/stat files and from real spinning processes, the rule maps what is left free to a thread count, a
user's choice stops it, and setup() starts it in a notebook's kernel (before each cell). No test judges a
time: `bench load` measures what following buys (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fp8lab import contention
from fp8lab.contention import Follower, Sample, others_cpus, sample, threads_for

REPO = Path(__file__).resolve().parents[1]
HEAD = "cpu  900 0 300 5000 10 0 0 0 0 0\n"


def _stat(root: Path, per_cpu: dict[int, tuple[int, ...]]) -> None:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    lines = [HEAD] + [f"cpu{n} " + " ".join(map(str, f)) + "\n" for n, f in per_cpu.items()]
    (root / "proc/stat").write_text("".join(lines) + "intr 12345 0 0\nctxt 999\n")


def test_a_sample_counts_the_affinity_masks_cpus_busy_time_steal_included(tmp_path):
    ticks = os.sysconf("SC_CLK_TCK")
    #                user nice system idle iowait irq softirq steal guest guest_nice
    _stat(tmp_path, {0: (100, 5, 20, 900, 40, 1, 2, 7, 50, 0),
                     1: (300, 0, 30, 700, 10, 0, 0, 0, 0, 0),
                     2: (9999, 0, 0, 0, 0, 0, 0, 0, 0, 0)})  # not ours: left out
    s = sample({0, 1}, tmp_path)
    assert s is not None
    assert s.busy * ticks == pytest.approx((100 + 5 + 20 + 1 + 2 + 7) + (300 + 30))  # guest is inside user
    assert sample({0}, tmp_path / "nowhere") is None


def test_others_are_the_machines_busy_time_less_this_process():
    before, after = Sample(10.0, 100.0, 5.0), Sample(12.0, 103.5, 6.0)
    assert others_cpus(before, after) == pytest.approx((3.5 - 1.0) / 2.0)
    assert others_cpus(before, Sample(12.0, 101.0, 7.5)) == 0.0  # our own time is never the others'
    assert others_cpus(before, before) == 0.0


@pytest.mark.parametrize(("free", "ceiling", "threads"), [
    (2.0, 2, 2), (1.6, 2, 2), (1.5, 2, 2), (1.4, 2, 1), (1.0, 2, 1), (0.3, 2, 1), (-0.5, 2, 1),
    (7.9, 8, 8), (6.2, 8, 6), (3.0, 2, 2)])
def test_the_threads_are_the_free_cpus_rounded_between_one_and_the_policys(free, ceiling, threads):
    assert threads_for(free, ceiling) == threads


class _Planted:
    """A sampler whose busy seconds advance as the test says, and torch's thread count as a value."""

    def __init__(self) -> None:
        self.t, self.busy, self.own, self.threads, self.sets = 0.0, 0.0, 0.0, 2, []

    def look(self) -> Sample:
        return Sample(self.t, self.busy, self.own)

    def advance(self, seconds: float, others: float, own: float) -> None:
        self.t += seconds
        self.busy += (others + own) * seconds
        self.own += own * seconds

    def set(self, n: int) -> None:
        self.threads = n
        self.sets.append(n)


def _follower(monkeypatch, planted: _Planted, cpus: int = 2, ceiling: int = 2) -> Follower:
    monkeypatch.setattr(contention.time, "monotonic", lambda: planted.t)
    return Follower(set(range(cpus)), ceiling, planted.look, planted.set, lambda: planted.threads)


def test_two_busy_programs_take_it_to_one_thread_and_a_quiet_machine_back_to_two(monkeypatch):
    planted = _Planted()
    f = _follower(monkeypatch, planted)
    planted.advance(1.0, others=0.02, own=1.9)  # quiet
    assert f.look() == 2 and planted.sets == []
    planted.advance(1.0, others=1.0, own=1.0)  # another program's two threads: half the machine
    assert f.look() == 1 and planted.sets == [1] and f.others == pytest.approx(1.0)
    planted.advance(0.3, others=1.3, own=0.7)  # too soon for a training loop's look ...
    assert f.look() == 1 and f.last.wall == 2.0
    planted.advance(0.3, others=0.0, own=1.0)  # ... a cell's (force) waits for SHORTEST only
    assert f.look(force=True) == 1 and f.others == pytest.approx((1.3 * 0.3) / 0.6)
    planted.advance(1.0, others=0.1, own=1.0)  # the others stopped
    assert f.look() == 2 and planted.sets == [1, 2] and f.changes == 2
    planted.advance(1.0, others=0.0, own=0.0)
    planted.threads = 1  # the user's torch.set_num_threads(1): it stands
    assert f.look() == 1 and "torch.set_num_threads(1) was called" in f.stopped
    planted.advance(1.0, others=0.0, own=0.0)
    assert f.look() == 1 and planted.sets == [1, 2]


def test_on_a_big_node_other_cores_load_leaves_a_quotas_threads_alone(monkeypatch):
    planted = _Planted()
    f = _follower(monkeypatch, planted, cpus=64, ceiling=2)  # a 2-CPU quota on a 64-core node
    planted.advance(1.0, others=40.0, own=2.0)
    assert f.look() == 2 and planted.sets == []
    planted.advance(1.0, others=63.5, own=0.5)
    assert f.look() == 1


def test_only_the_main_thread_fits_the_threads(monkeypatch):
    planted = _Planted()
    f = _follower(monkeypatch, planted)
    planted.advance(1.0, others=2.0, own=0.0)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(f.look()))
    worker.start()
    worker.join()
    assert seen == [2] and planted.sets == []
    assert f.look() == 1


PROBE = """
import json, sys
{before}
import fp8lab, torch
from fp8lab import contention
{between}
fp8lab.setup(quiet=True)
print(json.dumps({{"following": contention.following() is not None, "line": contention.line(),
                  "status": fp8lab.status_line(), "threads": torch.get_num_threads()}}))
"""


def _probe(before: str = "", between: str = "", env: dict | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "FP8LAB_THREADS_SET")}
    r = subprocess.run([sys.executable, "-c", PROBE.format(before=before, between=between)], capture_output=True,
                       text=True, env={**base, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg", **(env or {})},
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: there is nothing to fit")
def test_setup_starts_following_unless_the_threads_are_the_users():
    out = _probe()
    assert out["following"] and "threads follow the load" in out["line"]
    assert out["status"].splitlines()[-1].endswith(out["line"])
    for kind, kwargs in (("environment", {"env": {"OMP_NUM_THREADS": "1"}}),
                         ("before", {"before": "import torch; torch.set_num_threads(1)"})):
        out = _probe(**kwargs)
        assert not out["following"] and out["threads"] == 1, kind
        assert out["line"] == "threads do not follow the load: the threads are yours", kind


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: there is nothing to fit")
def test_beside_real_spinning_processes_a_look_takes_one_thread_and_the_cell_hook_is_registered():
    """As many spinners as CPUs while this kernel sleeps: the others hold the machine, whatever else runs."""
    import torch
    from IPython.core.interactiveshell import InteractiveShell

    before = torch.get_num_threads()
    spin = "while True:\n    sum(i * i for i in range(10_000))\n"
    cpus = os.sched_getaffinity(0)
    shell = InteractiveShell.instance()
    saved = list(contention._FOLLOWER)
    try:
        torch.set_num_threads(2)
        follower = Follower(cpus, 2, lambda: sample(cpus), torch.set_num_threads, torch.get_num_threads)
        contention._FOLLOWER[:] = [follower]
        contention._before_each_cell()
        contention._before_each_cell()  # again (a first cell run twice): one hook
        assert shell.events.callbacks["pre_run_cell"].count(contention._before_cell) == 1
        spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in cpus]
        try:
            time.sleep(0.3)
            follower.look(force=True)  # a fresh window: the spinners' alone
            time.sleep(1.0)
            assert shell.run_cell("pass").success  # the hook looks before the cell
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        assert follower.others > len(cpus) - 0.75 and torch.get_num_threads() == 1, (follower.others, cpus)
    finally:
        contention._FOLLOWER[:] = saved
        InteractiveShell.clear_instance()
        torch.set_num_threads(before)
