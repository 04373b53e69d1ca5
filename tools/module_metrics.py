"""How readable the package's dependencies are, counted from its source (issue: a library a learner can read).

`python tools/module_metrics.py [--list] [PACKAGE_DIR]` prints, for fp8lab (or a copy of it), and with --list
each item counted (path:line: what):
  private_imports     private names (`_x`) imported from another fp8lab module
  function_imports    imports of fp8lab modules inside functions (the dependency a reader does not see at the top)
  granularity_checks  `isinstance(..., PerTensor | PerRow | PerBlock)` switches (behaviour that belongs on the types)
  cycles              import cycles between fp8lab modules, counting function-level and TYPE_CHECKING imports
  named_tests         modules with logic that have their mirrored test file: fp8lab/<folder>/<module>.py ->
                      tests/<folder>/test_<module>.py (a leading underscore dropped), a package's __init__.py
                      with logic -> tests/<folder>/test_<package>.py (fp8lab/__init__.py -> tests/test_fp8lab.py)
tests/hygiene/test_architecture.py holds these to ceilings, so that a change that makes one worse fails.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

GRANULARITY_TYPES = {"PerTensor", "PerRow", "PerBlock"}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass
class Metrics:
    """The counts, with what each one counted (for a failing test's message)."""

    private_imports: list[str] = field(default_factory=list)
    function_imports: list[str] = field(default_factory=list)
    granularity_checks: list[str] = field(default_factory=list)
    cycles: list[list[str]] = field(default_factory=list)
    with_logic: list[str] = field(default_factory=list)
    named_tests: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {"private_imports": len(self.private_imports), "function_imports": len(self.function_imports),
                "granularity_checks": len(self.granularity_checks), "cycles": len(self.cycles),
                "modules_with_logic": len(self.with_logic), "named_tests": len(self.named_tests)}


def module_name(package: Path, path: Path) -> str:
    """fp8lab/training/layers.py -> fp8lab.training.layers; a package's __init__.py -> the package."""
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, here: str, is_package: bool,
              modules: set[str]) -> list[tuple[str, str]]:
    """(module, name) pairs an import statement reaches inside the package: name '' for a whole module."""
    root = next(iter(modules)).split(".")[0]
    if isinstance(node, ast.Import):
        return [(a.name, "") for a in node.names if a.name.split(".")[0] == root]
    if node.level:  # a relative import: resolved against this module's package
        base = here.split(".") if is_package else here.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    if source.split(".")[0] != root:
        return []
    out = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        out.append((sub, "") if sub in modules else (source, alias.name))
    return out


def _within_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, FUNCTIONS):
            return True
    return False


def _granularity_check(node: ast.Call) -> bool:
    if not (isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2):
        return False
    names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node.args[1])
             if isinstance(n, ast.Name | ast.Attribute)}
    return bool(names & GRANULARITY_TYPES)


def mirrored_test(package: Path, path: Path) -> Path:
    """The test file a module's tests live in, relative to the tests folder: the package's layout, mirrored.

    fp8lab/lab/panels/fp4.py -> lab/panels/test_fp4.py; fp8lab/bench/__init__.py -> bench/test_bench.py;
    fp8lab/__init__.py -> test_fp8lab.py; fp8lab/training/_watchdog.py -> training/test_watchdog.py."""
    rel = path.relative_to(package)
    stem = (rel.parent.name or package.name) if path.name == "__init__.py" else path.stem.lstrip("_")
    return rel.parent / f"test_{stem}.py"


def _has_logic(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in tree.body)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def measure(package: Path, tests: Path) -> Metrics:
    """Count the package's metrics (see the module docstring); `tests` is the folder searched for test files."""
    paths = sorted(package.rglob("*.py"))
    modules = {module_name(package, p) for p in paths}
    m = Metrics()
    graph: dict[str, set[str]] = {}
    for path in paths:
        here = module_name(package, path)
        rel = str(path.relative_to(package.parent))
        tree = ast.parse(path.read_text(), filename=rel)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        graph[here] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                reached = _imported(node, here, path.name == "__init__.py", modules)
                for target, name in reached:
                    if target != here:
                        graph[here].add(target)
                    if name.startswith("_") and not name.startswith("__") and target != here:
                        m.private_imports.append(f"{rel}:{node.lineno}: {target}.{name}")
                    elif name == "" and target.rsplit(".", 1)[-1].startswith("_") \
                            and not target.rsplit(".", 1)[-1].startswith("__"):
                        m.private_imports.append(f"{rel}:{node.lineno}: {target}")
                if reached and _within_function(node, parents):
                    m.function_imports.append(f"{rel}:{node.lineno}: {', '.join(t for t, _ in reached)}")
            elif isinstance(node, ast.Call) and _granularity_check(node):
                m.granularity_checks.append(f"{rel}:{node.lineno}")
        if path.name != "__main__.py" and _has_logic(tree):  # the command line: tests/test_cli.py
            m.with_logic.append(rel)
            if (tests / mirrored_test(package, path)).is_file():
                m.named_tests.append(rel)
    m.cycles = _cycles(graph)
    return m


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    listing = "--list" in argv
    argv = [a for a in argv if a != "--list"]
    root = Path(__file__).resolve().parent.parent
    package = Path(argv[0]) if argv else root / "fp8lab"
    m = measure(package, package.parent / "tests")
    for name, count in m.counts().items():
        print(f"{name:20} {count}")
    for cycle in m.cycles:
        print("cycle:", " <-> ".join(cycle))
    if listing:
        for name in ("private_imports", "function_imports", "granularity_checks"):
            for item in getattr(m, name):
                print(f"{name}: {item}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
