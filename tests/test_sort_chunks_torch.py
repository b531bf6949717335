"""moe_sort_chunks on torch tensors: the custom ops (CPU tensors here; CUDA tensors where a
GPU is present) give the NumPy bits, their gradient is the inverse sort, opcheck passes and
torch.compile traces them."""

import ml_dtypes
import numpy as np
import pytest

from _cases import assert_same_bits, random_bits
from moe_numba import moe_sort_chunks


def _torch():
    return pytest.importorskip("torch", reason="the torch custom ops need torch")


def _tensor(array, device):
    from _torch_cases import to_torch

    return to_torch(array, device)


def _array(tensor):
    from _torch_cases import to_numpy

    return to_numpy(tensor)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize(
    "dtype",
    [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.float32, np.uint16, np.int8, np.complex64],
)
def test_torch_matches_numpy(device, dtype):
    torch = _torch()
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rng = np.random.default_rng(11)
    x = random_bits(rng, (9, 5), dtype)
    probs = random_bits(rng, (9,), np.float32)
    sizes, order = [2, 0, 4, 1], [3, 0, 2, 1]
    expected, expected_probs = moe_sort_chunks(x, sizes, order, probs)
    y, probs_y = moe_sort_chunks(_tensor(x, device), sizes, order, _tensor(probs, device))
    assert isinstance(y, torch.Tensor) and y.device.type == device
    assert_same_bits(_array(y), expected, "y")
    assert_same_bits(_array(probs_y), expected_probs, "probs_y")
    assert moe_sort_chunks(_tensor(x, device), sizes, order)[1] is None
    # sizes in a tensor: a CPU tensor counts as host sizes, a CUDA one runs the device op
    y, _ = moe_sort_chunks(_tensor(x, device), torch.tensor(sizes, device=device), order)
    assert_same_bits(_array(y), expected, "y (sizes in a tensor)")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("sizes_on_device", [False, True])
def test_torch_gradient_is_the_inverse_sort(device, sizes_on_device):
    torch = _torch()
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rng = np.random.default_rng(12)
    sizes, order = [3, 1, 0, 2], [2, 3, 0, 1]
    x = _tensor(rng.standard_normal((8, 4)).astype(ml_dtypes.bfloat16), device)
    probs = _tensor(rng.random(8, dtype=np.float32), device)
    dy = _tensor(rng.standard_normal((8, 4)).astype(ml_dtypes.bfloat16), device)
    dp = _tensor(rng.standard_normal(8).astype(np.float32), device)
    x.requires_grad_(True)
    probs.requires_grad_(True)
    if sizes_on_device:  # (sizes in a tensor, also on the CPU, as the schema allows)
        sizes_tensor = torch.tensor(sizes, device=device)
        y, probs_y, _ = torch.ops.moe_numba.sort_chunks(x, probs, sizes_tensor, order, None, True)
    else:
        y, probs_y = moe_sort_chunks(x, sizes, order, probs)
    torch.autograd.backward([y, probs_y], [dy, dp])
    inverse = np.argsort(order).tolist()  # (inverse[order[i]] = i)
    back_sizes = [sizes[c] for c in order]
    expected_x, expected_p = moe_sort_chunks(_array(dy), back_sizes, inverse, _array(dp))
    assert_same_bits(_array(x.grad), expected_x, "grad x")
    assert_same_bits(_array(probs.grad), expected_p, "grad probs")


def test_torch_gradient_of_the_rows_alone():
    """Only the rows reach the loss: no probability gradient; and the reverse."""
    torch = _torch()
    x = torch.randn(6, 3, requires_grad=True)
    probs = torch.rand(6, requires_grad=True)
    y, probs_y = moe_sort_chunks(x, [2, 4], [1, 0], probs)
    y.sum().backward()
    assert probs.grad is None and torch.equal(x.grad, torch.ones(6, 3))
    x.grad = None
    y, probs_y = moe_sort_chunks(x, [2, 4], [1, 0], probs)
    (probs_y * torch.arange(6.0)).sum().backward()
    assert x.grad is None
    assert probs.grad.tolist() == [4.0, 5.0, 0.0, 1.0, 2.0, 3.0]


