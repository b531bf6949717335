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


def test_clear_forgets_every_replay_and_the_cores_calls(monkeypatch):
    """What the tools call between settings: every replayed op's ``clear`` (the compiled
    replays, or their stand-ins where the extension is not built) and the core's; that a
    cleared key records anew is checked on a GPU, in test_torch_replay."""
    pytest.importorskip("torch")
    from moe_numba.torch import _replay

    cleared = []

    class Op:
        def __init__(self, name):
            self.name = name

        def clear(self):
            cleared.append(self.name)

    monkeypatch.setattr(_replay, "OPS", (Op("a"), Op("b")))
    monkeypatch.setattr(_replay._core, "clear", lambda: cleared.append("core"))
    _replay.clear()
    assert sorted(cleared) == ["a", "b", "core"]


def test_the_replayed_ops_can_be_cleared():
    pytest.importorskip("torch")
    from moe_numba.torch import _replay

    assert _replay.PERMUTE in _replay.OPS and len(_replay.OPS) == 4
    for op in _replay.OPS:
        op.clear()
