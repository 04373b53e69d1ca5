"""The oldest supported versions: pyproject.toml's floors are compat.txt's pins (what `make compat` runs
the core tests against), and pip resolves fp8lab with every one of them pinned at once."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENT = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(.*)$")


def _pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "compat.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[name.lower().replace("_", "-")] = version
    return out


def _floors() -> dict[str, str]:
    """Each requirement's floor; a package the base dependencies name keeps their floor (an extra may need a
    newer one for itself: [torchao] needs torch 2.11, test_an_extra_that_needs_a_newer_torch_says_so)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *(r for reqs in project["optional-dependencies"].values() for r in reqs)]
    out: dict[str, str] = {}
    for req in requirements:
        name, spec = REQUIREMENT.match(req).groups()
        floor = re.search(r">=\s*([0-9][0-9.]*)", spec)
        if floor:
            out.setdefault(name.lower().replace("_", "-"), floor.group(1))
    return out


def _extra(name: str) -> dict[str, str]:
    """{package: floor} of pyproject.toml's extra `name`."""
    reqs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]
    out = {}
    for req in reqs:
        package, spec = REQUIREMENT.match(req).groups()
        floor = re.search(r">=\s*([0-9][0-9.]*)", spec)
        out[package.lower()] = floor.group(1) if floor else ""
    return out


def test_an_extra_that_needs_a_newer_torch_says_so():
    """fp8lab.extras.NEEDS (what counts an installed extra as unusable) and the extra's own requirements
    in pyproject.toml name the same torch; the base floor may lie below it (the lab runs without the extra)."""
    from fp8lab.extras import NEEDS

    for extra, (package, floor) in NEEDS.items():
        assert _same_version(_extra(extra).get(package, "none"), floor), (extra, _extra(extra), floor)
        base = _floors()[package]
        assert [int(p) for p in floor.split(".")] >= [int(p) for p in base.split(".")], (extra, floor, base)


def _same_version(a: str, b: str) -> bool:
    pad = lambda v: [int(p) for p in v.split(".")] + [0] * (3 - len(v.split(".")))  # noqa: E731
    return pad(a) == pad(b)


def test_every_floor_is_pinned_in_compat_and_every_pin_is_a_floor():
    pins, floors = _pins(), _floors()
    for name, version in pins.items():
        assert name in floors, f"compat.txt pins {name}, which pyproject.toml does not require"
        assert _same_version(floors[name], version), f"{name}: pyproject's floor {floors[name]}, compat.txt {version}"
    for name in ("torch", "numpy", "pandas", "matplotlib"):
        assert name in pins, f"compat.txt must pin {name}'s floor"


@pytest.mark.slow
def test_pip_resolves_fp8lab_with_every_floor_pinned(tmp_path):
    """`pip install --dry-run` of this source tree with its [data] extra (compat.txt pins scikit-learn's
    floor; [torchao] needs a newer torch than the base floor, so the floors run without it) and compat.txt
    as constraints, as a fresh environment would (--ignore-installed): it resolves, and would install
    exactly the floors (needs the package index, as `make setup` does)."""
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                           "--report", str(report), "-c", str(ROOT / "compat.txt"), f"{ROOT}[data]"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    chosen = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
              for item in json.loads(report.read_text())["install"]}
    for name, version in _pins().items():
        if name in ("ml-dtypes",):  # a test dependency: not part of fp8lab's own requirements
            continue
        assert _same_version(chosen.get(name, "none").split("+")[0], version), (name, chosen.get(name), version)
