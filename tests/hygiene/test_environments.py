"""The places that name versions agree: constraints.txt (the lab's exact versions), pyproject.toml
(the ranges the package accepts), environment.yml (local conda users) and binder/environment.yml
(mybinder.org); the Python floor is what the locked packages need; `make lab` installs no test
tools; binder/postBuild fails loudly and binder/start applies the lab's Jupyter configuration.

Each conda environment must name exactly the packages of pyproject's dependencies and `lab`
extra (test tools stay out), at constraints.txt's versions, whether from conda or pip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml  # PyYAML: a dependency of jupyter_server (via jupyter-events), so always here

try:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ImportError:  # the same library, vendored by pip
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.version import Version


REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "constraints.txt"
ENVIRONMENTS = ["environment.yml", "binder/environment.yml"]
# conda-forge names that differ from the PyPI name of the same project
CONDA_TO_PYPI = {"matplotlib-base": "matplotlib", "pytorch": "torch"}
NOT_PINNED_HERE = {"python", "pip"}
REQUIREMENT = re.compile(r"([A-Za-z0-9_.\-]+)\s*([<>=!~][^;]*)?")
SELF = re.compile(r"fp8lab\[([a-z,]+)\]")  # an extra that brings others: "fp8lab[torchao,data]"


def _name(name: str) -> str:
    """PEP 503 normalisation, so ml_dtypes == ml-dtypes."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def requirements(*groups: str) -> dict[str, SpecifierSet]:
    """{package: range} of pyproject's groups: "dependencies" or an extra's name (with the extras it names).
    A package named twice (torch, and the [torchao] extra's newer torch) gets both ranges at once."""
    proj = project()
    found: dict[str, SpecifierSet] = {}

    def add(name: str, spec: SpecifierSet) -> None:
        found[name] = found[name] & spec if name in found else spec

    for group in groups:
        for line in proj["dependencies"] if group == "dependencies" else proj["optional-dependencies"][group]:
            if inner := SELF.fullmatch(line.strip()):
                for name, spec in requirements(*inner[1].split(",")).items():
                    add(name, spec)
                continue
            m = REQUIREMENT.fullmatch(line.strip())
            assert m, f"pyproject.toml: cannot read {line!r}"
            add(_name(m[1]), SpecifierSet(m[2] or ""))
    return found


def locked() -> dict[str, str]:
    """{package: version} from constraints.txt."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        assert m, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        assert _name(m[1]) not in pins, f"constraints.txt names {m[1]} twice"
        pins[_name(m[1])] = m[2]
    return pins


def lab_pins() -> dict[str, str]:
    """The locked versions of the package's dependencies and the lab extra (what conda users get)."""
    lock = locked()
    return {name: lock[name] for name in requirements("dependencies", "lab")}


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


def test_constraints_lock_every_requirement_inside_its_range():
    """One exact version per package pyproject names, inside pyproject's range; the ranges are
    ranges (a floor and a ceiling), not pins, so `pip install fp8lab` keeps a user's own torch."""
    ranges = requirements("dependencies", "lab", "test")
    lock = locked()
    assert sorted(lock) == sorted(ranges), (
        f"constraints.txt and pyproject.toml name different packages: only locked {sorted(set(lock) - set(ranges))}, "
        f"not locked {sorted(set(ranges) - set(lock))}")
    for name, spec in ranges.items():
        operators = {s.operator for s in spec}
        assert "==" not in operators and "===" not in operators, f"pyproject.toml pins {name} exactly: {spec}"
        assert operators & {">=", "~="}, f"pyproject.toml: {name} {spec} has no floor"
        if name != "setuptools":  # a build tool: any newer one will do
            assert operators & {"<", "~="}, f"pyproject.toml: {name} {spec} has no ceiling"
        assert Version(lock[name]) in spec, f"constraints.txt's {name}=={lock[name]} is outside pyproject's {spec}"


def test_this_environment_has_the_locked_versions():
    """`make setup` installed exactly constraints.txt (torch 2.13.0, not whatever pip prefers)."""
    lock = locked()
    differ = {}
    for name, version in lock.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            differ[name] = (version, "not installed")
            continue
        if Version(installed).base_version != Version(version).base_version:  # 2.13.0+cpu is 2.13.0
            differ[name] = (version, installed)
    assert not differ, f"(locked, installed) differ: {differ}; run `make clean setup`"


