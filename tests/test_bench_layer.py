"""The experts-layer benchmark (``python -m benchmarks layer``, and its decode steps,
``--decode``): its command line, its refusals without a CUDA GPU, what it prints and records
(the timing itself needs a GPU)."""

import re

import pytest

from _benchmarks import figure, header
from benchmarks import layer as _layer
from benchmarks import records, tables
from benchmarks.__main__ import main as command_line


def _options(argv):
    command = _layer.parser()
    return _layer.options(command, command.parse_args(argv))


def test_defaults_cover_every_model_size_and_implementation():
    args = _options([])
    assert args.models == list(_layer.MODELS) and not args.decode
    assert args.tokens == [16, 512, 4096, 16384]
    assert args.impls == ["moe_numba", "grouped_mm", "batched_mm", "eager"]


def test_selection():
    args = _options(
        ["--models", "gpt-oss-20b,deepseek-v3", "--tokens", "8,64", "--impls", "moe_numba"]
    )
    assert (args.models, args.tokens, args.impls) == (
        ["gpt-oss-20b", "deepseek-v3"],
        [8, 64],
        ["moe_numba"],
    )


def test_decode_defaults_to_small_steps_of_moe_numba_and_batched_mm():
    args = _options(["--decode"])
    assert args.decode and args.models == list(_layer.MODELS)
    assert args.tokens == [1, 4, 16, 64]
    assert args.impls == ["moe_numba", "batched_mm"]
    args = _options(["--decode", "--tokens", "2", "--impls", "grouped_mm,moe_numba"])
    assert (args.tokens, args.impls) == ([2], ["grouped_mm", "moe_numba"])


@pytest.mark.parametrize("impls", ["eager", "moe_numba,eager"])
def test_decode_refuses_what_a_graph_cannot_capture(impls, capsys):
    with pytest.raises(SystemExit, match="^2$"):
        _options(["--decode", "--impls", impls])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        "python -m benchmarks layer: error: argument --impls: eager reads the routing on the "
        "host, which a CUDA graph cannot capture: with --decode choose from moe_numba, "
        "grouped_mm, batched_mm"
    )
    assert _options(["--impls", impls]).impls == impls.split(",")  # without --decode: timed


def test_decode_without_a_gpu(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the benchmark would run")
    with pytest.raises(SystemExit, match="^2$"):
        command_line(["layer", "--decode", "--models", "mixtral-8x7b"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"python -m benchmarks layer: error: needs torch with a CUDA GPU; torch \S+ sees no "
        r"CUDA GPU",
        last,
    )


def _decode_row(impl="moe_numba", skipped=None):
    row = dict(key=f"qwen3-30b-a3b T=4 {impl}", model="qwen3-30b-a3b", T=4, unit="us", impl=impl)
    modes = dict(gpu=30.0, one_call=80.0, host=25.0, host_busy=20.0)
    figures = {f"graph {m}": figure(v).record() for m, v in modes.items()}
    figures.update({f"eager {m}": figure(v * 4).record() for m, v in modes.items()})
    return dict(
        row,
        figures={} if skipped else figures,
        skipped=skipped,
        graph_equals_eager=None if skipped else True,
    )


def test_decode_rows_printed_and_tabled(tmp_path):
    done, skipped = _decode_row(), _decode_row("batched_mm", "per-pair weight copies over 8 GiB")
    assert _layer.decode_cells(done) == [
        *("qwen3-30b-a3b", "4", "moe_numba", "30.0", "80.0", "25.0"),
        *("120.0", "320.0", "100.0", "yes"),
    ]
    assert _layer.decode_cells(skipped) == [
        "qwen3-30b-a3b",
        "4",
        "batched_mm",
        "skipped: per-pair weight copies over 8 GiB",
    ]
    path = tmp_path / "decode.json"
    records.save(path, header(what="decode"), [done, skipped])
    titles, rows = tables.layout_decode(records.load(path))
    assert titles[3:] == [
        *("graph GPU us", "graph 1-call us", "eager GPU us", "eager 1-call us"),
        "graph = eager",
    ]
    assert rows == [
        ["qwen3-30b-a3b", "4", "moe_numba", "30.0", "80.0", "120.0", "320.0", "yes"],
        ["qwen3-30b-a3b", "4", "batched_mm", "-", "-", "-", "-", "skipped"],
    ]


def test_capture_warms_up_on_a_side_stream_then_captures_once():
    """torch's protocol for a capture, on a stand-in for torch.cuda that logs each step."""
    import contextlib
    import types

    log = []

    class Stream:
        def __init__(self, name="side"):
            self.name = name

        def wait_stream(self, other):
            log.append(f"{self.name} waits for {other.name}")

    class Graph:
        pass

    @contextlib.contextmanager
    def on(stream):
        log.append(f"on {stream.name}")
        yield
        log.append(f"off {stream.name}")

    @contextlib.contextmanager
    def capturing(graph):
        log.append("capture")
        yield
        log.append("captured")

    main_stream = Stream("main")
    cuda = types.SimpleNamespace(
        Stream=Stream,
        current_stream=lambda: main_stream,
        stream=on,
        CUDAGraph=Graph,
        graph=capturing,
    )
    fake = types.SimpleNamespace(cuda=cuda)
    graph, out = _layer.capture(fake, lambda: log.append("step") or "y", warmup=2)
    assert isinstance(graph, Graph) and out == "y"
    assert log == [
        *("side waits for main", "on side", "step", "step", "off side"),
        *("main waits for side", "capture", "step", "captured"),
    ]
    log.clear()
    _layer.capture(fake, lambda: log.append("step"), warmup=0)
    assert log.count("step") == 2  # one warm-up call at least, then the captured one


def test_the_command_line_hands_every_option_to_the_layer_bench(capsys):
    with pytest.raises(SystemExit) as raised:
        command_line(["layer", "--help"])
    assert raised.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m benchmarks layer")
    assert "--models" in out and "--batched-limit-gib" in out and "--decode" in out


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
