"""The gradient ops on a backend against the oracle: the checks the gradient tests share."""

import re

import numpy as np
import pytest

from _cases import (
    assert_close_combine,
    assert_same_bits,
    counts_of,
    metadata,
    random_routing,
)
from moe_numba import moe_permute_backward, moe_unpermute_backward, oracle
from moe_numba.ops import PERMUTE_BACKWARD, UNPERMUTE_BACKWARD


def with_gradients(backend):
    """``backend``, once it offers the gradient ops (the GPU ones come separately)."""
    if backend.name != "cpu":
        from moe_numba.backends import gpu_backend

        if not hasattr(gpu_backend(), "permute_backward"):
            pytest.xfail("the GPU backend has no gradient ops yet")
    return backend


def run_on(backend, op, *arrays, **flags):
    dev = backend.to_device
    outputs = op(*(None if x is None else dev(x) for x in arrays), **flags)
    return tuple(None if x is None else backend.to_host(x) for x in outputs)


def routed(rng, num_tokens, topk, num_experts, alignment, *, repeats=0.0, drop=False):
    """A routing map (with -1 slots, repeated experts at rate ``repeats``) and the row map the
    oracle's permute makes of it (``drop``: capacities below the counts drop tokens)."""
    routemap = random_routing(rng, num_tokens, topk, num_experts, repeats=repeats)
    capacities = counts_of(routemap, num_experts)
    if drop:
        capacities = rng.integers(0, capacities + 1)
    (_, rowmap, _, _), _ = oracle.permute(
        np.zeros((num_tokens, 1), np.float32),
        None,
        routemap,
        np.zeros(routemap.shape, np.float32),
        num_experts,
        capacities,
        alignment,
    )
    num_rows = int(oracle.padded_rows(capacities, alignment).sum())
    return routemap, rowmap, num_rows


def spoil(rng, rowmap, routemap, num_rows, num_experts):
    """Bad row-map entries (outside [-1, R), and rows named twice) and bad routing ids."""
    rowmap, routemap = rowmap.copy(), routemap.copy()
    wrong = rng.random(rowmap.shape) < 0.1
    rowmap[wrong] = rng.integers(-5, num_rows + 5, rowmap.shape)[wrong]
    bad = rng.random(routemap.shape) < 0.1
    routemap[bad] = rng.integers(-4, num_experts + 4, routemap.shape)[bad]
    return rowmap, routemap


def token_with_40_rows(rng, num_rows=100):
    """A malformed (routing map, row map): 45 experts, K = 4; token 0 names 2 of them but its
    row map names 40 rows (more than a warp lists at once), token 1 names 4 rows."""
    routemap = np.array([[3, 44, -1, 3], [0, 1, 2, 40]], np.int64)
    rowmap = np.full((2, 45), -1, np.int32)
    rowmap[0, :40] = rng.permutation(num_rows)[:40]
    rowmap[1, [0, 1, 2, 40]] = [95, 96, 97, 98]
    return routemap, rowmap


def expected_error(status, op, arrays, scalars):
    """The message that the oracle's status words give for this call of ``op`` (its
    declaration), or None."""
    plan = op.check(metadata(arrays), scalars)
    try:
        op.raise_for(status, plan)
    except ValueError as error:
        return str(error)
    return None


def compare(actual, expected, names):
    for a, b, what in zip(actual, expected, names, strict=True):
        if b is None:
            assert a is None, what
        else:
            assert_same_bits(a, b, what)


def unchanged(inputs, copies):
    for after, before in zip(inputs, copies, strict=True):
        if before is not None:
            assert_same_bits(after, before, "an input")


def check_permute_backward(backend, grad_rows, grad_probs, rowmap, routemap, validate=True):
    """Run on ``backend`` and compare with the oracle (outputs, or the error when validating);
    check that no input changed. Returns the oracle's outputs."""
    arrays = (grad_rows, grad_probs, rowmap, routemap)
    copies = [None if x is None else x.copy() for x in arrays]
    expected, status = oracle.permute_backward(*arrays)
    op = PERMUTE_BACKWARD
    message = expected_error(status, op, op.arrays(*arrays), op.scalars(validate=True))
    if validate and message is not None:
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            run_on(backend, moe_permute_backward, *arrays)
    else:
        actual = run_on(backend, moe_permute_backward, *arrays, validate=validate)
        compare(actual, expected, ("grad_hidden_states", "grad_expert_prob_topk"))
    unchanged(arrays, copies)
    return expected


def check_unpermute_backward(backend, *arrays, weighted, num_rows, validate=True):
    """As :func:`check_permute_backward`, for ``moe_unpermute_backward(*arrays, ...)``."""
    copies = [None if x is None else x.copy() for x in arrays]
    expected, status = oracle.unpermute_backward(*arrays, weighted, num_rows)
    op = UNPERMUTE_BACKWARD
    scalars = op.scalars(using_weighted_combine=weighted, num_rows=num_rows, validate=True)
    message = expected_error(status, op, op.arrays(*arrays), scalars)
    flags = dict(using_weighted_combine=weighted, num_rows=num_rows)
    if validate and message is not None:
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            run_on(backend, moe_unpermute_backward, *arrays, **flags)
    else:
        actual = run_on(backend, moe_unpermute_backward, *arrays, **flags, validate=validate)
        names = ("grad_hidden_states_unzipped", "grad_token_prob_unzipped")
        if weighted and arrays[0] is not None and not backend.exact_fma:
            # the simulator's fma rounds twice: the dot product within 1 ulp per term of the
            # same sum of absolute values
            magnitude = oracle.unpermute_backward(
                *(None if x is None else np.abs(x) for x in arrays[:3]),
                *arrays[3:5], np.abs(arrays[5]), weighted, num_rows,
            )[0][1]  # fmt: skip
            compare(actual[:1], expected[:1], names[:1])
            assert_close_combine(actual[1], expected[1], magnitude, arrays[0].shape[1], names[1])
        else:
            compare(actual, expected, names)
    unchanged(arrays, copies)
    return expected
