"""The house rules, checked on the source (ast only; nothing is imported):

- no import circle between dqa's modules, counting imports inside functions;
- no module over 700 lines;
- no private name (``_x``) imported from a module of another package;
- no shim: no module-level ``__getattr__`` that keeps an old import path alive.

The package map is pyproject's ``[tool.setuptools.package-dir]``: ``dqa.audit`` lives in
``audit/``, ``dqa.regen`` in ``regen/``, and so on.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 700


def _modules() -> dict[str, Path]:
    """Returns {dotted module name: file} for every module of the installed package."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = cfg["tool"]["setuptools"]["package-dir"]
    top = {name: ROOT / path for name, path in dirs.items() if name.count(".") <= 1}
    out: dict[str, Path] = {}
    for pkg, folder in top.items():
        for file in folder.rglob("*.py"):
            rel = file.relative_to(folder).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([pkg, *parts])
            out.setdefault(name, file)
    return out


MODULES = _modules()



def _package_of(module: str) -> str:
    file = MODULES[module]
    return module if file.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = _package_of(module).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """Returns (imported module, imported name or None, line) for every import in the file."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, None, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for a in node.names:
                out.append((target, a.name, node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for target, name, _ in _imports(module):
            if name and f"{target}.{name}" in MODULES:
                dest = f"{target}.{name}"
            elif target in MODULES:
                dest = target
            else:
                continue
            if dest != module:
                graph[module].add(dest)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_map_finds_the_code():
    assert {"dqa.cli", "dqa.audit.scan", "dqa.regen.run", "dqa.expectations.gate"} <= set(MODULES)


def test_no_import_circle_between_dqas_modules():
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_700_lines(module):
    lines = MODULES[module].read_text().count("\n")
    assert lines <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)}: {lines} lines"


def test_no_private_name_is_imported_across_packages():
    crossings = []
    for module in MODULES:
        here = _package_of(module)
        for target, name, line in _imports(module):
            if not target.startswith("dqa") or target not in MODULES:
                continue
            private = name and name.startswith("_") and not name.startswith("__")
            if private and _package_of(target) != here:
                crossings.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {target}.{name}")
    assert crossings == []


def test_no_shim_keeps_an_old_import_path_alive():
    shims = []
    for module, file in MODULES.items():
        tree = ast.parse(file.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                shims.append(str(file.relative_to(ROOT)))
    assert shims == []
