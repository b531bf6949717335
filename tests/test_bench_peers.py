"""``python -m benchmarks bench --peers``: everything that runs without a GPU. Its options and
their checks, the refusal without a GPU, the cache folder (where it is, what ``fetch`` does
with pip's wheels, with a stand-in for pip), the plumbing of one case with peers that failed
to load, and the printed table of made-up results.

The peers' kernels themselves run only on a GPU: ``python -m benchmarks bench --peers``.
"""

import hashlib
import os
import sys
import types
import zipfile

import pytest

from _benchmarks import assert_refused, figure
from _torch_cases import to_torch, torch
from benchmarks import bench, records, report
from benchmarks import cases as _cases
from benchmarks import peers as _peers
from benchmarks.cases import Case
from benchmarks.options import torch_cuda_problem
from benchmarks.peer_gradients import bench_gradients
from benchmarks.peers import OURS, TE, VLLM, PeerBench, op_name
from benchmarks.records import Result


def _settings(argv):
    parser = bench.parser()
    return bench.settings(parser, parser.parse_args(argv))


def _refused(argv, message, capsys):
    assert_refused(lambda: _settings(argv), "python -m benchmarks bench", message, capsys)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """XDG_CACHE_HOME in a scratch folder: the default cache lies there."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


# ------------------------------------------------------------------------------ the options


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_refused_without_a_gpu(cache_home, capsys):
    _refused(
        ["--peers"],
        r"^python -m benchmarks bench: error: argument --peers: needs torch with a CUDA GPU; "
        r"torch \S+ sees no CUDA GPU$",
        capsys,
    )
    assert not cache_home.exists()  # refused before anything is downloaded


def test_refused_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as when torch is not installed
    assert torch_cuda_problem() == (
        "torch is not installed: pip install -e '.[gpu,torch]' in the moe-numba checkout (it is "
        "not on PyPI yet)"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--peers-cache=/tmp/x"], "argument --peers-cache: only with --peers"),
        (["--gradients"], "argument --gradients: only with --peers"),
        (["--peers", "--sweep"], r"argument --sweep: not allowed with --peers \(it has"),
        (
            ["--peers", "--backend=cpu"],
            "argument --backend: --peers times CUDA ops on torch tensors; got cpu",
        ),
    ],
)
def test_options_that_go_only_with_peers(argv, message, cache_home, capsys):
    _refused(argv, message, capsys)


def test_a_cache_that_is_a_file_is_refused(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("")
    _refused(
        ["--peers", f"--peers-cache={path}"],
        f"argument --peers-cache: {path} is a file; give a folder$",
        capsys,
    )


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """As on a machine with a GPU whose peers are in the cache already: the settings the
    bench would run with, from its options."""
    monkeypatch.setattr(_peers, "torch_cuda_problem", lambda: "")
    monkeypatch.setattr(_peers, "fetch", lambda cache: _peers.PeerFiles(cache))
    monkeypatch.setattr(_peers, "load", lambda files: {TE: "not here", VLLM: "not here"})
    return _settings


def test_peers_run_the_published_shapes_by_default(fake_gpu, cache_home, capsys):
    settings = fake_gpu(["--peers", "--gradients"])
    assert settings.target.library == "torch"
    assert settings.cases == list(_peers.CASES)
    assert settings.repeat == _cases.REPEATS["cuda", False]
    assert isinstance(settings.peers, PeerBench) and settings.peers.gradients
    assert "peers: TE FAILED to load: not here" in capsys.readouterr().err


def test_peers_at_one_shape(fake_gpu, cache_home):
    settings = fake_gpu(["--peers", "--tokens=256", "--alignment=1", "--quick"])
    default = _cases.defaults("cuda")
    assert settings.cases == [Case(**dict(default, tokens=256, alignment=1))]
    assert settings.repeat == _cases.REPEATS["cuda", True]
    assert not settings.peers.gradients


# ------------------------------------------------------------------------------ the cache


def test_default_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _peers.default_cache() == os.path.join(tmp_path, "moe-numba", "peers")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = os.path.join(tmp_path, "home", ".cache", "moe-numba", "peers")
    assert _peers.default_cache() == expected


def test_a_cache_inside_the_checkout_is_refused(tmp_path):
    checkout = tmp_path / "moe-numba"
    (checkout / "build").mkdir(parents=True)
    problem = _peers.cache_problem(checkout / "build" / "peers", checkout=checkout)
    assert problem.startswith(f"{checkout / 'build' / 'peers'} is inside the moe-numba checkout")
    assert "the peers' code must stay out of it" in problem
    assert _peers.cache_problem(tmp_path / "elsewhere", checkout=checkout) is None
    assert _peers.cache_problem(tmp_path / "moe-numba-cache", checkout=checkout) is None


def test_the_checkout_this_runs_from_is_found():
    root = _peers.source_checkout()
    if root is not None:  # a checkout (an installed wheel has none)
        assert os.path.exists(os.path.join(root, "pyproject.toml"))
        assert os.path.abspath(_peers.__file__).startswith(root + os.sep)


class FakePip:
    """Stands in for ``pip download``: writes a wheel holding ``members`` (path: bytes) of
    the package asked for into ``--dest``, or fails."""

    def __init__(self, wheels, fail=()):
        self.wheels = wheels
        self.fail = fail
        self.commands = []

    def __call__(self, command, check):
        self.commands.append(command)
        spec = command[-1]
        if spec in self.fail:
            return types.SimpleNamespace(returncode=1)
        dest = command[command.index("--dest") + 1]
        os.makedirs(dest, exist_ok=True)
        name = spec.replace("==", "-") + "-py3-none-any.whl"
        with zipfile.ZipFile(os.path.join(dest, name), "w") as wheel:
            for path, data in self.wheels[spec].items():
                wheel.writestr(path, data)
        return types.SimpleNamespace(returncode=0)


def _wheels(so=b"library"):
    te = {path: f"# {path}".encode() for path in _peers.TE_FILES}
    return {_peers.TE_SPEC: te, _peers.VLLM_SPEC: {_peers.VLLM_SO: so, "vllm/other.py": b""}}


def test_fetch_takes_what_it_needs_from_the_wheels_once(tmp_path, monkeypatch):
    monkeypatch.setattr(_peers, "VLLM_SO_SHA256", hashlib.sha256(b"library").hexdigest())
    pip = FakePip(_wheels())
    files = _peers.fetch(str(tmp_path / "cache"), run=pip)
    assert [c[-1] for c in pip.commands] == [_peers.TE_SPEC, _peers.VLLM_SPEC]
    assert pip.commands[1][-1 - len(_peers.VLLM_WHEEL) : -1] == list(_peers.VLLM_WHEEL)
    assert all("--no-deps" in c and "--only-binary=:all:" in c for c in pip.commands)
    for path in _peers.TE_FILES:
        with open(os.path.join(files.te, path)) as f:
            assert f.read() == f"# {path}"
    with open(files.vllm_so, "rb") as f:
        assert f.read() == b"library"
    with open(files.sources) as f:
        sources = f.read().splitlines()
    assert [line.split()[0] for line in sources] == [_peers.TE_SPEC, _peers.VLLM_SPEC]
    assert all(" sha256:" in line for line in sources)
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(
        ["SOURCES", os.path.basename(files.te), os.path.basename(os.path.dirname(files.vllm_so))]
    )  # the wheels and the scratch folder are gone
    _peers.fetch(str(tmp_path / "cache"), run=pip)
    assert len(pip.commands) == 2  # nothing downloaded again


def test_fetch_refuses_a_library_other_than_the_one_it_knows(tmp_path):
    pip = FakePip(_wheels(so=b"something else"))
    with pytest.raises(RuntimeError, match=r"_moe_C_stable_libtorch\.abi3\.so of .* has sha256"):
        _peers.fetch(str(tmp_path / "cache"), run=pip)
    files = _peers.PeerFiles(str(tmp_path / "cache"))
    assert files.te_present() and not files.vllm_present()  # TE's part is kept
    assert not [f for f in os.listdir(tmp_path / "cache") if f.startswith(".download-")]


def test_fetch_says_when_pip_fails(tmp_path):
    pip = FakePip(_wheels(), fail=[_peers.TE_SPEC])
    with pytest.raises(RuntimeError, match=r"pip could not download transformer_engine==2\.20\.2"):
        _peers.fetch(str(tmp_path / "cache"), run=pip)


# ------------------------------------------------------------------------------ one case


class _TorchCpuTarget:
    """Torch CPU tensors and a host copy: enough to run the plumbing of one case."""

    description = "test"
    device = "cpu"

    @staticmethod
    def upload(x):
        return None if x is None else to_torch(x, "cpu")

    @staticmethod
    def copier(nbytes):
        source = torch.zeros(-(-nbytes // 2), dtype=torch.uint8)
        target = torch.empty_like(source)
        return lambda: target.copy_(source)


class _Timer:
    hold_timeouts = 0

    def time(self, fn, synchronizes=False):
        fn()
        return dict.fromkeys(records.CUDA_MODES, figure(2.0))


def test_one_case_with_peers_that_did_not_load():
    """moe-numba's ops are timed; each peer that failed to load is a note, not a crash."""
    case = Case(tokens=16, hidden=8, experts=4, topk=2, alignment=4, dtype="bf16")
    peers = {TE: "ImportError: no triton", VLLM: "OSError: no libcuda"}
    bench = PeerBench(peers, gradients=bench_gradients)
    results = bench.bench_case(case, _TorchCpuTarget(), _Timer())
    assert [r.op for r in results] == [
        op_name("permute", OURS),
        op_name("unpermute weighted", OURS),
    ]
    assert [line for _, line in bench.notes] == [
        "TE FAILED: RuntimeError: ImportError: no triton",
        "vLLM FAILED: RuntimeError: OSError: no libcuda",
        "gradients beside TE FAILED: RuntimeError: ImportError: no triton",
    ]
    assert bench.status() == 0


