"""The experts-layer benchmark (``python -m benchmarks layer``): its command line and its
refusal to run without a CUDA GPU (the timing itself needs one)."""

import pytest

from benchmarks import layer as _layer
from benchmarks.__main__ import main as command_line


def test_defaults_cover_every_model_size_and_implementation():
    args = _layer.parser().parse_args([])
    assert args.models == list(_layer.MODELS)
    assert args.tokens == [16, 512, 4096, 16384]
    assert args.impls == ["moe_numba", "grouped_mm", "batched_mm", "eager"]


def test_selection():
    args = _layer.parser().parse_args(
        ["--models", "gpt-oss-20b,deepseek-v3", "--tokens", "8,64", "--impls", "moe_numba"]
    )
    assert (args.models, args.tokens, args.impls) == (
        ["gpt-oss-20b", "deepseek-v3"],
        [8, 64],
        ["moe_numba"],
    )


def test_the_command_line_hands_every_option_to_the_layer_bench(capsys):
    with pytest.raises(SystemExit) as raised:
        command_line(["layer", "--help"])
    assert raised.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m benchmarks layer")
    assert "--models" in out and "--batched-limit-gib" in out


def test_the_permute_and_unpermute_are_timed_beside_a_copy_of_their_bytes(monkeypatch):
    """The copy moves what the layer's permute and unpermute move (benchmarks/bytes.py):
    (T + TK) + (TK + T) rows forward, 4T + 5TK with backward (the layer's buffer is
    unpadded); the timed call runs both ops, and their backward when a gradient is given."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import types

    from benchmarks import target as _target
    from benchmarks import timers as _timers
    from moe_numba import transformers as backend

    copies, runs = [], []

    class Timer:
        def __init__(self, *args, **kwargs):
            pass

        def gpu_samples(self, fn):
            runs.append(fn)
            fn()
            return [float(len(runs))]

    class Target:
        def __init__(self, library):
            assert library == "torch"

        def copier(self, nbytes):
            copies.append(nbytes)
            return lambda: None

    monkeypatch.setattr(_timers, "CudaTimer", Timer)
    monkeypatch.setattr(_target, "CudaTarget", Target)
    T, H, E, K = 16, 64, 8, 2
    x = torch.randn(T, H, dtype=torch.bfloat16)
    weights, index = torch.topk(torch.randn(T, E).softmax(-1), K, dim=-1)
    args = types.SimpleNamespace(iters=1, warmup=0)
    ops, copy = _layer._against_copy(torch, backend, x, index, weights, E, None, args)
    assert (ops["median"], copy["median"]) == (1.0, 2.0) and ops["n"] == copy["n"] == 1
    grad = torch.randn(T, H, dtype=torch.bfloat16)
    permuted_rows = []
    real = backend.permute_routes

    def permute_routes(rows, *rest):
        permuted_rows.append(rows)
        return real(rows, *rest)

    monkeypatch.setattr(backend, "permute_routes", permute_routes)
    _layer._against_copy(torch, backend, x, index, weights, E, grad, args)
    rows = 2 * (T + T * K), 4 * T + 5 * T * K
    assert copies == [n * H * 2 for n in rows]
    # every timed call's rows got their gradient: the backward ran
    assert permuted_rows and all(r.grad is not None for r in permuted_rows)
