"""fp8lab.timing: how many calls each helper makes and in what order, and the tables and lines it prints
(no speed is asserted: speed is measured by the benchmarks)."""

import re

from fp8lab import timing


def test_timed_runs_warmup_then_repeats():
    calls = []
    out = timing.timed(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and len(out) == 4 and all(t >= 0 for t in out)


def test_time_interleaved_alternates_the_candidates():
    order = []
    times = timing.time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                                    rounds=3, warmup=1)
    assert order == ["a", "b"] + ["a", "b"] * 3  # warm-ups, then one call of each per round
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}


def test_print_table_is_markdown_with_every_key(capsys):
    timing.print_table("T", [{"x": 1, "y": 0.123456}, {"x": 22, "z": 12345.6}], note="n")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:3] == ["T", "n"]
    assert lines[3] == "| x  | y     | z     |"
    assert lines[4] == "|----|-------|-------|"
    assert lines[5] == "| 1  | 0.123 | -     |"
    assert lines[6] == "| 22 | -     | 12346 |"


def test_machine_and_reference_speed_lines():
    line = timing.machine_line("kernels on")
    assert re.match(r"\d{4}-\d\d-\d\d, .+, \d+ threads?, .+, torch .+, kernels on$", line)
    assert timing.cpu_name()
    speed = timing.reference_speed(size=64, repeats=1)
    assert re.match(r"fp32 64\^3 mm [\d.]+ ms \(\d+ threads?\)", speed) and "; bf16 " in speed
