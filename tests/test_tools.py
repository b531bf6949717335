"""The GPU scripts of tools/ import on any machine (they run only where a GPU is; their
imports of the library's internals must not rot unseen), and refuse a bad option with
argparse's error (exit status 2, no traceback) before any work: here, with no GPU, work would
fail otherwise."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
SCRIPTS = ["after_sync", "graph_replay", "host_time", "host_time_ab", "sanitize", "split_rows"]


def _load(name, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(TOOLS))  # (as ``python tools/NAME.py`` has it)
    spec = importlib.util.spec_from_file_location(f"tools_{name}", TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # (their work is under main(), not at import)
    return module


@pytest.mark.parametrize("name", SCRIPTS)
def test_tool_imports(name, monkeypatch):
    assert callable(_load(name, monkeypatch).main)


BAD_OPTIONS = [
    ("after_sync", ["--tokens", "3"], "unrecognized arguments: --tokens 3"),
    ("after_sync", ["now"], "unrecognized arguments: now"),
    ("host_time", ["-n", "5"], "unrecognized arguments: -n 5"),
    ("sanitize", ["--quick"], "unrecognized arguments: --quick"),
    ("graph_replay", ["--tokens", "0"], "argument --tokens: expected an int >= 1; got 0"),
    ("graph_replay", ["--tokens", "-3"], "argument --tokens: expected an int >= 1; got -3"),
    ("graph_replay", ["--tokens", "many"], "argument --tokens: expected an int >= 1; got 'many'"),
    ("graph_replay", ["--token", "256", "--x"], "unrecognized arguments: --x"),
    ("split_rows", ["parts", "rows"], "argument SWEEP: 'rows' is no sweep; choose from parts"),
    ("host_time_ab", [], "the following arguments are required: other"),
    ("host_time_ab", ["/nonexistent/tree"], "other: '/nonexistent/tree' is not a tree with a"),
    ("host_time_ab", [str(ROOT), "0"], "argument rounds: expected an int >= 1; got 0"),
    ("host_time_ab", [str(ROOT), "3", "4"], "unrecognized arguments: 4"),
    ("host_time_ab", ["--one", "that"], "argument --one: invalid choice: 'that'"),
]


@pytest.mark.parametrize("name, argv, reason", BAD_OPTIONS)
def test_a_bad_option_is_refused_before_any_work(name, argv, reason, monkeypatch, capsys):
    main = _load(name, monkeypatch).main
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and f"error: {reason}" in err, err


@pytest.mark.parametrize("name", ["after_sync", "graph_replay"])  # (no options; options)
def test_the_command_line_refuses_with_exit_status_2(name):
    """``python tools/NAME.py --no-such-option``: argparse's usage and error, no traceback
    (the other scripts parse the same way: their refusals are tested in this process)."""
    pytest.importorskip("torch")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run(
        [sys.executable, str(TOOLS / f"{name}.py"), "--no-such-option"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "error: " in done.stderr, done.stderr


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_shows_the_docstring(name, monkeypatch, capsys):
    module = _load(name, monkeypatch)
    with pytest.raises(SystemExit) as shown:
        module.main(["--help"])
    assert shown.value.code == 0
    assert module.__doc__.splitlines()[0] in capsys.readouterr().out


def test_clear_forgets_the_cores_prepared_calls():
    """What the tools call between settings (``moe_numba.clear``, which ``use_settings``
    calls) forgets the core's prepared calls among every cache; that a cleared key records
    anew is checked on a GPU, in test_torch_replay."""
    import moe_numba
    from moe_numba import backends
    from moe_numba.ops import UNPERMUTE, UnpermuteArrays, UnpermuteScalars

    arrays = UnpermuteArrays(
        np.zeros((2, 3), np.float32),
        np.array([[0], [1]], np.int32),
        np.zeros((2, 1), np.int32),
        np.ones(2, np.float32),
    )
    scalars = UnpermuteScalars(total_zipped_tokens=2, num_experts=1)
    backends.prepare(UNPERMUTE, arrays, scalars)  # (a type met first is checked without a key)
    _, plan = backends.prepare(UNPERMUTE, arrays, scalars)
    assert backends.prepare(UNPERMUTE, arrays, scalars)[1] is plan  # (remembered)
    moe_numba.clear()
    assert backends.prepare(UNPERMUTE, arrays, scalars)[1] is not plan
