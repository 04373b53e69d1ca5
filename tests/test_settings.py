"""fp8lab.settings: each run-wide setting read from the environment when asked, with the values its
docstring lists and a ValueError naming them otherwise."""

import platform

import pytest

from fp8lab import settings


def test_smoke_and_size_follow_fp8lab_smoke(monkeypatch):
    monkeypatch.delenv("FP8LAB_SMOKE", raising=False)
    assert not settings.smoke() and settings.size(1000, 10) == 1000
    for on in ("1", "true", " YES ", "on"):
        monkeypatch.setenv("FP8LAB_SMOKE", on)
        assert settings.smoke() and settings.size(1000, 10) == 10
    monkeypatch.setenv("FP8LAB_SMOKE", "0")
    assert not settings.smoke()


def test_kernels_requested_takes_on_off_or_unset(monkeypatch):
    monkeypatch.delenv("FP8LAB_KERNELS", raising=False)
    assert settings.kernels_requested()
    monkeypatch.setenv("FP8LAB_KERNELS", "")
    assert settings.kernels_requested()
    monkeypatch.setenv("FP8LAB_KERNELS", "Off")
    assert not settings.kernels_requested()
    monkeypatch.setenv("FP8LAB_KERNELS", "maybe")
    with pytest.raises(ValueError, match="neither on nor off"):
        settings.kernels_requested()


def test_build_timeout_is_a_positive_number_of_seconds(monkeypatch):
    monkeypatch.delenv("FP8LAB_BUILD_TIMEOUT", raising=False)
    assert settings.build_timeout(30.0) == 30.0
    monkeypatch.setenv("FP8LAB_BUILD_TIMEOUT", " 2.5 ")
    assert settings.build_timeout(30.0) == 2.5
    for bad in ("0", "-1", "inf", "nan", "soon"):
        monkeypatch.setenv("FP8LAB_BUILD_TIMEOUT", bad)
        with pytest.raises(ValueError, match="seconds"):
            settings.build_timeout(30.0)


def test_draw_mode(monkeypatch):
    monkeypatch.delenv("FP8LAB_DRAW", raising=False)
    assert settings.draw_requested() == "auto"
    monkeypatch.setenv("FP8LAB_DRAW", "SYNC")
    assert settings.draw_requested() == "sync"
    monkeypatch.setenv("FP8LAB_DRAW", "async")
    with pytest.raises(ValueError, match="drawing mode"):
        settings.draw_requested()


def test_blas_reproducibility_keeps_a_users_choice(monkeypatch):
    monkeypatch.delenv("MKL_CBWR", raising=False)
    assert settings.pin_blas_reproducibility() == "AUTO,STRICT"
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert settings.pin_blas_reproducibility() == "COMPATIBLE"


def test_keep_freed_memory_raises_glibcs_thresholds_once():
    """fp8lab.setup() and the benchmarks keep freed blocks up to 32 MiB in the heap: glibc's mallopt accepts both
    thresholds (on glibc), and the setting is made once per process (a second call answers the first's words)."""
    said = settings.keep_freed_memory()
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert said == "glibc keeps freed blocks up to 32 MiB for reuse"
    else:
        assert said.startswith("allocator unchanged")
    assert settings.keep_freed_memory() is said
