"""The one decision of the torch path: may a call skip torch's dispatcher?

Every call with torch tensors can run as the registered custom op
(``torch.ops.moe_numba.*``): torch then sees it, and every transform (``jit.trace``,
``make_fx``, ``torch.export``, ``torch.compile``, ``torch.func``, forward-mode AD, fake and
meta tensors, dispatch and function modes) records, traces or refuses it as it does any op.
The custom op costs host time, so a call skips the dispatcher, and runs the op's
implementation directly (:mod:`._calls`), only when torch would do nothing else with it. That
is read from torch's own state, not from a list of transforms:

- the thread's dispatch keys are those of plain eager execution: no functorch layer
  (``vmap``, ``grad``, ``jvp``), no Python dispatch mode (``make_fx``, fake tensor mode,
  any ``TorchDispatchMode``), no ``jit.trace`` tracer, nor any key a future transform adds;
- no ``__torch_function__`` mode is active (``set_default_device``, ``TorchFunctionMode``);
- no forward-mode AD level is open (dual tensors carry tangents the op must see);
- dynamo is not tracing the call (``torch.compiler.is_compiling``);
- every tensor is a plain ``torch.Tensor`` (no subclass: fake, functional and user tensor
  subclasses dispatch themselves) on the CPU or a CUDA device. Arguments that are not
  tensors are no concern of torch's: the direct route refuses them with the core's errors.

Autograd recording (grad mode with an input that requires a gradient) does not need the
dispatcher: a direct call is recorded through a ``torch.autograd.Function`` made of the same
functions as the op's registered autograd (:mod:`._autograd`).
"""

import torch
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
from torch.autograd import forward_ad

_Tensor = torch.Tensor
_include = torch._C._dispatch_tls_local_include_set
# the keys a thread has in plain eager execution (inference mode has fewer), as the bits of
# a DispatchKeySet: any other key in the thread's include set is a transform's
_OTHER_KEYS = ~(
    torch._C.DispatchKeySet(torch._C.DispatchKey.BackendSelect)
    .add(torch._C.DispatchKey.ADInplaceOrView)
    .raw_repr()
)
_function_mode = torch._C._is_torch_function_mode_enabled
_compiling = torch.compiler.is_compiling
_functorch_interpreters = retrieve_all_functorch_interpreters
_TRANSFORM = torch._C._functorch.TransformType


def eager():
    """Whether the thread is in plain eager execution (see the module docstring): all that a
    replay needs (a replay's key holds its tensors' exact type and device); a direct call
    needs :func:`plain_tensors` too."""
    return not (
        _compiling()  # (first: dynamo traces this function, and reads no further)
        or _include().raw_repr() & _OTHER_KEYS
        or _function_mode()
        or forward_ad._current_level >= 0
    )


def plain_tensors(arrays):
    """Whether every tensor of ``arrays`` (tensors or None) is a plain ``torch.Tensor`` on the
    CPU or a CUDA device: with :func:`eager`, a call on them may skip the dispatcher (torch
    would do nothing else with it; see the module docstring)."""
    for x in arrays:
        if type(x) is _Tensor:
            if not (x.is_cuda or x.is_cpu):
                return False
        elif isinstance(x, _Tensor):
            return False
    return True


def refuse_unsupported(name, arrays):
    """Raise ``NotImplementedError`` naming the transform and ``name`` (the public function)
    when a transform the custom ops cannot serve is active for a call on ``arrays``: their
    gradients are reverse-mode autograd formulas, which ``torch.func``'s ``grad`` and
    ``jvp`` and forward-mode AD do not use (without this, forward AD would silently give no
    tangent)."""
    if _compiling():  # (dynamo traces the op itself; these lookups would break its graph)
        return
    transform = None
    for interpreter in _functorch_interpreters():
        key = interpreter.key()
        if key == _TRANSFORM.Grad:
            transform = "torch.func.grad (or vjp, jacrev)"
        elif key == _TRANSFORM.Jvp:
            transform = "torch.func.jvp (or jacfwd)"
    if transform is None and forward_ad._current_level >= 0:
        for x in arrays:
            if isinstance(x, _Tensor) and forward_ad.unpack_dual(x).tangent is not None:
                transform = "forward-mode AD (torch.autograd.forward_ad)"
    if transform is not None:
        raise NotImplementedError(
            f"{name} does not support {transform}: its torch custom op has reverse-mode "
            "gradients only (loss.backward() and torch.autograd.grad, create_graph=True "
            "included); compute the gradient with torch.autograd instead"
        )
