"""Without the optional extras the lab imports and runs, and each place that needs one says how to add it.

torchao comes with `fp8lab[torchao]`, scikit-learn with `fp8lab[data]` (`fp8lab[lab]` brings both).
They are hidden, not uninstalled: a subprocess starts with tests/fixtures/without_extras on
PYTHONPATH, whose sitecustomize makes `import torchao` / `import sklearn` (and find_spec) fail as for
a package never installed, in that process and in every process it starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab.extras import EXTRAS, MissingExtra, available, require

REPO = Path(__file__).resolve().parent.parent
HIDER = REPO / "tests" / "fixtures" / "without_extras"


def _without(code: str, hide: str = "torchao,sklearn", timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HIDER), str(REPO)]), "FP8LAB_TEST_WITHOUT": hide,
           "FP8LAB_SMOKE": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_fixture_hides_the_packages():
    code = """
import importlib.util
for name in ("torchao", "sklearn"):
    try:
        __import__(name)
        print(name, "imported")
    except ModuleNotFoundError:
        print(name, "hidden")
from fp8lab.extras import available
print(available("torchao"), available("data"))
"""
    r = _without(code)
    assert r.stdout.split() == ["torchao", "hidden", "sklearn", "hidden", "False", "False"], r.stdout + r.stderr
    assert available("torchao") and available("data"), "this venv (make setup) has both extras"


def test_every_module_imports_without_the_extras():
    code = """
import importlib, pkgutil, fp8lab
failed = []
for m in pkgutil.walk_packages(fp8lab.__path__, "fp8lab."):
    try:
        importlib.import_module(m.name)
    except Exception as err:
        failed.append(f"{m.name}: {type(err).__name__}: {err}")
print("\\n".join(failed) or "ok")
"""
    r = _without(code)
    assert r.stdout.strip() == "ok", r.stdout + r.stderr


PLACES = """
import json, torch
from fp8lab.extras import MissingExtra

def attempt(what, call):
    try:
        call()
        out = {"what": what, "raised": None}
    except Exception as err:
        out = {"what": what, "raised": type(err).__name__, "message": str(err),
               "import_error": isinstance(err, ImportError), "value_error": isinstance(err, ValueError)}
    print(json.dumps(out))

from fp8lab.nn import convert
from fp8lab.training.export import export, export_table
from fp8lab.training.distributed import compare
from fp8lab.training import capstone
from fp8lab.data.real import load_digits

model = torch.nn.Sequential(torch.nn.Linear(32, 32))
attempt("convert", lambda: convert(model, "tensorwise", engine="torchao"))
attempt("export config", lambda: export("rowwise", "torchao").config)
attempt("export text", lambda: export("rowwise", "torchao").text)
attempt("export table", export_table)
attempt("compare", lambda: compare("tensorwise", nproc=2, steps=2, engine="torchao", stream=None))
attempt("digits case", lambda: capstone.make_case("digits"))
attempt("load digits", load_digits)
attempt("text case", lambda: capstone.make_case("char_lm"))
"""


def test_each_place_that_needs_an_extra_says_how_to_add_it():
    r = _without(PLACES)
    rows = {row["what"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert len(rows) == 8, r.stdout + r.stderr
    for what, extra in [("convert", "torchao"), ("export config", "torchao"), ("compare", "torchao"),
                        ("digits case", "data"), ("load digits", "data")]:
        row = rows[what]
        assert row["raised"] == "MissingExtra", (what, row)
        assert f'pip install "fp8lab[{extra}]"' in row["message"], (what, row["message"])
        assert row["import_error"] and row["value_error"], row
    for what in ("export text", "export table", "text case"):  # what needs no extra still works
        assert rows[what]["raised"] is None, rows[what]


def test_a_notebook_shows_the_message_not_a_traceback():
    code = """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_cell("from fp8lab.training import capstone")
shell.run_cell("capstone.make_case('digits')")
"""
    r = _without(code)
    out = r.stdout
    assert 'MissingExtra: loading the handwritten digits needs scikit-learn' in out, out + r.stderr
    assert 'pip install "fp8lab[data]"' in out
    assert "Traceback" not in out and "real.py" not in out, out


def test_the_distributed_panel_explains_a_missing_torchao():
    code = """
