"""PyTorch integration: every op of moe-numba as a differentiable torch custom op.

Called with torch tensors (CPU or CUDA), the public functions (:func:`moe_numba.moe_permute`,
:func:`moe_numba.moe_unpermute`, the two backward ops, :func:`moe_numba.moe_sort_chunks`)
go to this package's front (:mod:`._front`), which runs them directly where torch would do
nothing else with the call, and as the custom ops ``torch.ops.moe_numba.<op>`` otherwise.
The custom ops have fake kernels (``torch.compile`` traces them, ``torch.library.opcheck``
passes) and gradients (docs/gradients.rst). CPU tensors run on the Cython backend through
NumPy views of their memory; CUDA tensors run the numba.cuda kernels on torch's current
stream.

:data:`routes` counts the calls of each op per route (replay, direct, custom op): where a
program's calls go, and so where their host time goes.

Importing this package registers the ops; the public functions import it on their first call
with a torch tensor, so ``import moe_numba`` never imports torch.
"""

from ._front import ROUTES as routes  # (importing _front registers the ops and gradients)

__all__ = ["routes"]
