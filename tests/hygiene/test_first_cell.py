"""Every notebook's first cell on a hosted service (tools/links.py writes it): where fp8lab is missing it
installs it from FP8LAB_SOURCE (or the repository, once pyproject.toml names one) with pip, the source
one argument of an argument list, never through a shell; with no source it installs nothing and says
how to get fp8lab; where fp8lab is installed it does nothing but import it.

The cell runs here as plain Python in a subprocess, fp8lab's spec made to look missing, with
sys.executable pointing at a recorder that writes the arguments it was given (the real pip is
called once too, with a hostile source: it fails, and nothing else runs).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOSTILE = [
    "$(touch {mark}/dollar)",
    "`touch {mark}/backtick`",
    '"; touch {mark}/quote; echo "',
    "'; touch {mark}/single; echo '",
    "fp8lab; rm -rf {mark}/victim",
    "fp8lab\ntouch {mark}/newline",
    "fp8lab && touch {mark}/and",
    "--index-url=http://127.0.0.1:9/ fp8lab",
    "-r {mark}/requirements.txt",
]


def _links():
    spec = importlib.util.spec_from_file_location("tools_links", REPO / "tools" / "links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _guard(cell: str) -> str:
    """The install part of the cell (before `import fp8lab`), with fp8lab looking missing."""
    guard = cell.split("import fp8lab\n")[0]
    assert 'find_spec("fp8lab")' in guard
    return guard.replace('find_spec("fp8lab")', 'find_spec("fp8lab_missing_here")')


def _run_cell(cell: str, tmp_path: Path, source: str | None,
              recorder: bool = True) -> tuple[subprocess.CompletedProcess, list | None]:
    """Run the cell's install part in a fresh Python; return the process and the argv pip got (None: not called)."""
    record = tmp_path / "argv.json"
    record.unlink(missing_ok=True)
    prelude = ""
    if recorder:
        fake = tmp_path / "python-recorder"
        fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                        f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
        fake.chmod(0o755)
        prelude = f"import sys\nsys.executable = {str(fake)!r}\n"
    env = {k: v for k, v in os.environ.items() if k != "FP8LAB_SOURCE"}
    env.update({"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if source is not None:
        env["FP8LAB_SOURCE"] = source
    proc = subprocess.run([sys.executable, "-c", prelude + _guard(cell)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    return proc, (json.loads(record.read_text()) if record.exists() else None)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_source_reaches_pip_as_one_argument_and_runs_no_shell(tmp_path, hostile):
    mark = tmp_path / "marks"
    mark.mkdir()
    (mark / "victim").write_text("still here")
    source = hostile.format(mark=mark)
    proc, argv = _run_cell(_links().setup_cell(None), tmp_path, source)
    assert proc.returncode == 0, proc.stderr
    assert argv == ["-m", "pip", "install", "-q", "--", source], argv  # one argument, after "--": never an option
    assert sorted(p.name for p in mark.iterdir()) == ["victim"], "a shell ran the source"
    assert (mark / "victim").read_text() == "still here"


def test_the_real_pip_given_a_hostile_source_fails_and_runs_nothing_else(tmp_path):
    mark = tmp_path / "marks"
    mark.mkdir()
    source = f'$(touch {mark}/pwned)"; touch {mark}/quoted; "'
    proc, argv = _run_cell(_links().setup_cell(None), tmp_path, source, recorder=False)
    assert argv is None
    assert proc.returncode != 0
    assert "ModuleNotFoundError: pip could not install fp8lab from" in proc.stderr, proc.stderr[-2000:]
    assert list(mark.iterdir()) == []


def test_without_a_source_the_cell_installs_nothing_and_says_how_to_get_fp8lab(tmp_path):
    links = _links()
    proc, argv = _run_cell(links.setup_cell(None), tmp_path, None)
    assert argv is None, "pip was called without a source"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: fp8lab is not installed here"), proc.stderr
    for what in ("FP8LAB_SOURCE", "wheel", "repository", "git+https://", "docs/install.md"):
        assert what in last, what
    proc, argv = _run_cell(links.setup_cell(None), tmp_path, "")  # set but empty: the same
    assert argv is None and "fp8lab is not installed here" in proc.stderr


def test_with_a_repository_the_default_source_is_the_repository_and_fp8lab_source_wins(tmp_path):
    cell = _links().setup_cell("https://github.com/acme/fp8lab")
    proc, argv = _run_cell(cell, tmp_path, None)
    assert proc.returncode == 0, proc.stderr
    assert argv == ["-m", "pip", "install", "-q", "--", "fp8lab[torchao,data] @ git+https://github.com/acme/fp8lab"]
    proc, argv = _run_cell(cell, tmp_path, "/wheels/fp8lab-0.1.0-py3-none-any.whl")
    assert argv[-1] == "/wheels/fp8lab-0.1.0-py3-none-any.whl"


def test_where_fp8lab_is_installed_the_cell_calls_no_pip(tmp_path):
    """The committed first cell, unchanged, in this venv: no pip, and the status line printed once."""
    cell = "".join(next(c for c in json.loads((REPO / "notebooks" / "00_setup_check.ipynb").read_text())["cells"]
                        if c["cell_type"] == "code")["source"])
    assert cell == _links().setup_cell(_links().repository_url())
    record = tmp_path / "argv.json"
    fake = tmp_path / "python-recorder"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(record)!r}, 'w').write('called')\n")
    fake.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(REPO), "FP8LAB_SMOKE": "1", "MPLBACKEND": "Agg"}
    code = f"import sys\nsys.executable = {str(fake)!r}\n" + cell
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert not record.exists()
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("fp8lab ") for line in lines) == 1 and lines[-1].startswith("threads: "), lines


def test_a_cell_ending_in_setup_shows_the_status_line_once():
    """setup() prints the line and returns None: a notebook cell ending in it has no Out[] repeating it."""
    import matplotlib
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    # setup() sets the lab's plot theme for the whole process: the later tests' figures keep their own
    with matplotlib.rc_context():
        try:
            result = shell.run_cell("import fp8lab\nfp8lab.setup()", store_history=True)
            assert result.success and result.result is None
        finally:
            InteractiveShell.clear_instance()
