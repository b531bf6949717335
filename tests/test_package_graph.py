"""The package graph of ``moe_numba`` is a tree: no import circles, and three layers.

Every import of every module (module level or inside a function, Python or Cython) is an
edge to the module it names: ``from . import x`` to the submodule ``x``, ``from .m import
name`` to ``m``, and ``from .. import name`` of a name that is no submodule to the package's
``__init__``.

The layers, from the top: the public functions and the table of fronts that they pick from
(``moe_numba``, ``moe_numba._api*``, ``moe_numba._fronts``, and Paddle's signatures in
``moe_numba.paddle``); the integrations of libraries with transforms of their own and of
model frameworks (``moe_numba.torch``, ``moe_numba.paddle``, ``moe_numba.transformers``);
the core (everything else: contract, ops, backends, kernels, runtime). A layer imports only
the layers below it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "moe_numba"


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    paths = [p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".pyx")]
    return {_module_name(p): p for p in paths}


def _source(path):
    text = path.read_text()
    if path.suffix == ".pyx":  # Cython's own statements are not Python: keep the imports
        lines = [line for line in text.splitlines() if re.match(r"\s*(from|import) ", line)]
        lines = [line for line in lines if " cimport " not in line]
        text = "\n".join(line.strip() for line in lines)
    return text


def _imports(name, path, modules):
    package = name if path.name in ("__init__.py",) else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(_source(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    yield full
                elif base in modules:
                    yield base


def _graph():
    modules = _modules()
    return {name: set(_imports(name, path, modules)) - {name} for name, path in modules.items()}


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert _cycles(_graph()) == []


PUBLIC = ("moe_numba", "moe_numba._api", "moe_numba._api_backward", "moe_numba._api_sort")
# (Paddle's signatures and install() are public functions of moe_numba.paddle)
PUBLIC += ("moe_numba._fronts", "moe_numba.paddle", "moe_numba.paddle._functional")
PUBLIC += ("moe_numba.paddle._install",)
INTEGRATIONS = ("moe_numba.torch", "moe_numba.paddle", "moe_numba.transformers")
CONSUMERS = ("moe_numba.__main__", "moe_numba._demo")  # (the public API's own users)


def _layer(name):
    if name in PUBLIC:
        return 2
    if any(name == p or name.startswith(p + ".") for p in INTEGRATIONS):
        return 1
    return 0


def test_each_layer_imports_only_the_layers_below_it():
    graph = _graph()
    for name, imported in graph.items():
        if name.startswith(CONSUMERS):
            continue
        for other in imported:
            assert _layer(other) <= _layer(name), f"{name} imports {other}, a layer above it"


def test_the_layers_are_as_named():
    graph = _graph()
    assert all(name in graph for name in PUBLIC + INTEGRATIONS)
    assert _layer("moe_numba._core") == 0 and _layer("moe_numba.torch._front") == 1


def test_the_analysis_sees_circles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
