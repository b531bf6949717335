"""PyTorch integration: ``moe_permute`` / ``moe_unpermute`` as differentiable custom ops.

Called with torch tensors (CPU or CUDA), :func:`moe_numba.moe_permute` and
:func:`moe_numba.moe_unpermute` run the torch custom ops ``torch.ops.moe_numba.permute`` and
``torch.ops.moe_numba.unpermute``. They have fake kernels (``torch.compile`` traces them,
``torch.library.opcheck`` passes) and gradients (docs/gradients.rst) computed by the custom ops
``torch.ops.moe_numba.permute_backward`` and ``unpermute_backward``. CPU tensors run on the
Cython backend through NumPy views of their memory; CUDA tensors run the numba.cuda kernels on
torch's current stream.

Importing this module registers the ops; the public functions import it on their first call
with a torch tensor, so ``import moe_numba`` never imports torch.
"""

from . import _calls  # noqa: F401  (registers the ops and their gradients)

__all__: list[str] = []
