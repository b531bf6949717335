"""The bench's arithmetic and reporting on synthetic results (CPU only, fast), its CUDA
plumbing with a fake timer on NumPy arrays, and one real CPU run at a tiny shape.

Speed itself is measured by running the bench, not by tests.
"""

import json
import re

import numpy as np
import pytest

from _benchmarks import figure, header
from _cases import assert_same_bits
from benchmarks import bench, cpu, cuda, numpy_baseline, records, report, timers
from benchmarks import bytes as _bytes
from benchmarks import cases as _cases
from benchmarks.cases import Case
from benchmarks.records import Result
from benchmarks.run import Settings, run
from benchmarks.target import CpuTarget
from moe_numba import moe_permute, oracle

TINY = dict(tokens=16, hidden=8, experts=4, topk=2, alignment=4)
TINY_ARGS = [f"--{k}={v}" for k, v in TINY.items()] + ["--repeat=1"]


# ------------------------------------------------------------------------------ byte accounting


@pytest.mark.parametrize("dtype", ["bf16", "fp32", "fp8"])
@pytest.mark.parametrize("alignment", [1, 4, 16])
def test_padded_rows_are_the_rows_a_permute_writes(dtype, alignment):
    case = Case(tokens=37, hidden=130, experts=5, topk=3, alignment=alignment, dtype=dtype)
    x = _cases.make_inputs(case)
    rows = moe_permute(x.hidden, x.scale, x.routemap, x.probs, 5, x.counts, alignment)[0]
    assert _bytes.padded_rows(x.counts, alignment) == rows.shape[0]
    assert sum(x.counts) == 37 * 3  # every slot routed: the unpermute reads T*K rows


def test_byte_formulas():
    counts = [5, 0, 3]  # padded to 4: 8 + 0 + 4 = 12 rows
    bf16 = Case(tokens=4, hidden=256, experts=3, topk=2, alignment=4, dtype="bf16")
    assert _bytes.padded_rows(counts, 4) == 12
    assert _bytes.permute_bytes(bf16, counts) == (4 + 12) * 256 * 2
    assert _bytes.unpermute_bytes(bf16) == (4 * 2 + 4) * 256 * 2
    # float8: one float32 scale per 128 columns (ceil), read with each row and written too
    fp8 = Case(tokens=4, hidden=300, experts=3, topk=2, alignment=4, dtype="fp8")
    assert fp8.scale_width == 3
    assert _bytes.permute_bytes(fp8, counts) == (4 + 12) * (300 + 3 * 4)
    assert not fp8.has_unpermute and bf16.has_unpermute


def test_case_refuses_more_slots_than_experts():
    with pytest.raises(ValueError, match=r"topk must be in \[1, experts = 4\].*got 5"):
        Case(tokens=4, hidden=8, experts=4, topk=5, alignment=1, dtype="bf16")
    with pytest.raises(ValueError, match=r"dtype must be one of .*got 'int8'"):
        Case(tokens=4, hidden=8, experts=4, topk=1, alignment=1, dtype="int8")


def test_numpy_baselines_follow_the_contract():
    case = Case(tokens=33, hidden=16, experts=6, topk=3, alignment=4, dtype="bf16")
    x = _cases.make_inputs(case, seed=3)
    expected, _ = oracle.permute(x.hidden, None, x.routemap, x.probs, 6, x.counts, 4)
    rows, rowmap, row_probs = numpy_baseline.permute(x.hidden, x.routemap, x.probs, x.counts, 4)
    assert_same_bits(rows, expected[0], "rows")
    assert_same_bits(rowmap, expected[1], "rowmap")
    assert_same_bits(row_probs, expected[2], "row probabilities")
    (combined, _), _ = oracle.unpermute(
        rows, rowmap, x.routemap, row_probs, 33, 6, using_weighted_combine=True
    )
    baseline = numpy_baseline.unpermute(rows, rowmap, x.routemap, row_probs)
    # rounded products summed in slot order, not the contract's fma in expert order
    np.testing.assert_allclose(
        baseline.astype(np.float32), combined.astype(np.float32), rtol=2**-7, atol=2**-7
    )


