"""The worked example of Paddle's ``moe_permute`` docs: 3 tokens, 3 experts, top-8 with -1 slots.

Run it with ``python docs/examples/worked_example.py``; it asserts every output.
"""

# [start]
import ml_dtypes
import numpy as np

from moe_numba import moe_permute, moe_unpermute

num_tokens, hidden, topk, num_experts = 3, 128, 8, 3
rng = np.random.default_rng(0)
hidden_states = rng.standard_normal((num_tokens, hidden), dtype=np.float32)
hidden_states = hidden_states.astype(ml_dtypes.bfloat16)

# expert id per top-k slot, -1 = no expert
expert_routemap_topk = np.array(
    [
        [-1, 0, -1, -1, 2, -1, -1, -1],  # token 0 -> experts 0 and 2
        [1, -1, -1, -1, -1, -1, -1, -1],  # token 1 -> expert 1
        [-1, -1, 1, -1, -1, -1, -1, -1],  # token 2 -> expert 1
    ],
    dtype=np.int32,
)
expert_prob_topk = np.zeros((num_tokens, topk), dtype=np.float32)
expert_prob_topk[0, 1], expert_prob_topk[0, 4] = 0.75, 0.25
expert_prob_topk[1, 0] = 1.0
expert_prob_topk[2, 2] = 0.5

hidden_states_unzipped, rowmap, token_prob_unzipped, scale_unzipped, expert_indices = moe_permute(
    hidden_states,
    None,  # no scale
    expert_routemap_topk,
    expert_prob_topk,
    num_experts=num_experts,
    tokens_per_expert=[1, 2, 1],
    padding_alignment=2,
    return_expert_indices=True,
)
# [end]

# [start-check]
# 3 experts, each padded to a multiple of 2 rows: 2 + 2 + 2 = 6 rows
assert hidden_states_unzipped.shape == (6, hidden)
assert hidden_states_unzipped.dtype == ml_dtypes.bfloat16
assert rowmap.tolist() == [[0, -1, 4], [-1, 2, -1], [-1, 3, -1]]
assert token_prob_unzipped.tolist() == [0.75, 0.0, 1.0, 0.5, 0.25, 0.0]
assert expert_indices.tolist() == [0, -1, 1, 1, 2, -1]
assert scale_unzipped.shape == (0,) and scale_unzipped.dtype == np.float32

bits = hidden_states.view(np.uint16)  # compare bit patterns: rows are copied as raw bytes
rows = hidden_states_unzipped.view(np.uint16)
for row, token in [(0, 0), (2, 1), (3, 2), (4, 0)]:
    assert np.array_equal(rows[row], bits[token])
assert not rows[[1, 5]].any()  # padding rows are zero

# where each expert's block ends: a grouped GEMM's offsets, for this buffer and for one row
# fewer (too few: validate=False drops what does not fit, here expert 2's padding row)
for buffer_size, ends in [(-1, [2, 4, 6]), (5, [2, 4, 5])]:
    *_, expert_offsets = moe_permute(
        hidden_states,
        None,
        expert_routemap_topk,
        expert_prob_topk,
        num_experts=num_experts,
        tokens_per_expert=[1, 2, 1],
        padding_alignment=2,
        override_buffer_size=buffer_size,
        validate=False,
        return_expert_offsets=True,
    )
    assert expert_offsets.tolist() == ends and expert_offsets.dtype == np.int32
# [end-check]

# [start-unpermute]
# Unweighted combine: a token's rows are summed in ascending expert id.
combined, prob_topk = moe_unpermute(
    hidden_states_unzipped,
    rowmap,
    expert_routemap_topk,
    token_prob_unzipped,
    total_zipped_tokens=num_tokens,
    num_experts=num_experts,
)
x = hidden_states.astype(np.float32)
assert np.array_equal(combined.astype(np.float32), x * [[2.0], [1.0], [1.0]])
assert np.array_equal(prob_topk, expert_prob_topk)

# Weighted combine: fma(row, prob, acc) per row; 0.75 * x + 0.25 * x == x exactly here.
combined, _ = moe_unpermute(
    hidden_states_unzipped,
    rowmap,
    expert_routemap_topk,
    token_prob_unzipped,
    total_zipped_tokens=num_tokens,
    num_experts=num_experts,
    using_weighted_combine=True,
)
assert np.array_equal(combined.astype(np.float32), x * [[1.0], [1.0], [0.5]])
# [end-unpermute]
