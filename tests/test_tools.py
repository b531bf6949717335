"""The GPU scripts of tools/ import on any machine (they run only where a GPU is; their
imports of the library's internals must not rot unseen)."""

import importlib.util
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


@pytest.mark.parametrize("name", ["host_time", "sanitize"])
def test_tool_imports(name):
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location(f"tools_{name}", TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # (their work is under main(), not at import)
    assert callable(module.main)
