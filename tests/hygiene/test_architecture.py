"""The package's layout: folders are layers, imports flow down (import-linter's contract in
pyproject.toml), every folder's map names its files, and no module grows past a reader's page count.

`lint-imports` reads every import statically (grimp), at module level and inside functions: a
function-level import is a dependency too (it only runs later).
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fp8lab

PACKAGE = Path(fp8lab.__file__).parent
ROOT = PACKAGE.parent
LINT = Path(sys.executable).with_name("lint-imports")
LAYERS = ("numerics", "gemm", "figures", "training", "lab", "bench", "harness", "data")
TOP_LEVEL = {"__init__.py", "__main__.py", "nn.py", "settings.py", "threads.py", "timing.py", "_version.py",
             "extras.py", "progress.py"}
# modules allowed past MAX_LINES, with the reason
MAX_LINES = 600
LONG: dict[str, str] = {}


def _lint(package_parent: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=package_parent,
                          env={"PYTHONPATH": str(package_parent), "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=120)


def test_imports_follow_the_layers():
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize("module, upward", [
    ("numerics/formats.py", "fp8lab.lab.panels"),  # the bottom reaching the top, inside a function
    ("gemm/emulation.py", "fp8lab.training.layers"),  # a layer reaching the one above
    ("lab/panels/base.py", "fp8lab.harness.answers"),  # inside the lab: a panel reaching the key
])
def test_an_import_against_the_layers_fails_the_contract(tmp_path, module, upward):
    """The mutation that proves the contract bites: one upward import in a copy of the package."""
    shutil.copytree(PACKAGE, tmp_path / "fp8lab", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "fp8lab" / module
    target.write_text(target.read_text() + f"\n\ndef _upward():\n    import {upward}  # noqa\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "BROKEN" in proc.stdout and upward in proc.stdout


def test_modules_live_in_their_layer_folders():
    stray = {p.name for p in PACKAGE.glob("*.py")} - TOP_LEVEL
    assert not stray, f"top-level modules outside a layer folder: {sorted(stray)}"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS), folders


@pytest.mark.parametrize("layer", LAYERS)
def test_each_folder_opens_with_a_map_naming_its_modules(layer):
    """A folder's __init__ docstring is its table of contents: every module in it is named there."""
    folder = PACKAGE / layer
    doc = (folder / "__init__.py").read_text().split('"""')[1]
    for path in folder.glob("*.py"):
        if path.name != "__init__.py":
            assert path.stem in doc, f"fp8lab/{layer}/__init__.py's map does not mention {path.name}"
    for sub in (p for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        assert sub.name in doc, f"fp8lab/{layer}/__init__.py's map does not mention {sub.name}/"


def test_no_module_is_longer_than_a_reader_wants():
    long = {}
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and rel not in LONG:
            long[rel] = lines
    assert not long, f"modules over {MAX_LINES} lines (split them, or say why in LONG): {long}"
    for rel in LONG:
        assert (PACKAGE / rel).exists(), f"LONG names {rel}, which is gone"


def test_every_mutation_of_make_mutate_still_applies_once():
    """tools/mutate.py edits the code by text: after a move or a rename a mutation's text is not in
    its file, and `make mutate` stops at it. Each mutation's text occurs exactly once in its file,
    and each names tests that exist (a parametrized test by its function's name and a case's id in brackets)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import mutate
    finally:
        sys.path.remove(str(ROOT / "tools"))
    stale = [f"{mu.name}: {mu.path}" for mu in mutate.MUTATIONS
             if not (ROOT / mu.path).is_file() or (ROOT / mu.path).read_text().count(mu.old) != 1]
    assert not stale, "mutations whose text does not occur once:\n" + "\n".join(stale)
    missing = [t for mu in mutate.MUTATIONS for t in mu.tests
               if not (ROOT / t.split("::")[0]).is_file()
               or ("::" in t and f"def {t.split('::')[1].split('[')[0]}(" not in (ROOT / t.split("::")[0]).read_text())]
    assert not missing, f"mutations name tests that do not exist: {missing}"