# ------------------------------------------------------------------------------ results, JSON


BF16 = Case(tokens=256, hidden=64, experts=8, topk=2, alignment=16, dtype="bf16")
FP8 = Case(tokens=256, hidden=64, experts=8, topk=2, alignment=16, dtype="fp8")


def _gpu_result(case, op, nbytes, gpu, copy_gpu, one_call=50.0, host=30.0):
    us = dict(gpu=gpu, one_call=one_call, host=host, host_busy=host - 10)
    copy_us = dict(gpu=copy_gpu, one_call=copy_gpu + 5, host=8.0, host_busy=6.0)
    return Result(case, op, nbytes, _figures(us), _figures(copy_us))


def _figures(medians):
    return {mode: figure(value) for mode, value in medians.items()}


def _gpu_results():
    return [
        _gpu_result(BF16, "permute", 2_000_000, 10.0, 8.0),
        _gpu_result(BF16, "permute validate=False", 2_000_000, 9.0, 8.0, one_call=40.0),
        _gpu_result(BF16, "unpermute weighted", 1_000_000, 5.0, 5.0),
        _gpu_result(FP8, "permute", 1_500_000, 6.0, 4.0),
    ]


def test_result_figures():
    r = _gpu_result(BF16, "permute", 2_000_000, gpu=10.0, copy_gpu=8.0)
    assert r.modes == ("gpu", "one_call", "host", "host_busy")
    assert r.gbps == pytest.approx(200.0)  # 2e6 bytes in 10 us
    assert r.copy_gbps == pytest.approx(250.0)
    assert r.percent == pytest.approx(80.0)
    cpu = Result(BF16, "permute", 3_000_000, _figures({"wall": 1000.0}), _figures({"wall": 500.0}))
    assert (cpu.gbps, cpu.percent) == (pytest.approx(3.0), pytest.approx(50.0))
    spread = Result(BF16, "permute", 2_000_000, {"gpu": figure(10.0, 5.0)}, {"gpu": figure(8.0)})
    assert spread.gbps == pytest.approx(200.0)  # from the median


def test_json_round_trip(tmp_path):
    path = tmp_path / "run.json"
    results = _gpu_results()
    records.save_results(path, header(), results)
    document = json.loads(path.read_text())
    assert document["format"] == records.FORMAT == 3
    assert document["device"]["name"] == "NVIDIA H100 80GB HBM3"
    first = document["rows"][0]
    assert first["key"] == f"{BF16.label()} | permute" and first["unit"] == "us"
    assert first["figures"]["gpu"] == {"min": 10.0, "median": 10.0, "max": 10.0, "n": 15}
    assert first["copy"]["gpu"]["median"] == 8.0 and first["percent"] == pytest.approx(80.0)
    record = records.load(path)
    assert record.header["backend"] == "cuda (torch arrays, numba.cuda kernels)"
    assert record.card == "NVIDIA H100 80GB HBM3"
    assert record.results() == results


