"""The GPU scripts of tools/ import on any machine (they run only where a GPU is; their
imports of the library's internals must not rot unseen)."""

import importlib.util
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


@pytest.mark.parametrize(
    "name", ["after_sync", "graph_replay", "host_time", "host_time_ab", "sanitize", "split_rows"]
)
def test_tool_imports(name, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(TOOLS))  # (as ``python tools/NAME.py`` has it)
    spec = importlib.util.spec_from_file_location(f"tools_{name}", TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # (their work is under main(), not at import)
    assert callable(module.main)
