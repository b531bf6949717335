"""Shared pieces of the torch tests: devices, NumPy <-> torch copies, routing cases, bits.

Every torch test runs on the CPU and, where ``torch.cuda.is_available()``, on CUDA.
"""

from __future__ import annotations

from contextlib import contextmanager

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _cases import counts_of, random_probs, random_routing, random_values  # noqa: E402

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="torch finds no CUDA GPU"),
    ],
)
DEVICES = ["cpu", CUDA]

TORCH_DTYPES = {
    np.dtype(ml_dtypes.bfloat16): torch.bfloat16,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# the ml_dtypes types that NumPy cannot hand torch: their bits go through as integers
_VIEWED = {
    np.dtype(ml_dtypes.bfloat16): torch.bfloat16,
    np.dtype(ml_dtypes.float8_e4m3fn): torch.float8_e4m3fn,
    np.dtype(ml_dtypes.float8_e5m2): torch.float8_e5m2,
}
_VIEWED_BACK = {t: d for d, t in _VIEWED.items()}


_INTEGERS = {1: np.uint8, 2: np.int16}  # (NumPy's side of _BITS)


def from_numpy(array):
    """A CPU tensor sharing the memory of a NumPy array (ml_dtypes' types included)."""
    dtype = _VIEWED.get(array.dtype)
    if dtype is None:
        return torch.from_numpy(array)
    return torch.from_numpy(array.view(_INTEGERS[array.itemsize])).view(dtype)


def to_numpy(t):
    """A tensor copied to a NumPy array of the same dtype (ml_dtypes' types included)."""
    t = t.detach().cpu()
    dtype = _VIEWED_BACK.get(t.dtype)
    if dtype is None:
        return t.numpy().copy()
    return t.view(_BITS[t.element_size()]).numpy().view(dtype).copy()


@contextmanager
def torch_ops():
    """The names of the ops that torch's dispatcher runs in the ``with`` block, as torch's
    profiler records them (it leaves the routes as they are): ``moe_numba::permute`` where
    a call took the custom op, ``aten::empty`` where it allocated. The list is filled in
    when the block ends, by an exception too."""
    from torch.profiler import ProfilerActivity, profile

    names = []
    # (acc_events: the events of the whole block, not only of the profiler's last cycle;
    # some torch releases warn without it)
    profiler = profile(activities=[ProfilerActivity.CPU], acc_events=True)
    try:
        with profiler:
            yield names
    finally:
        names.extend(event.name for event in profiler.events())


def custom_ops(names):
    """The custom ops of moe_numba among the op ``names`` of :func:`torch_ops`."""
    return [name for name in names if name.startswith("moe_numba::")]


def to_torch(x, device):
    """A NumPy array (any dtype, ml_dtypes included) copied to a tensor on ``device``."""
    if not isinstance(x, np.ndarray):
        return x
    return from_numpy(np.ascontiguousarray(x)).clone().to(device)


def bits(t):
    """The tensor's elements as integers of the same width (for bitwise comparisons)."""
    t = t.detach().cpu().contiguous()
    return t.view(_BITS[t.element_size()])


def assert_same_bits(actual, expected):
    """Same dtype, shape and bits; ``expected`` may be a NumPy array."""
    if isinstance(expected, np.ndarray):
        expected = from_numpy(np.ascontiguousarray(expected))
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.equal(bits(actual), bits(expected))


def routing(seed, num_tokens=7, topk=3, num_experts=4, alignment=2, dtype=np.float32, hidden=5):
    """NumPy inputs of a valid permute: rows, routing map, probabilities, capacities."""
    rng = np.random.default_rng(seed)
    routemap = random_routing(rng, num_tokens, topk, num_experts)
    return dict(
        hidden_states=random_values(rng, (num_tokens, hidden), dtype, special=0.0),
        expert_routemap_topk=routemap,
        expert_prob_topk=random_probs(rng, (num_tokens, topk)),
        num_experts=num_experts,
        tokens_per_expert=counts_of(routemap, num_experts).tolist(),
        padding_alignment=alignment,
    )


def rows_needed(case):
    """``sum_e ceil(n_e / A) * A`` of a :func:`routing` case."""
    a = case["padding_alignment"]
    return sum(-(-n // a) * a for n in case["tokens_per_expert"])