# a record of the first version's JSON (one time per operation), as it wrote them
FIRST_FORMAT = dict(
    backend="cpu (2 threads)",
    results=[
        dict(
            tokens=4096, hidden=2048, experts=32, topk=8, alignment=16, dtype="bf16",
            op="permute", ms=5.92, gbps=25.7, roofline_gbps=25.5, percent=100.4,
            host_us=None, baseline_ms=48.1,
        )
    ],
)  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, r"cannot read .*run.json: No such file or directory$"),
        ("not json", r"run.json is not JSON: Expecting value"),
        ("[1, 2]", r"run.json is not a moe-numba benchmark record \(no 'rows'\)$"),
        (json.dumps(FIRST_FORMAT), r"run.json was written by an older moe-numba \(one time per "
         r"operation\); the benchmarks read records of format 3: run the benchmark again"),
        ('{"format": 2, "results": []}', r"written by an older moe-numba \(medians only, no "
         r"commit or device\); the benchmarks read records of format 3"),
        ('{"format": 4, "rows": []}', r"written by format 4; the benchmarks read records of"),
        ('{"format": 3, "rows": [{"key": "k", "figures": {"gpu": {"min": 1}}}]}',
         r"run.json: row 0 is malformed \(KeyError: 'median'\)$"),
        ('{"format": 3, "rows": [{"key": "k", "figures": {}}]}',
         r"run.json: row 0 is malformed \(no 'unit'\)$"),
        ('{"format": 3, "rows": []}', r"run.json: the record has no 'what'$"),
    ],
)  # fmt: skip
def test_load_refuses_what_it_cannot_read(tmp_path, text, message):
    path = tmp_path / "run.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=message):
        records.load(path)


# ------------------------------------------------------------------------------ table, compare


def test_table_of_gpu_results(capsys):
    report.print_table(_gpu_results())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["operation", "GPU", "us", "GB/s", "%", "copy", "1-call", "us"] + [
        "host",
        "us",
        "busy",
        "host",
        "us",
    ]
    body = [line.split() for line in lines[2:]]
    # a heading per case; the copy above the first result of each byte count, named after it
    assert body[0] == BF16.label().split()
    assert body[1] == ["copy", "for", "permute", "8.0", "250.0", "100.0%", "13.0", "8.0", "6.0"]
    assert body[2] == ["permute", "10.0", "200.0", "80.0%", "50.0", "30.0", "20.0"]
    assert body[3] == [
        *("permute", "validate=False", "9.0", "222.2", "88.9%", "40.0", "30.0", "20.0")
    ]
    # the columns line up under the header
    assert len({len(line) for line in lines[:2]} | {len(lines[3])}) == 1
    assert body[4][:4] == ["copy", "for", "unpermute", "weighted"] and body[5][0] == "unpermute"
    assert body[6] == FP8.label().split() and body[7][0] == "copy" and body[8][0] == "permute"
    assert len(body) == 9


def test_table_of_cpu_results(capsys):
    results = [
        Result(
            BF16,
            "permute",
            3_000_000,
            _figures({"wall": 1000.0}),
            _figures({"wall": 500.0}),
            numpy_us=figure(9000.0),
        )
    ]
    report.print_table(results)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["operation", "wall", "us", "GB/s", "%", "copy", "vs", "NumPy"]
    # what the CPU's "% copy" compares, said where it is printed (it can pass 100%)
    note = report.CPU_COPY_NOTE.splitlines()
    assert lines[2 : 2 + len(note)] == note and "can pass 100%" in note[-1]
    lines = lines[:2] + lines[2 + len(note) :]
    assert lines[3].split() == ["copy", "for", "permute", "500.0", "6.0", "100.0%"]
    assert lines[4].split() == ["permute", "1000.0", "3.0", "50.0%", "9.0x"]


def test_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the bench extra")
    from benchmarks.plot import plot

    results = [
        _gpu_result(Case(t, 64, 8, 2, 16, "bf16"), "permute", 1000 * t, t / 100, t / 120)
        for t in (256, 1024, 4096)
    ]
    plot(results, tmp_path / "sweep.png", "cuda (torch arrays)")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------ timers


class _FakeCuda:
    """Events that log what happens and report a fixed time per event pair."""

    def __init__(self, log, elapsed_ms):
        self.log = log
        self.elapsed_ms = elapsed_ms

    def event(self):
        log, elapsed_ms = self.log, self.elapsed_ms

        class Event:
            def record(self):
                log.append("record")

            def synchronize(self):
                log.append("wait")

            def elapsed_time(self, stop):
                return elapsed_ms

        return Event()

    def synchronize(self):
        self.log.append("sync")