def test_python_floor_is_what_the_locked_packages_need():
    """requires-python's floor admits every locked package (their own Requires-Python), and one
    version lower would not: the claim is neither too generous nor too strict."""
    spec = SpecifierSet(project()["requires-python"])
    (floor,) = [Version(s.version) for s in spec if s.operator == ">="]
    below = Version(f"{floor.major}.{floor.minor - 1}")
    needs_floor = []
    for name in locked():
        requires = metadata.metadata(name).get("Requires-Python")
        if not requires:
            continue
        assert floor in SpecifierSet(requires), f"{name} needs Python {requires}, but fp8lab claims {spec}"
        if below not in SpecifierSet(requires):
            needs_floor.append(name)
    assert needs_floor, f"every locked package runs on Python {below}: lower requires-python"
    assert Version(".".join(map(str, sys.version_info[:3]))) in spec
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    assert tool["ruff"]["target-version"] == f"py{floor.major}{floor.minor}"
    assert f"PYTHON_FLOOR := {floor.major}.{floor.minor}" in (REPO / "Makefile").read_text()
    for relpath in ENVIRONMENTS:
        env = yaml.safe_load((REPO / relpath).read_text())
        (python,) = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
        assert Version(python.split("=")[-1]) in spec, f"{relpath} asks for {python}"


def _dry_run(target: str, tmp_path: Path) -> list[str]:
    """The pip install commands `make TARGET` would run on a machine without .venv."""
    out = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return [line for line in out.splitlines() if " pip install" in line and "--upgrade pip" not in line]


@pytest.mark.skipif(not any(os.access(Path(d) / "make", os.X_OK) for d in os.get_exec_path()), reason="no make")
def test_make_lab_installs_the_lab_without_test_tools(tmp_path):
    (lab,) = _dry_run("lab", tmp_path)
    assert "-c constraints.txt" in lab and lab.endswith('-e ".[lab]"'), lab
    for target in ("setup", "test"):
        (dev,) = _dry_run(target, tmp_path)
        assert "-c constraints.txt" in dev and dev.endswith('-e ".[lab,test]"'), dev


