"""The benchmarks' machine line (fp8lab/bench/table.py, timing.reference_speed): every table says how fast the
machine it ran on multiplied matrices, measured in the same process (an fp32 2048^3 matmul; bf16 where a call is
cheap), and the CPU quota the process ran in. The times are read, never judged.
"""

from __future__ import annotations

import re

import torch

from fp8lab.bench import quota as quota_module
from fp8lab.bench import table as table_module
from fp8lab.bench.table import bench_machine_line, print_table
from fp8lab.timing import reference_speed

MS = r"\d+\.\d ms"


def test_every_table_names_the_reference_speed_beside_the_machine(capsys):
    print_table("a table", [{"what": "x", "median ms": 1.0}], "a note")
    out = capsys.readouterr().out.splitlines()
    title, machine, note = out[1:4]
    assert title == "a table" and note == "a note"
    threads = torch.get_num_threads()
    assert re.search(rf", reference: fp32 2048\^3 mm {MS} \({threads} threads?\)", machine), machine
    assert re.match(r"\d{4}-\d\d-\d\d, ", machine), machine  # the date first
    assert "reference:" not in bench_machine_line(reference=False)


def test_the_reference_names_its_threads_and_times_bf16_only_where_cheap():
    threads = torch.get_num_threads()
    line = reference_speed(size=256, repeats=1, bf16_budget_s=1e-9)  # any bf16 call is over this budget
    assert re.fullmatch(rf"fp32 256\^3 mm {MS} \({threads} threads?\)(, {MS} \(1 thread\))?; bf16 not timed "
                        r"\(a 256\^3 call scaled to 256\^3: \d+ s\)", line), line
    assert (", " in line.split(";")[0]) == (threads > 1)  # one thread beside torch's count where they differ
    line = reference_speed(size=256, repeats=1, bf16_budget_s=1e9)
    assert re.search(rf"; bf16 {MS}$", line), line
    assert torch.get_num_threads() == threads  # left as it was


def test_the_machine_line_names_the_cpu_quota_the_process_runs_in(monkeypatch):
    monkeypatch.setattr(quota_module.threads, "cpu_quota",
                        lambda: (0.5, "cgroup v1 cpu.cfs_quota_us/cfs_period_us 5000/10000"))
    line = bench_machine_line(reference=False)
    assert line.endswith(", in a CPU quota of 0.5 CPU (cgroup v1 cpu.cfs_quota_us/cfs_period_us 5000/10000)"), line
    monkeypatch.setattr(quota_module.threads, "cpu_quota", lambda: (None, "no CPU quota"))
    assert "quota" not in bench_machine_line(reference=False)
    assert table_module.quota_label is quota_module.quota_label
