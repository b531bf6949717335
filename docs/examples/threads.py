"""OpenMP threads of the CPU backend: results do not depend on the thread count.

Run it with ``python docs/examples/threads.py``; it asserts bit-identical results.
"""

# [start]
import ml_dtypes
import numpy as np

import moe_cpu
from moe_numba import moe_permute, moe_unpermute

rng = np.random.default_rng(1)
num_tokens, hidden, topk, num_experts = 512, 64, 4, 16
hidden_states = rng.standard_normal((num_tokens, hidden), dtype=np.float32)
hidden_states = hidden_states.astype(ml_dtypes.bfloat16)
routemap = np.argsort(rng.random((num_tokens, num_experts)), axis=1)[:, :topk].astype(np.int32)
probs = rng.random((num_tokens, topk), dtype=np.float32)
tokens_per_expert = np.bincount(routemap.ravel(), minlength=num_experts).tolist()


def run():
    rows, rowmap, row_probs, _ = moe_permute(
        hidden_states, None, routemap, probs, num_experts, tokens_per_expert, 8
    )
    combined, _ = moe_unpermute(
        rows, rowmap, routemap, row_probs, num_tokens, num_experts, using_weighted_combine=True
    )
    return rows.view(np.uint16), rowmap, combined.view(np.uint16)


print("OpenMP built in:", moe_cpu.openmp_enabled())
print("threads:", moe_cpu.get_num_threads())  # OMP_NUM_THREADS or the core count

try:
    moe_cpu.set_num_threads(1)
    assert moe_cpu.get_num_threads() == 1
    serial = run()
    moe_cpu.set_num_threads(4)  # ignored (stays 1) when built without OpenMP
    parallel = run()
finally:
    moe_cpu.set_num_threads(None)  # back to the OpenMP default

assert all(np.array_equal(a, b) for a, b in zip(serial, parallel, strict=True))
# [end]
