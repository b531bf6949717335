"""A Hugging Face transformers experts backend built on ``moe_permute`` / ``moe_unpermute``.

transformers 5 lets a model pick the implementation of its MoE experts layer by name
(``experts_implementation=...`` at load time, or ``model.set_experts_implementation``);
:func:`register` adds ``"moe_numba"`` to that registry. The experts layer then runs as:

1. routing clean-up on the device: an expert named twice by one token keeps its first slot,
   with the weights of every slot naming it summed there (``moe_permute`` counts only the
   first slot of a duplicate; the experts layer of transformers applies the expert once per
   slot, which is the same sum); the weights are cast to float32 (the contract's
   probability dtype); ids outside ``[0, E)`` (expert-parallel sentinels) are left to the
   permute and the unpermute, which treat them as -1 (``validate=False``);
2. :func:`moe_numba.moe_permute` into an expert-major buffer of ``round_up(T * K, 8)`` rows
   (``override_buffer_size``: counts taken on the device, no host round trip), each expert's
   rows unpadded (``padding_alignment=1``: the grouped GEMM takes any group size, and padding
   would only add rows to multiply), with the end row of each expert's block
   (``return_expert_offsets=True``, written by the permute's own kernels);
3. over those offsets, the up (or gate-up) projection, the model's own gate or activation,
   the down projection, as ``torch._grouped_mm``, with per-row biases gathered by the
   permute's ``expert_indices``;
4. :func:`moe_numba.moe_unpermute` with the weighted combine (float32 accumulation, one
   rounding).

Nothing in it reads a device value on the host, so ``torch.compile(fullgraph=True)`` traces it
(and nothing stops a CUDA graph from capturing it); the only exception is the per-expert loop
used where ``torch._grouped_mm`` cannot run (see :func:`experts_forward`).

Importing this module imports torch; importing ``moe_numba`` does not import this module.
"""

from __future__ import annotations

from ._errors import install_extra

try:
    import torch
except ModuleNotFoundError as error:
    if error.name != "torch":
        raise
    raise ModuleNotFoundError(
        "moe_numba.transformers needs torch (and transformers>=5): "
        + install_extra("transformers"),
        name="torch",
    ) from error

from ._contract import PermuteArrays, PermuteScalars, UnpermuteArrays, UnpermuteScalars  # noqa: E402
from .ops import PERMUTE, UNPERMUTE  # noqa: E402
from .torch import _front  # noqa: E402

__all__ = ["experts_forward", "register"]

NAME = "moe_numba"

# The permute buffer's row count is rounded up to this many rows so that a [rows, n] view
# transposed by autograd (the weight gradient of a grouped GEMM) keeps the 16-byte stride
# alignment that torch._grouped_mm requires, for every 2-byte and 4-byte dtype.
_ROW_MULTIPLE = 8

