"""The array-library adapters: each implements the protocol, and copies keep every bit.

torch's adapter is exercised on CPU tensors (its methods work on any device), the simulator's
where the CUDA simulator is on; the CUDA-only paths run in the GPU suite.
"""

import numpy as np
import pytest

from _cases import HIDDEN_DTYPES, assert_same_bits, random_bits
from moe_numba import _libraries
from moe_numba._libraries import (
    ArrayLibrary,
    DeviceLibrary,
    NumpyLibrary,
    SimulatorLibrary,
    TorchLibrary,
    library_named,
)
from moe_numba._transfer import gpu_library, to_device, to_host

ADAPTERS = (NumpyLibrary, *_libraries.GPU_LIBRARIES)


PROTOCOL = {
    "serves",
    "usable",
    "shape",
    "dtype",
    "is_contiguous",
    "key",
    "device",
    "empty",
    "from_numpy",
    "to_host",
    "copy",
}
DEVICE_PROTOCOL = {"buffer", "upload", "stream"}


def _members(protocol):
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_the_protocols_name_these_members():
    assert _members(ArrayLibrary) == PROTOCOL
    assert _members(DeviceLibrary) == DEVICE_PROTOCOL


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_every_adapter_implements_the_protocol(adapter):
    wanted = PROTOCOL | (DEVICE_PROTOCOL if adapter.location == "cuda" else set())
    missing = sorted(name for name in wanted if not callable(getattr(adapter, name, None)))
    assert not missing, f"{adapter.__name__} lacks {missing}"
    assert adapter.location in ("cpu", "cuda")
    assert isinstance(adapter.usable(), bool)


@pytest.mark.parametrize("dtype", HIDDEN_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_adapter_copies_keep_every_bit(dtype):
    numpy = library_named("numpy")
    x = random_bits(np.random.default_rng(0), (3, 5), dtype)
    y = numpy.from_numpy(x)
    assert y is not x and numpy.dtype(y) == np.dtype(dtype) and numpy.shape(y) == (3, 5)
    assert_same_bits(numpy.to_host(y), x)
    z = numpy.empty((3, 5), dtype, like=y)
    numpy.copy(z, y)
    assert_same_bits(z, x)


@pytest.mark.parametrize("dtype", HIDDEN_DTYPES, ids=lambda d: np.dtype(d).name)
def test_torch_adapter_copies_keep_every_bit(dtype):
    torch = pytest.importorskip("torch")
    adapter = TorchLibrary()
    like = torch.empty(0)  # a CPU tensor: the adapter puts copies on its device
    x = random_bits(np.random.default_rng(1), (4, 3), dtype)
    t = adapter.from_numpy(x, like)
    assert t.device == like.device and adapter.dtype(t) == np.dtype(dtype)
    assert adapter.shape(t) == (4, 3) and adapter.is_contiguous(t)
    assert_same_bits(adapter.to_host(t), x)
    u = adapter.empty((4, 3), dtype, like)
    adapter.copy(u, t)
    assert_same_bits(adapter.to_host(u), x)
    assert not TorchLibrary.serves(t)  # a CPU tensor is no CUDA array


def test_torch_cpu_tensors_are_host_arrays():
    torch = pytest.importorskip("torch")
    adapter = _libraries.classify(torch.zeros(2))
    assert isinstance(adapter, _libraries.TorchCpuLibrary)
    assert adapter.location == "cpu" and adapter.device(torch.zeros(2)) == "cpu"
    # one tensor type, two adapters: the lookup by type still asks the device
    if torch.cuda.is_available():
        assert isinstance(_libraries.array_library(torch.zeros(2, device="cuda")), TorchLibrary)
        assert isinstance(_libraries.array_library(torch.zeros(2)), _libraries.TorchCpuLibrary)


@pytest.mark.sim  # (a skip outside the simulator left it to no run: the simulator's selects sim)
@pytest.mark.parametrize("dtype", HIDDEN_DTYPES, ids=lambda d: np.dtype(d).name)
def test_simulator_adapter_copies_keep_every_bit(dtype):
    x = random_bits(np.random.default_rng(2), (2, 3), dtype)
    d = to_device(x, "numba")  # numba's device arrays are the simulator's
    adapter = _libraries.classify(d)
    assert isinstance(adapter, SimulatorLibrary) and library_named("numba") is adapter
    assert adapter.dtype(d) == np.dtype(dtype) and adapter.key(d) is not None
    assert_same_bits(to_host(d), x)
    assert_same_bits(adapter.buffer(d).sim_array, x)
    e = adapter.empty((2, 3), dtype, d)
    adapter.copy(e, d)
    assert_same_bits(adapter.to_host(e), x)
    name = gpu_library()
    assert SimulatorLibrary.usable() and name is not None and library_named(name).usable()
