"""tools/module_metrics.py counts what it says: on a small package planted with each kind of problem, and on
fp8lab itself, held to ceilings so that a change making one worse fails (tests/hygiene/test_architecture.py's
layers see folders; these see modules)."""

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import module_metrics  # noqa: E402

sys.path.remove(str(ROOT / "tools"))

# Counted on the package as it stands; lower a ceiling when a change lowers its count, never raise it.
CEILINGS = {"private_imports": 0, "function_imports": 5, "granularity_checks": 0, "cycles": 0}
NAMED_TESTS_FLOOR = 117


def _plant(tmp_path: Path, files: dict[str, str]) -> module_metrics.Metrics:
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "tests").mkdir(exist_ok=True)
    return module_metrics.measure(tmp_path / "pkg", tmp_path / "tests")


def test_each_kind_of_problem_is_counted_where_it_is(tmp_path):
    m = _plant(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.b import _helper, public\n\ndef f():\n    from pkg import b\n    return b\n",
        "b.py": ("from .a import f\n\ndef _helper():\n    pass\n\ndef public(g):\n"
                 "    return isinstance(g, PerBlock | PerRow)\n"),
        "c.py": "import pkg.a\n\ndef g(x):\n    return isinstance(x, (int, PerTensor))\n",
    })
    (tmp_path / "tests" / "test_c.py").write_text("")
    assert m.private_imports == ["pkg/a.py:1: pkg.b._helper"]
    assert m.function_imports == ["pkg/a.py:4: pkg.b"]
    assert m.granularity_checks == ["pkg/b.py:7", "pkg/c.py:4"]
    assert m.cycles == [["pkg.a", "pkg.b"]]  # a function-level import closes a cycle too
    m = module_metrics.measure(tmp_path / "pkg", tmp_path / "tests")
    assert m.with_logic == ["pkg/a.py", "pkg/b.py", "pkg/c.py"] and m.named_tests == ["pkg/c.py"]


def test_a_module_is_named_only_by_its_mirrored_test_file(tmp_path):
    m = _plant(tmp_path, {"__init__.py": "def top():\n    pass\n", "sub/__init__.py": "class S:\n    pass\n",
                          "sub/x.py": "def f():\n    pass\n", "sub/_y.py": "def g():\n    pass\n",
                          "sub/z.py": "def h():\n    pass\n", "__main__.py": "def main():\n    pass\n"})
    for rel in ("test_pkg.py", "sub/test_sub.py", "sub/test_x.py", "sub/test_y.py", "test_z.py", "test_sub_z.py"):
        (tmp_path / "tests" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / rel).write_text("")
    m = module_metrics.measure(tmp_path / "pkg", tmp_path / "tests")
    assert m.with_logic == ["pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/_y.py", "pkg/sub/x.py", "pkg/sub/z.py"]
    assert m.named_tests == ["pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/_y.py", "pkg/sub/x.py"]  # not z


def test_a_relative_import_and_a_private_module_are_resolved(tmp_path):
    m = _plant(tmp_path, {"__init__.py": "", "sub/__init__.py": "from . import _inner\n",
                          "sub/_inner.py": "from ..sub import x\n", "sub/x.py": "from .. import sub\n"})
    assert m.private_imports == ["pkg/sub/__init__.py:1: pkg.sub._inner"]
    assert m.cycles == [["pkg.sub", "pkg.sub._inner", "pkg.sub.x"]]


def _over_ceiling(m: module_metrics.Metrics, name: str, ceilings: dict[str, int] = CEILINGS) -> str:
    """Why `name`'s count exceeds its ceiling, listing what it counted ("" where it does not)."""
    count = m.counts()[name]
    listed = {"private_imports": m.private_imports, "function_imports": m.function_imports,
              "granularity_checks": m.granularity_checks, "cycles": m.cycles}[name]
    if count <= ceilings[name]:
        return ""
    return f"{name}: {count} > {ceilings[name]}, now:\n" + "\n".join(map(str, listed))


