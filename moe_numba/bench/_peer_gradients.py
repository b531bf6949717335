"""The gradient ops and a whole training step beside Transformer Engine's Triton kernels.

::

    python -m moe_numba.bench._peer_gradients --peers .peers [--shapes headline,e256,t256]
        [--iters 20] [--json PATH]

``--peers`` is the folder that ``shared/peers/fetch.sh`` fills (git-ignored, never
committed): its ``peers.py`` supplies the inputs (``make_case``), the loader of TE's kernels
(``load_te``) and the timing (``measure``, ``measure_copy``), so these figures are taken
exactly as the forward ops' peer table is. Per shape (bf16 rows, the shape's Paddle
alignment) it times, on torch CUDA tensors:

- ``permute backward``: moe-numba's :func:`~moe_numba.moe_permute_backward` (row and
  probability gradients) against TE's ``unpermute_with_mask_map`` with the permuted
  probabilities' gradient, which is what TE's permute op runs in its backward;
- ``unpermute backward``: the weighted combine's backward, moe-numba's
  :func:`~moe_numba.moe_unpermute_backward` against TE's
  ``unpermute_with_mask_map_bwd_with_merging_probs``;
- ``step``: forward and backward of the MoE layer without the experts' GEMMs (identity
  experts, the probability applied by the combine): moe-numba through torch autograd
  (``moe_permute`` then the weighted ``moe_unpermute``, ``backward``) against TE's four
  kernels chained by hand (``make_row_id_map``, ``permute_with_mask_map``,
  ``unpermute_with_mask_map`` with merging probabilities, then the two backward kernels);
- the peak memory of that step above what its inputs hold, for both.

Each time is GPU time with the host running ahead, one call's latency after a sync and host
time per call, beside a device copy of the same bytes in the same run. Before timing, the
gradients of both are compared: bit for bit where the two add in the same order (the row
gradient of the permute), else within a bf16 step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

SHAPES = ("headline", "e256", "t256")


def load_peers(folder):
    """The ``peers.py`` module of ``folder`` (the peers tool's copy beside the kernels)."""
    path = os.path.join(folder, "peers.py")
    if not os.path.exists(path):
        raise SystemExit(f"--peers: {path} does not exist; run shared/peers/fetch.sh first")
    spec = importlib.util.spec_from_file_location("moe_numba_peers_tool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TeInputs:
    """TE's view of one case: the routing mask, (T, E) probabilities, the padding offsets."""

    def __init__(self, torch, te, c):
        slots = c.routes.long()
        self.mask = torch.zeros(c.T, c.E, dtype=torch.bool, device="cuda").scatter_(1, slots, True)
        self.probs = torch.zeros(c.T, c.E, device="cuda").scatter_(1, slots, c.probs)
        pads = c.padded - c.counts
        self.pad_offsets = None if c.A == 1 else torch.cumsum(pads, 0) - pads
        self.row_id_map = te.make_row_id_map(self.mask, c.T, c.E)


def gradient_inputs(torch, c):
    """The gradients fed to the backward ops: of the permuted rows and their probabilities
    (padding rows included), and of the combined output."""
    g = torch.Generator(device="cuda").manual_seed(7)
    return dict(
        rows=torch.randn(c.R, c.H, device="cuda", generator=g).to(torch.bfloat16),
        row_probs=torch.randn(c.R, device="cuda", generator=g),
        y=torch.randn(c.T, c.H, device="cuda", generator=g).to(torch.bfloat16),
    )


def permute_backward_calls(torch, lib, te, c, t, grads, forward):
    """``{impl: call}`` of the permute's backward, and the check of their outputs
    (``forward``: moe-numba's permute outputs of the case)."""
    _, rowmap, _, _ = forward

    def ours():
        return lib.moe_permute_backward(
            grads["rows"], grads["row_probs"], rowmap, c.routes, validate=False
        )

    def theirs():  # TE's permute backward: the unweighted unpermute of the gradients
        return te.unpermute_with_mask_map(
            grads["rows"], t.row_id_map, None, grads["row_probs"], t.pad_offsets, c.T, c.E, c.H
        )

    (dx, dprobs), (te_dx, te_dprobs) = ours(), theirs()
    te_dprobs_topk = te_dprobs.gather(1, c.routes.long())
    check = dict(rows=_same(torch, dx, te_dx), probs=_same(torch, dprobs, te_dprobs_topk))
    return dict(moe_numba=ours, te=theirs), check


def unpermute_backward_calls(torch, lib, te, c, t, grads, forward):
    """``{impl: call}`` of the weighted combine's backward, and the check of their outputs."""
    rows, rowmap, row_probs, _ = forward
    te_rows = te.permute_with_mask_map(
        c.x, t.row_id_map, None, None, t.pad_offsets, c.T, c.E, c.R, c.H, None
    )[0]

    def ours():
        return lib.moe_unpermute_backward(
            grads["y"],
            None,
            rows,
            rowmap,
            c.routes,
            row_probs,
            using_weighted_combine=True,
            num_rows=c.R,
            validate=False,
        )

    def theirs():
        return te.unpermute_with_mask_map_bwd_with_merging_probs(
            grads["y"], t.row_id_map, te_rows, t.probs, t.pad_offsets, c.T, c.E, c.R, c.H
        )

    (drows, drow_probs), (te_drows, te_dprobs) = ours(), theirs()
    filled = rowmap >= 0  # (T, E): the pairs that hold a row
    ours_pairs = drow_probs[rowmap[filled].long()]
    check = dict(
        rows=_same(torch, drows, te_drows), probs=_close(torch, ours_pairs, te_dprobs[filled])
    )
    return dict(moe_numba=ours, te=theirs), check


def step_calls(torch, lib, te, c, t, grads, _forward):
    """``{impl: step}``: forward and backward of the layer without GEMMs (each step runs
    its own forward), and the check."""
    counts = c.counts.tolist()
    x = c.x.detach().requires_grad_(True)
    probs = c.probs.detach().requires_grad_(True)
    te_probs = t.probs.detach()

    def ours():
        rows, rowmap, row_probs, _ = lib.moe_permute(
            x, None, c.routes, probs, c.E, counts, c.A, validate=False
        )
        y = lib.moe_unpermute(
            rows, rowmap, c.routes, row_probs, c.T, c.E, using_weighted_combine=True, validate=False
        )[0]
        x.grad = probs.grad = None
        y.backward(grads["y"])
        return y, x.grad, probs.grad

    def theirs():
        row_id_map = te.make_row_id_map(t.mask, c.T, c.E)
        rows = te.permute_with_mask_map(
            c.x, row_id_map, None, None, t.pad_offsets, c.T, c.E, c.R, c.H, None
        )[0]
        y = te.unpermute_with_mask_map(
            rows, row_id_map, te_probs, None, t.pad_offsets, c.T, c.E, c.H
        )[0]
        drows, dprobs = te.unpermute_with_mask_map_bwd_with_merging_probs(
            grads["y"], row_id_map, rows, te_probs, t.pad_offsets, c.T, c.E, c.R, c.H
        )
        dx = te.unpermute_with_mask_map(
            drows, row_id_map, None, None, t.pad_offsets, c.T, c.E, c.H
        )[0]
        return y, dx, dprobs

    (y, dx, dprobs), (te_y, te_dx, te_dprobs) = ours(), theirs()
    check = dict(
        y=_close(torch, y, te_y),
        x=_close(torch, dx, te_dx),
        probs=_close(torch, dprobs, te_dprobs.gather(1, c.routes.long())),
    )
    return dict(moe_numba=ours, te=theirs), check


def _same(torch, a, b):
    return (
        "identical"
        if torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
        else _close(torch, a, b)
    )


def _close(torch, a, b):
    diff = (a.float() - b.float()).abs()
    ok = bool((diff <= b.float().abs() / 64 + 1e-3).all())
    return f"{'close' if ok else 'DIFFERENT'} (max |diff| {float(diff.max()):.2g})"


def peak_bytes(torch, step):
    """Peak device memory of one ``step()`` above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def run_case(peers, torch, lib, te, name, iters):
    """Every measurement of one shape, as a JSON-ready dict."""
    c = peers.make_case(name, "paddle")
    t = TeInputs(torch, te, c)
    grads = gradient_inputs(torch, c)
    forward = lib.moe_permute(c.x, None, c.routes, c.probs, c.E, c.counts.tolist(), c.A)
    row = c.H * c.x.element_size()
    routed = c.T * c.K
    ops = {  # name: (builder, bytes read and written)
        "permute backward": (permute_backward_calls, (routed + c.T) * row),
        "unpermute backward": (unpermute_backward_calls, (c.T + routed + c.R) * row),
        # permute T -> R, combine K*T -> T, its backward T + K*T -> R, permute's K*T -> T
        "step": (step_calls, (4 * c.T + 3 * routed + 2 * c.R) * row),
    }
    res = dict(shape=name, T=c.T, H=c.H, K=c.K, E=c.E, A=c.A, R=c.R, ops={})
    for op, (build, nbytes) in ops.items():
        calls, check = build(torch, lib, te, c, t, grads, forward)
        timed = {"copy": dict(peers.measure_copy(nbytes, iters), bytes=nbytes)}
        for impl, call in calls.items():
            timed[impl] = dict(peers.measure(call, iters), bytes=nbytes)
        for m in timed.values():
            m["gbs"] = nbytes / m["gpu_ms"] / 1e6
            m["pct_copy"] = 100 * timed["copy"]["gpu_ms"] / m["gpu_ms"]
        if op == "step":
            for impl, call in calls.items():
                timed[impl]["peak_mib"] = peak_bytes(torch, call) / 2**20
        res["ops"][op] = dict(check=check, **timed)
    return res


def print_case(r):
    print(
        f"\n{r['shape']}: T={r['T']} H={r['H']} K={r['K']} E={r['E']} bf16, alignment "
        f"{r['A']}: {r['R']} rows"
    )
    print(
        f"{'op':19} {'impl':9} | {'gpu ms':>8} {'%copy':>5} {'TE/ours':>7} | "
        f"{'1-call ms':>9} {'TE/ours':>7} | {'host us':>7} | {'peak MiB':>8}"
    )
    for op, m in r["ops"].items():
        for impl in ("copy", "moe_numba", "te"):
            x = m[impl]
            star = "*" if x["host_bound"] else " "
            speed = single = ""
            if impl == "moe_numba":
                speed = f"{m['te']['gpu_ms'] / x['gpu_ms']:6.2f}x"
                single = f"{m['te']['single_ms'] / x['single_ms']:6.2f}x"
            peak = f"{x['peak_mib']:8.0f}" if "peak_mib" in x else ""
            print(
                f"{op:19} {impl:9} | {x['gpu_ms']:7.3f}{star} {x['pct_copy']:4.0f}% "
                f"{speed:>7} | {x['single_ms']:9.3f} {single:>7} | {x['host_us']:7.0f} | "
                f"{peak:>8}"
            )
        print(f"{'':19} check: " + ", ".join(f"{k} {v}" for k, v in m["check"].items()))


def main(argv=None):
    """The command line of the module docstring; returns the exit status (1 if some
    gradient of TE differs from moe-numba's beyond rounding)."""
    parser = argparse.ArgumentParser(prog="python -m moe_numba.bench._peer_gradients")
    parser.add_argument("--peers", default=".peers", help="the folder fetch.sh filled")
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help=f"comma-separated, from {', '.join(SHAPES)}"
    )
    parser.add_argument("--iters", type=int, default=20, help="calls per measurement")
    parser.add_argument("--json", help="save the results there (after every shape)")
    args = parser.parse_args(argv)
    names = args.shapes.split(",")
    unknown = sorted(set(names) - set(SHAPES))
    if unknown:
        parser.error(f"--shapes: unknown {unknown}; choose from {', '.join(SHAPES)}")
    if args.iters < 1:
        parser.error(f"--iters: expected a positive number of calls, got {args.iters}")
    peers = load_peers(args.peers)
    import torch

    if not torch.cuda.is_available():
        parser.error("needs PyTorch with a CUDA GPU")
    import moe_numba

    te = peers.load_te(args.peers)
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; median of {args.iters}; "
        "TE/ours above 1: moe-numba is faster"
    )
    results = []
    for name in names:
        results.append(run_case(peers, torch, moe_numba, te, name, args.iters))
        torch.cuda.empty_cache()
        print_case(results[-1])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    wrong = [
        f"{r['shape']} {op} {k}"
        for r in results
        for op, m in r["ops"].items()
        for k, v in m["check"].items()
        if "DIFFERENT" in v
    ]
    print("gradients that differ from moe-numba's: " + (", ".join(wrong) or "none"))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