@pytest.mark.parametrize("relpath", ENVIRONMENTS)
def test_conda_environment_pins_equal_the_lock(relpath):
    expected = lab_pins()
    found, env = environment_pins(REPO / relpath)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    differ = {k: (expected[k], found[k]) for k in set(expected) & set(found) if expected[k] != found[k]}
    assert not missing and not extra and not differ, (
        f"{relpath} disagrees with constraints.txt: missing {missing}, not the package's or the lab's {extra}, "
        f"versions (constraints.txt, {relpath}) {differ}"
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


def _links_tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tools_links", REPO / "tools" / "links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NOTEBOOK_NAMES = [p.name for p in sorted((REPO / "notebooks").glob("*.ipynb"))]


def test_hosted_links_open_each_notebook_from_one_repository_url():
    links = _links_tool()
    for name in NOTEBOOK_NAMES:
        got = dict(links.hosted_links("https://github.com/acme/fp8lab", name))
        assert got["Binder"] == f"https://mybinder.org/v2/gh/acme/fp8lab/HEAD?urlpath=lab/tree/notebooks/{name}"
        assert got["Colab"] == f"https://colab.research.google.com/github/acme/fp8lab/blob/main/notebooks/{name}"
        assert got["Kaggle"] == f"https://kaggle.com/kernels/welcome?src=https://github.com/acme/fp8lab/blob/main/notebooks/{name}"
    assert [service for service, _ in links.hosted_links("https://gitlab.com/acme/fp8lab", name)] == ["Binder"]
    assert links.hosted_links("https://git.example.org/acme/fp8lab", name) == []  # an unknown host: no link at all
    assert links.hosted_links(None, name) == []
    assert links.install_source(None) is None  # no default: the first cell says how to get fp8lab
    assert links.install_source("https://github.com/acme/fp8lab") == "fp8lab[torchao,data] @ git+https://github.com/acme/fp8lab"


def test_the_notebooks_and_the_readme_are_as_tools_links_writes_them():
    """`python tools/links.py --check`: the links cells, the first cells and the README's block follow
    pyproject.toml's [project.urls] Repository."""
    r = subprocess.run([sys.executable, str(REPO / "tools" / "links.py"), "--check"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr


def test_setting_the_repository_url_fills_every_link_and_the_install_source(tmp_path):
    links = _links_tool()
    shutil.copytree(REPO / "notebooks", tmp_path / "notebooks")
    text = (REPO / "pyproject.toml").read_text()
    assert "[project.urls]" not in text, "the Repository URL is set: this test's copy would name it twice"
    (tmp_path / "pyproject.toml").write_text(text.replace(
        "[project.optional-dependencies]",
        '[project.urls]\nRepository = "https://github.com/acme/fp8lab"\n\n[project.optional-dependencies]', 1))
    (tmp_path / "README.md").write_text(f"# fp8lab\n\n{links.BEGIN}\n{links.END}\n")
    changes = links.plan(tmp_path)
    assert set(changes) == {*(tmp_path / "notebooks" / n for n in NOTEBOOK_NAMES), tmp_path / "README.md"}
    for name in NOTEBOOK_NAMES:
        nb = json.loads(changes[tmp_path / "notebooks" / name])
        cells = ["".join(c["source"]) for c in nb["cells"]]
        (links_cell,) = [c for c in cells if links.BEGIN in c]
        assert f"(https://colab.research.google.com/github/acme/fp8lab/blob/main/notebooks/{name})" in links_cell
        first = next(c for c, cell in zip(cells, nb["cells"], strict=True) if cell["cell_type"] == "code")
        assert "'fp8lab[torchao,data] @ git+https://github.com/acme/fp8lab'" in first
    assert "https://mybinder.org/v2/gh/acme/fp8lab/HEAD?urlpath=lab/tree/notebooks/00_setup_check.ipynb" in \
        changes[tmp_path / "README.md"]


def test_no_link_a_learner_clicks_holds_a_placeholder():
    """No OWNER (or other placeholder) in a link of a notebook, nor of the README once it holds the links block."""
    texts = ["\n".join("".join(c["source"]) for c in json.loads((REPO / "notebooks" / n).read_text())["cells"]
                       if c["cell_type"] == "markdown") for n in NOTEBOOK_NAMES]
    readme = (REPO / "README.md").read_text()
    if _links_tool().BEGIN in readme:
        texts.append(readme)
    link = re.compile(r"\]\((https?://[^)\s]+)\)|href=[\"'](https?://[^\"']+)")
    urls = [markdown or tag for t in texts for markdown, tag in link.findall(t)]
    placeholders = [u for u in urls if re.search(r"OWNER|USER(NAME)?/|<[a-z ]+>|example\.(com|org)", u)]
    assert not placeholders, placeholders


def test_binder_start_puts_the_labs_jupyter_config_first():
    """repo2docker runs binder/start before Jupyter: the lab's configuration (no news pop-up)
    joins JUPYTER_CONFIG_PATH ahead of what was there, and the command runs."""
    from fp8lab.lab.launcher import CONFIG_DIR

    start = REPO / "binder" / "start"
    assert start.stat().st_mode & 0o111, "binder/start must be executable"
    code = "import os; print(os.environ['JUPYTER_CONFIG_PATH'])"
    out = subprocess.run(["bash", str(start), sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "JUPYTER_CONFIG_PATH": "/elsewhere"}, check=True).stdout.strip()
    assert out.split(os.pathsep) == [str(CONFIG_DIR), "/elsewhere"]
    assert (CONFIG_DIR / "labconfig" / "default_setting_overrides.json").exists()


def test_binder_start_makes_openmp_wait_passively_unless_the_environment_says_otherwise():
    """Binder's kernels get the thread policy's wait policy before any of them loads torch (fp8lab.threads);
    the kernel's `import fp8lab` then reads it as fp8lab's, not the user's."""
    from fp8lab.threads import MARKER, decide

    start = REPO / "binder" / "start"
    code = ("import json, os; "
            "print(json.dumps({k: os.environ.get(k) for k in ('OMP_WAIT_POLICY', 'FP8LAB_THREADS_SET')}))")
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", MARKER)}
    for extra, policy, marker in [({}, "PASSIVE", "OMP_WAIT_POLICY"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE", None),
                                  ({"GOMP_SPINCOUNT": "0"}, None, None)]:
        out = json.loads(subprocess.run(["bash", str(start), sys.executable, "-c", code], capture_output=True,
                                        text=True, timeout=30, env={**base, **extra}, check=True).stdout)
        assert out == {"OMP_WAIT_POLICY": policy, "FP8LAB_THREADS_SET": marker}, (extra, out)
    seen = {"OMP_WAIT_POLICY": "PASSIVE", MARKER: "OMP_WAIT_POLICY"}
    assert decide(seen, 2, None, "no CPU quota", False).wait_by == "set by fp8lab before this process started"


def test_the_binder_files_and_the_readme_point_at_what_exists():
    """binder/README.md and binder/environment.yml send readers to docs/install.md's Binder paragraph, which
    exists; the README sends conda users to docs/install.md, which covers environment.yml."""
    install = (REPO / "docs" / "install.md").read_text()
    assert "**Binder.**" in install and "binder/postBuild" in install
    for path in ("binder/README.md", "binder/environment.yml"):
        text = (REPO / path).read_text()
        assert "docs/install.md" in text and "README's Binder section" not in text, path
    assert "conda" in (REPO / "README.md").read_text() and "docs/install.md" in (REPO / "README.md").read_text()
    assert "conda env create -f environment.yml" in install and "conda activate fp8lab" in install
    assert "conda env create -f environment.yml" in (REPO / "environment.yml").read_text()  # the same command