from fp8lab.lab.panels import DistributedPanel
panel = DistributedPanel()
panel.controls["engine"].value = "torchao"
panel.run(blocking=True)
print(panel.log.value)
"""
    r = _without(code)
    assert "FAILED: engine 'torchao' needs torchao" in r.stdout, r.stdout + r.stderr
    assert 'pip install "fp8lab[torchao]"' in r.stdout


def test_doctor_says_which_extras_are_missing():
    r = _without("from fp8lab.lab.doctor import versions; print(versions())")
    assert """'torchao': 'not installed (optional: pip install "fp8lab[torchao]")'""" in r.stdout, r.stdout + r.stderr
    assert """'scikit-learn': 'not installed (optional: pip install "fp8lab[data]")'""" in r.stdout


def test_missing_extra_names_its_extra_and_refuses_unknown_ones():
    err = MissingExtra("data", "this")
    assert err.extra == "data" and err.name == "sklearn"
    assert err._render_traceback_() == [f"MissingExtra: {err.msg}"]
    with pytest.raises(ValueError, match="unknown extra 'cuda'; valid: torchao, data"):
        available("cuda")
    require("torchao", "nothing")  # installed here: no error
    assert set(EXTRAS) == {"torchao", "data"}


def test_torchao_beside_a_torch_older_than_it_needs_counts_as_missing_and_says_why(monkeypatch):
    """torchao 0.18 installed beside torch 2.9 (the floor of fp8lab's own requirements): fp8lab does not
    call into it (torch's pytree would raise an AttributeError deep inside torchao) but says what to do."""
    import importlib.metadata

    from fp8lab import extras
    from fp8lab.lab.doctor import versions
    from fp8lab.training.export import export

    real = importlib.metadata.version
    monkeypatch.setattr(extras.importlib.metadata, "version",
                        lambda dist: "2.9.0+cu128" if dist == "torch" else real(dist))
    assert extras.unusable("torchao") == f"torchao {real('torchao')} needs torch >= 2.11, this is torch 2.9.0+cu128"
    assert extras.unusable("data") is None
    assert not available("torchao") and available("torchao", installed_only=True)
    with pytest.raises(MissingExtra) as caught:
        _ = export("mxfp8", "torchao").config
    message = str(caught.value)
    assert "the installed one cannot run here: torchao" in message and 'pip install "torch>=2.11"' in message
    assert "cannot run here: torchao" in versions()["torchao"]
    monkeypatch.setattr(extras.importlib.metadata, "version", real)
    assert extras.unusable("torchao") is None and available("torchao")  # this venv's torch runs it


BROKEN = "this torchao is broken on purpose"


def _broken_torchao(tmp_path: Path) -> dict:
    """A torchao that fails at import, first on the path, with the metadata of an installed 0.99.0."""
    (tmp_path / "torchao").mkdir()
    (tmp_path / "torchao" / "__init__.py").write_text(f"raise RuntimeError({BROKEN!r})\n")
    info = tmp_path / "torchao-0.99.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchao\nVersion: 0.99.0\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "FP8LAB_SMOKE": "1",
            "MPLBACKEND": "Agg"}


def test_doctor_imports_the_extras_it_reports_and_calls_a_broken_one_broken(tmp_path):
    env = _broken_torchao(tmp_path)
    r = subprocess.run([sys.executable, "-m", "fp8lab", "doctor"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(line for line in r.stdout.splitlines() if line.strip().startswith("torchao"))
    assert f"BROKEN: `import torchao` fails with RuntimeError: {BROKEN}" in line, line
    assert not line.split()[1][0].isdigit(), line  # not listed by its version
    assert "scikit-learn" in r.stdout and "BROKEN" not in r.stdout.replace(line, "")


def test_convert_with_a_broken_torchao_says_so_not_a_raw_import_error(tmp_path):
    code = """
import torch
from fp8lab.extras import MissingExtra, available
from fp8lab.nn import convert
print("available", available("torchao"), available("torchao", installed_only=True))
try:
    convert(torch.nn.Sequential(torch.nn.Linear(32, 32)), "tensorwise", engine="torchao")
except MissingExtra as err:
    print("MissingExtra", isinstance(err, ImportError), isinstance(err, ValueError))
    print(err)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_broken_torchao(tmp_path), capture_output=True,
                       text=True, timeout=300)
    out = r.stdout
    assert "available False True" in out and "MissingExtra True True" in out, out + r.stderr
    assert f"the installed one is broken: `import torchao` fails with RuntimeError: {BROKEN}" in out, out
    assert "pip install --force-reinstall" in out
