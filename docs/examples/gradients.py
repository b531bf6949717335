"""The gradients of a permute -> unpermute round trip, by hand: 2 tokens, 3 experts, top-2.

Run it with ``python docs/examples/gradients.py``; it asserts every output.
"""

# [start]
import numpy as np

from moe_numba import (
    moe_permute,
    moe_permute_backward,
    moe_unpermute,
    moe_unpermute_backward,
)

x = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
routes = np.array([[2, 0], [2, 2]], dtype=np.int32)  # token 1 names expert 2 twice
probs = np.array([[0.25, 0.75], [0.5, 0.125]], dtype=np.float32)
rows, rowmap, row_probs, _ = moe_permute(
    x, None, routes, probs, 3, [1, 0, 2], 1, validate=False
)  # validate=False: the repeated expert's later slot is ignored
y, slot_probs = moe_unpermute(rows, rowmap, routes, row_probs, 2, 3, using_weighted_combine=True)

# backward, from the gradients of y and slot_probs
dy = np.array([[1.0, 10.0], [100.0, 1000.0]], dtype=np.float32)
d_slot_probs = np.array([[1.0, 2.0], [4.0, 8.0]], dtype=np.float32)
d_rows, d_row_probs = moe_unpermute_backward(
    dy, d_slot_probs, rows, rowmap, routes, row_probs,
    using_weighted_combine=True, num_rows=rows.shape[0],
)  # fmt: skip
dx, dprobs = moe_permute_backward(d_rows, d_row_probs, rowmap, routes)
# [end]

# [start-check]
assert rowmap.tolist() == [[0, -1, 1], [-1, -1, 2]]  # row 0: expert 0; rows 1, 2: expert 2
assert row_probs.tolist() == [0.75, 0.25, 0.5]
# each row gets its token's gradient times the row's probability
assert d_rows.tolist() == [[0.75, 7.5], [0.25, 2.5], [50.0, 500.0]]
# dot(dy[t], rows[r]) plus the gradients of the slots filled from row r:
# row 0: 1*1 + 10*2 + slot 1 (2.0); row 1: 21 + slot 0 (1.0);
# row 2: 100*3 + 1000*4 + slots 0 and 1 of token 1 (4.0 + 8.0)
assert d_row_probs.tolist() == [23.0, 22.0, 4312.0]
# the token's rows summed back; a repeated slot (token 1, slot 1) gets no probability gradient
assert dx.tolist() == [[1.0, 10.0], [50.0, 500.0]]
assert dprobs.tolist() == [[22.0, 23.0], [4312.0, 0.0]]
# [end-check]
