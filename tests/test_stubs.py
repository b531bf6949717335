"""The type stubs of the compiled moe_cpu modules name exactly what the modules define."""

import ast
import importlib
from pathlib import Path

import pytest

STUB_DIR = Path(__file__).resolve().parents[1] / "src" / "moe_cpu"


def _stub_names(path):
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize("stub", sorted(STUB_DIR.glob("_*.pyi")), ids=lambda p: p.stem)
def test_stub_matches_module(stub):
    module = importlib.import_module(f"moe_cpu.{stub.stem}")
    public = {n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n))}
    stubbed = _stub_names(stub)
    missing = {n for n in stubbed if not hasattr(module, n)}
    assert not missing, f"{stub.name} names what the module lacks: {missing}"
    undeclared = public - stubbed - {"np", "os"}
    assert not undeclared, f"{stub.name} misses {undeclared}"


def test_packages_are_typed():
    root = STUB_DIR.parent
    assert (root / "moe_numba" / "py.typed").exists()
    assert (root / "moe_cpu" / "py.typed").exists()
