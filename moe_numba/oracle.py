"""The oracle: docs/contract.rst written as slow, plain NumPy, one function per op.

Every backend is tested against these functions, bit for bit, and so can any other
implementation of the contract (a kernel of your own). They favour clarity over speed
(Python loops over tokens and slots) and never raise for bad values: each returns its outputs
and the status words that the backends report for them (the slots of ``moe_numba.abi``; -1
where there is nothing to report).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from . import abi
from ._capacities import padded

_CANONICAL_NAN_BITS = {
    np.dtype(np.float32): (np.uint32, abi.CANONICAL_NAN_FLOAT32),
    np.dtype(ml_dtypes.bfloat16): (np.uint16, abi.CANONICAL_NAN_BFLOAT16),
    np.dtype(np.float16): (np.uint16, abi.CANONICAL_NAN_FLOAT16),
}


def routed_experts(routemap_row, num_experts):
    """Map expert -> first top-k slot for one token; also the bad and repeated slots.

    Returns ``(routes, bad, repeated)``: ``routes`` maps each expert the token counts for to the
    lowest slot naming it, ``bad`` lists ``(k, id)`` of ids outside [-1, E) and ``repeated``
    lists ``(k, id)`` of later slots naming an expert again.
    """
    routes, bad, repeated = {}, [], []
    for k, expert in enumerate(int(i) for i in routemap_row):
        if expert == -1:
            continue
        if not 0 <= expert < num_experts:
            bad.append((k, expert))
        elif expert in routes:
            repeated.append((k, expert))
        else:
            routes[expert] = k
    return routes, bad, repeated


def padded_rows(capacities, padding_alignment):
    """``ceil(n_e / A) * A`` for every expert, as int64."""
    return padded(np.asarray(capacities, dtype=np.int64), padding_alignment)


def permute(
    hidden_states,
    scale,
    expert_routemap_topk,
    expert_prob_topk,
    num_experts,
    tokens_per_expert,
    padding_alignment,
    do_gather=True,
    return_expert_indices=False,
    override_buffer_size=-1,
    return_expert_offsets=False,
):
    """Reference ``moe_permute`` on NumPy arrays.

    Returns ``(outputs, status)`` where ``outputs`` is the tuple ``moe_permute`` returns and
    ``status`` the int64 status words (``abi.PERMUTE_*``).
    """
    routemap = np.asarray(expert_routemap_topk)
    probs = np.asarray(expert_prob_topk, dtype=np.float32)
    num_tokens, topk = routemap.shape
    status = np.full(abi.PERMUTE_STATUS_LEN, -1, dtype=np.int64)

    routes_per_token = []
    for t in range(num_tokens):
        routes, bad, repeated = routed_experts(routemap[t], num_experts)
        routes_per_token.append(routes)
        if bad and status[abi.PERMUTE_BAD_ID] == -1:
            status[abi.PERMUTE_BAD_ID] = t * topk + bad[0][0]
            status[abi.PERMUTE_BAD_ID_VALUE] = bad[0][1]
        if repeated and status[abi.PERMUTE_DUPLICATE] == -1:
            status[abi.PERMUTE_DUPLICATE] = t * topk + repeated[0][0]
            status[abi.PERMUTE_DUPLICATE_VALUE] = repeated[0][1]

    counts = np.zeros(num_experts, dtype=np.int64)
    for routes in routes_per_token:
        for expert in routes:
            counts[expert] += 1

    override = override_buffer_size >= 0
    capacities = counts if override else np.asarray(tokens_per_expert, dtype=np.int64)
    padded = padded_rows(capacities, padding_alignment)
    offsets = np.concatenate([[0], np.cumsum(padded)])
    rows_needed = int(offsets[-1])
    num_rows = override_buffer_size if override else rows_needed
    if override and rows_needed > num_rows:
        status[abi.PERMUTE_ROWS_NEEDED] = rows_needed
    if not override:
        mismatched = np.flatnonzero(counts != capacities)
        if mismatched.size:
            status[abi.PERMUTE_MISMATCH] = mismatched[0]
            status[abi.PERMUTE_MISMATCH_COUNT] = counts[mismatched[0]]

    rowmap = np.full((num_tokens, num_experts), -1, dtype=np.int32)
    probs_unzipped = np.zeros(num_rows, dtype=np.float32)
    expert_indices = np.full(num_rows, -1, dtype=np.int32)
    source_token = np.full(num_rows, -1, dtype=np.int64)
    rank = np.zeros(num_experts, dtype=np.int64)
    for t, routes in enumerate(routes_per_token):
        for expert, k in routes.items():
            r = rank[expert]
            rank[expert] += 1
            row = offsets[expert] + r
            if r < capacities[expert] and row < num_rows:
                rowmap[t, expert] = row
                probs_unzipped[row] = probs[t, k]
                expert_indices[row] = expert
                source_token[row] = t

    hidden_states = np.asarray(hidden_states)
    filled = source_token >= 0
    if do_gather:
        hidden_unzipped = np.zeros((num_rows, hidden_states.shape[1]), hidden_states.dtype)
        hidden_unzipped[filled] = hidden_states[source_token[filled]]
    else:
        hidden_unzipped = np.zeros((0, hidden_states.shape[1]), hidden_states.dtype)
    if scale is not None and do_gather:
        scale = np.asarray(scale)
        scale_unzipped = np.zeros((num_rows, scale.shape[1]), scale.dtype)
        scale_unzipped[filled] = scale[source_token[filled]]
    else:
        scale_unzipped = np.zeros(0, np.float32)

    outputs = (hidden_unzipped, rowmap, probs_unzipped, scale_unzipped)
    if return_expert_indices:
        outputs += (expert_indices,)
    if return_expert_offsets:
        outputs += (np.minimum(offsets[1:], num_rows).astype(np.int32),)
    return outputs, status


def fma_float32(x, y, z):
    """Correctly rounded float32 ``x * y + z`` (one rounding), element-wise.

    The product of two float32 values is exact in float64. The float64 sum is then rounded
    *to odd* (an inexact result takes the neighbour with an odd last bit, found with the
    exact error of TwoSum), and rounding that to float32 is correct because float64 has more
    than 24 + 2 bits.
    """
    with np.errstate(invalid="ignore", over="ignore"):  # NaN, inf - inf, overflow: all defined
        x, y, z = (np.asarray(a, dtype=np.float32).astype(np.float64) for a in (x, y, z))
        product = x * y
        total = product + z
        b = total - product
        error = (product - (total - b)) + (z - b)
        last_bit_even = (total.view(np.int64) & 1) == 0
        inexact = np.isfinite(total) & (error != 0) & last_bit_even
        toward = np.where(error > 0, np.inf, -np.inf)
        total = np.where(inexact, np.nextafter(total, toward), total)
        return total.astype(np.float32)


def round_to(dtype, values):
    """Round float32 ``values`` to ``dtype`` (nearest even), NaN made canonical."""
    dtype = np.dtype(dtype)
    # overflow to infinity is the defined result; a signalling NaN (invalid) is made canonical
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.asarray(values, dtype=np.float32).astype(dtype)
    bits_type, nan_bits = _CANONICAL_NAN_BITS[dtype]
    bits = rounded.view(bits_type).copy()
    bits[np.isnan(rounded)] = nan_bits
    return bits.view(dtype)


def unpermute(
    hidden_states_unzipped,
    zipped_expertwise_rowmap,
    expert_routemap_topk,
    token_prob_unzipped,
    total_zipped_tokens,
    num_experts,
    using_mix_precision=True,
    using_weighted_combine=False,
):
    """Reference ``moe_unpermute`` on NumPy arrays.

    Returns ``((hidden_states, expert_prob_topk), status)`` with the int64 status words
    ``abi.UNPERMUTE_*``.
    """
    rows = np.asarray(hidden_states_unzipped)
    rowmap = np.asarray(zipped_expertwise_rowmap)
    routemap = np.asarray(expert_routemap_topk)
    probs = np.asarray(token_prob_unzipped, dtype=np.float32).reshape(-1)
    num_rows, hidden = rows.shape
    topk = routemap.shape[1]
    status = np.full(abi.UNPERMUTE_STATUS_LEN, -1, dtype=np.int64)

    bad_rows = np.flatnonzero((rowmap < -1) | (rowmap >= num_rows))
    if bad_rows.size:
        status[abi.UNPERMUTE_BAD_ROW] = bad_rows[0]
        status[abi.UNPERMUTE_BAD_ROW_VALUE] = rowmap.reshape(-1)[bad_rows[0]]
    bad_ids = np.flatnonzero((routemap < -1) | (routemap >= num_experts))
    if bad_ids.size:
        status[abi.UNPERMUTE_BAD_ID] = bad_ids[0]
        status[abi.UNPERMUTE_BAD_ID_VALUE] = routemap.reshape(-1)[bad_ids[0]]

    def row_of(t, expert):
        row = int(rowmap[t, expert])
        return row if 0 <= row < num_rows else -1

    combined = np.zeros((total_zipped_tokens, hidden), dtype=rows.dtype)
    for t in range(total_zipped_tokens):
        acc = np.zeros(hidden, dtype=np.float32)
        for expert in range(num_experts):  # ascending expert id, not top-k order
            row = row_of(t, expert)
            if row < 0:
                continue
            x = rows[row].astype(np.float32)
            if using_weighted_combine:
                acc = fma_float32(x, probs[row], acc)
            else:
                with np.errstate(invalid="ignore", over="ignore"):
                    acc = acc + x
            if not using_mix_precision:
                acc = round_to(rows.dtype, acc).astype(np.float32)
        combined[t] = round_to(rows.dtype, acc)

    prob_topk = np.zeros((total_zipped_tokens, topk), dtype=np.float32)
    for t in range(total_zipped_tokens):
        for k in range(topk):
            expert = int(routemap[t, k])
            if 0 <= expert < num_experts and row_of(t, expert) >= 0:
                prob_topk[t, k] = probs[row_of(t, expert)]
    return (combined, prob_topk), status


# The gradients (docs/gradients.rst). The value rules of both are moe_unpermute's, so its
# oracle gives their status words; permute_backward's data gradient *is* its unweighted
# combine.

WARP_LANES = 32


def warp_dot(x, y):
    """Float32 dot products of the rows ``x[i]`` and ``y[i]`` in the order of
    docs/gradients.rst.

    Element h belongs to lane ``(h // V) % 32`` with ``V = 16 // itemsize`` (the lanes of a
    warp reading 16-byte words); each lane starts at +0.0 and takes ``fma(x, y, acc)`` over
    its elements in ascending h; then, for ``off`` = 16, 8, 4, 2, 1, every lane adds the lane
    ``l ^ off`` to itself. The result is lane 0, NaN made canonical.
    """
    x = np.asarray(x)
    y = np.asarray(y)
    num, hidden = x.shape
    elements_per_word = 16 // x.dtype.itemsize
    lanes = np.zeros((num, WARP_LANES), dtype=np.float32)
    for h in range(hidden):
        lane = (h // elements_per_word) % WARP_LANES
        lanes[:, lane] = fma_float32(x[:, h], y[:, h], lanes[:, lane])
    for off in (16, 8, 4, 2, 1):
        with np.errstate(invalid="ignore", over="ignore"):
            lanes = lanes + lanes[:, np.arange(WARP_LANES) ^ off]
    return round_to(np.float32, lanes[:, 0])


def permute_backward(
    grad_hidden_states_unzipped,
    grad_token_prob_unzipped,
    zipped_expertwise_rowmap,
    expert_routemap_topk,
):
    """Reference ``moe_permute_backward`` on NumPy arrays (either gradient may be None, not
    both).

    Returns ``((grad_hidden_states, grad_expert_prob_topk), status)`` with the int64 status
    words ``abi.UNPERMUTE_*``.
    """
    rowmap = np.asarray(zipped_expertwise_rowmap)
    routemap = np.asarray(expert_routemap_topk)
    num_tokens, num_experts = rowmap.shape
    grad_rows = grad_hidden_states_unzipped
    if grad_rows is None:
        num_rows = np.asarray(grad_token_prob_unzipped).shape[0]
        grad_rows = np.zeros((num_rows, 0), dtype=np.float32)
    grad_rows = np.asarray(grad_rows)
    num_rows = grad_rows.shape[0]
    (grad_hidden, _), status = unpermute(
        grad_rows, rowmap, routemap, np.zeros(num_rows, np.float32), num_tokens, num_experts
    )
    if grad_hidden_states_unzipped is None:
        grad_hidden = None

    grad_prob = None
    if grad_token_prob_unzipped is not None:
        row_bits = np.asarray(grad_token_prob_unzipped, dtype=np.float32).view(np.uint32)
        grad_prob = np.zeros(routemap.shape, dtype=np.float32)
        for t in range(num_tokens):
            routes, _, _ = routed_experts(routemap[t], num_experts)  # expert -> counted slot
            for expert, k in routes.items():
                row = int(rowmap[t, expert])
                if 0 <= row < num_rows:
                    grad_prob.view(np.uint32)[t, k] = row_bits[row]  # a copy: every bit kept
    return (grad_hidden, grad_prob), status


def unpermute_backward(
    grad_hidden_states,
    grad_expert_prob_topk,
    hidden_states_unzipped,
    zipped_expertwise_rowmap,
    expert_routemap_topk,
    token_prob_unzipped,
    using_weighted_combine,
    num_rows,
):
    """Reference ``moe_unpermute_backward`` on NumPy arrays (None as the public function
    allows).

    Returns ``((grad_hidden_states_unzipped, grad_token_prob_unzipped), status)`` with the
    int64 status words ``abi.UNPERMUTE_*`` and ``abi.UNPERMUTE_BACKWARD_*``.
    """
    rowmap = np.asarray(zipped_expertwise_rowmap)
    routemap = np.asarray(expert_routemap_topk)
    num_tokens, num_experts = rowmap.shape
    _, map_status = unpermute(
        np.zeros((num_rows, 0), np.float32),
        rowmap,
        routemap,
        np.zeros(num_rows, np.float32),
        num_tokens,
        num_experts,
    )
    status = np.full(abi.UNPERMUTE_BACKWARD_STATUS_LEN, -1, dtype=np.int64)
    status[: abi.UNPERMUTE_STATUS_LEN] = map_status

    # the (token, expert) pair of each row; a row named twice has none
    pair_of_row, twice = {}, {}
    for t in range(num_tokens):
        for expert in range(num_experts):
            row = int(rowmap[t, expert])
            if not 0 <= row < num_rows or row in twice:
                continue
            if row in pair_of_row:
                first = pair_of_row.pop(row)
                twice[row] = (first[0] * num_experts + first[1], t * num_experts + expert)
            else:
                pair_of_row[row] = (t, expert)
    if twice:
        row = min(twice)
        status[abi.UNPERMUTE_BACKWARD_DUPLICATE_ROW] = row
        status[abi.UNPERMUTE_BACKWARD_DUPLICATE_FIRST] = twice[row][0]
        status[abi.UNPERMUTE_BACKWARD_DUPLICATE_SECOND] = twice[row][1]

    grad_rows = grad_prob = None
    dots = {}  # row -> the dot-product term of its probability gradient
    if grad_hidden_states is not None:
        dy = np.asarray(grad_hidden_states)
        grad_rows = np.zeros((num_rows, dy.shape[1]), dtype=dy.dtype)
        if using_weighted_combine:
            probs = np.asarray(token_prob_unzipped, dtype=np.float32).reshape(-1)
        if using_weighted_combine and hidden_states_unzipped is not None:
            rows = sorted(pair_of_row)
            tokens = [pair_of_row[r][0] for r in rows]
            xu = np.asarray(hidden_states_unzipped)
            dots = dict(zip(rows, warp_dot(dy[tokens], xu[rows]), strict=True))
    if grad_hidden_states is not None or grad_expert_prob_topk is not None:
        grad_prob = np.zeros(num_rows, dtype=np.float32)
    for row, (t, expert) in pair_of_row.items():
        if grad_rows is not None:
            if using_weighted_combine:
                with np.errstate(invalid="ignore", over="ignore"):
                    grad_rows[row] = round_to(dy.dtype, dy[t].astype(np.float32) * probs[row])
            else:
                grad_rows[row] = dy[t]  # a copy: every bit kept
        if grad_prob is not None:
            d = dots.get(row, np.float32(0.0))
            if grad_expert_prob_topk is not None:
                for k in range(routemap.shape[1]):  # every slot filled from this row
                    if int(routemap[t, k]) == expert:
                        with np.errstate(invalid="ignore", over="ignore"):
                            d = d + np.float32(grad_expert_prob_topk[t, k])
            grad_prob[row] = round_to(np.float32, d)
    return (grad_rows, grad_prob), status


def sort_chunks(x, split_sizes, order, probs=None):
    """Reference ``moe_sort_chunks`` on NumPy arrays, bad sizes following the
    ``validate=False`` rule (``_contract_sort.BAD_SIZES_RULE``).

    Returns ``((y, probs_y), status)`` with the int64 status words ``abi.SORT_*``;
    ``probs_y`` is None when ``probs`` is.
    """
    x = np.asarray(x)
    num_rows = x.shape[0]
    sizes = [int(s) for s in split_sizes]
    status = np.full(abi.SORT_STATUS_LEN, -1, dtype=np.int64)

    # chunk c covers rows [first[c], end[c]) of x
    first, end = [], []
    row = 0  # Python ints: no overflow
    for c, size in enumerate(sizes):
        if size < 0 and status[abi.SORT_BAD_SIZE] == -1:
            status[abi.SORT_BAD_SIZE] = c
            status[abi.SORT_BAD_SIZE_VALUE] = size
        size = max(size, 0)
        if row + size > num_rows and status[abi.SORT_PAST_END] == -1:
            status[abi.SORT_PAST_END] = c
            status[abi.SORT_PAST_END_SIZE] = sizes[c]
            status[abi.SORT_PAST_END_START] = row
        first.append(min(row, num_rows))
        end.append(min(row + size, num_rows))
        row += size

    source = list(range(num_rows))  # row of x that each row of y copies
    at = 0
    for c in order:
        for r in range(first[c], end[c]):
            source[at] = r
            at += 1
    y = x[source]
    probs_y = None if probs is None else np.asarray(probs, dtype=np.float32)[source]
    return (y, probs_y), status
