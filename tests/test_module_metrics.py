"""tools/module_metrics.py counts what it says: on a small package planted with each kind of problem, and on
fp8lab itself, held to ceilings so that a change making one worse fails (tests/test_architecture.py's
layers see folders; these see modules)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import module_metrics  # noqa: E402

sys.path.remove(str(ROOT / "tools"))

# Counted on the package as it stands; lower a ceiling when a change lowers its count, never raise it.
CEILINGS = {"private_imports": 49, "function_imports": 209, "granularity_checks": 30, "cycles": 2}
NAMED_TESTS_FLOOR = 34


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


def test_a_relative_import_and_a_private_module_are_resolved(tmp_path):
    m = _plant(tmp_path, {"__init__.py": "", "sub/__init__.py": "from . import _inner\n",
                          "sub/_inner.py": "from ..sub import x\n", "sub/x.py": "from .. import sub\n"})
    assert m.private_imports == ["pkg/sub/__init__.py:1: pkg.sub._inner"]
    assert m.cycles == [["pkg.sub", "pkg.sub._inner", "pkg.sub.x"]]


@pytest.mark.parametrize("name", sorted(CEILINGS))
def test_the_package_does_not_get_harder_to_read(name):
    m = module_metrics.measure(ROOT / "fp8lab", ROOT / "tests")
    count = m.counts()[name]
    listed = {"private_imports": m.private_imports, "function_imports": m.function_imports,
              "granularity_checks": m.granularity_checks, "cycles": m.cycles}[name]
    assert count <= CEILINGS[name], f"{name}: {count} > {CEILINGS[name]}, now:\n" + "\n".join(map(str, listed))


def test_the_share_of_modules_with_a_test_file_of_their_name_does_not_fall():
    m = module_metrics.measure(ROOT / "fp8lab", ROOT / "tests")
    missing = sorted(set(m.with_logic) - set(m.named_tests))
    assert len(m.named_tests) >= NAMED_TESTS_FLOOR, f"{len(m.named_tests)} named; without one: {missing}"
