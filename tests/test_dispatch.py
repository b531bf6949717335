"""Which backend runs a call, and what happens when arrays live in different places."""

import ast
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import moe_numba
from moe_numba import GPUUnavailableError, backends, moe_permute, moe_unpermute
from moe_numba._dispatch import locate
from moe_numba._libraries import array_library, classify, library_named
from test_errors import permute_defaults, unpermute_defaults


def packages_loaded_by(statement):
    """The top-level packages in sys.modules after ``statement`` runs in a fresh process."""
    code = f"import sys; {statement}; print(sorted({{m.partition('.')[0] for m in sys.modules}}))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(ast.literal_eval(out))


def test_import_is_cheap():
    """Importing moe_numba loads neither numba nor any GPU library."""
    assert not packages_loaded_by("import moe_numba") & {"numba", "torch", "cupy"}


def test_moe_cpu_imports_nothing_of_moe_numba():
    """The CPU backend is a package of its own: the package graph is a tree."""
    loaded = packages_loaded_by("import moe_cpu")
    assert "moe_cpu" in loaded and "moe_numba" not in loaded


def test_numpy_goes_to_cpu():
    assert locate({"a": np.zeros(2), "b": None}) == "cpu"
    assert classify(np.zeros(2)).location == "cpu"


class _DLPackOnlyCudaArray:
    """A CUDA array that offers DLPack but no __cuda_array_interface__ (as JAX arrays do)."""

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, stream=None):
        raise AssertionError("moe_numba must not try to use this array")


class _CudaArrayInterfaceObject:
    __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_one_classifier_serves_dispatch_and_lookup():
    """An object passes locate exactly when an adapter serves it."""
    cuda_object = _CudaArrayInterfaceObject()
    assert classify(cuda_object).name == "numba" and classify(cuda_object).location == "cuda"
    assert locate({"a": cuda_object}) == "cuda"
    for refused in (_DLPackOnlyCudaArray(), [1.0, 2.0], 3.0):
        assert classify(refused) is None
        with pytest.raises(
            TypeError, match="^a must be a NumPy array, a torch CPU tensor or a CUDA array "
        ):
            locate({"a": refused})
        with pytest.raises(TypeError, match="no array library of moe-numba serves"):
            array_library(refused)


def test_meta_tensors_have_a_location_but_no_backend():
    """A meta tensor is classified (so that a mix with data tensors names both devices), but
    no backend runs meta tensors alone: the custom ops' fake kernels give their outputs."""
    torch = pytest.importorskip("torch")
    meta = torch.zeros(2, device="meta")
    assert classify(meta).location == "meta"
    with pytest.raises(TypeError, match="^a is a meta tensor, which holds no data"):
        locate({"a": meta, "b": torch.zeros(2, device="meta")})
    with pytest.raises(TypeError, match=r"^a is on cpu but b is on meta \(a meta tensor holds"):
        locate({"a": np.zeros(2), "b": meta})


def test_dlpack_only_cuda_array_is_refused_by_name():
    args = permute_defaults()
    args["expert_prob_topk"] = _DLPackOnlyCudaArray()
    with pytest.raises(
        TypeError,
        match=r"expert_prob_topk must be a NumPy array, a torch CPU tensor or a CUDA array .*; got "
        r"test_dispatch._DLPackOnlyCudaArray \(a CUDA array known only through DLPack: pass it "
        r"as a torch tensor or a CuPy array, e.g. torch.from_dlpack\(expert_prob_topk\)",
    ):
        moe_permute(**args)


def test_a_cuda_tokens_per_expert_is_refused():
    args = permute_defaults()
    args["tokens_per_expert"] = _DLPackOnlyCudaArray()
    with pytest.raises(TypeError, match="tokens_per_expert must be a host sequence of ints"):
        moe_permute(**args)


def test_libraries_by_name():
    assert library_named("numpy").from_numpy(np.arange(3)).tolist() == [0, 1, 2]
    with pytest.raises(
        ValueError,
        match="library must be one of cudasim, cupy, numba, numpy, torch, torch-cpu; got 'jax'",
    ):
        library_named("jax")


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

    moe_numba.clear()  # (the GPU backend too: the next one checks for a GPU again)
    monkeypatch.setattr(config, "ENABLE_CUDASIM", 0)
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    with pytest.raises(GPUUnavailableError, match=r"finds no usable GPU/driver.*nvidia-smi"):
        backends.gpu_backend()


def test_cuda_arrays_without_numba_cuda_name_the_extra(monkeypatch):
    moe_numba.clear()
    monkeypatch.setitem(sys.modules, "numba", None)
    with pytest.raises(
        GPUUnavailableError, match=r"pip install -e '\.\[gpu\]' in the moe-numba checkout"
    ):
        backends.gpu_backend()


def test_missing_cuda_compiler_libraries_name_the_extra():
    from moe_numba.runtime._launch import RawKernel

    class NvvmSupportError(Exception):
        pass

    class Dispatcher:
        def compile(self, signature):
            raise NvvmSupportError("libNVVM cannot be found")

    kernel = RawKernel(Dispatcher(), signature=None, name="gather")
    with pytest.raises(
        GPUUnavailableError,
        match=r"cannot compile the GPU kernel gather: "
        r"libNVVM cannot be found; install the GPU extra.*pip install -e '\.\[gpu\]' in the "
        r"moe-numba checkout",
    ):
        kernel.cu_kernel(0)


def test_the_cpu_backend_offers_a_method_per_op():
    """``moe_numba.backends``' promise: one method per op, named as the op, taking ``(plan,
    arrays, empty)`` (the GPU backend's is checked in the simulator, test_cuda_kernels)."""
    import inspect

    from moe_numba.ops import OPS

    backend = backends.cpu_backend()
    for op in OPS:
        method = getattr(backend, op.name)
        assert list(inspect.signature(method).parameters)[:3] == ["plan", "arrays", "empty"]
