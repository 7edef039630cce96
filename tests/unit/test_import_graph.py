"""No import cycle inside the ``nri_numa`` package.

Every import counts: at module level, inside functions, and under ``TYPE_CHECKING`` (a cycle
hidden there is one refactor away from a real one). Importing ``a.b.c`` also imports the
packages ``a.b`` and ``a`` (their ``__init__`` runs first), so those are edges too, except a
module's own parent packages, which are already loading when it runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "nri_numa"
REPO = Path(__file__).resolve().parents[2]


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package under ``root``."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported_names(module: str, path: Path) -> set[str]:
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    """module → the package's modules that importing it loads directly."""
    modules = module_files(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module, path in modules.items():
        for name in _imported_names(module, path):
            if name not in modules:
                continue  # outside the package, or a name imported from a module
            parts = name.split(".")
            for depth in range(2, len(parts) + 1):
                target = ".".join(parts[:depth])
                own_parent = module == target or module.startswith(target + ".")
                if target in modules and not own_parent:
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found


def test_the_package_has_no_import_cycle():
    found = cycles(import_graph(REPO))
    assert not found, "import cycles in nri_numa: " + "; ".join(" <-> ".join(c) for c in found)


def test_a_cycle_through_type_checking_and_function_imports_is_found(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "inner").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "inner" / "__init__.py").write_text("from nri_numa.inner.a import A\n")
    (pkg / "inner" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nA = 1\nif TYPE_CHECKING:\n    from .b import B\n")
    (pkg / "inner" / "b.py").write_text("def f():\n    from nri_numa.inner.a import A\nB = 2\n")
    (pkg / "c.py").write_text("import nri_numa.inner.b\n")
    graph = import_graph(tmp_path)
    assert graph["nri_numa.c"] == {"nri_numa.inner", "nri_numa.inner.b"}
    assert graph["nri_numa.inner.a"] == {"nri_numa.inner.b"}  # its own package is no edge
    assert cycles(graph) == [["nri_numa.inner.a", "nri_numa.inner.b"]]


def test_a_package_init_that_imports_its_importer_is_a_cycle(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "x").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "x" / "__init__.py").write_text("from nri_numa import y\n")
    (pkg / "x" / "m.py").write_text("")
    (pkg / "y.py").write_text("from nri_numa.x.m import thing\n")
    assert cycles(import_graph(tmp_path)) == [["nri_numa.x", "nri_numa.y"]]
