"""The three places that name versions agree: pyproject.toml (the pins), environment.yml (local
conda users) and binder/environment.yml (mybinder.org); and binder/postBuild fails loudly.

Each conda environment must name exactly the packages of pyproject's dependencies and `lab`
extra (test tools stay out), at the same versions, whether it takes them from conda or pip.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml  # PyYAML: a dependency of jupyter_server (via jupyter-events), so always here

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, vendored by pip
    from pip._vendor import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
ENVIRONMENTS = ["environment.yml", "binder/environment.yml"]
# conda-forge names that differ from the PyPI name of the same project
CONDA_TO_PYPI = {"matplotlib-base": "matplotlib", "pytorch": "torch"}
NOT_PINNED_HERE = {"python", "pip"}


def _name(name: str) -> str:
    """PEP 503 normalisation, so ml_dtypes == ml-dtypes."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["lab"]]:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", requirement)
        assert m, f"pyproject.toml: {requirement!r} is not pinned with =="
        pins[_name(m[1])] = m[2]
    return pins


def environment_pins(path: Path) -> tuple[dict[str, str], dict]:
    """{package: version} from a conda environment file (conda and pip sections), and the file."""
    env = yaml.safe_load(path.read_text())
    pins: dict[str, str] = {}

    def add(name: str, version: str) -> None:
        name = _name(CONDA_TO_PYPI.get(name, name))
        assert name not in pins, f"{path.name}: {name} is named twice (conda and pip?)"
        pins[name] = version

    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for line in dep["pip"]:
                if line.startswith("-"):  # --extra-index-url ..., -e .
                    continue
                m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line)
                assert m, f"{path}: pip requirement {line!r} is not pinned with =="
                add(m[1], m[2])
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\s*={1,2}\s*(\S+))?", dep)
        assert m, f"{path}: cannot read conda dependency {dep!r}"
        if m[1] in NOT_PINNED_HERE:
            continue
        assert m[2], f"{path}: conda dependency {dep!r} has no version"
        add(m[1], m[2])
    return pins, env


@pytest.mark.parametrize("relpath", ENVIRONMENTS)
def test_conda_environment_pins_equal_pyproject(relpath):
    expected = pyproject_pins()
    found, env = environment_pins(REPO / relpath)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    differ = {k: (expected[k], found[k]) for k in set(expected) & set(found) if expected[k] != found[k]}
    assert not missing and not extra and not differ, (
        f"{relpath} disagrees with pyproject.toml: missing {missing}, not in pyproject {extra}, "
        f"versions (pyproject, {relpath}) {differ}"
    )
    assert env["channels"][0] == "conda-forge"


def test_both_environments_use_the_same_python_and_cpu_torch():
    pythons, index_urls = set(), set()
    for relpath in ENVIRONMENTS:
        env = yaml.safe_load((REPO / relpath).read_text())
        pythons |= {d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")}
        pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
        index_urls |= {line for line in pip if "download.pytorch.org/whl/cpu" in line}
    assert len(pythons) == 1, f"the environments ask for different Pythons: {pythons}"
    assert index_urls == {"--extra-index-url https://download.pytorch.org/whl/cpu"}


def test_binder_post_build_fails_loudly_and_installs_fp8lab_without_dependencies():
    post_build = REPO / "binder" / "postBuild"
    lines = [ln.strip() for ln in post_build.read_text().splitlines()]
    assert lines[0] == "#!/usr/bin/env bash"
    code = [ln for ln in lines[1:] if ln and not ln.startswith("#")]
    assert code[0] == "set -euo pipefail", "binder/postBuild must start with `set -euo pipefail`"
    installs = [ln for ln in code if "pip install" in ln]
    assert installs and all("--no-deps" in ln for ln in installs), "postBuild must not change the environment layer"
    assert post_build.stat().st_mode & 0o111, "binder/postBuild must be executable"


def test_readme_binder_link_opens_notebook_00():
    readme = (REPO / "README.md").read_text()
    m = re.search(r"https://mybinder\.org/v2/gh/([^/\s]+)/([^/\s]+)/HEAD\?urlpath=([^)\s]+)", readme)
    assert m, "README.md has no mybinder.org link"
    assert m[3] == "lab/tree/notebooks/00_setup_check.ipynb"