# dtypes torch._grouped_mm multiplies (eagerly, on the CPU and on CUDA)
_GROUPED_MM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def register(name: str = NAME) -> str:
    """Add the moe-numba experts backend to transformers' ``ExpertsInterface``.

    Safe to call more than once: registering the same function under a name again changes
    nothing.

    Parameters
    ----------
    name : str, default "moe_numba"
        The name that models pass as ``experts_implementation``.

    Returns
    -------
    str
        ``name``.

    Raises
    ------
    TypeError
        ``name`` is not a non-empty str.
    ImportError
        transformers (5 or newer, with ``transformers.integrations.moe``) is not installed.

    Examples
    --------
    >>> import moe_numba.transformers
    >>> moe_numba.transformers.register()  # doctest: +SKIP
    'moe_numba'
    >>> model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="moe_numba")
    ... # doctest: +SKIP
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty str, got {name!r}")
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError as error:
        raise ImportError(
            "moe_numba.transformers.register needs transformers>=5 "
            "(transformers.integrations.moe.ExpertsInterface): " + install_extra("transformers")
        ) from error
    ExpertsInterface.register(name, experts_forward)
    return name


def experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The experts layer of a transformers MoE model, on ``moe_permute`` / ``moe_unpermute``.

    The signature of an ``ExpertsInterface`` function: ``self`` is the model's experts module
    (a class decorated with ``use_experts_implementation``). Its weights are read as the
    library's own ``grouped_mm`` backend reads them: ``gate_up_proj`` ([E, 2I, H], or
    [E, H, 2I] when ``self.is_transposed``) and ``self._apply_gate`` for gated experts,
    ``up_proj`` and ``self.act_fn`` otherwise; ``down_proj``; the ``*_bias`` tensors ([E, n])
    when ``self.has_bias``; ``self.post_expert_norm`` when ``self.has_post_expert_norm``.

    ``torch._grouped_mm`` multiplies the expert blocks where it can (bfloat16, float16 or
    float32 tensors whose strides are multiples of 16 bytes; under ``torch.compile``, float16
    and float32 go through an opaque custom op that calls it, as its compiled form takes only
    bfloat16). Elsewhere (widths that are not a multiple of 16 bytes, width 1 among them, a
    GPU before compute capability 8.0, a torch without it) each expert's block is multiplied
    on its own, which needs the offsets on the host: one device-to-host copy per call, and a
    graph break under ``torch.compile``.

    Parameters
    ----------
    hidden_states : torch.Tensor of shape (T, H)
        Token rows, cast to the weights' dtype (as transformers' ``grouped_mm`` does), which
        must be bfloat16, float16 or float32 (the dtypes ``moe_permute`` takes).
    top_k_index : torch.Tensor of shape (T, K), integer
        Expert id of each slot; ids outside ``[0, E)`` select nothing; an id named twice by one
        token counts twice.
    top_k_weights : torch.Tensor of shape (T, K), floating point
        Routing weight of each slot.

    Returns
    -------
    torch.Tensor of shape (T, H)
        ``sum_k top_k_weights[t, k] * expert_{top_k_index[t, k]}(hidden_states[t])``, dtype of
        ``hidden_states``.

    Raises
    ------
    TypeError
        An argument is not a tensor, or has an unsupported dtype.
    ValueError
        An argument has the wrong shape.
    """
    _check_inputs(hidden_states, top_k_index, top_k_weights)
    num_experts = int(self.num_experts)
    has_gate = getattr(self, "has_gate", True)
    has_bias = getattr(self, "has_bias", False)
    transposed = getattr(self, "is_transposed", False)
    if has_gate:
        up_weight, up_bias = self.gate_up_proj, getattr(self, "gate_up_proj_bias", None)
    else:
        up_weight, up_bias = self.up_proj, getattr(self, "up_proj_bias", None)
    down_weight, down_bias = self.down_proj, getattr(self, "down_proj_bias", None)
    if not has_bias:
        up_bias = down_bias = None

    num_tokens, top_k = top_k_index.shape
    if num_tokens * top_k == 0:  # no rows: torch._grouped_mm refuses an empty operand
        return torch.zeros_like(hidden_states)
    routes, permuted = permute_rows(
        _contiguous(_as(hidden_states, up_weight.dtype)),
        top_k_index,
        top_k_weights,
        num_experts,
        return_expert_indices=has_bias,
    )
    rows, rowmap, row_probs, offsets = permuted[0], permuted[1], permuted[2], permuted[-1]
    # a row past the filled ones selects bias row E, an appended zero row: the grouped GEMM
    # leaves those rows (and their gradients) undefined, and this keeps them out of the bias
    # gradient
    row_experts = None
    if has_bias:
        row_experts = permuted[4].remainder(num_experts + 1)  # (-1 -> E)

    out = _grouped_linear(rows, up_weight, up_bias, offsets, row_experts, transposed)
    out = self._apply_gate(out) if has_gate else self.act_fn(out)
    out = _grouped_linear(out, down_weight, down_bias, offsets, row_experts, transposed)
    if getattr(self, "has_post_expert_norm", False):
        # the norm's weight gradient sums over every row it sees: give it defined rows
        filled = torch.arange(out.shape[0], device=out.device) < offsets[-1]
        out = self.post_expert_norm(torch.where(filled.unsqueeze(1), out, 0))
    combined = combine_rows(out, rowmap, routes, row_probs, num_experts)
    return _as(combined, hidden_states.dtype)


def permute_rows(rows, top_k_index, top_k_weights, num_experts, return_expert_indices=False):
    """The layer's routing clean-up and permute: every token's rows in an expert-major buffer
    of ``round_up(T * K, 8)`` unpadded rows, counted on the device.

    Parameters
    ----------
    rows : torch.Tensor of shape (T, H), contiguous
        The token rows, in a dtype ``moe_permute`` takes.
    top_k_index, top_k_weights : torch.Tensor of shape (T, K)
        As :func:`merged_routing` takes them.
    num_experts : int
        E.
    return_expert_indices : bool, default False
        Also ask the permute for each row's expert.

    Returns
    -------
    routes : torch.Tensor of shape (T, K)
        The routing map the permute took (:func:`merged_routing`).
    permuted : tuple of torch.Tensor
        ``moe_permute``'s outputs, ``expert_offsets`` last (``validate=False``).
    """
    routes, probs = merged_routing(top_k_index, top_k_weights, num_experts)
    return routes, permute_routes(rows, routes, probs, num_experts, return_expert_indices)


