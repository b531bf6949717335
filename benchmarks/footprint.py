"""The memory a benchmark's shape needs (:mod:`moe_numba._footprint` has the rest: what there
is, and the refusal): each command line refuses a shape that cannot fit before it allocates
anything.

The estimate is the sum of the arrays that are alive together at the run's peak, the
transient ones of the input generation included (the scores and their sort indices of every
token and expert, the rows in float32 before they are cast). Each row count is its upper
bound, ``R <= T K + E (A - 1)`` permuted rows; index traffic smaller than a row is left out.
"""

from __future__ import annotations

from moe_numba._footprint import Need, permute_output_bytes


def bench_need(case, device):
    """The :class:`Need` of timing ``case`` (a :class:`.cases.Case`) on ``device``."""
    t, h, e, k, i, s = (
        case.tokens,
        case.hidden,
        case.experts,
        case.topk,
        case.itemsize,
        case.scale_width,
    )
    rows = t * k + e * (case.alignment - 1)
    inputs = t * (h * i + s * 4 + k * 8)  # rows (+ scales), routemap, probabilities
    generating = t * e * 12 + t * h * 4  # float32 scores, their int64 partition; float32 rows
    # one permute kept for the unpermute and the timed call's own; the unpermute's output
    outputs = 2 * permute_output_bytes(t, rows, h, i, e, s) + t * (h * i + k * 4)
    copies = (t + rows) * (h * i + s * 4) + (t * k + t) * h * i  # the rooflines' buffers
    if device == "cuda":
        return Need(inputs + generating, inputs + outputs + copies)
    # the NumPy baseline: its own inputs, its permute, the float32 combine and a gather
    baseline = inputs + permute_output_bytes(t, rows, h, i, e) + 2 * t * h * 4
    return Need(inputs + outputs + copies + max(generating, baseline), 0)


def gradients_need(case):
    """The :class:`Need` of ``python -m benchmarks gradients`` at ``case`` on a GPU: the
    forward permute and its inputs, the three calls' inputs (uploaded once each) and the
    largest call's outputs, the largest copy; on the host, the inputs being generated and the
    forward's rows fetched back."""
    t, h, e, k, i = case.tokens, case.hidden, case.experts, case.topk, case.itemsize
    rows = t * k + e * (case.alignment - 1)
    row = h * i
    inputs = t * (row + k * 8)
    forward = inputs + permute_output_bytes(t, rows, h, i, e)
    grads = 2 * rows * row + t * row + t * k * 4 + rows * 4  # dXu, Xu, dY, g, row probs
    outputs = rows * row + t * row + t * k * 4
    copy = (t + t * k + rows) * row
    generating = t * e * 12 + t * h * 4 + inputs
    host = generating + permute_output_bytes(t, rows, h, i, e) + grads
    return Need(host, forward + grads + outputs + copy)


def memory_need(tokens, hidden, topk, experts, alignment):
    """The :class:`Need` of ``python -m benchmarks memory`` on a GPU: a bf16 layer step
    without the experts' GEMMs (rows, probabilities, routing and the output's gradient in;
    the permuted rows, their product with the probabilities and both their gradients; the
    output and the rows' gradient), the float32 draws the inputs come from."""
    t, h, e, k = tokens, hidden, experts, topk
    rows = t * k + e * (alignment - 1)
    inputs = t * (h * 2 + k * 12) + t * h * 2 + t * e * 4 + t * h * 4
    step = permute_output_bytes(t, rows, h, 2, e) + 3 * rows * h * 2 + 2 * t * h * 2
    return Need(0, inputs + step)
