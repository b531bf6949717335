"""``python -m benchmarks bench --peers --gradients``: the gradient ops and a training step
beside Transformer Engine's Triton kernels (:mod:`.peers` loads them), per bf16 case:

- ``permute backward``: :func:`~moe_numba.moe_permute_backward` (row and probability
  gradients) against TE's ``unpermute_with_mask_map`` of the gradients, which is what TE's
  permute op runs in its backward;
- ``unpermute backward``: the weighted combine's backward,
  :func:`~moe_numba.moe_unpermute_backward` against TE's
  ``unpermute_with_mask_map_bwd_with_merging_probs``;
- ``layer step``: forward and backward of the MoE layer without the experts' GEMMs (identity
  experts, the probabilities applied by the combine): moe-numba through torch autograd
  against TE's kernels chained by hand; and the peak memory of one step above what its inputs
  hold, for both.

Before timing, the gradients are compared: bit for bit where both add in the same order,
else within about a bfloat16 step (:func:`.peers.check_close`).
"""

from __future__ import annotations

from moe_numba import moe_permute, moe_permute_backward, moe_unpermute, moe_unpermute_backward

from .bytes import permute_backward_bytes, step_bytes, unpermute_backward_bytes
from .peers import OURS, TE, TeInputs, check_close, check_rows, op_name
from .workload import Operation, time_operations


def _same(torch, got, want):
    """``"identical"``, or how close ``got`` is to ``want`` when not."""
    verdict = check_rows(torch, [got], [want])
    return verdict if verdict == "identical" else check_close(torch, got, want)


def _gradients(torch, inputs, rows):
    """Random gradients of the permuted rows (``rows`` of them, padding included) and their
    probabilities, and of the combined output."""
    c = inputs.case
    device = inputs.hidden.device
    g = torch.Generator(device=device).manual_seed(7)
    return dict(
        rows=torch.randn(rows, c.hidden, device=device, generator=g).to(inputs.hidden.dtype),
        row_probs=torch.randn(rows, device=device, generator=g),
        y=torch.randn(c.tokens, c.hidden, device=device, generator=g).to(inputs.hidden.dtype),
    )


def peak_bytes(torch, call):
    """Peak device memory of one ``call()`` above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def bench_gradients(torch, te, inputs, ours, target, timer, note):
    """Results of the three gradient comparisons of one case (``inputs`` and ``ours``, the
    case's inputs and moe-numba's permute of them, as :class:`.peers.PeerBench` made them),
    timed by ``timer`` beside a copy of their bytes; ``note(case, line)`` takes the checks
    and the peak memory."""
    c = inputs.case
    t = TeInputs(torch, inputs)
    grads = _gradients(torch, inputs, t.rows)
    rows, rowmap, row_probs, _ = ours
    routes = inputs.routemap
    slots = routes.long()
    row_id_map = te.make_row_id_map(t.mask, c.tokens, c.experts)
    shape = (c.tokens, c.experts)

    def ours_permute_backward():
        return moe_permute_backward(
            grads["rows"], grads["row_probs"], rowmap, routes, validate=False
        )

    def te_permute_backward():
        return te.unpermute_with_mask_map(
            grads["rows"], row_id_map, None, grads["row_probs"], t.pad_offsets, *shape, c.hidden
        )

    (dx, dprobs), (te_dx, te_dprobs) = ours_permute_backward(), te_permute_backward()
    note(
        c,
        f"check permute backward, {TE}: rows {_same(torch, dx, te_dx)}, probabilities "
        f"{_same(torch, dprobs, te_dprobs.gather(1, slots))}",
    )

    te_rows = te.permute_with_mask_map(
        inputs.hidden, row_id_map, None, None, t.pad_offsets, *shape, t.rows, c.hidden, None
    )[0]

    def ours_unpermute_backward():
        return moe_unpermute_backward(
            grads["y"],
            None,
            rows,
            rowmap,
            routes,
            row_probs,
            using_weighted_combine=True,
            num_rows=t.rows,
            validate=False,
        )

    def te_unpermute_backward():
        return te.unpermute_with_mask_map_bwd_with_merging_probs(
            grads["y"], row_id_map, te_rows, t.probs, t.pad_offsets, *shape, t.rows, c.hidden
        )

    (drows, drow_probs), (te_drows, te_dprobs) = ours_unpermute_backward(), te_unpermute_backward()
    filled = rowmap >= 0  # (T, E): the pairs that hold a row
    pairs = drow_probs[rowmap[filled].long()]
    note(
        c,
        f"check unpermute backward, {TE}: rows {_same(torch, drows, te_drows)}, "
        f"probabilities {check_close(torch, pairs, te_dprobs[filled])}",
    )

    x = inputs.hidden.detach().requires_grad_(True)
    probs = inputs.probs.detach().requires_grad_(True)

    def ours_step():
        out = moe_permute(
            x, None, routes, probs, c.experts, inputs.counts, c.alignment, validate=False
        )
        y = moe_unpermute(
            out[0],
            out[1],
            routes,
            out[2],
            c.tokens,
            c.experts,
            using_weighted_combine=True,
            validate=False,
        )[0]
        x.grad = probs.grad = None
        y.backward(grads["y"])
        return y, x.grad, probs.grad

    def te_step():
        ids = te.make_row_id_map(t.mask, *shape)
        permuted = te.permute_with_mask_map(
            inputs.hidden, ids, None, None, t.pad_offsets, *shape, t.rows, c.hidden, None
        )[0]
        y = te.unpermute_with_mask_map(
            permuted, ids, t.probs, None, t.pad_offsets, *shape, c.hidden
        )[0]
        d_rows, d_probs = te.unpermute_with_mask_map_bwd_with_merging_probs(
            grads["y"], ids, permuted, t.probs, t.pad_offsets, *shape, t.rows, c.hidden
        )
        d_x = te.unpermute_with_mask_map(d_rows, ids, None, None, t.pad_offsets, *shape, c.hidden)
        return y, d_x[0], d_probs

    (y, sx, sprobs), (te_y, te_sx, te_sprobs) = ours_step(), te_step()
    note(
        c,
        f"check layer step, {TE}: output {check_close(torch, y, te_y)}, rows' gradient "
        f"{check_close(torch, sx, te_sx)}, probabilities' gradient "
        f"{check_close(torch, sprobs, te_sprobs.gather(1, slots))}",
    )
    peaks = {
        impl: peak_bytes(torch, step) / 2**20 for impl, step in ((OURS, ours_step), (TE, te_step))
    }
    note(
        c,
        "peak memory of one layer step above its inputs: "
        + ", ".join(f"{impl} {mib:.0f} MiB" for impl, mib in peaks.items()),
    )

    calls = [
        ("permute backward", permute_backward_bytes(c), ours_permute_backward, te_permute_backward),
        (
            "unpermute backward",
            unpermute_backward_bytes(c, inputs.counts),
            ours_unpermute_backward,
            te_unpermute_backward,
        ),
        ("layer step", step_bytes(c, inputs.counts), ours_step, te_step),
    ]
    ops = [
        Operation(op_name(name, impl), call, nbytes, False)
        for name, nbytes, *pair in calls
        for impl, call in zip((OURS, TE), pair, strict=True)
    ]
    return time_operations(c, ops, target, timer)
