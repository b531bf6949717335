"""``python -m benchmarks``: the commands it lists, and the bench's options, each checked
before any work (a bad one is an argparse error that names it, exit status 2)."""

import fnmatch
import re
import sys
from pathlib import Path

import pytest

from _benchmarks import BOUNDS, assert_refused, figure, header, run_module
from benchmarks import bench, cases, footprint, records
from benchmarks.__main__ import COMMANDS
from benchmarks.__main__ import main as benchmarks_main
from benchmarks.cases import Case
from benchmarks.environment import cpu_name
from benchmarks.records import Result
from benchmarks.target import CpuTarget, NoGPUError

ROOT = Path(__file__).resolve().parent.parent


def no_gpu(backend):
    """A target chooser as on a machine where no array library sees a GPU."""
    if backend == "cuda":
        raise NoGPUError("no usable GPU: none of torch, CuPy, numba.cuda sees one")
    return CpuTarget()


def _settings(argv, choose=no_gpu):
    parser = bench.parser()
    return bench.settings(parser, parser.parse_args(argv), choose)


def _refused(argv, message, capsys, choose=no_gpu):
    """Check the bench's options; it must exit with status 2 and ``message`` (a regex) last."""
    assert_refused(lambda: _settings(argv, choose), "python -m benchmarks bench", message, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        *BOUNDS,
        (["--repeat", "0"], r"argument --repeat: must be from 1 to 1000; got 0$"),
        (["--experts", "5000"], r"argument --experts: must be from 1 to 4096; got 5000"),
        (["--alignment", "0"], r"argument --alignment: must be from 1 to 4096; got 0"),
        (["--topk", "0"], r"argument --topk: must be from 1 to 4096; got 0$"),
        (
            ["--backend", "cpu", "--experts", "4", "--topk", "5"],
            r"argument --topk: must be at most the number of experts \(--experts 4\).*got 5$",
        ),
        (
            ["--backend", "cpu", "--topk", "40"],
            r"argument --topk: .* \(the default --experts 32\): .*got 40$",
        ),
        (
            ["--sweep", "--tokens", "256"],
            r"argument --tokens: not allowed with --sweep \(the sweep has its own shapes\)$",
        ),
        (["--sweep", "--dtype", "fp8"], r"argument --dtype: not allowed with --sweep"),
        (
            ["--compare", "missing.json"],
            r"argument --compare: cannot read missing.json: No such file or directory$",
        ),
        (
            ["--json", "no/such/folder/run.json"],
            r"argument --json: cannot write no/such/folder/run.json: folder .* does not exist$",
        ),
        (["--json", "."], r"argument --json: \. is a folder; give a file name$"),
        (["--backend", "gpu"], r"argument --backend: invalid choice: 'gpu'"),
        (
            ["--backend", "cuda"],
            r"argument --backend: cuda: no usable GPU: none of torch, CuPy, numba.cuda sees one$",
        ),
    ],
)
def test_bad_options_are_refused_before_any_work(argv, message, capsys):
    _refused(argv, message, capsys)


