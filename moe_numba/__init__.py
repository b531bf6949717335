"""moe-numba: Mixture-of-Experts token permute/unpermute on NumPy arrays and CUDA arrays.

``moe_permute`` ("unzip") copies every (token, expert) pair into an expert-major, padded
buffer; ``moe_unpermute`` ("zip") sums each token's expert rows back into one row. The
contract is PaddlePaddle's ``moe_permute``/``moe_unpermute``, with its undefined corners
defined. NumPy arrays run on the CPU (``moe_cpu``, Cython/OpenMP); CUDA arrays (numba device
arrays, CuPy arrays, PyTorch CUDA tensors) run numba.cuda kernels on their GPU.

Importing this package does not import numba, torch or CuPy.
"""

from ._api import moe_permute, moe_unpermute
from ._api_backward import moe_permute_backward, moe_unpermute_backward
from ._api_sort import moe_sort_chunks
from ._cache import clear
from ._errors import GPUUnavailableError

__all__ = [
    "GPUUnavailableError",
    "clear",
    "moe_permute",
    "moe_permute_backward",
    "moe_sort_chunks",
    "moe_unpermute",
    "moe_unpermute_backward",
    "__version__",
]
__version__ = "0.1.0"
