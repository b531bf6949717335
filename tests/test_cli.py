"""``python -m moe_numba``: every option is checked before any work, and a bad one is an
argparse error that names it (exit status 2); the demo's exit status says whether the
outputs matched the oracle."""

import re
import subprocess
import sys

import numpy as np
import pytest

import moe_numba._transfer
import moe_numba.bench
from moe_numba import __main__ as cli
from moe_numba import _demo
from moe_numba.bench import _results


@pytest.fixture
def started(monkeypatch):
    """Stand-ins for the bench and the demo: they record what they were given."""
    calls = []
    monkeypatch.setattr(moe_numba.bench, "run", lambda settings: calls.append(settings) or 0)
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
        (["bench", "--tokens", "0"], r"argument --tokens: must be from 1 to 1048576; got 0$"),
        (["demo", "--tokens", "-5"], r"argument --tokens: must be from 1 to 1048576; got -5$"),
        (["bench", "--repeat", "0"], r"argument --repeat: must be from 1 to 1000; got 0$"),
        (["bench", "--hidden", "x"], r"argument --hidden: expected an integer from 1 to 65536; "),
        (["demo", "--hidden", "2.5"], r"argument --hidden: expected an integer .*got '2.5'$"),
        (["bench", "--experts", "5000"], r"argument --experts: must be from 1 to 4096; got 5000"),
        (["demo", "--experts", "0"], r"argument --experts: must be from 1 to 4096; got 0"),
        (["bench", "--alignment", "0"], r"argument --alignment: must be from 1 to 4096; got 0"),
        (["bench", "--topk", "0"], r"argument --topk: must be from 1 to 4096; got 0$"),
        (
            ["demo", "--topk", "40"],
            r"argument --topk: must be at most the number of experts \(--experts 32\): each "
            r"token goes to distinct experts; got 40$",
        ),
        (
            ["bench", "--backend", "cpu", "--experts", "4", "--topk", "5"],
            r"argument --topk: must be at most the number of experts \(--experts 4\).*got 5$",
        ),
        (
            ["bench", "--backend", "cpu", "--topk", "40"],
            r"argument --topk: .* \(the default --experts 32\): .*got 40$",
        ),
        (
            ["bench", "--sweep", "--tokens", "256"],
            r"argument --tokens: not allowed with --sweep \(the sweep has its own shapes\)$",
        ),
        (["bench", "--sweep", "--dtype", "fp8"], r"argument --dtype: not allowed with --sweep"),
        (
            ["bench", "--compare", "missing.json"],
            r"argument --compare: cannot read missing.json: No such file or directory$",
        ),
        (
            ["bench", "--json", "no/such/folder/run.json"],
            r"argument --json: cannot write no/such/folder/run.json: folder .* does not exist$",
        ),
        (["bench", "--json", "."], r"argument --json: \. is a folder; give a file name$"),
        (["bench", "--backend", "gpu"], r"argument --backend: invalid choice: 'gpu'"),
        (
            ["bench", "--backend", "cuda"],
            r"argument --backend: cuda: no usable GPU: none of torch, CuPy, numba.cuda sees one$",
        ),
        (["demo", "--backend", "cuda"], r"argument --backend: cuda: no usable GPU"),
    ],
)
def test_bad_options_are_refused_before_any_work(argv, message, capsys, started, no_gpu):
    _refused(argv, message, capsys)
    assert started == []


def test_compare_refuses_a_file_of_the_first_format(tmp_path, capsys, started):
    old = tmp_path / "old.json"
    old.write_text('{"backend": "cpu (2 threads)", "results": [{"op": "permute", "ms": 1.0}]}')
    _refused(
        ["bench", "--compare", str(old)],
        r"argument --compare: .*old.json was written by an older moe-numba \(one time per "
        r"operation\); this bench reads format 2: run the bench again with --json",
        capsys,
    )
    assert started == []


def test_plot_needs_matplotlib(monkeypatch, capsys, started):
    find_spec = cli.importlib.util.find_spec
    monkeypatch.setattr(
        cli.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a),
    )
    message = r"argument --plot: needs matplotlib: pip install 'moe-numba\[bench\]'$"
    _refused(["bench", "--plot", "sweep.png"], message, capsys)
    assert started == []