def test_compare_refuses_a_file_of_the_first_format(tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text('{"backend": "cpu (2 threads)", "results": [{"op": "permute", "ms": 1.0}]}')
    _refused(
        ["--compare", str(old)],
        r"argument --compare: .*old.json was written by an older moe-numba \(one time per "
        r"operation\); the benchmarks read records of format 3: run the benchmark again",
        capsys,
    )


def test_compare_refuses_a_record_of_another_card(tmp_path, capsys):
    old = tmp_path / "old.json"
    one = {"wall": figure(1.0)}
    result = Result(Case(16, 8, 4, 4, 2, "fp16"), "permute", 100, one, one)
    records.save_results(old, header(card="NVIDIA H200"), [result])
    _refused(
        ["--backend=cpu", "--compare", str(old)],
        rf"argument --compare: {re.escape(str(old))} was made on NVIDIA H200, this run on "
        r".*: compare records of one card$",
        capsys,
    )


def test_plot_needs_matplotlib(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as when it is not installed
    message = r"argument --plot: needs matplotlib: pip install -e '.\[bench\]' in the moe-numba"
    _refused(["--plot", "sweep.png"], message, capsys)


def test_checked_options_reach_the_bench(tmp_path):
    old = tmp_path / "old.json"
    case = Case(16, 8, 4, 4, 2, "fp16")
    result = Result(case, "permute", 100, {"wall": figure(1.0)}, {"wall": figure(1.0)})
    records.save_results(old, header(card=cpu_name()), [result])
    argv = ["--backend=cpu", "--tokens=16", "--hidden=8", "--experts=4"]
    argv += ["--alignment=2", "--dtype=fp16", "--quick", f"--compare={old}"]
    settings = _settings(argv)
    assert settings.target.device == "cpu"
    assert settings.cases == [case]  # K: the default 8, at most E
    assert settings.repeat == 3  # --quick on the CPU
    assert settings.previous.path == str(old) and settings.previous.results() == [result]
    assert settings.what == "bench"
    swept = _settings(["--backend=cpu", "--sweep", "--repeat=2"])
    assert swept.cases == cases.sweep("cpu") and swept.repeat == 2 and swept.what == "sweep"


GiB = 1 << 30


def test_a_shape_beyond_memory_is_refused(capsys):
    """Terabytes: more than any machine has, whatever /proc/meminfo says here."""
    message = (
        re.escape("bf16 T=1048576 ")
        + r".* needs about \d+\.\d GiB of host memory \(\d+ bytes, estimated\) "
        r"and \d+\.\d GiB are available \(.*\): choose a smaller shape$"
    )
    _refused(["--backend=cpu", "--tokens=1048576", "--experts=4096"], message, capsys)


def test_the_estimate_covers_the_arrays():
    """At least the rows in, the padded rows out (twice: the call kept for the combine and
    the timed one) and the combine's output."""
    case = Case(4096, 1024, 16, 4, 8, "fp32")
    row = 1024 * 4
    rows_out = 4096 * 4 + 16 * 7
    for device in ("cpu", "cuda"):
        need = footprint.bench_need(case, device)
        arrays = need.host if device == "cpu" else need.device
        assert arrays >= (4096 + 2 * rows_out + 4096) * row


# ------------------------------------------------------------------------------ the commands


def test_every_command_is_listed(capsys):
    with pytest.raises(SystemExit, match="^0$"):
        benchmarks_main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m benchmarks [-h] COMMAND")
    assert re.findall(r"^    (\w+)(?: |$)", out, flags=re.M) == list(COMMANDS)


def test_each_command_has_its_own_help(capsys):
    for name in COMMANDS:
        with pytest.raises(SystemExit, match="^0$"):
            benchmarks_main([name, "--help"])
        assert capsys.readouterr().out.startswith(f"usage: python -m benchmarks {name}")


def test_an_unknown_command_is_refused(capsys):
    with pytest.raises(SystemExit, match="^2$"):
        benchmarks_main(["demo"])
    assert "argument COMMAND: invalid choice: 'demo'" in capsys.readouterr().err


def test_the_module_exits_with_status_2():
    done = run_module("bench", "--tokens", "0")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith("argument --tokens: must be from 1 to 1048576; got 0")
    assert "Traceback" not in done.stderr


def test_the_benchmarks_are_in_no_wheel():
    """pyproject's package list (setuptools matches each package's dotted name against its
    patterns, as fnmatch does) takes moe_numba and moe_cpu, never the benchmarks."""
    tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml (Python 3.11+)")
    with open(ROOT / "pyproject.toml", "rb") as f:
        include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    assert (ROOT / "benchmarks" / "__init__.py").is_file()  # a package: only the list keeps it out
    for name in ("benchmarks", "benchmarks.records"):
        assert not any(fnmatch.fnmatchcase(name, pattern) for pattern in include), name
    for name in ("moe_numba", "moe_numba.torch", "moe_cpu"):
        assert any(fnmatch.fnmatchcase(name, pattern) for pattern in include), name
