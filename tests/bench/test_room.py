"""bench room's memory arithmetic: the memory available here, what a kernel holds at least, and the refusal."""

from pathlib import Path

import pytest

from fp8lab.bench.room import RoomTooBig, available_memory_mb, bench_room, own_memory_mb, room_fits


def _machine(tmp_path: Path, available_kb: int, cgroup: str = "", files: dict[str, str] | None = None) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text(f"MemTotal: 25165824 kB\nMemAvailable: {available_kb} kB\n")
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for rel, text in (files or {}).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_available_memory_is_memavailable_or_a_cgroups_room_under_its_limit(tmp_path):
    plain = _machine(tmp_path / "a", 20 * 1024 * 1024)
    assert available_memory_mb(plain) == (20 * 1024, "MemAvailable in /proc/meminfo")
    v2 = _machine(tmp_path / "b", 20 * 1024 * 1024, "0::/hub/learner\n",
                  {"sys/fs/cgroup/hub/learner/memory.max": str(4 * 2**30),
                   "sys/fs/cgroup/hub/learner/memory.current": str(2**30)})
    assert available_memory_mb(v2) == (3 * 1024, "cgroup memory.max 4.0 GiB, 1.0 in use")
    v1 = _machine(tmp_path / "c", 2 * 1024 * 1024, "4:memory:/box\n",
                  {"sys/fs/cgroup/memory/box/memory.limit_in_bytes": str(8 * 2**30),
                   "sys/fs/cgroup/memory/box/memory.usage_in_bytes": "0"})
    assert available_memory_mb(v1) == (2 * 1024, "MemAvailable in /proc/meminfo")  # the smaller of the two
    unlimited = _machine(tmp_path / "d", 1024 * 1024, "0::/\n", {"sys/fs/cgroup/memory.max": "max",
                                                                 "sys/fs/cgroup/memory.current": "5"})
    assert available_memory_mb(unlimited) == (1024, "MemAvailable in /proc/meminfo")
    assert available_memory_mb(tmp_path / "nowhere") == (None, "no /proc/meminfo here")


def test_a_room_that_cannot_fit_says_the_arithmetic_and_how_many_fit():
    """1000 kernels of about 600 MB (bench room's own quiet run measures that much) on a 24 GiB machine."""
    why = room_fits(1000, 600, "the quiet kernel's peak", (21_000, "MemAvailable in /proc/meminfo"))
    assert why == ("bench room 1000: 1000 kernels x 600 MB (the quiet kernel's peak) = 585.9 GB, but this machine "
                   "has 20.5 GB available (MemAvailable in /proc/meminfo): they cannot all fit. Ask for at most 35 "
                   "kernel(s) here, or pass --ignore-memory to start them anyway")
    assert room_fits(35, 600, "x", (21_000, "m")) is None
    assert "Ask for at most 35 kernel(s) here" in room_fits(36, 600, "x", (21_000, "m"))  # one more: refused
    assert room_fits(10_000, 600, "x", (None, "no /proc/meminfo here")) is None  # nothing known: nothing refused


def test_what_a_kernel_holds_at_least_is_this_processes_own_memory():
    mb = own_memory_mb()
    assert mb is None or 50 < mb < 20_000  # (torch alone holds about 200 MB of its own)


def test_bench_room_refuses_before_starting_anything_and_refuses_a_count_below_one(monkeypatch):
    import fp8lab.bench.room as room

    started = []
    monkeypatch.setattr(room, "run_in_subprocess", lambda *a, **k: started.append(a) or {})
    monkeypatch.setattr(room, "available_memory_mb", lambda: (1000.0, "a test's machine"))
    monkeypatch.setattr(room, "own_memory_mb", lambda: 200.0)
    with pytest.raises(RoomTooBig, match=r"6 kernels x 200 MB .* = 1.2 GB, but this machine has 1.0 GB available"):
        bench_room(6)
    assert not started
    for n in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="at least 1 kernel"):
            bench_room(n)


def test_bench_room_refuses_after_the_quiet_kernel_from_its_measured_peak(monkeypatch):
    import fp8lab.bench.room as room

    started = []
    monkeypatch.setattr(room, "run_in_subprocess", lambda *a, **k: {"run_all_s": 1.0, "peak_mb": 600.0})
    monkeypatch.setattr(room, "start_in_subprocess", lambda *a, **k: started.append(a))
    monkeypatch.setattr(room, "available_memory_mb", lambda: (1000.0, "a test's machine"))
    monkeypatch.setattr(room, "own_memory_mb", lambda: 200.0)
    with pytest.raises(RoomTooBig, match=r"3 kernels x 600 MB \(the quiet kernel's peak, just measured"):
        bench_room(3)  # (3 x 200 MB fits: the quiet kernel runs, and its peak says they do not)
    assert not started