def test_checked_options_reach_the_bench(tmp_path, started):
    old = tmp_path / "old.json"
    case = moe_numba.bench._cases.Case(16, 8, 4, 4, 2, "fp16")
    result = _results.Result(case, "permute", 100, {"wall": 1.0}, {"wall": 1.0})
    _results.save(old, "cpu", [result])
    argv = ["bench", "--backend=cpu", "--tokens=16", "--hidden=8", "--experts=4"]
    argv += ["--alignment=2", "--dtype=fp16", "--quick", f"--compare={old}"]
    assert cli.main(argv) == 0
    (settings,) = started
    assert settings.target.device == "cpu"
    assert settings.cases == [case]  # K: the default 8, at most E
    assert settings.repeat == 3  # --quick on the CPU
    assert settings.previous == (str(old), [result])
    assert cli.main(["bench", "--backend=cpu", "--sweep", "--repeat=2"]) == 0
    assert started[1].cases == moe_numba.bench._cases.sweep("cpu") and started[1].repeat == 2


def test_demo_topk_defaults_to_at_most_the_experts(started):
    assert cli.main(["demo", "--backend=cpu", "--experts=4"]) == 0
    assert started[0]["topk"] == 4 and started[0]["experts"] == 4
    assert cli.main(["demo", "--backend=cpu", "--topk=3"]) == 0
    assert started[1]["topk"] == 3 and started[1]["tokens"] == 4096


def test_the_module_exits_with_status_2():
    done = subprocess.run(
        [sys.executable, "-m", "moe_numba", "bench", "--tokens", "0"],
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


@pytest.mark.parametrize(
    ("argv", "label"),
    [
        (["bench", "--backend=cpu", "--tokens=1048576", "--experts=4096"], "bf16 T=1048576 "),
        (
            ["demo", "--backend=cpu", "--tokens=1048576", "--hidden=65536"],
            "the demo's workload T=1048576 H=65536 E=32 K=8",
        ),
    ],
)
def test_a_shape_beyond_memory_is_refused(argv, label, capsys, started):
    """Terabytes: more than any machine has, whatever /proc/meminfo says here."""
    message = (
        re.escape(label) + r".* needs about \d+\.\d GiB of host memory \(\d+ bytes, estimated\) "
        r"and \d+\.\d GiB are available \(.*\): choose a smaller shape$"
    )
    _refused(argv, message, capsys)
    assert started == []


def test_host_memory_is_compared_with_the_estimate(monkeypatch, capsys, started):
    from moe_numba.bench import _footprint

    case = moe_numba.bench._cases.Case(65536, 2048, 32, 8, 16, "bf16")
    need = _footprint.bench_need(case, "cpu").host
    monkeypatch.setattr(_footprint, "host_available", lambda: (need, "MemAvailable"))
    assert cli.main(["bench", "--backend=cpu", "--tokens=65536"]) == 0
    monkeypatch.setattr(_footprint, "host_available", lambda: (need - 1, "MemAvailable"))
    available = f"{(need - 1) / GiB:.1f} GiB are available \\(MemAvailable\\)"
    _refused(
        ["bench", "--backend=cpu", "--tokens=65536"], f"\\({need} bytes, .*{available}", capsys
    )
    assert len(started) == 1


def test_gpu_memory_is_compared_on_a_gpu(monkeypatch, capsys, started):
    from moe_numba.bench import _footprint

    class FakeGPU:
        device = "cuda"

    monkeypatch.setattr(cli, "_target", lambda parser, backend: FakeGPU())
    monkeypatch.setattr(_footprint, "device_available", lambda: 1 << 30)
    _refused(
        ["bench", "--tokens=65536"],
        r"^.*bf16 T=65536 H=7168 E=64 K=8 A=128 needs about \d+\.\d GiB of GPU memory "
        r"\(\d+ bytes, estimated\) and 1\.0 GiB are free on the GPU: choose a smaller shape$",
        capsys,
    )
    monkeypatch.setattr(_footprint, "device_available", lambda: None)  # no figure: no check
    assert cli.main(["bench", "--tokens=65536"]) == 0


def test_the_estimate_covers_the_arrays():
    """At least the rows in, the padded rows out (twice: the call kept for the combine and
    the timed one) and the combine's output."""
    from moe_numba.bench import _footprint

    case = moe_numba.bench._cases.Case(4096, 1024, 16, 4, 8, "fp32")
    row = 1024 * 4
    rows_out = 4096 * 4 + 16 * 7
    for device in ("cpu", "cuda"):
        need = _footprint.bench_need(case, device)
        arrays = need.host if device == "cpu" else need.device
        assert arrays >= (4096 + 2 * rows_out + 4096) * row
