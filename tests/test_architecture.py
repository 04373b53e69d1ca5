"""The package's map: every module is on it, imports flow one way (no cycle, none against the map),
and the map a reader sees (fp8lab/__init__.py's docstring, the README's "The package") is this one.

The import graph is read from the source with ast (nothing is imported): every `import fp8lab.x`
and `from fp8lab.x import ...` / `from fp8lab import x`, at module level and inside functions,
since a function-level import is a dependency too (it only runs later).
"""

import ast
import re
from pathlib import Path

import pytest

import fp8lab

PACKAGE = Path(fp8lab.__file__).parent
README = PACKAGE.parent / "README.md"

# The map, bottom up: a module may import only modules listed before it. (Its groups are the
# layers a reader sees in fp8lab/__init__.py's docstring; within a layer the order is the order
# of their imports.)
ORDER = [
    "settings", "_watchdog",                                    # no fp8lab imports
    "formats", "scaling", "kernels", "timing", "quantize",      # numbers: formats, scales, the C twins
    "metrics", "recipes", "gemm", "nn", "train",                # FP8 training
    "data", "realdata", "anatomy", "render", "plots",           # data and figures
    "export", "readiness", "cost", "distributed", "capstone", "measured",  # built on training
    "doctor", "exercises", "widgets", "answers", "bench", "lab",          # the edges
    "__main__", "__init__",
]

# `from fp8lab import __version__` reads the package's version string, not a module's code
CONSTANTS = {"__version__"}

# Imports against the map that wait on a file another branch owns (fp8lab/widgets.py); each must
# still exist (the test fails once it is gone, so that the entry is deleted with it)
AWAITING: set[tuple[str, str]] = set()


def _modules() -> list[str]:
    return sorted(p.stem for p in PACKAGE.glob("*.py"))


def imports(path: Path) -> set[str]:
    """The fp8lab modules a file imports (module level and inside functions); `from fp8lab import NAME`
    with a NAME that is no module imports the package itself (`__init__`)."""
    modules = set(_modules())
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative imports are not used in fp8lab: say so if one appears
                found.add(f"<relative import in {path.name}>")
                continue
            parts = (node.module or "").split(".")
            if parts[0] != "fp8lab":
                continue
            if len(parts) > 1:
                found.add(parts[1])
            else:
                names = {a.name for a in node.names} - CONSTANTS
                found |= {n if n in modules else "__init__" for n in names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("fp8lab.")}
    return found - {path.stem}


def graph() -> dict[str, set[str]]:
    return {m: imports(PACKAGE / f"{m}.py") for m in _modules()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (each holds a cycle), as sorted lists."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def against(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) pairs where the imported module is not below the importer on the map."""
    return {(m, d) for m, deps in g.items() for d in deps if d not in ORDER or ORDER.index(d) >= ORDER.index(m)}


def test_every_module_is_on_the_map():
    modules = set(_modules())
    assert modules == set(ORDER), (f"on the map but missing: {sorted(set(ORDER) - modules)}; "
                                   f"missing from the map: {sorted(modules - set(ORDER))}")
    assert len(ORDER) == len(set(ORDER))


def test_no_import_goes_against_the_map():
    bad = against(graph())
    assert bad - AWAITING == set(), sorted(bad - AWAITING)
    assert AWAITING <= bad, f"resolved, delete from AWAITING: {sorted(AWAITING - bad)}"


def test_no_import_cycle():
    g = graph()
    for importer, imported in AWAITING:  # the awaited edges are the known cycles: the rest must have none
        g[importer].discard(imported)
    assert cycles(g) == []


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
])
def test_the_cycle_finder_finds_cycles(edges, expected):
    assert sorted(cycles(edges)) == expected


def test_a_function_level_import_counts(tmp_path):
    src = tmp_path / "gemm.py"
    src.write_text("import torch\nfrom fp8lab import kernels\n\ndef f():\n    from fp8lab.widgets import PANELS\n"
                   "    import fp8lab.train\n    from fp8lab import E4M3, __version__\n")
    assert imports(src) == {"kernels", "widgets", "train", "__init__"}


def _map_lines(text: str) -> list[str]:
    """Module names in the order a map lists them, one per line: lines that start with a module
    name (`name` or name), or table rows whose second cell is one."""
    names = set(ORDER)
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            name = cells[1] if len(cells) > 2 else ""
        else:
            m = re.match(r"\s*`?([A-Za-z_]+)`?\s", line + " ")
            name = m.group(1) if m else ""
        if name in names and name not in out:
            out.append(name)
    return out


def test_the_docstring_map_is_this_map_in_this_order():
    doc = fp8lab.__doc__
    listed = _map_lines(doc.split("The map", 1)[1])
    assert listed == ORDER[:-1], f"fp8lab/__init__.py's map lists {listed}"


def test_the_readme_lists_every_module_one_line_each():
    section = README.read_text().split("## The package", 1)[1].split("\n## ", 1)[0]
    listed = _map_lines(section)
    assert set(listed) == set(ORDER[:-1]), f"missing from the README: {sorted(set(ORDER[:-1]) - set(listed))}"
    assert listed == ORDER[:-1], f"the README lists the modules in another order: {listed}"
