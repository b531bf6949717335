"""Quickstart on the CPU: route bf16 tokens to experts, run the experts, combine the results.

Run it with ``python docs/examples/quickstart.py``; it asserts its results.
"""

# [start-route]
import ml_dtypes
import numpy as np

from moe_numba import moe_permute, moe_unpermute

rng = np.random.default_rng(0)
num_tokens, hidden, topk, num_experts, alignment = 64, 256, 2, 8, 16

hidden_states = rng.standard_normal((num_tokens, hidden), dtype=np.float32)
hidden_states = hidden_states.astype(ml_dtypes.bfloat16)

# A router: each token's top-2 experts and their softmax probabilities.
logits = rng.standard_normal((num_tokens, num_experts), dtype=np.float32)
expert_routemap_topk = np.argsort(-logits, axis=1)[:, :topk].astype(np.int32)
top_logits = np.take_along_axis(logits, expert_routemap_topk, axis=1)
expert_prob_topk = np.exp(top_logits) / np.exp(top_logits).sum(axis=1, keepdims=True)
expert_prob_topk = expert_prob_topk.astype(np.float32)

# Tokens per expert (a token counts once per expert).
tokens_per_expert = np.bincount(expert_routemap_topk.ravel(), minlength=num_experts)
# [end-route]

# [start-permute]
hidden_states_unzipped, rowmap, token_prob_unzipped, scale_unzipped = moe_permute(
    hidden_states,
    None,
    expert_routemap_topk,
    expert_prob_topk,
    num_experts=num_experts,
    tokens_per_expert=tokens_per_expert.tolist(),
    padding_alignment=alignment,
)

# Expert e owns the rows offsets[e]:offsets[e + 1], its tokens first, then zero padding.
padded = -(-tokens_per_expert // alignment) * alignment
offsets = np.concatenate([[0], np.cumsum(padded)])
assert hidden_states_unzipped.shape == (offsets[-1], hidden)
# [end-permute]

# [start-check]
bits = hidden_states.view(np.uint16)
rows = hidden_states_unzipped.view(np.uint16)
for e in range(num_experts):
    tokens = np.flatnonzero((expert_routemap_topk == e).any(axis=1))  # ascending token index
    filled = rowmap[tokens, e]
    assert filled.tolist() == list(range(offsets[e], offsets[e] + len(tokens)))
    assert np.array_equal(rows[filled], bits[tokens])
    assert not rows[offsets[e] + len(tokens) : offsets[e + 1]].any()  # padding is zero
# [end-check]

# [start-unpermute]
# The experts would run here, one grouped GEMM over the row blocks; identity experts below.
expert_outputs = hidden_states_unzipped

combined, prob_topk = moe_unpermute(
    expert_outputs,
    rowmap,
    expert_routemap_topk,
    token_prob_unzipped,
    total_zipped_tokens=num_tokens,
    num_experts=num_experts,
    using_weighted_combine=True,  # sum of prob * row, in float32, rounded once to bf16
)
assert combined.dtype == ml_dtypes.bfloat16 and combined.shape == (num_tokens, hidden)
assert np.array_equal(prob_topk, expert_prob_topk)  # the probabilities come back as well

# The probabilities of a token sum to 1 (up to float32 rounding), so the weighted combine
# of unchanged rows gives the tokens back up to one bf16 rounding.
x = hidden_states.astype(np.float32)
assert np.allclose(combined.astype(np.float32), x, rtol=2**-7, atol=0)

# Unweighted, the two copies of each token add up to exactly 2 * x.
combined_sum, _ = moe_unpermute(
    expert_outputs,
    rowmap,
    expert_routemap_topk,
    token_prob_unzipped,
    total_zipped_tokens=num_tokens,
    num_experts=num_experts,
)
assert np.array_equal(combined_sum.astype(np.float32), 2 * x)
# [end-unpermute]
