"""``python -m moe_numba demo``: the docs example and a realistic workload, checked."""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np

from . import moe_permute, moe_unpermute, oracle


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.array_equal(
            np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
        )
    )


def _check(name, actual, expected):
    ok = all(_same_bits(a, b) for a, b in zip(actual, expected, strict=True))
    print(f"  {name:<34} {'identical to the oracle' if ok else 'DIFFERS from the oracle'}")
    return ok


def docs_example_inputs():
    """The example of Paddle's docs: 3 tokens, H=128, topk 8, 3 experts, tokens_per_expert
    [1, 2, 1], alignment 2 (random bf16 rows and probabilities, seed 0).

    Returns
    -------
    tuple
        ``(hidden, routemap, probs)`` NumPy arrays.
    """
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((3, 128)).astype(ml_dtypes.bfloat16)
    routemap = np.full((3, 8), -1, dtype=np.int32)
    routemap[0, [1, 5]] = [2, 0]
    routemap[1, 3] = 1
    routemap[2, 0] = 1
    probs = rng.random((3, 8), dtype=np.float32)
    return hidden, routemap, probs


def _docs_example(target):
    hidden, routemap, probs = docs_example_inputs()
    move = target.upload
    outputs = moe_permute(move(hidden), None, move(routemap), move(probs), 3, [1, 2, 1], 2)
    outputs = [target.to_host(x) for x in outputs]
    print("docs example: 3 tokens, 3 experts, tokens_per_expert [1, 2, 1], alignment 2")
    print(f"  hidden_states_unzipped: {outputs[0].shape[0]} rows (each expert padded to 2)")
    print("  zipped_expertwise_rowmap (row of token t for expert e, -1 = none):")
    for t, row in enumerate(outputs[1]):
        print(f"    token {t}: {row.tolist()}")
    expected, _ = oracle.permute(hidden, None, routemap, probs, 3, [1, 2, 1], 2)
    return _check("permute", outputs, expected)


def _workload(target, tokens, hidden, experts, topk):
    rng = np.random.default_rng(1)
    print(
        f"\nrandom workload: T={tokens} H={hidden} E={experts} K={topk} bf16, "
        "alignment 16, weighted combine"
    )
    scores = rng.random((tokens, experts))
    routemap = np.argsort(scores, axis=1)[:, :topk].astype(np.int32)
    probs = rng.random((tokens, topk), dtype=np.float32)
    x = rng.standard_normal((tokens, hidden)).astype(ml_dtypes.bfloat16)
    counts = np.bincount(routemap.reshape(-1), minlength=experts).tolist()
    move, to_host = target.upload, target.to_host
    args = [move(x), None, move(routemap), move(probs), experts, counts, 16]

    def timed(fn):
        fn()  # warm-up: compiles kernels on first use
        target.synchronize()
        start = time.perf_counter()
        result = fn()
        target.synchronize()
        return result, (time.perf_counter() - start) * 1e3

    permuted, permute_ms = timed(lambda: moe_permute(*args))
    rows, rowmap, row_probs, _ = permuted
    combined, unpermute_ms = timed(
        lambda: moe_unpermute(
            rows, rowmap, args[2], row_probs, tokens, experts, using_weighted_combine=True
        )
    )
    print(f"  moe_permute   {permute_ms:8.2f} ms   -> {rows.shape[0]} rows")
    print(f"  moe_unpermute {unpermute_ms:8.2f} ms   -> {tuple(combined[0].shape)}")
    print("  checking against the NumPy oracle (slow, plain Python) ...", flush=True)
    expected, _ = oracle.permute(x, None, routemap, probs, experts, counts, 16)
    ok = _check("permute", [to_host(v) for v in permuted], expected)
    expected_combine, _ = oracle.unpermute(
        expected[0],
        expected[1],
        routemap,
        expected[2],
        tokens,
        experts,
        using_weighted_combine=True,
    )
    return _check("weighted unpermute", [to_host(v) for v in combined], expected_combine) and ok


def run_demo(target, tokens, hidden, experts, topk):
    """Run the demo on ``target`` (:mod:`moe_numba._target`) with a random workload of
    the given shape (``topk <= experts``); returns the exit status (0: everything matched)."""
    print(f"backend: {target.description}\n")
    ok = _docs_example(target)
    ok = _workload(target, tokens, hidden, experts, topk) and ok
    print("\nall outputs identical to the oracle" if ok else "\nMISMATCH: see above")
    return 0 if ok else 1
