"""fp8lab.bench.threadcount: every (round, condition, thread count) runs, interleaved, busy conditions inside
their groups, and the table's ratios to the faster count (runs, groups and spinners replaced by recorders)."""

import contextlib
import math

from fp8lab.bench import threadcount


def test_runs_interleave_and_the_table_compares_counts(monkeypatch):
    seconds = {1: 2.0, 4: 1.0}
    entered = []

    @contextlib.contextmanager
    def groups(condition):
        entered.append(condition)
        yield ("kernel.procs", "others.procs", "how")

    class Busy:
        def __init__(self, n, where):
            assert (n, where) == (2, "others.procs")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(threadcount.threads, "decision", lambda: type("D", (), {"cpus": 4})())
    monkeypatch.setattr(threadcount, "run", lambda count, steps, procs=None: {
        "s": seconds[count] * (1.5 if procs else 1.0), "threads": count})
    monkeypatch.setattr(threadcount, "groups", groups)
    monkeypatch.setattr(threadcount, "Busy", Busy)
    tables = []
    monkeypatch.setattr(threadcount, "print_table", lambda title, rows, note: tables.append(rows))
    runs = threadcount.bench_threads(steps=1, rounds=2)
    assert [(r["round"], r["condition"], r["count"]) for r in runs[:6]] == [
        (1, "quiet", 1), (1, "quiet", 4), (1, "busy", 1), (1, "busy", 4), (1, "shared", 1), (1, "shared", 4)]
    assert len(runs) == 12 and entered == ["busy", "busy", "shared", "shared"] * 2  # a group per loaded run
    table = {(r["condition"], r["threads"]): r for r in tables[0]}
    assert table["quiet", 4]["x the faster"] == 1.0 and table["quiet", 1]["x the faster"] == 2.0
    assert math.isclose(table["busy", 1]["median s"], 3.0) and table["busy", 1]["rounds s"] == "3.00, 3.00"