# ------------------------------------------------------------------------------ the table


def _result(op, nbytes, gpu):
    case = _peers.CASES[0]
    figures = dict(gpu=gpu, one_call=gpu + 10, host=30.0, host_busy=20.0)
    copy = dict(gpu=500.0, one_call=510.0, host=9.0, host_busy=8.0)
    return Result(
        case,
        op,
        nbytes,
        {m: figure(v) for m, v in figures.items()},
        {m: figure(v) for m, v in copy.items()},
    )


def test_table_of_peer_results(capsys):
    results = [
        _result(op_name("permute", OURS), 2_000_000_000, 590.0),
        _result(op_name("permute", TE), 2_000_000_000, 1236.0),
        _result(op_name("permute", VLLM), 1_900_000_000, 941.0),
    ]
    bench = PeerBench({})
    bench.notes = [
        (_peers.CASES[0], "check permute, TE: identical"),
        (_peers.CASES[0], "check permute, vLLM: DIFFERENT"),
        (_peers.CASES[1], "check permute, TE: identical"),
    ]
    report.print_table(results)
    bench.print_notes(_peers.CASES[0])
    lines = capsys.readouterr().out.splitlines()
    body = [line.split() for line in lines[2:]]
    assert body[0] == _peers.CASES[0].label().split()
    # each copy row names the op whose bytes it moves; TE's permute moves moe-numba's bytes
    assert body[1][:5] == ["copy", "for", "permute,", "moe-numba", "500.0"]
    assert body[2][:3] == ["permute,", "moe-numba", "590.0"]
    assert body[3][:3] == ["permute,", "TE", "1236.0"]
    assert body[4][:5] == ["copy", "for", "permute,", "vLLM", "500.0"]
    assert body[5][:3] == ["permute,", "vLLM", "941.0"]
    assert lines[-2:] == ["  check permute, TE: identical", "  check permute, vLLM: DIFFERENT"]
    assert bench.status() == 1
