"""A buffer of more than 2**31 elements (R * H), on a real GPU: 64-bit row offsets."""

import ml_dtypes
import numpy as np
import pytest

from _cases import assert_same_bits, counts_of
from moe_numba import moe_permute, moe_unpermute, oracle

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_buffer_past_two_to_the_31_elements(backend):
    if backend.name != "torch":
        pytest.skip("runs once, with torch tensors on a real GPU (needs ~20 GB of GPU memory)")
    tokens, hidden, experts, topk = 65536, 7168, 64, 8
    rng = np.random.default_rng(0)
    scores = rng.random((tokens, experts), dtype=np.float32)
    routemap = np.argpartition(scores, topk - 1, axis=1)[:, :topk].astype(np.int32)
    probs = rng.random((tokens, topk), dtype=np.float32)
    x = rng.integers(0, 2**16, (tokens, hidden), dtype=np.uint16).view(ml_dtypes.bfloat16)
    counts = counts_of(routemap, experts).tolist()
    d = backend.to_device
    rows, rowmap, row_probs, _ = moe_permute(
        d(x), None, d(routemap), d(probs), experts, counts, 128
    )
    assert rows.shape[0] * hidden > 2**31
    (want_rows, want_rowmap, want_probs, _), _ = oracle.permute(
        x, None, routemap, probs, experts, counts, 128
    )
    host_rows = backend.to_host(rows)
    assert_same_bits(host_rows, want_rows, "hidden_states_unzipped")
    assert_same_bits(backend.to_host(rowmap), want_rowmap, "rowmap")
    assert_same_bits(backend.to_host(row_probs), want_probs, "token_prob_unzipped")

    # the combine of the last tokens reads rows past 2**31 elements
    combined, _ = moe_unpermute(
        rows, rowmap, d(routemap), row_probs, tokens, experts, using_weighted_combine=True
    )
    last = slice(tokens - 64, tokens)
    (want, _), _ = oracle.unpermute(
        host_rows,
        want_rowmap[last],
        routemap[last],
        want_probs,
        64,
        experts,
        using_weighted_combine=True,
    )
    assert_same_bits(backend.to_host(combined)[last], want, "hidden_states")