@pytest.mark.parametrize("name", sorted(CEILINGS))
def test_the_package_does_not_get_harder_to_read(name):
    m = module_metrics.measure(ROOT / "fp8lab", ROOT / "tests")
    assert not _over_ceiling(m, name), _over_ceiling(m, name)


def test_a_copy_of_the_package_with_a_planted_private_import_and_cycles_fails_the_ceilings(tmp_path):
    """The ceilings bite on the package itself: a copy of fp8lab with a private name imported across modules
    inside a function, closing a cycle (progress -> extras -> progress), and a cycle closed by a TYPE_CHECKING
    import (timing -> _version -> timing) counts each and fails ceilings set at the clean copy's counts."""
    copy = tmp_path / "fp8lab"
    for path in (ROOT / "fp8lab").rglob("*.py"):
        (copy / path.relative_to(ROOT / "fp8lab")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy / path.relative_to(ROOT / "fp8lab"))
    clean = module_metrics.measure(copy, ROOT / "tests")
    assert clean.counts() == module_metrics.measure(ROOT / "fp8lab", ROOT / "tests").counts()

    def plant(rel: str, text: str) -> int:
        path = copy / rel
        path.write_text(path.read_text() + text)
        return len(path.read_text().splitlines())  # the planted import's line: the last

    line = plant("progress.py", "\n\ndef _planted():\n    from fp8lab.extras import _planted\n")
    plant("extras.py", "\nfrom fp8lab import progress\n")
    plant("timing.py", "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                       "    from fp8lab._version import __version__\n")
    plant("_version.py", "\nfrom fp8lab import timing\n")
    m = module_metrics.measure(copy, ROOT / "tests")
    assert set(m.private_imports) - set(clean.private_imports) == {f"fp8lab/progress.py:{line}: fp8lab.extras._planted"}
    assert set(m.function_imports) - set(clean.function_imports) == {f"fp8lab/progress.py:{line}: fp8lab.extras"}
    assert [c for c in m.cycles if c not in clean.cycles] == [["fp8lab._version", "fp8lab.timing"],
                                                            ["fp8lab.extras", "fp8lab.progress"]]
    for name in ("private_imports", "function_imports", "cycles"):
        assert _over_ceiling(m, name, clean.counts()), name
        assert not _over_ceiling(clean, name, clean.counts()), name


def test_the_share_of_modules_with_a_test_file_of_their_name_does_not_fall():
    m = module_metrics.measure(ROOT / "fp8lab", ROOT / "tests")
    missing = sorted(f"{rel} -> tests/{module_metrics.mirrored_test(ROOT / 'fp8lab', ROOT / rel)}"
                     for rel in set(m.with_logic) - set(m.named_tests))
    assert len(m.named_tests) >= NAMED_TESTS_FLOOR, f"{len(m.named_tests)} named; without one: {missing}"


def test_the_tests_folders_mirror_the_package():
    """A test file sits in a folder of the package's shape (or hygiene/, notebooks/), each folder a package:
    tests/lab/panels/ for fp8lab/lab/panels/, so that two folders may hold files of one name."""
    tests = ROOT / "tests"
    package_folders = {p.parent.relative_to(ROOT / "fp8lab") for p in (ROOT / "fp8lab").rglob("__init__.py")}
    folders = {p.parent.relative_to(tests) for p in tests.rglob("test_*.py") if "fixtures" not in p.parts}
    assert folders <= package_folders | {Path("hygiene"), Path("notebooks")}, sorted(map(str, folders))
    assert [str(f) for f in sorted(folders) if not (tests / f / "__init__.py").is_file()] == []


def test_every_import_left_in_a_function_says_why():
    """An fp8lab import inside a function is a dependency the reader does not see at the top: each one left
    carries a comment, just above it, giving its reason (an optional or heavy dependency, a measured cost)."""
    m = module_metrics.measure(ROOT / "fp8lab", ROOT / "tests")
    silent = []
    for item in m.function_imports:
        path, line = item.split(":")[:2]
        above = (ROOT / path).read_text().splitlines()[max(0, int(line) - 4):int(line) - 1]
        if not any(text.strip().startswith("#") for text in above):
            silent.append(item)
    assert not silent, f"in-function imports without a reason above them: {silent}"
