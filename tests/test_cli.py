"""``python -m moe_numba``: every option is checked before any work, and a bad one is an
argparse error that names it (exit status 2); the demo's exit status says whether the
outputs matched the oracle; the package's command line lists only what the package has (the
benchmarks are ``python -m benchmarks``, tests/test_bench_cli.py)."""

import re
import subprocess
import sys

import numpy as np
import pytest

import moe_numba._transfer
from moe_numba import __main__ as cli
from moe_numba import _demo
from moe_numba._footprint import Need, demo_need, refusal


@pytest.fixture
def started(monkeypatch):
    """A stand-in for the demo: it records what it was given."""
    calls = []
    monkeypatch.setattr(_demo, "run_demo", lambda **settings: calls.append(settings) or 0)
    return calls


@pytest.fixture
def no_gpu(monkeypatch):
    """As on a machine where no array library sees a GPU (the simulator included)."""
    monkeypatch.setattr(moe_numba._transfer, "gpu_library", lambda: None)


def _refused(argv, message, capsys):
    """Run the command line; it must exit with status 2 and ``message`` (a regex) last."""
    with pytest.raises(SystemExit, match="^2$"):
        cli.main(argv)
    err = capsys.readouterr().err
    assert err.startswith(f"usage: python -m moe_numba {argv[0]}"), err
    last = err.strip().splitlines()[-1]
    assert re.search(message, last), last


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--tokens", "-5"], r"argument --tokens: must be from 1 to 1048576; got -5$"),
        (["demo", "--hidden", "2.5"], r"argument --hidden: expected an integer .*got '2.5'$"),
        (["demo", "--experts", "0"], r"argument --experts: must be from 1 to 4096; got 0"),
        (
            ["demo", "--topk", "40"],
            r"argument --topk: must be at most the number of experts \(--experts 32\): each "
            r"token goes to distinct experts; got 40$",
        ),
        (["demo", "--backend", "gpu"], r"argument --backend: invalid choice: 'gpu'"),
        (["demo", "--backend", "cuda"], r"argument --backend: cuda: no usable GPU"),
    ],
)
def test_bad_options_are_refused_before_any_work(argv, message, capsys, started, no_gpu):
    _refused(argv, message, capsys)
    assert started == []


def test_the_package_lists_only_its_own_commands(capsys):
    with pytest.raises(SystemExit, match="^0$"):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert re.search(r"^usage: python -m moe_numba \[-h\] COMMAND", out), out
    assert re.findall(r"^    (\w+)(?: |$)", out, flags=re.M) == ["demo"]
    for gone in ("bench", "layer"):
        with pytest.raises(SystemExit, match="^2$"):
            cli.main([gone])
        assert f"invalid choice: '{gone}'" in capsys.readouterr().err


def test_demo_topk_defaults_to_at_most_the_experts(started):
    assert cli.main(["demo", "--backend=cpu", "--experts=4"]) == 0
    assert started[0]["topk"] == 4 and started[0]["experts"] == 4
    assert cli.main(["demo", "--backend=cpu", "--topk=3"]) == 0
    assert started[1]["topk"] == 3 and started[1]["tokens"] == 4096


def test_the_module_exits_with_status_2():
    done = subprocess.run(
        [sys.executable, "-m", "moe_numba", "demo", "--tokens", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().endswith("argument --tokens: must be from 1 to 1048576; got 0")


TINY_DEMO = ["demo", "--backend=cpu", "--tokens=24", "--hidden=16", "--experts=4", "--topk=2"]


def test_demo_checks_against_the_oracle(capsys):
    assert cli.main(TINY_DEMO) == 0
    out = capsys.readouterr().out
    assert out.startswith("backend: cpu (NumPy arrays, Cython/OpenMP")
    assert "random workload: T=24 H=16 E=4 K=2 bf16" in out
    assert out.count(" identical to the oracle") == 4  # three checks and the summary
    assert out.rstrip().endswith("all outputs identical to the oracle")


def test_demo_exits_1_on_a_mismatch(monkeypatch, capsys):
    unpermute = _demo.moe_unpermute

    def off_by_one_bit(*args, **kwargs):
        hidden, probs = unpermute(*args, **kwargs)
        hidden = hidden.copy()
        hidden.view(np.uint16)[0, 0] ^= 1
        return hidden, probs

    monkeypatch.setattr(_demo, "moe_unpermute", off_by_one_bit)
    assert cli.main(TINY_DEMO) == 1
    out = capsys.readouterr().out
    assert "weighted unpermute                 DIFFERS from the oracle" in out
    assert out.rstrip().endswith("MISMATCH: see above")


GiB = 1 << 30


def test_a_demo_beyond_memory_is_refused(capsys, started):
    """Terabytes: more than any machine has, whatever /proc/meminfo says here."""
    message = (
        re.escape("the demo's workload T=1048576 H=65536 E=32 K=8")
        + r" needs about \d+\.\d GiB of host memory \(\d+ bytes, estimated\) "
        r"and \d+\.\d GiB are available \(.*\): choose a smaller shape$"
    )
    _refused(["demo", "--backend=cpu", "--tokens=1048576", "--hidden=65536"], message, capsys)
    assert started == []


def test_refusal_compares_the_estimate_with_what_there_is():
    need = demo_need(65536, 2048, 32, 8, "cpu")
    assert need.device == 0 and need.host > 65536 * 2048 * 2
    label = "the demo's workload"
    assert refusal(need, "cpu", label, host=(need.host, "MemAvailable")) is None
    assert refusal(need, "cpu", label, host=(need.host - 1, "MemAvailable")) == (
        f"the demo's workload needs about {need.host / GiB:.1f} GiB of host memory "
        f"({need.host} bytes, estimated) and {(need.host - 1) / GiB:.1f} GiB are available "
        "(MemAvailable): choose a smaller shape"
    )
    gpu = Need(host=1, device=3 * GiB)
    assert refusal(gpu, "cuda", "x", host=(GiB, "m"), free=GiB) == (
        "x needs about 3.0 GiB of GPU memory (3221225472 bytes, estimated) and 1.0 GiB are "
        "free on the GPU: choose a smaller shape"
    )
    assert refusal(gpu, "cuda", "x", host=(GiB, "m"), free=4 * GiB) is None
    assert refusal(gpu, "cpu", "x", host=(GiB, "m"), free=GiB) is None  # no GPU memory on a CPU
