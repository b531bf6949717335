"""What happens to malformed routing: ``validate=True`` raises, ``validate=False`` follows rules.

Run it with ``python docs/examples/malformed.py``; it asserts every rule it shows.
"""

# [start-helpers]
import numpy as np

from moe_numba import moe_permute, moe_unpermute

hidden = 4
hidden_states = np.arange(3 * hidden, dtype=np.float32).reshape(3, hidden)
probs = np.array([[0.5, 0.25], [0.125, 1.0], [0.75, 0.0625]], dtype=np.float32)


def permute(routemap, tokens_per_expert, validate, **options):
    """moe_permute with 3 experts, alignment 1, and the expert ids of ``routemap``."""
    return moe_permute(
        hidden_states,
        None,
        np.array(routemap, dtype=np.int32),
        probs,
        num_experts=3,
        tokens_per_expert=tokens_per_expert,
        padding_alignment=1,
        validate=validate,
        **options,
    )


def raises_value_error(*args, **kwargs):
    try:
        permute(*args, validate=True, **kwargs)
    except ValueError as error:
        return str(error)
    raise AssertionError("expected a ValueError")


# [end-helpers]

# [start-bad-id]
# An id outside [0, num_experts) other than -1: the slot counts as -1.
routemap = [[0, 7], [1, -1], [2, 0]]
print(raises_value_error(routemap, [2, 1, 1]))  # expert_routemap_topk[0, 1] = 7 ...
_, rowmap, prob, _ = permute(routemap, [2, 1, 1], validate=False)
assert rowmap.tolist() == [[0, -1, -1], [-1, 2, -1], [1, -1, 3]]
# [end-bad-id]

# [start-duplicate]
# The same expert twice in one row: the first slot (lowest k) counts, its probability is used.
routemap = [[1, 1], [0, -1], [2, -1]]
print(raises_value_error(routemap, [1, 1, 1]))  # ... repeats an expert of an earlier slot ...
_, rowmap, prob, _ = permute(routemap, [1, 1, 1], validate=False)
assert rowmap.tolist() == [[-1, 1, -1], [0, -1, -1], [-1, -1, 2]]
assert prob.tolist() == [0.125, 0.5, 0.75]
# [end-duplicate]

# [start-capacity]
# tokens_per_expert disagrees with the routing map: it is a capacity. Expert 0 receives 3
# tokens but has room for 2 (token 2, the highest index, is dropped); expert 1 receives 1
# token and has room for 2 (its second row is padding).
routemap = [[0, 1], [0, -1], [0, 2]]
print(raises_value_error(routemap, [2, 2, 1]))  # tokens_per_expert[0] = 2 but ... 3 tokens
out, rowmap, prob, _ = permute(routemap, [2, 2, 1], validate=False)
assert rowmap.tolist() == [[0, 2, -1], [1, -1, -1], [-1, -1, 4]]
assert prob.tolist() == [0.5, 0.125, 0.25, 0.0, 0.0625]
assert not out[3].any()  # the unfilled row of expert 1 is padding: zeros
# [end-capacity]

# [start-override]
# override_buffer_size: capacities come from the routing map itself, and R rows are allocated.
# A buffer too small drops the tokens whose row would fall outside it.
routemap = [[0, 1], [0, -1], [0, 2]]
print(raises_value_error(routemap, None, override_buffer_size=3))  # ... needs 5 rows ...
out, rowmap, prob, _ = permute(routemap, None, validate=False, override_buffer_size=3)
assert rowmap.tolist() == [[0, -1, -1], [1, -1, -1], [2, -1, -1]]
# A buffer larger than needed: rows past the last expert are zero padding.
out, rowmap, prob, _, experts = permute(
    routemap, None, validate=False, override_buffer_size=8, return_expert_indices=True
)
assert rowmap.tolist() == [[0, 3, -1], [1, -1, -1], [2, -1, 4]]
assert experts.tolist() == [0, 0, 0, 1, 2, -1, -1, -1]
assert not out[5:].any() and not prob[5:].any()
# [end-override]

# [start-unpermute]
# moe_unpermute: a rowmap entry outside [-1, R) and a routing id outside [-1, E) count as -1.
rows = np.ones((2, hidden), dtype=np.float32)
rowmap = np.array([[0, 9], [-1, 1]], dtype=np.int32)  # 9 is not a row of a 2-row buffer
routemap = np.array([[0, 1], [1, 5]], dtype=np.int32)  # 5 is not an expert id
row_probs = np.array([0.5, 0.25], dtype=np.float32)
try:
    moe_unpermute(rows, rowmap, routemap, row_probs, total_zipped_tokens=2, num_experts=2)
except ValueError as error:
    print(error)  # zipped_expertwise_rowmap[0, 1] = 9 is not a row ...
else:
    raise AssertionError("expected a ValueError")
combined, prob_topk = moe_unpermute(
    rows, rowmap, routemap, row_probs, total_zipped_tokens=2, num_experts=2, validate=False
)
assert combined.tolist() == [[1.0] * hidden, [1.0] * hidden]
assert prob_topk.tolist() == [[0.5, 0.0], [0.25, 0.0]]
# [end-unpermute]
