"""PaddlePaddle integration: Paddle tensors in and out, Paddle's own signatures, autograd.

- :func:`moe_numba.moe_permute` and the other public functions take ``paddle.Tensor``
  arguments (CPU tensors on the Cython backend through zero-copy NumPy views, GPU tensors on
  the numba kernels through their addresses on Paddle's current stream) and return Paddle
  tensors on the same place; ``moe_permute`` and ``moe_unpermute`` are differentiable through
  ``paddle.autograd.PyLayer``.
- :func:`moe_permute` and :func:`moe_unpermute` here have the signatures of
  ``paddle.nn.functional.moe_permute`` / ``moe_unpermute``.
- :func:`install` makes ``paddle.nn.functional``'s two functions run on CPU tensors, where
  Paddle has no kernel; :func:`uninstall` undoes it.
- :func:`as_numpy` is the NumPy view of a CPU tensor that the CPU backend runs on (no copy;
  bfloat16 and float8 as ``ml_dtypes`` dtypes).

Importing this package imports Paddle. See docs/paddle.rst.
"""

import sys

import paddle

from ._bridge import as_numpy
from ._functional import moe_permute, moe_unpermute
from ._install import install, uninstall

# paddle.jit.to_static(full_graph=True) rewrites the Python a function calls into a static
# graph: moe-numba's code (host code between kernels) must run as written, and then refuses a
# static graph's tensors by name
paddle.jit.ignore_module([sys.modules[__name__.rpartition(".")[0]]])

__all__ = ["as_numpy", "install", "moe_permute", "moe_unpermute", "uninstall"]