class _FakeHold:
    def __init__(self, log):
        self.log = log
        self.timed_out = 0

    def start(self):
        self.log.append("hold")

    def release(self):
        self.log.append("release")

    def finished(self):
        self.log.append("finished")


def _timer(elapsed_ms=0.5, **kwargs):
    log = []
    timer = timers.CudaTimer(
        cuda=_FakeCuda(log, elapsed_ms), hold=_FakeHold(log), **dict(repeat=2, batch=3, **kwargs)
    )
    return timer, log


def test_gpu_mode_holds_the_stream_while_it_enqueues_a_batch():
    timer, log = _timer(elapsed_ms=0.6)
    assert timer.gpu_us(lambda: log.append("call")) == pytest.approx(200.0)  # 0.6 ms / 3
    one_batch = ["hold", "record", "call", "call", "call", "record", "release", "wait"]
    assert log == (one_batch + ["finished"]) * 2


def test_gpu_mode_of_a_synchronizing_call_runs_one_call_ahead_instead():
    timer, log = _timer()
    timer.gpu_us(lambda: log.append("call"), synchronizes=True)
    assert log == ["call", "record", "call", "call", "call", "record", "wait"] * 2


def test_one_call_mode_times_a_call_right_after_a_sync():
    timer, log = _timer(elapsed_ms=0.05)
    assert timer.one_call_us(lambda: log.append("call")) == pytest.approx(50.0)
    assert log == ["sync", "record", "call", "record", "wait"] * 6  # repeat * batch calls


def test_host_mode_times_the_call_on_an_idle_gpu():
    timer, log = _timer()
    assert timer.host_us(lambda: log.append("call")) > 0
    assert log == ["sync", "call"] * 6 + ["sync"]


def test_busy_host_mode_times_calls_enqueued_behind_a_held_stream():
    timer, log = _timer()
    assert timer.host_busy_us(lambda: log.append("call")) > 0
    assert log == ["hold", "call", "call", "call", "release", "sync", "finished"] * 2


def test_busy_host_mode_of_a_synchronizing_call_runs_back_to_back_without_the_hold():
    timer, log = _timer()
    assert timer.host_busy_us(lambda: log.append("call"), synchronizes=True) > 0
    assert log == ["call", "call", "call", "sync"] * 2


def test_timers_report_every_mode_after_warm_up():
    timer, log = _timer(warmup=4)
    figures = timer.time(lambda: log.append("call"))
    assert tuple(figures) == records.CUDA_MODES
    assert log[:4] == ["call"] * 4 and log[4] == "hold"
    calls = []
    wall = timers.WallTimer(repeat=3, warmup=2).time(lambda: calls.append(1))
    assert tuple(wall) == records.CPU_MODES and len(calls) == 5
    assert 0 < wall["wall"].min <= wall["wall"].median <= wall["wall"].max
    assert wall["wall"].n == 3


# ------------------------------------------------------------------------------ the benches


class _FixedTimer:
    """Every call takes 2 us in every mode; the copy 1 us. The hold timed out once."""

    def __init__(self):
        self.hold_timeouts = 0
        self.timed = []

    def time(self, fn, synchronizes=False):
        fn()
        self.hold_timeouts = 1
        self.timed.append(synchronizes)
        us = 1.0 if len(self.timed) in (1, 4) else 2.0  # the copies come first of each op
        return dict.fromkeys(records.CUDA_MODES, figure(us))


