"""Every command of ``python -m benchmarks`` refuses a bad option before it starts any work or
process: an argparse error that names the option (exit status 2), never a traceback or a
hang. (The bench's own options: tests/test_bench_cli.py.)"""

import re
import sys

import pytest

from _benchmarks import BOUNDS, assert_refused, run_module
from benchmarks import distributed, gradients
from benchmarks.__main__ import main
from benchmarks.target import NoGPUError

torch = pytest.importorskip("torch")  # distributed, memory and layer are torch benchmarks


def _refused(argv, message, capsys):
    """``python -m benchmarks ARGV`` must exit with status 2, ``message`` (a regex) last."""
    assert_refused(lambda: main(argv), f"python -m benchmarks {argv[0]}", message, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        *BOUNDS,
        (["--ranks", "0"], r"argument --ranks: must be from 1 to 64; got 0$"),
        (["--ranks", "-1"], r"argument --ranks: must be from 1 to 64; got -1$"),
        (
            ["--ranks", "2", "--experts", "3"],
            r"argument --experts: must be a multiple of the number of ranks \(--ranks 2\): "
            r"each rank owns experts / ranks of them; got 3$",
        ),
        (["--experts", "3"], r"\(the default --ranks 2\).*got 3$"),
        (["--steps", "0"], r"argument --steps: must be from 1 to 1000; got 0$"),
        (["--warmup", "-1"], r"argument --warmup: must be from 0 to 1000; got -1$"),
        (["--alignment", "0"], r"argument --alignment: must be from 1 to 4096; got 0$"),
        (["--dtype", "float16"], r"argument --dtype: invalid choice: 'float16'"),
    ],
)
def test_distributed(argv, message, capsys):
    _refused(["distributed", *argv], message, capsys)


def test_distributed_under_torchrun_takes_its_processes():
    """Under torchrun the group is torchrun's: --ranks is refused, and the experts must
    divide among its processes."""
    command = distributed.parser()
    with pytest.raises(SystemExit, match="^2$"):
        distributed.settings(command, command.parse_args(["--ranks", "2"]), world=(0, 2, 2))
    with pytest.raises(SystemExit, match="^2$"):
        distributed.settings(command, command.parse_args(["--experts", "6"]), world=(0, 4, 4))
    ranks, options = distributed.settings(command, command.parse_args([]), world=(1, 4, 2))
    assert ranks == 4 and options["experts"] == 16


def test_distributed_refusals_name_the_option_under_torchrun(capsys):
    command = distributed.parser()
    with pytest.raises(SystemExit):
        distributed.settings(command, command.parse_args(["--experts", "6"]), world=(0, 4, 4))
    assert "(torchrun's 4 processes)" in capsys.readouterr().err


def test_torchrun_is_found_in_the_environment():
    assert distributed.torchrun_world({}) is None
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    assert distributed.torchrun_world(env) == (3, 8, 4)
    assert distributed.torchrun_world({"RANK": "0", "WORLD_SIZE": "2"}) == (0, 2, 2)


def test_distributed_defaults_are_a_valid_run():
    command = distributed.parser()
    ranks, options = distributed.settings(command, command.parse_args([]))
    assert ranks == 2
    assert options == dict(
        tokens=4096,
        hidden=1024,
        experts=16,
        topk=4,
        alignment=1,
        dtype=torch.bfloat16,
        steps=5,
        warmup=2,
    )


@pytest.mark.parametrize(
    "argv", [["--ranks", "0"], ["--steps", "0"], ["--topk", "9", "--experts", "4"]]
)
def test_distributed_refuses_in_a_fresh_interpreter_at_once(argv):
    """The refusals that used to hang (``--ranks 0``) or end in the workers' tracebacks:
    exit status 2 from the parent, no traceback, no worker."""
    done = run_module("distributed", *argv)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert f"argument {argv[0]}:" in done.stderr.splitlines()[-1]


def no_gpu(backend):
    raise NoGPUError("no usable GPU: none of torch, CuPy, numba.cuda sees one")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        *BOUNDS,
        (["--alignment", "0"], r"argument --alignment: must be from 1 to 4096; got 0$"),
        (["--repeat", "0"], r"argument --repeat: must be from 1 to 1000; got 0$"),
        (["--dtype", "fp8"], r"argument --dtype: invalid choice: 'fp8'"),
        (["--json", "no/such/folder/x.json"], r"argument --json: cannot write no/such/folder"),
        ([], r"needs a CUDA GPU: no usable GPU: none of torch, CuPy, numba.cuda sees one$"),
    ],
)
def test_gradients(argv, message, capsys):
    command = gradients.parser()

    def check():
        gradients.settings(command, command.parse_args(argv), choose=no_gpu)

    assert_refused(check, "python -m benchmarks gradients", message, capsys)


def test_gradients_refuse_a_shape_beyond_memory(capsys):
    """Terabytes: more than any machine has, whatever /proc/meminfo says here."""
    from benchmarks.target import CpuTarget

    command = gradients.parser()
    args = command.parse_args(["--tokens", "1048576", "--hidden", "65536"])
    with pytest.raises(SystemExit, match="^2$"):
        gradients.settings(command, args, choose=lambda backend: CpuTarget())
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(r"bf16 T=1048576 H=65536 .* needs about \d+\.\d GiB of host memory", last)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        *BOUNDS,
        (["--alignment", "0"], r"argument --alignment: must be from 1 to 4096; got 0$"),
        (["--json", "."], r"argument --json: \. is a folder; give a file name$"),
    ],
)
def test_memory(argv, message, capsys):
    _refused(["memory", *argv], message, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", "llama"], r"argument --models: expected a comma-separated list of qwen3"),
        (["--tokens", "0,16"], r"argument --tokens: expected a comma-separated list of integers"),
        (["--tokens", "a"], r"argument --tokens: .*; got 'a'$"),
        (["--tokens", "2000000"], r"argument --tokens: .* from 1 to 1048576; got '2000000'$"),
        (["--impls", "sdpa"], r"argument --impls: expected a comma-separated list of moe_numba"),
        (["--iters", "0"], r"argument --iters: must be from 1 to 1000; got 0$"),
        (["--warmup", "-1"], r"argument --warmup: must be from 0 to 1000; got -1$"),
        (["--batched-limit-gib", "0"], r"argument --batched-limit-gib: expected a positive"),
        (["--batched-limit-gib", "nan"], r"argument --batched-limit-gib: .*; got 'nan'$"),
        (["--json", "."], r"argument --json: \. is a folder; give a file name$"),
    ],
)
def test_layer(argv, message, capsys):
    _refused(["layer", *argv], message, capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
@pytest.mark.parametrize("command", ["memory", "layer"])
def test_without_a_gpu(command, capsys):
    _refused([command], r"needs torch with a CUDA GPU; torch \S+ sees no CUDA GPU$", capsys)


def test_a_command_whose_dependency_is_missing(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "benchmarks.distributed")
    monkeypatch.setitem(sys.modules, "torch", None)  # as when torch is not installed
    with pytest.raises(SystemExit, match="^2$"):
        main(["distributed", "--ranks", "2"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        "python -m benchmarks: error: argument COMMAND: distributed needs torch, which is not "
        "installed"
    )
