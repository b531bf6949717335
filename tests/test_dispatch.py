"""Which backend runs a call, and what happens when arrays live in different places."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from moe_numba import GPUUnavailableError, moe_permute, moe_unpermute
from moe_numba._arrays import is_cuda_array, locate
from test_errors import permute_defaults, unpermute_defaults


def test_import_is_cheap():
    """Importing moe_numba loads neither numba nor any GPU library."""
    code = (
        "import sys, moe_numba; "
        "print(sorted(m for m in ('numba', 'torch', 'cupy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_numpy_goes_to_cpu():
    assert locate({"a": np.zeros(2), "b": None}) == "cpu"
    assert not is_cuda_array(np.zeros(2))


def test_mixed_host_and_device_is_a_type_error(backend):
    if backend.name == "cpu":
        pytest.skip("needs a device backend")
    args = permute_defaults()
    args["expert_routemap_topk"] = backend.to_device(args["expert_routemap_topk"])
    with pytest.raises(
        TypeError,
        match=r"hidden_states is a numpy.ndarray \(host array\) but "
        r"expert_routemap_topk is a .* \(CUDA array\)",
    ):
        moe_permute(**args)
    args = unpermute_defaults()
    args["hidden_states_unzipped"] = backend.to_device(args["hidden_states_unzipped"])
    with pytest.raises(TypeError, match="nothing is copied between host and device"):
        moe_unpermute(**args)


def test_outputs_are_of_the_callers_kind(backend):
    args = {
        k: backend.to_device(v) if isinstance(v, np.ndarray) else v
        for k, v in permute_defaults().items()
    }
    outputs = moe_permute(**args, return_expert_indices=True)
    for out in outputs:
        assert type(out) is type(args["hidden_states"])
    assert backend.to_host(outputs[0]).dtype == ml_dtypes.bfloat16


def test_torch_cpu_tensor_among_numpy_arrays_is_refused():
    torch = pytest.importorskip("torch")
    args = permute_defaults()
    args["expert_prob_topk"] = torch.from_numpy(args["expert_prob_topk"])
    with pytest.raises(
        TypeError, match="expert_prob_topk is a torch.Tensor but hidden_states is a numpy.ndarray"
    ):
        moe_permute(**args)


def test_cuda_arrays_without_a_usable_gpu_explain_what_is_missing(monkeypatch):
    from numba import config, cuda

    from moe_numba import _gpu

    monkeypatch.setattr(_gpu, "_BACKEND", None)
    monkeypatch.setattr(config, "ENABLE_CUDASIM", 0)
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    with pytest.raises(GPUUnavailableError, match=r"finds no usable GPU/driver.*nvidia-smi"):
        _gpu.gpu_backend()


def test_cuda_arrays_without_numba_cuda_name_the_extra(monkeypatch):
    from moe_numba import _gpu

    monkeypatch.setattr(_gpu, "_BACKEND", None)
    monkeypatch.setitem(sys.modules, "numba", None)
    with pytest.raises(GPUUnavailableError, match=r"pip install 'moe-numba\[gpu\]'"):
        _gpu.gpu_backend()


def test_missing_cuda_compiler_libraries_name_the_extra():
    from moe_numba.kernels._launch import RawKernel

    class NvvmSupportError(Exception):
        pass

    class Dispatcher:
        def compile(self, signature):
            raise NvvmSupportError("libNVVM cannot be found")

    kernel = RawKernel(Dispatcher(), signature=None, name="gather")
    with pytest.raises(
        GPUUnavailableError,
        match=r"cannot compile the GPU kernel gather: "
        r"libNVVM cannot be found; install the GPU extra.*moe-numba\[gpu\]",
    ):
        kernel.cu_kernel(0)
