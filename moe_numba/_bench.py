"""``python -m moe_numba bench``: effective bandwidth against a copy of the same bytes.

Bytes a call must move (DESIGN.md): permute reads ``T*H`` and writes ``R*H`` elements (plus
the scale rows); the unpermute reads the routed rows and writes ``T*H``. A copy of half that
many bytes (it reads and writes them) measured in the same run is the roofline. Times are
medians after warm-up: on the GPU, CUDA events around batches of back-to-back calls (per
call), plus, for small shapes, the wall time per call including all host work.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import ml_dtypes
import numpy as np

from . import moe_permute, moe_unpermute

DTYPES = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
    "fp8": np.dtype(ml_dtypes.float8_e4m3fn),
}


@dataclass(frozen=True)
class Case:
    """One benchmark shape."""

    tokens: int
    hidden: int
    experts: int
    topk: int
    alignment: int
    dtype: str

    def label(self):
        return (
            f"{self.dtype} T={self.tokens} H={self.hidden} E={self.experts} "
            f"K={self.topk} A={self.alignment}"
        )


@dataclass
class Result:
    """One timed operation of one case."""

    case: Case
    op: str
    ms: float  # median device (or CPU) time per call
    gbps: float
    roofline_gbps: float
    host_us: float | None = None  # median wall time per call, back to back, host work included
    baseline_ms: float | None = None  # vectorised NumPy, on the CPU

    @property
    def percent(self):
        return 100.0 * self.gbps / self.roofline_gbps

    def key(self):
        return (self.op, *asdict(self.case).values())


def add_bench_arguments(parser):
    """Options of the ``bench`` command."""
    parser.add_argument(
        "--backend",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="cpu: NumPy arrays; cuda: torch (else CuPy, else numba) arrays; "
        "auto: cuda when a GPU is usable (default)",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="run the standard sweep over T, H, E, K and dtypes instead of one shape",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions and a shorter sweep"
    )
    parser.add_argument("--tokens", type=int, help="tokens T (one-shape mode)")
    parser.add_argument("--hidden", type=int, help="hidden width H")
    parser.add_argument("--experts", type=int, help="experts E")
    parser.add_argument("--topk", type=int, help="experts per token K")
    parser.add_argument("--alignment", type=int, help="padding alignment A (rows)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="row dtype")
    parser.add_argument("--repeat", type=int, help="timed repetitions per measurement")
    parser.add_argument("--json", metavar="FILE", help="save the results as JSON")
    parser.add_argument(
        "--compare",
        metavar="OLD.json",
        help="print each result's speed relative to an earlier --json file",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="plot %% of the copy roofline against T (needs matplotlib)",
    )


def _one_case(args, defaults):
    values = {name: getattr(args, name) for name in defaults}
    return Case(**{k: v if v is not None else defaults[k] for k, v in values.items()})


def cpu_cases(args):
    """The CPU bar shape, or the sweep."""
    default = dict(tokens=4096, hidden=2048, experts=32, topk=8, alignment=16, dtype="bf16")
    if not args.sweep:
        return [_one_case(args, default)]
    tokens = [256, 1024, 4096] if args.quick else [256, 1024, 4096, 16384]
    return (
        [Case(t, 2048, 32, 8, 16, "bf16") for t in tokens]
        + [Case(4096, 2048, e, 8, 16, "bf16") for e in (8, 256)]
        + [Case(4096, 2048, 32, 8, 16, d) for d in ("fp32", "fp8")]
    )


def cuda_cases(args):
    """The H200 bar shapes, or the sweep."""
    default = dict(tokens=16384, hidden=7168, experts=64, topk=8, alignment=128, dtype="bf16")
    if not args.sweep:
        return [_one_case(args, default)]
    tokens = [256, 4096, 16384] if args.quick else [256, 1024, 4096, 16384, 32768]
    return (
        [Case(t, 7168, 64, 8, 128, "bf16") for t in tokens]
        + [Case(16384, 7168, 64, 8, 128, d) for d in ("fp8", "fp16")]
        + [Case(4096, 7168, e, 8, 128, "bf16") for e in (8, 256, 1024)]
        + [Case(4096, 4096, 64, k, 128, "bf16") for k in (2, 16)]
    )


def make_inputs(case, seed=0):
    """Random rows, per-token float32 scales for fp8, distinct experts per token."""
    rng = np.random.default_rng(seed)
    dtype = DTYPES[case.dtype]
    hidden = rng.standard_normal((case.tokens, case.hidden), dtype=np.float32).astype(dtype)
    scale = None
    if dtype.itemsize == 1:
        scale = rng.random((case.tokens, -(-case.hidden // 128)), dtype=np.float32)
    scores = rng.random((case.tokens, case.experts), dtype=np.float32)
    topk = min(case.topk, case.experts)
    routemap = np.argpartition(scores, topk - 1, axis=1)[:, :topk].astype(np.int32)
    probs = rng.random(routemap.shape, dtype=np.float32)
    counts = np.bincount(routemap.reshape(-1), minlength=case.experts).tolist()
    return hidden, scale, routemap, probs, counts


def permute_bytes(case, rows, scale_width):
    itemsize = DTYPES[case.dtype].itemsize
    moved = (case.tokens + rows) * case.hidden * itemsize
    return moved + (case.tokens + rows) * scale_width * 4


def unpermute_bytes(case, routed_rows):
    return (routed_rows + case.tokens) * case.hidden * DTYPES[case.dtype].itemsize


# ------------------------------------------------------------------------------ CPU timing


def _median_seconds(fn, repeat, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def numpy_permute(hidden, routemap, counts, alignment):
    """Vectorised NumPy permute (the baseline): stable sort by expert, then one gather."""
    num_tokens, topk = routemap.shape
    flat = routemap.reshape(-1)
    valid = flat >= 0
    order = np.argsort(np.where(valid, flat, len(counts)), kind="stable")[: valid.sum()]
    experts = flat[order]
    tokens = order // topk
    padded = -(-np.asarray(counts) // alignment) * alignment
    offsets = np.concatenate([[0], np.cumsum(padded)])
    starts = np.concatenate([[0], np.cumsum(counts)])
    rows = offsets[experts] + np.arange(len(order)) - starts[experts]
    out = np.zeros((offsets[-1], hidden.shape[1]), hidden.dtype)
    out[rows] = hidden[tokens]
    rowmap = np.full((num_tokens, len(counts)), -1, np.int32)
    rowmap[tokens, experts] = rows
    return out, rowmap


def numpy_unpermute(rows, rowmap, routemap, probs):
    """Vectorised NumPy weighted combine (the baseline): one gather per top-k slot."""
    acc = np.zeros((rowmap.shape[0], rows.shape[1]), np.float32)
    tokens = np.arange(rowmap.shape[0])
    for k in range(routemap.shape[1]):
        row = rowmap[tokens, np.maximum(routemap[:, k], 0)]
        row = np.where(routemap[:, k] >= 0, row, -1)
        has = row >= 0
        acc[has] += rows[row[has]].astype(np.float32) * probs[row[has], None]
    return acc.astype(rows.dtype)


def bench_cpu_case(case, repeat):
    import moe_cpu

    hidden, scale, routemap, probs, counts = make_inputs(case)
    args = (hidden, scale, routemap, probs, case.experts, counts, case.alignment)
    rows, rowmap, row_probs, _ = moe_permute(*args)
    moved = permute_bytes(case, rows.shape[0], 0 if scale is None else scale.shape[1])
    source = np.empty(moved // 2, np.uint8)
    target = np.empty_like(source)
    source.fill(1)
    copy_s = _median_seconds(lambda: moe_cpu.copy_rows(source, target), repeat)
    roofline = moved / copy_s / 1e9
    permute_s = _median_seconds(lambda: moe_permute(*args), repeat)
    numpy_s = _median_seconds(
        lambda: numpy_permute(hidden, routemap, counts, case.alignment), max(3, repeat // 3)
    )
    results = [
        Result(
            case,
            "permute",
            permute_s * 1e3,
            moved / permute_s / 1e9,
            roofline,
            baseline_ms=numpy_s * 1e3,
        )
    ]
    if DTYPES[case.dtype].itemsize >= 2:
        routed = int((rowmap >= 0).sum())
        moved = unpermute_bytes(case, routed)
        source = np.empty(moved // 2, np.uint8)
        target = np.empty_like(source)
        source.fill(1)
        copy_s = _median_seconds(lambda: moe_cpu.copy_rows(source, target), repeat)
        unpermute_s = _median_seconds(
            lambda: moe_unpermute(
                rows,
                rowmap,
                routemap,
                row_probs,
                case.tokens,
                case.experts,
                using_weighted_combine=True,
            ),
            repeat,
        )
        numpy_s = _median_seconds(
            lambda: numpy_unpermute(rows, rowmap, routemap, row_probs), max(3, repeat // 3)
        )
        results.append(
            Result(
                case,
                "unpermute weighted",
                unpermute_s * 1e3,
                moved / unpermute_s / 1e9,
                moved / copy_s / 1e9,
                baseline_ms=numpy_s * 1e3,
            )
        )
    return results


# ------------------------------------------------------------------------------ GPU timing


class _GPUTimer:
    """CUDA-event medians and back-to-back wall times on the legacy default stream."""

    def __init__(self, repeat):
        from numba import cuda

        from ._bench_hold import Hold

        self.cuda = cuda
        self.repeat = repeat
        self.hold = Hold()

    def device_ms(self, fn, synchronizes=False, batch=10, warmup=3):
        """Median GPU time per call over ``repeat`` batches of back-to-back calls.

        A batch is timed between two events. It is enqueued behind a kernel that holds the
        stream until the host has enqueued it all (:mod:`._bench_hold`), so the events
        time the GPU work, not the host's time to enqueue it. A call that ``synchronizes``
        (``validate=True``) cannot be held (it would wait for the held stream): one call
        goes ahead of the start event instead, so the GPU has work while the host enqueues
        the batch; such calls pay for their host work wherever the GPU waits for it.
        """
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(self.repeat):
            start, stop = self.cuda.event(), self.cuda.event()
            if synchronizes:
                fn()
            else:
                self.hold.start()
            start.record()
            for _ in range(batch):
                fn()
            stop.record()
            if not synchronizes:
                self.hold.release()
            stop.synchronize()
            if not synchronizes:
                self.hold.finished()
            times.append(self.cuda.event_elapsed_time(start, stop) / batch)
        return statistics.median(times)

    @property
    def hold_timeouts(self):
        """How many timed batches the stream hold let go before the host released it."""
        return self.hold.timed_out

    def host_us(self, fn, calls=200):
        fn()
        self.cuda.synchronize()
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            self.cuda.synchronize()
            samples.append((time.perf_counter() - start) / calls * 1e6)
        return statistics.median(samples)


def _device_copy(library, nbytes):
    from ._transfer import to_device

    source = to_device(np.ones(nbytes, np.uint8), library)
    if library == "torch":
        target = source.clone()
        return lambda: target.copy_(source)
    if library == "cupy":
        import cupy

        target = cupy.empty_like(source)
        return lambda: cupy.copyto(target, source)
    target = to_device(np.empty(nbytes, np.uint8), library)
    return lambda: target.copy_to_device(source)


def bench_cuda_case(case, repeat, library):
    from ._transfer import to_device

    timer = _GPUTimer(repeat)
    hidden, scale, routemap, probs, counts = make_inputs(case)
    d = [None if a is None else to_device(a, library) for a in (hidden, scale, routemap, probs)]
    args = (*d, case.experts, counts, case.alignment)
    rows, rowmap, row_probs, _ = moe_permute(*args)
    small = case.tokens <= 1024
    moved = permute_bytes(case, rows.shape[0], 0 if scale is None else scale.shape[1])
    roofline = moved / timer.device_ms(_device_copy(library, moved // 2)) / 1e6

    def timed(op, call, validate, moved, roofline):
        ms = timer.device_ms(call, synchronizes=validate)
        host_us = timer.host_us(call) if small else None
        return Result(case, op, ms, moved / ms / 1e6, roofline, host_us=host_us)

    results = [
        timed(
            op,
            lambda validate=validate: moe_permute(*args, validate=validate),
            validate,
            moved,
            roofline,
        )
        for op, validate in (("permute", True), ("permute validate=False", False))
    ]
    if DTYPES[case.dtype].itemsize >= 2:
        routed = int(case.tokens * min(case.topk, case.experts))
        moved = unpermute_bytes(case, routed)
        roofline = moved / timer.device_ms(_device_copy(library, moved // 2)) / 1e6
        combine_args = (rows, rowmap, d[2], row_probs, case.tokens, case.experts)
        results += [
            timed(
                op,
                lambda validate=validate: moe_unpermute(
                    *combine_args, using_weighted_combine=True, validate=validate
                ),
                validate,
                moved,
                roofline,
            )
            for op, validate in (
                ("unpermute weighted", True),
                ("unpermute weighted validate=False", False),
            )
        ]
    if timer.hold_timeouts:
        print(
            f"warning: {case.label()}: {timer.hold_timeouts} timed batch(es) took the host "
            "longer to enqueue than the stream hold lasts; their times include host time",
            file=sys.stderr,
        )
    return results


# ------------------------------------------------------------------------------ reporting


def print_table(results, out=None):
    out = out or sys.stdout  # (looked up per call, so redirections of sys.stdout apply)
    header = (
        f"{'case':<44} {'operation':<34} {'ms':>9} {'GB/s':>8} {'copy GB/s':>9} "
        f"{'% copy':>7} {'host us':>8} {'vs NumPy':>8}"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in results:
        host = f"{r.host_us:8.1f}" if r.host_us is not None else f"{'':>8}"
        speedup = f"{r.baseline_ms / r.ms:7.1f}x" if r.baseline_ms else f"{'':>8}"
        print(
            f"{r.case.label():<44} {r.op:<34} {r.ms:9.3f} {r.gbps:8.1f} "
            f"{r.roofline_gbps:9.1f} {r.percent:6.1f}% {host} {speedup}",
            file=out,
        )


def save_json(results, path, backend):
    records = [
        dict(
            asdict(r.case),
            op=r.op,
            ms=r.ms,
            gbps=r.gbps,
            roofline_gbps=r.roofline_gbps,
            percent=r.percent,
            host_us=r.host_us,
            baseline_ms=r.baseline_ms,
        )
        for r in results
    ]
    with open(path, "w") as f:
        json.dump({"backend": backend, "results": records}, f, indent=1)


def compare_json(results, path, out=None):
    out = out or sys.stdout
    with open(path) as f:
        old = {
            (
                r["op"],
                *(r[k] for k in ("tokens", "hidden", "experts", "topk", "alignment", "dtype")),
            ): r
            for r in json.load(f)["results"]
        }
    print(f"\ncompared with {path} (ratio > 1: faster now)", file=out)
    for r in results:
        before = old.get(r.key())
        if before:
            print(
                f"  {r.case.label():<44} {r.op:<34} {before['ms'] / r.ms:6.2f}x "
                f"({before['ms']:.3f} -> {r.ms:.3f} ms)",
                file=out,
            )


def plot(results, path, backend):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'moe-numba[bench]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for op in dict.fromkeys(r.op for r in results):
        series = sorted(
            (r.case.tokens, r.percent)
            for r in results
            if r.op == op
            and r.case.dtype == "bf16"
            and (r.case.hidden, r.case.experts, r.case.topk)
            == (results[0].case.hidden, results[0].case.experts, results[0].case.topk)
        )
        if len(series) > 1:
            ax.plot(*zip(*series, strict=True), marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens T")
    ax.set_ylabel("% of copy bandwidth (same bytes)")
    ax.set_ylim(0, 105)
    c = results[0].case
    ax.set_title(f"moe-numba on {backend}: bf16 H={c.hidden} E={c.experts} K={c.topk}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_bench(args):
    """Run the benchmark; returns the exit status."""
    from ._transfer import gpu_library

    library = None if args.backend == "cpu" else gpu_library()
    if args.backend == "cuda" and library is None:
        print("no usable GPU (torch, CuPy or numba.cuda) found", file=sys.stderr)
        return 2
    if library is None:
        import moe_cpu

        backend = f"cpu ({moe_cpu.get_num_threads()} threads)"
        cases = cpu_cases(args)
        repeat = args.repeat or (3 if args.quick else 7)
    else:
        backend = f"cuda ({library} arrays)"
        cases = cuda_cases(args)
        repeat = args.repeat or (5 if args.quick else 15)
    print(
        f"backend: {backend}; {len(cases)} shape(s), {repeat} timed repetitions each",
        file=sys.stderr,
    )
    results = []
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case.label()}", file=sys.stderr, flush=True)
        if library is None:
            results += bench_cpu_case(case, repeat)
        else:
            results += bench_cuda_case(case, repeat, library)
    print_table(results)
    if args.json:
        save_json(results, args.json, backend)
    if args.compare:
        compare_json(results, args.compare)
    if args.plot:
        plot(results, args.plot, backend)
    return 0
