"""Errors of moe-numba beyond the TypeError/ValueError of bad arguments."""


class GPUUnavailableError(RuntimeError):
    """CUDA arrays were passed but the GPU backend cannot run here; the message says why
    and what to install."""


def install_extra(extra):
    """The command that installs the optional dependencies ``extra``: from the checkout, as
    moe-numba is not on PyPI yet."""
    return f"pip install -e '.[{extra}]' in the moe-numba checkout (it is not on PyPI yet)"


INSTALL_GPU_EXTRA = (
    "install the GPU extra, which brings the CUDA compiler libraries numba needs (NVVM, "
    "NVRTC, nvJitLink): " + install_extra("gpu")
)


def numba_unavailable(error):
    """The :class:`GPUUnavailableError` for CUDA arrays on an install where ``import numba``
    fails with ``error`` (an :class:`ImportError`), to raise ``from error``."""
    return GPUUnavailableError(
        f"CUDA arrays were passed but numba.cuda cannot be imported ({error}); " + INSTALL_GPU_EXTRA
    )


# numba-cuda's exception types for missing CUDA compiler libraries, by name (they live in
# modules that differ between numba-cuda versions)
MISSING_TOOLKIT_ERRORS = ("DynamicLibNotFoundError", "NvvmSupportError", "NvrtcSupportError")
