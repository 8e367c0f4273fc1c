"""The house rules, checked on the source (ast only; nothing is imported):

- no import circle between dqa's modules, counting imports inside functions;
- no module over 700 lines;
- no private name (``_x``) imported from a module of another package;
- no shim: no module-level ``__getattr__`` that keeps an old import path alive;
- no module importing more than 12 of dqa's modules (counting imports inside functions);
- ``dqa.regen.dispatch`` and the run (``dqa.regen.run``, ``dqa.regen.run_*``) never name the SGLang
  router: no import of a router module, no identifier that speaks of it (``facts.router``,
  ``says_no_workers``): what a router changes is asked of ``servers.facts.ServerFacts``;
- one HTTP stack: aiohttp, imported by ``dqa.regen.wire.transport`` alone; no other HTTP client
  (httpx, requests, urllib3, http.client) anywhere in dqa (``urllib.request`` only where
  ``wire.http_policy`` reads the proxy environment).

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
MAX_DQA_IMPORTS = 12


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


def test_no_module_imports_more_than_12_of_dqas_modules():
    graph = _graph()
    crowded = {m: len(deps) for m, deps in graph.items() if len(deps) > MAX_DQA_IMPORTS}
    assert crowded == {}, f"modules importing more than {MAX_DQA_IMPORTS} of dqa's modules: {crowded}"
    assert max(len(deps) for deps in graph.values()) >= 5  # the graph is the real one, not empty


ROUTER_WORDS = ("router", "no_workers")


def _names_the_router(module: str) -> list[str]:
    """Where ``module`` names the SGLang router: imports of a module whose name speaks of it, and
    identifiers (names, attributes, functions, arguments, keywords) that do. Strings and comments
    are not looked at."""
    found = []
    for target, name, line in _imports(module):
        full = f"{target}.{name}" if name else target
        if any(w in full.lower() for w in ROUTER_WORDS):
            found.append(f"{MODULES[module].relative_to(ROOT)}:{line}: imports {full}")
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        ident = None
        if isinstance(node, ast.Name):
            ident = node.id
        elif isinstance(node, ast.Attribute):
            ident = node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            ident = node.name
        elif isinstance(node, ast.arg):
            ident = node.arg
        elif isinstance(node, ast.keyword):
            ident = node.arg
        if ident and any(w in ident.lower() for w in ROUTER_WORDS):
            found.append(f"{MODULES[module].relative_to(ROOT)}:{node.lineno}: {ident}")
    return found


def _dispatch_and_run_modules() -> list[str]:
    return sorted(m for m in MODULES if m == "dqa.regen.dispatch" or m.startswith("dqa.regen.dispatch.")
                  or m == "dqa.regen.run" or m.startswith("dqa.regen.run_"))


def test_dispatch_and_the_run_never_name_the_router():
    modules = _dispatch_and_run_modules()
    assert {"dqa.regen.run", "dqa.regen.dispatch.scheduler", "dqa.regen.dispatch.preflight"} <= set(modules)
    assert _names_the_router("dqa.regen.servers.facts")  # the check sees the router where it lives
    assert [hit for m in modules for hit in _names_the_router(m)] == []


HTTP_CLIENTS = ("aiohttp", "httpx", "requests", "urllib3", "http.client", "urllib.request", "pycurl")
HTTP_ALLOWED = {("dqa.regen.wire.transport", "aiohttp"), ("dqa.regen.wire.http_policy", "urllib.request")}


def _http_clients(module: str) -> set[str]:
    """The HTTP client libraries ``module`` imports (``HTTP_CLIENTS``, by their top names)."""
    out = set()
    for target, name, _ in _imports(module):
        for full in (target, f"{target}.{name}" if name else target):
            for lib in HTTP_CLIENTS:
                if full == lib or full.startswith(lib + "."):
                    out.add(lib)
    return out


def test_one_http_stack():
    used = {(m, lib) for m in MODULES for lib in _http_clients(m)}
    assert ("dqa.regen.wire.transport", "aiohttp") in used  # the check sees the one stack
    assert used - HTTP_ALLOWED == set(), "HTTP goes over aiohttp in dqa.regen.wire.transport only"
