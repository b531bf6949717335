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


def test_clear_forgets_every_replay_and_the_cores_calls():
    """What the tools call between settings: every op's replays (the compiled replays, or
    their stand-ins where the extension is not built) and the core's prepared calls; that a
    cleared key records anew is checked on a GPU, in test_torch_replay."""
    torch = pytest.importorskip("torch")
    from moe_numba import _core, moe_unpermute
    from moe_numba._ops import OPS
    from moe_numba.torch import _replay

    arrays = (torch.zeros((2, 3)), torch.tensor([[0], [1]], dtype=torch.int32))
    arrays += (torch.zeros((2, 1), dtype=torch.int32), torch.ones(2))
    for _ in range(2):  # (a type met for the first time is checked without a key)
        moe_unpermute(*arrays, 2, 1)
    assert sum(len(_core.CALLS[op]) for op in OPS) > 0
    _replay.clear()
    assert sum(len(_core.CALLS[op]) for op in OPS) == 0
    assert set(_replay.REPLAYS) == set(OPS)