def permute_routes(rows, routes, probs, num_experts, return_expert_indices=False):
    """:func:`permute_rows` after its routing clean-up: ``moe_permute``'s outputs for the
    routing map and float32 weights that :func:`merged_routing` returns."""
    num_tokens, top_k = routes.shape
    num_rows = -(-num_tokens * top_k // _ROW_MULTIPLE) * _ROW_MULTIPLE
    scalars = PermuteScalars(
        num_experts=num_experts,
        padding_alignment=1,
        return_expert_indices=return_expert_indices,
        override_buffer_size=num_rows,
        validate=False,
        return_expert_offsets=True,
    )
    return _front.call(PERMUTE, PermuteArrays(rows, None, routes, probs), scalars)


def combine_rows(rows, rowmap, routes, row_probs, num_experts):
    """The layer's unpermute: each token's expert rows weighted by their probabilities and
    summed in float32 (``moe_unpermute``, ``validate=False``), for the outputs of
    :func:`permute_rows`.

    Returns
    -------
    torch.Tensor of shape (T, H)
        The dtype of ``rows``.
    """
    scalars = UnpermuteScalars(
        total_zipped_tokens=rowmap.shape[0],
        num_experts=num_experts,
        using_weighted_combine=True,
        validate=False,
    )
    arrays = UnpermuteArrays(rows, rowmap, routes, row_probs)
    return _front.call(UNPERMUTE, arrays, scalars)[0]


def _contiguous(tensor):
    """``tensor.contiguous()``, without a call into torch where it is contiguous already."""
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def merged_routing(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing map and float32 weights for ``moe_permute``, on the device, sync-free.

    Where one token names an expert in several slots, the first of them carries the sum of
    their weights and the later ones become -1; every other slot keeps its id and its weight
    bit for bit. Ids outside ``[0, num_experts)`` (expert-parallel sentinels) stay as they
    are: ``moe_permute`` and ``moe_unpermute`` with ``validate=False`` treat them as -1.

    Parameters
    ----------
    top_k_index : torch.Tensor of shape (T, K), int32 or int64
        Expert id of each slot.
    top_k_weights : torch.Tensor of shape (T, K), floating point
        Routing weight of each slot.
    num_experts : int
        E.

    Returns
    -------
    routes : torch.Tensor of shape (T, K), the dtype of ``top_k_index``, contiguous
    probs : torch.Tensor of shape (T, K), float32, contiguous
        Differentiable in ``top_k_weights``: a merged slot passes its gradient to every slot
        it summed.
    """
    ids = _contiguous(top_k_index)
    if ids.shape[1] == 1:
        return ids, _contiguous(_as(top_k_weights, torch.float32))
    # same[t, k, j]: slots k and j name one expert; each slot takes the sum of the weights of
    # its expert's slots, in float32 (each weight widened exactly; slot order, zeros in
    # between: exact for a slot that shares its expert with none), and a slot whose expert
    # an earlier slot named becomes -1 (its sum then reaches nothing)
    same = ids[:, :, None] == ids[:, None, :]
    probs = torch.where(same, top_k_weights[:, None, :], 0.0).sum(2, dtype=torch.float32)
    ids = torch.where(same.tril(-1).any(2), -1, ids)
    return ids, probs


def _as(tensor, dtype):
    """``tensor.to(dtype)``, without a call into torch where it has that dtype already (a
    layer's host time is mostly such calls at decode sizes)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _grouped_linear(rows, weight, bias, offsets, row_experts, transposed):
    """``rows @ weight[e].T (+ bias[e])`` for the rows of each expert e (``weight[e]`` as
    stored when ``transposed``)."""
    if not transposed:
        weight = weight.transpose(-2, -1)
    out = grouped_mm(_as(rows, weight.dtype), weight, offsets)
    if bias is not None:
        out = out + torch.nn.functional.pad(bias, (0, 0, 0, 1))[row_experts]
    return out


def grouped_mm(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``out[i] = rows[i] @ weight[e]`` for the rows ``offsets[e - 1] <= i < offsets[e]``.

    Rows at or past ``offsets[-1]`` of ``out`` (and of the gradient of ``rows``) are left
    undefined, as by ``torch._grouped_mm``.

    Parameters
    ----------
    rows : torch.Tensor of shape (R, n)
    weight : torch.Tensor of shape (E, n, m)
    offsets : torch.Tensor of shape (E,), int32
        Cumulative end row of each expert.

    Returns
    -------
    torch.Tensor of shape (R, m)
    """
    if _grouped_mm_runs(rows, weight):
        if torch.compiler.is_compiling() and rows.dtype != torch.bfloat16:
            return torch.ops.moe_numba_transformers.grouped_mm(rows, weight, offsets)
        return torch._grouped_mm(rows, weight, offs=offsets)
    return _looped_mm(rows, weight, offsets)


def _grouped_mm_runs(rows, weight):
    """Whether torch._grouped_mm takes these operands."""
    if not hasattr(torch, "_grouped_mm") or rows.dtype not in _GROUPED_MM_DTYPES:
        return False
    if weight.device.type == "cuda" and not _ampere_or_newer(weight.device.index):
        return False
    size = rows.element_size()
    # torch._grouped_mm needs each matrix's leading stride (the one that is not its unit
    # stride) to be a multiple of 16 bytes. Every matrix of the call and of its backward is
    # rows.shape[-1] or weight.shape[-1] wide, so both widths must be, width 1 too: a [R, 1]
    # matrix's strides are both 1, and torch takes the row stride 1 as the leading one.
    widths = (rows.shape[-1], weight.shape[-1])
    if any((w * size) % 16 for w in widths):
        return False
    return all(s == 1 or (s * size) % 16 == 0 for s in (*rows.stride(), *weight.stride()))


_AMPERE_OR_NEWER: dict[int, bool] = {}  # CUDA device index -> compute capability >= 8.0


def _ampere_or_newer(index):
    """Whether CUDA device ``index`` has compute capability 8.0 or more: asked of torch once
    per device (it reads the device's properties anew at every call, and a layer asks twice).
    While dynamo traces, torch is asked (the answer is a constant of the graph; the cache
    must not change under a trace)."""
    if torch.compiler.is_compiling():
        return torch.cuda.get_device_capability(index) >= (8, 0)
    found = _AMPERE_OR_NEWER.get(index)
    if found is None:
        found = _AMPERE_OR_NEWER[index] = torch.cuda.get_device_capability(index) >= (8, 0)
    return found


def _looped_mm(rows, weight, offsets):
    """Each expert's block multiplied on its own (the offsets come to the host)."""
    blocks, start = [], 0
    for expert, end in enumerate(offsets.tolist()):
        blocks.append(rows[start:end] @ weight[expert])
        start = end
    blocks.append(rows.new_zeros(rows.shape[0] - start, weight.shape[-1]))
    return torch.cat(blocks)


# torch.compile traces torch._grouped_mm only in bfloat16 (its meta function refuses other
# dtypes); an opaque custom op runs the same call for float16 and float32 inside a graph.
@torch.library.custom_op("moe_numba_transformers::grouped_mm", mutates_args=())
def _grouped_mm_op(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(rows, weight, offs=offsets)


@_grouped_mm_op.register_fake
def _(rows, weight, offsets):
    return rows.new_empty(rows.shape[0], weight.shape[-1])


def _grouped_mm_setup(ctx, inputs, output):
    rows, weight, offsets = inputs
    ctx.save_for_backward(rows, weight, offsets)


def _grouped_mm_backward(ctx, grad):
    rows, weight, offsets = ctx.saved_tensors
    grad = grad.contiguous()
    grad_rows = grad_weight = None
    if ctx.needs_input_grad[0]:
        grad_rows = _grouped_mm_op(grad, weight.transpose(-2, -1), offsets)
    if ctx.needs_input_grad[1]:
        grad_weight = _grouped_mm_weight_grad(rows, grad, offsets)
    return grad_rows, grad_weight, None


@torch.library.custom_op("moe_numba_transformers::grouped_mm_weight_grad", mutates_args=())
def _grouped_mm_weight_grad(
    rows: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    # experts with no rows get a zero block
    return torch._grouped_mm(rows.transpose(0, 1), grad, offs=offsets)


@_grouped_mm_weight_grad.register_fake
def _(rows, grad, offsets):
    return rows.new_empty(offsets.shape[0], rows.shape[1], grad.shape[1])


_grouped_mm_op.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup)


def _check_inputs(hidden_states, top_k_index, top_k_weights):
    for name, value in (
        ("hidden_states", hidden_states),
        ("top_k_index", top_k_index),
        ("top_k_weights", top_k_weights),
    ):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if hidden_states.dim() != 2:
        raise ValueError(f"hidden_states: expected shape (T, H), got {tuple(hidden_states.shape)}")
    if top_k_index.dim() != 2 or top_k_index.shape[0] != hidden_states.shape[0]:
        raise ValueError(
            f"top_k_index: expected shape ({hidden_states.shape[0]}, K), "
            f"got {tuple(top_k_index.shape)}"
        )
    if top_k_weights.shape != top_k_index.shape:
        raise ValueError(
            f"top_k_weights: expected the shape of top_k_index {tuple(top_k_index.shape)}, "
            f"got {tuple(top_k_weights.shape)}"
        )
    if top_k_index.dtype.is_floating_point or top_k_index.dtype.is_complex:
        raise TypeError(f"top_k_index: expected an integer dtype, got {top_k_index.dtype}")
    if not top_k_weights.dtype.is_floating_point:
        raise TypeError(f"top_k_weights: expected a floating dtype, got {top_k_weights.dtype}")