def test_torch_opcheck():
    torch = _torch()
    sort_chunks = torch.ops.moe_numba.sort_chunks.default

    def leaf(*shape, dtype=torch.float32):
        return torch.randn(*shape).to(dtype).requires_grad_(True)

    # (x, probs, sizes in a tensor, order, host sizes, validate)
    cases = [
        (leaf(7, 3), leaf(7), None, [2, 0, 1], [2, 1, 3], True),
        (leaf(7, 3, dtype=torch.bfloat16), None, None, [2, 0, 1], [2, 1, 3], True),
        (leaf(5, 2), leaf(5), None, [1, 0], [0, 5], True),
        (leaf(0, 2), None, None, [], [], True),
        (leaf(7, 3), leaf(7), torch.tensor([2, 1, 3]), [2, 0, 1], None, True),
        (leaf(7, 3), None, torch.tensor([4, 3], dtype=torch.int32), [1, 0], None, False),
    ]
    for args in cases:
        torch.library.opcheck(sort_chunks, args)  # every test: schema, autograd, fake, aot


def test_torch_compile_traces_forward_and_backward():
    torch = _torch()

    def step(x, probs):
        y, probs_y = moe_sort_chunks(x, [2, 1, 3], [2, 0, 1], probs)
        return (y * y).sum() + probs_y.sum()

    x = torch.randn(6, 4, requires_grad=True)
    probs = torch.rand(6, requires_grad=True)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    compiled(x, probs).backward()
    expected_x, expected_p = x.grad.clone(), probs.grad.clone()
    x.grad = probs.grad = None
    step(x, probs).backward()
    assert torch.equal(x.grad, expected_x) and torch.equal(probs.grad, expected_p)


def test_torch_errors_as_for_numpy():
    torch = _torch()
    x = torch.zeros(6, 2)
    with pytest.raises(ValueError, match=r"order\[2\] = 0 repeats order\[1\]"):
        moe_sort_chunks(x, [2, 1, 3], [2, 0, 0])
    with pytest.raises(ValueError, match=r"split_sizes must be >= 0; got split_sizes\[0\] = -2"):
        moe_sort_chunks(x, torch.tensor([-2, 1, 3]), [2, 0, 1])
    with pytest.raises(TypeError, match=r"x is a torch.Tensor but probs is a numpy.ndarray"):
        moe_sort_chunks(x, [2, 1, 3], [2, 0, 1], np.zeros(6, np.float32))
    with pytest.raises(TypeError, match=r"probs is a torch.Tensor but x is a numpy.ndarray"):
        moe_sort_chunks(np.zeros((6, 2), np.float32), [2, 1, 3], [2, 0, 1], torch.zeros(6))
    # sizes are host values whatever holds them: a CPU tensor with NumPy rows is fine
    y, _ = moe_sort_chunks(np.arange(6.0).reshape(6, 1), torch.tensor([2, 1, 3]), [2, 0, 1])
    assert y.ravel().tolist() == [3.0, 4.0, 5.0, 0.0, 1.0, 2.0]


@pytest.mark.filterwarnings("ignore:`torch.jit.(trace|script)` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("requires_grad", [False, True])
def test_jit_trace(requires_grad):
    """torch.jit.trace records the custom op, and the traced program gives the eager bits,
    for new inputs too, and its gradient."""
    torch = _torch()

    def step(x, probs):
        return moe_sort_chunks(x, [2, 1, 3], [2, 0, 1], probs)

    x = torch.randn(6, 4, requires_grad=requires_grad)
    probs = torch.rand(6, requires_grad=requires_grad)
    traced = torch.jit.trace(step, (x, probs), check_trace=False)
    assert "moe_numba::sort_chunks" in str(traced.graph)
    x2 = torch.randn(6, 4, requires_grad=requires_grad)
    for got, expected in zip(traced(x2, probs), step(x2, probs), strict=True):
        assert torch.equal(got, expected)
    if requires_grad:
        traced(x2, probs)[0].sum().backward()
        assert torch.equal(x2.grad, torch.ones(6, 4))