def test_cuda_bench_times_every_operation_against_a_copy(capsys):
    """The GPU bench's plumbing, on NumPy arrays (the timer and the arrays are the only
    GPU-specific parts): the operations, their bytes and copies, the hold warning."""
    case = Case(**TINY, dtype="bf16")
    timer = _FixedTimer()
    results = cuda.bench_case(case, CpuTarget(), timer)
    assert [r.op for r in results] == [
        "permute",
        "permute validate=False",
        "unpermute weighted",
        "unpermute weighted validate=False",
    ]
    x = _cases.make_inputs(case)
    moved = [_bytes.permute_bytes(case, x.counts)] * 2 + [_bytes.unpermute_bytes(case)] * 2
    assert [r.nbytes for r in results] == moved
    assert timer.timed == [False, True, False, False, True, False]  # copy, op, op, ...
    assert all(r.percent == pytest.approx(50.0) for r in results)
    assert "1 timed batch(es) took the host longer" in capsys.readouterr().err


def test_cpu_bench_prints_records_and_compares(tmp_path, capsys):
    path = tmp_path / "run.json"
    assert bench.main(["--backend=cpu", *TINY_ARGS, f"--json={path}"]) == 0
    captured = capsys.readouterr()
    assert "[1/1] bf16 T=16 H=8 E=4 K=2 A=4" in captured.err  # progress, as the shape starts
    assert "% copy" in captured.out and "bf16 T=16 H=8 E=4 K=2 A=4" in captured.out
    assert f"record: {path}" in captured.err
    record = records.load(path)
    assert record.header["backend"].startswith("cpu (NumPy arrays")
    assert record.header["what"] == "bench" and record.header["device"]["cores"] >= 1
    assert record.header["command"] == "python -m benchmarks bench --backend=cpu " + " ".join(
        [*TINY_ARGS, f"--json={path}"]
    )
    assert record.header["versions"]["moe_numba"]
    results = record.results()
    assert [r.op for r in results] == ["permute", "unpermute weighted"]
    for r in results:
        assert tuple(r.us) == tuple(r.copy_us) == ("wall",)
        assert r.us["wall"].n == 1 and r.numpy_us.n == 3  # --repeat=1; the baseline's floor
        assert r.us["wall"].median > 0 and r.copy_us["wall"].median > 0
    assert bench.main(["--backend=cpu", *TINY_ARGS, f"--compare={path}"]) == 0
    out = capsys.readouterr().out
    assert f"old: {path}: bench" in out and "new: this run" in out
    assert "only in" not in out
    assert re.search(r"^4 figures compared, \d+ more than 5% worse", out, flags=re.M), out


def test_a_run_prints_each_shape_as_it_finishes(monkeypatch, capsys):
    """A sweep prints a shape's rows before the next shape starts, the titles once."""
    cases = [Case(**TINY, dtype="bf16"), Case(**dict(TINY, tokens=32), dtype="bf16")]
    printed_before = []
    bench_case = cpu.bench_case

    def recording(case, target, timer):
        printed_before.append(capsys.readouterr().out)
        return bench_case(case, target, timer)

    monkeypatch.setattr(cpu, "bench_case", recording)
    assert run(Settings(CpuTarget(), cases, repeat=1)) == 0
    last = capsys.readouterr().out
    assert printed_before[0] == ""
    assert cases[0].label() in printed_before[1] and "operation" in printed_before[1]
    assert cases[1].label() in last and "operation" not in last


def test_each_operation_gets_its_copy_row_even_at_equal_bytes(capsys):
    """A permute and an unpermute that move the same bytes each have their copy row (the
    permute's options share it)."""
    report.print_table(
        [
            _gpu_result(BF16, "permute", 1_000_000, 10.0, 8.0),
            _gpu_result(BF16, "permute validate=False", 1_000_000, 9.0, 8.0),
            _gpu_result(BF16, "unpermute weighted", 1_000_000, 5.0, 8.0),
        ]
    )
    names = [" ".join(line.split()[:3]) for line in capsys.readouterr().out.splitlines()[3:]]
    assert names == [
        "copy for permute",
        "permute 10.0 100.0",
        "permute validate=False 9.0",
        "copy for unpermute",
        "unpermute weighted 5.0",
    ]
