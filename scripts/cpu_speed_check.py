"""Speed check of the moe_cpu backend against its copy roofline and vectorised NumPy.

Usage: python scripts/cpu_speed_check.py [--tokens 4096] [--hidden 2048] [--topk 8]
       [--experts 32] [--alignment 16] [--threads N] [--reps 9]

Bytes counted as in DESIGN.md: permute = read T*H + write R*H elements; unpermute = read the
routed rows + write T*H elements. The copy roofline copies the same number of bytes with
``moe_cpu.copy_rows`` (which moves 2 * size bytes). Medians of interleaved rounds after one
warm-up call of each case.
"""

import argparse
import statistics
import time

import ml_dtypes
import numpy as np

import moe_cpu
from moe_numba import _abi


def numpy_layout(routemap, num_experts, alignment):
    """Vectorised NumPy rowmap (token-ascending within an expert, padded per expert)."""
    T, K = routemap.shape
    token = np.repeat(np.arange(T), K)
    expert = routemap.reshape(-1)
    keep = expert >= 0
    token, expert = token[keep], expert[keep]
    order = np.lexsort((token, expert))
    token, expert = token[order], expert[order]
    counts = np.bincount(expert, minlength=num_experts)
    padded = -(-counts // alignment) * alignment
    offsets = np.concatenate([[0], np.cumsum(padded)[:-1]])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rows = offsets[expert] + np.arange(expert.size) - starts[expert]
    rowmap = np.full((T, num_experts), -1, np.int32)
    rowmap[token, expert] = rows
    return rowmap, int(padded.sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--alignment", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    T, H, K, E, A = args.tokens, args.hidden, args.topk, args.experts, args.alignment
    moe_cpu.set_num_threads(args.threads)
    print(
        f"T={T} H={H} K={K} E={E} A={A} bf16, threads={moe_cpu.get_num_threads()}, "
        f"OpenMP={moe_cpu.openmp_enabled()}"
    )

    rng = np.random.default_rng(0)
    routemap = np.argsort(rng.random((T, E)), axis=1)[:, :K].astype(np.int32)
    probs = rng.random((T, K), dtype=np.float32)
    hidden = rng.standard_normal((T, H), dtype=np.float32).astype(ml_dtypes.bfloat16)
    counts = np.bincount(routemap.reshape(-1), minlength=E).astype(np.int64)
    R = int((-(-counts // A) * A).sum())
    hb = H * 2

    out_hidden = np.empty((R, hb), np.uint8)
    out_rowmap = np.empty((T, E), np.int32)
    out_probs = np.empty(R, np.float32)
    out_indices = np.empty(R, np.int32)
    status = np.empty(_abi.PERMUTE_STATUS_LEN, np.int64)
    hidden_bytes = hidden.view(np.uint8)

    def permute():
        moe_cpu.permute(
            hidden_bytes,
            None,
            routemap,
            probs,
            counts,
            A,
            out_hidden,
            None,
            out_rowmap,
            out_probs,
            out_indices,
            status,
            True,
        )

    permute()
    assert (status == -1).all()
    rowmap = out_rowmap.copy()
    rows = out_hidden.view(np.uint16).reshape(R, H)
    row_probs = out_probs.copy()

    # numpy permute: the gather alone, and with the layout computed in NumPy too
    filled_tokens, filled_experts = np.nonzero(rowmap >= 0)
    filled_rows = rowmap[filled_tokens, filled_experts]
    hidden_u16 = hidden.view(np.uint16)

    def numpy_gather():
        out = np.zeros((R, H), np.uint16)
        out[filled_rows] = hidden_u16[filled_tokens]
        return out

    def numpy_permute():
        rm, rows_needed = numpy_layout(routemap, E, A)
        t, e = np.nonzero(rm >= 0)
        out = np.zeros((rows_needed, H), np.uint16)
        out[rm[t, e]] = hidden_u16[t]
        return out

    assert (numpy_gather() == rows).all() and (numpy_permute() == rows).all()

    out_combined = np.empty((T, H), np.uint16)
    out_prob_topk = np.empty((T, K), np.float32)
    ustatus = np.empty(_abi.UNPERMUTE_STATUS_LEN, np.int64)

    def unpermute():
        moe_cpu.unpermute(
            rows,
            rowmap,
            routemap,
            row_probs,
            out_combined,
            out_prob_topk,
            ustatus,
            _abi.DATA_BFLOAT16,
            True,
            True,
        )

    slot_rows = np.take_along_axis(rowmap, routemap.astype(np.int64), axis=1)  # [T, K]
    rows_bf16 = rows.view(ml_dtypes.bfloat16)

    def numpy_unpermute():
        acc = np.zeros((T, H), np.float32)
        for k in range(K):
            r = slot_rows[:, k]
            acc += rows_bf16[r].astype(np.float32) * row_probs[r][:, None]
        return acc.astype(ml_dtypes.bfloat16)

    routed = int((rowmap >= 0).sum())
    permute_bytes = T * hb + R * hb
    unpermute_bytes = routed * hb + T * hb
    copy_src = {n: np.ones(n, np.uint8) for n in (permute_bytes // 2, unpermute_bytes // 2)}
    copy_dst = {n: np.empty(n, np.uint8) for n in copy_src}

    cases = [
        (
            "copy_rows (permute bytes)",
            lambda: moe_cpu.copy_rows(copy_src[permute_bytes // 2], copy_dst[permute_bytes // 2]),
            permute_bytes,
        ),
        ("moe_cpu.permute", permute, permute_bytes),
        ("numpy gather only", numpy_gather, permute_bytes),
        ("numpy permute (layout+gather)", numpy_permute, permute_bytes),
        (
            "copy_rows (unpermute bytes)",
            lambda: moe_cpu.copy_rows(
                copy_src[unpermute_bytes // 2], copy_dst[unpermute_bytes // 2]
            ),
            unpermute_bytes,
        ),
        ("moe_cpu.unpermute weighted", unpermute, unpermute_bytes),
        ("numpy weighted combine", numpy_unpermute, unpermute_bytes),
    ]
    # interleaved rounds, so that load from other processes hits every case alike
    times = {name: [] for name, _, _ in cases}
    for _, fn, _ in cases:
        fn()
    for _ in range(args.reps):
        for name, fn, _ in cases:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    results = {}
    for name, _, nbytes in cases:
        seconds = statistics.median(times[name])
        results[name] = nbytes / seconds / 1e9
        print(
            f"{name:32s} {seconds * 1e3:8.2f} ms {results[name]:7.2f} GB/s "
            f"(best {min(times[name]) * 1e3:.2f} ms)"
        )

    p, u = results["moe_cpu.permute"], results["moe_cpu.unpermute weighted"]
    print(
        f"permute:   {p / results['copy_rows (permute bytes)']:.0%} of copy, "
        f"{p / results['numpy gather only']:.1f}x numpy gather, "
        f"{p / results['numpy permute (layout+gather)']:.1f}x numpy permute"
    )
    print(
        f"unpermute: {u / results['copy_rows (unpermute bytes)']:.0%} of copy, "
        f"{u / results['numpy weighted combine']:.1f}x numpy"
    )


if __name__ == "__main__":
    main()
