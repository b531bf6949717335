"""The experts-layer benchmark (``python -m moe_numba layer``): its command line and its
refusal to run without a CUDA GPU (the timing itself needs one)."""

import pytest

from moe_numba.__main__ import main as command_line
from moe_numba.bench import _layer


def test_defaults_cover_every_model_size_and_implementation():
    args = _layer.parse_args([])
    assert args.models == list(_layer.MODELS)
    assert args.tokens == [16, 512, 4096, 16384]
    assert args.impls == ["moe_numba", "grouped_mm", "batched_mm", "eager"]


def test_selection():
    args = _layer.parse_args(
        ["--models", "gpt-oss-20b,deepseek-v3", "--tokens", "8,64", "--impls", "moe_numba"]
    )
    assert (args.models, args.tokens, args.impls) == (
        ["gpt-oss-20b", "deepseek-v3"],
        [8, 64],
        ["moe_numba"],
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", "llama"], "--models: expected a comma-separated list of qwen3-30b-a3b"),
        (["--tokens", "0,16"], "--tokens: expected a comma-separated list of positive ints"),
        (["--tokens", "a"], "got 'a'"),
        (["--impls", "sdpa"], "--impls: expected a comma-separated list of moe_numba"),
        (["--iters", "0"], "--iters >= 1 and --warmup >= 0 expected, got 0, 3"),
    ],
)
def test_bad_arguments_name_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as raised:
        _layer.parse_args(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_refuses_without_a_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the benchmark would run")
    with pytest.raises(SystemExit, match="needs a CUDA GPU: torch.cuda.is_available"):
        _layer.main(["--models", "mixtral-8x7b", "--tokens", "16"])


def test_the_command_line_hands_every_option_to_the_layer_bench(capsys):
    with pytest.raises(SystemExit) as raised:
        command_line(["layer", "--help"])
    assert raised.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m moe_numba layer")
    assert "--models" in out and "--batched-limit-gib" in out
    with pytest.raises(SystemExit) as raised:
        command_line(["layer", "--tokens", "0"])
    assert raised.value.code == 2
    assert "--tokens: expected a comma-separated list of positive ints" in capsys.readouterr().err


def test_the_command_line_lists_the_layer_bench(capsys):
    with pytest.raises(SystemExit):
        command_line(["--help"])
    assert "layer" in capsys.readouterr().out
