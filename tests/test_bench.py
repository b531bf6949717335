"""``python -m moe_numba bench`` on tiny shapes: its table, JSON, comparison, and the byte
counts behind every figure (speed itself is measured by running it, not by tests)."""

import json

import numpy as np
import pytest

from moe_numba import _bench, moe_permute
from moe_numba.__main__ import main

TINY = dict(tokens=16, hidden=8, experts=4, topk=2, alignment=4)
TINY_ARGS = [f"--{k}={v}" for k, v in TINY.items()] + ["--repeat=1"]


def test_cpu_bench_prints_saves_and_compares(tmp_path, capsys):
    path = tmp_path / "run.json"
    assert main(["bench", "--backend=cpu", *TINY_ARGS, f"--json={path}"]) == 0
    table = capsys.readouterr().out
    assert "% copy" in table and "bf16 T=16 H=8 E=4 K=2 A=4" in table
    saved = json.loads(path.read_text())
    assert saved["backend"].startswith("cpu")
    assert [r["op"] for r in saved["results"]] == ["permute", "unpermute weighted"]
    for r in saved["results"]:
        assert r["ms"] > 0 and r["baseline_ms"] > 0
        assert r["percent"] == pytest.approx(100 * r["gbps"] / r["roofline_gbps"])
    assert main(["bench", "--backend=cpu", *TINY_ARGS, f"--compare={path}"]) == 0
    assert f"compared with {path}" in capsys.readouterr().out


class _FixedTimer:
    """Every call (the copy too) takes 1 ms and 10 us of host time; calls run once."""

    hold_timeouts = 0

    def __init__(self, repeat):
        pass

    def device_ms(self, fn, synchronizes=False, batch=10, warmup=3):
        fn()
        return 1.0

    def host_us(self, fn, calls=200):
        fn()
        return 10.0


def test_cuda_bench_case_counts_the_bytes(backend, monkeypatch):
    """Every operation, with and without validation; GB/s from the bytes of the contract."""
    if backend.name == "cpu":
        pytest.skip("needs a device backend")
    if backend.name == "cudasim":  # the simulator's events do not time anything
        monkeypatch.setattr(_bench, "_GPUTimer", _FixedTimer)
    case = _bench.Case(**TINY, dtype="bf16")
    results = _bench.bench_cuda_case(case, 1, backend.library)
    assert [r.op for r in results] == [
        "permute",
        "permute validate=False",
        "unpermute weighted",
        "unpermute weighted validate=False",
    ]
    hidden, scale, routemap, probs, counts = _bench.make_inputs(case)
    rows = moe_permute(hidden, scale, routemap, probs, case.experts, counts, case.alignment)[0]
    permute_bytes = 2 * (case.tokens + rows.shape[0]) * case.hidden
    unpermute_bytes = 2 * (int((routemap >= 0).sum()) + case.tokens) * case.hidden
    for r, moved in zip(results, [permute_bytes] * 2 + [unpermute_bytes] * 2, strict=True):
        assert r.gbps == pytest.approx(moved / r.ms / 1e6)
        assert r.host_us is not None  # small shapes report the host-inclusive time
    assert np.isfinite([r.percent for r in results]).all()
