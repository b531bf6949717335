"""The metadata rules of the contract (docs/contract.rst), the layout plan, and the wording
of every error.

Everything here looks at shapes, dtypes and Python scalars only (the caller reads them into
:class:`ArrayMeta`): it runs before any work starts and never touches array contents. Value
errors found by the backends come back as status words (:mod:`moe_numba.abi`) and are worded
by :func:`raise_for_permute_status` and :func:`raise_for_unpermute_status`.
"""

from __future__ import annotations

import numbers
import operator
from typing import NamedTuple

import ml_dtypes
import numpy as np

from . import abi
from ._libraries import is_traced_int

# frozensets: a dtype is hashed once instead of compared with each entry
HIDDEN_DTYPES = frozenset(
    np.dtype(d)
    for d in (
        ml_dtypes.bfloat16,
        np.float16,
        np.float32,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e5m2,
    )
)
FLOAT8_DTYPES = frozenset((np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)))
COMBINE_DTYPES = {
    np.dtype(np.float32): abi.DATA_FLOAT32,
    np.dtype(ml_dtypes.bfloat16): abi.DATA_BFLOAT16,
    np.dtype(np.float16): abi.DATA_FLOAT16,
}
ROUTEMAP_DTYPES = frozenset((np.dtype(np.int32), np.dtype(np.int64)))
FLOAT32 = frozenset((np.dtype(np.float32),))
INT32 = frozenset((np.dtype(np.int32),))

INT64_MAX = 2**63 - 1
# zipped_expertwise_rowmap holds row numbers as int32: every call has fewer rows than this
MAX_ROWS = 2**31 - 1
ROWMAP_INT32 = "zipped_expertwise_rowmap holds int32 row numbers"


def _names(dtypes):
    return ", ".join(sorted(str(d) for d in dtypes))


def check_bool(name, value):
    """``value`` must be a Python or NumPy bool."""
    if value is True or value is False:
        return value
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__} {value!r}")
    return bool(value)


def check_int(name, value, minimum, maximum=INT64_MAX, why="int64"):
    """``value`` must be an integer (not a bool) in [``minimum``, ``maximum``]; returns it
    as ``int``. ``why`` says where the maximum comes from. A traced int passes as it is (see
    :func:`~._libraries.is_traced_int`)."""
    if is_traced_int(value):
        return value
    if not is_int(value):
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}")
    value = operator.index(value)  # exact: NumPy's unsigned values keep their value
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be at most {_power_text(maximum)} ({why}); got {value}")
    return value


def _power_text(maximum):
    """``2**31 - 1`` for 2147483647: the limits as a reader knows them."""
    return f"2**{maximum.bit_length()} - 1" if (maximum + 1) & maximum == 0 else str(maximum)


def check_dtype(name, dtype, allowed):
    """``dtype`` must be one of ``allowed``."""
    if dtype not in allowed:
        raise TypeError(f"{name} must have dtype {_names(allowed)}; got {dtype}")


def check_shape(name, shape, expected, meaning):
    """``shape`` must equal ``expected``; ``meaning`` spells the expected shape in symbols."""
    if tuple(shape) != tuple(expected):
        raise ValueError(
            f"{name} must have shape {meaning} = {tuple(expected)}; got {tuple(shape)}"
        )


def check_ndim(name, shape, ndim, meaning):
    """``shape`` must have ``ndim`` dimensions; ``meaning`` spells them."""
    if len(shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D {meaning}; got shape {tuple(shape)}")


def is_int(x):
    """Whether ``x`` is an integer and not a bool (Python's or NumPy's)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


class ArrayMeta(NamedTuple):
    """What the checks read of an array: its shape, and its NumPy dtype (None if it has
    none that moe-numba knows)."""

    shape: tuple[int, ...]
    dtype: np.dtype | None


class PermuteArrays(NamedTuple):
    """The array arguments of one ``moe_permute`` call, as the caller passed them."""

    hidden_states: object
    scale: object | None
    expert_routemap_topk: object
    expert_prob_topk: object


class UnpermuteArrays(NamedTuple):
    """The array arguments of one ``moe_unpermute`` call, as the caller passed them."""

    hidden_states_unzipped: object
    zipped_expertwise_rowmap: object
    expert_routemap_topk: object
    token_prob_unzipped: object


class PermuteScalars(NamedTuple):
    """The scalar arguments of one ``moe_permute`` call, with the public defaults
    (``tokens_per_expert`` is host data, not a scalar: it travels beside them)."""

    num_experts: int
    padding_alignment: int
    do_gather: bool = True
    using_ue8m0_scale: bool = False
    return_expert_indices: bool = False
    override_buffer_size: int = -1
    validate: bool = True
    return_expert_offsets: bool = False


class UnpermuteScalars(NamedTuple):
    """The scalar arguments of one ``moe_unpermute`` call, with the public defaults."""

    total_zipped_tokens: int
    num_experts: int
    using_mix_precision: bool = True
    using_weighted_combine: bool = False
    validate: bool = True


class PermutePlan(NamedTuple):
    """Shapes of one ``moe_permute`` call, decided from metadata alone."""

    num_tokens: int
    hidden: int
    topk: int
    num_experts: int
    alignment: int
    num_rows: int  # -1 until the capacities are known
    hidden_dtype: np.dtype
    scale_width: int  # 0 when no scale is given
    scale_dtype: np.dtype | None
    capacities: np.ndarray | None  # None under override_buffer_size
    do_gather: bool
    return_expert_indices: bool
    return_expert_offsets: bool
    override: bool  # override_buffer_size >= 0: R given, counts taken where the rows are
    validate: bool

    runs = True  # (every call runs: see BackwardPlan.runs)

    @property
    def gather_scale(self):
        """Whether scale rows are gathered: a scale was given and rows are copied."""
        return self.do_gather and self.scale_dtype is not None

    @property
    def hidden_row_bytes(self):
        """Bytes of one hidden row (0 when rows are not copied)."""
        return self.hidden * self.hidden_dtype.itemsize if self.do_gather else 0

    @property
    def scale_row_bytes(self):
        """Bytes of one scale row (0 when no scale rows are gathered)."""
        return self.scale_width * 4 if self.gather_scale else 0


def check_permute_metadata(arrays, scalars: PermuteScalars):
    """Check the metadata of a ``moe_permute`` call (everything but ``tokens_per_expert``) and
    plan its outputs; ``num_rows`` is -1 unless ``override_buffer_size`` fixes it.

    ``arrays`` is a :class:`PermuteArrays` of :class:`ArrayMeta` (None for no scale),
    ``scalars`` the call's :class:`PermuteScalars`. Raises ``TypeError``/``ValueError``
    naming the argument.
    """
    s = scalars
    do_gather = check_bool("do_gather", s.do_gather)
    using_ue8m0_scale = check_bool("using_ue8m0_scale", s.using_ue8m0_scale)
    return_expert_indices = check_bool("return_expert_indices", s.return_expert_indices)
    return_expert_offsets = check_bool("return_expert_offsets", s.return_expert_offsets)
    validate = check_bool("validate", s.validate)
    num_experts = check_int("num_experts", s.num_experts, 1)
    alignment = check_int("padding_alignment", s.padding_alignment, 1)
    override = check_int("override_buffer_size", s.override_buffer_size, -1, MAX_ROWS, ROWMAP_INT32)

    hidden_shape, hidden_dtype = arrays.hidden_states
    check_ndim("hidden_states", hidden_shape, 2, "[num_tokens, hidden]")
    check_dtype("hidden_states", hidden_dtype, HIDDEN_DTYPES)
    num_tokens, hidden = hidden_shape
    if hidden < 1:
        raise ValueError(f"hidden_states must have at least one column; got shape {hidden_shape}")

    routemap_shape, routemap_dtype = arrays.expert_routemap_topk
    check_ndim("expert_routemap_topk", routemap_shape, 2, "[num_tokens, topk]")
    check_dtype("expert_routemap_topk", routemap_dtype, ROUTEMAP_DTYPES)
    topk = routemap_shape[1]
    check_shape("expert_routemap_topk", routemap_shape, (num_tokens, topk), "[num_tokens, topk]")
    if topk < 1:
        raise ValueError(f"expert_routemap_topk must have topk >= 1 columns; got {routemap_shape}")
    probs_shape, probs_dtype = arrays.expert_prob_topk
    check_dtype("expert_prob_topk", probs_dtype, FLOAT32)
    check_shape("expert_prob_topk", probs_shape, (num_tokens, topk), "[num_tokens, topk]")

    scale_width, scale_dtype = 0, None
    if arrays.scale is not None:
        scale_shape, scale_dtype = arrays.scale
        expected = np.dtype(np.int32) if using_ue8m0_scale else np.dtype(np.float32)
        if scale_dtype != expected:
            why = "using_ue8m0_scale=True" if using_ue8m0_scale else "using_ue8m0_scale=False"
            raise TypeError(f"scale must have dtype {expected} with {why}; got {scale_dtype}")
        check_ndim("scale", scale_shape, 2, "[num_tokens, scale_width]")
        scale_width = scale_shape[1]
        if scale_shape[0] != num_tokens or scale_width < 1:
            raise ValueError(
                f"scale must have shape [num_tokens, scale_width >= 1] with num_tokens = "
                f"{num_tokens}; got {tuple(scale_shape)}"
            )
    elif do_gather and hidden_dtype in FLOAT8_DTYPES:
        raise ValueError(
            f"scale is required for float8 hidden_states ({hidden_dtype}) when do_gather=True; "
            "got None"
        )

    if override >= 0:
        _check_padded_counts(alignment, num_experts, num_tokens, topk)
    return PermutePlan(
        num_tokens=num_tokens,
        hidden=hidden,
        topk=topk,
        num_experts=num_experts,
        alignment=alignment,
        num_rows=override,
        hidden_dtype=hidden_dtype,
        scale_width=scale_width,
        scale_dtype=scale_dtype,
        capacities=None,
        do_gather=do_gather,
        return_expert_indices=return_expert_indices,
        return_expert_offsets=return_expert_offsets,
        override=override >= 0,
        validate=validate,
    )


def _check_padded_counts(alignment, num_experts, num_tokens, topk):
    """Under ``override_buffer_size`` the GPU pads the counts it finds in int64: refuse an
    alignment with which they could pass it. At most ``pairs = T * min(K, E)`` (token, expert)
    pairs count, in at most ``min(E, pairs)`` experts: ``pairs + min(E, pairs) * (A - 1)``
    rows always suffice."""
    pairs = num_tokens * min(topk, num_experts)
    if pairs + min(num_experts, pairs) * (alignment - 1) > INT64_MAX:
        raise ValueError(
            f"padding_alignment = {alignment} is too large: {pairs} (token, expert) pairs "
            "padded to it could need more than 2**63 - 1 rows (int64)"
        )


class UnpermutePlan(NamedTuple):
    """Shapes of one ``moe_unpermute`` call, decided from metadata alone."""

    num_tokens: int
    hidden: int
    topk: int
    num_experts: int
    num_rows: int
    dtype: np.dtype
    data_type: int
    weighted: bool
    mix_precision: bool
    validate: bool

    runs = True  # (every call runs: see BackwardPlan.runs)


def check_unpermute_metadata(arrays, scalars: UnpermuteScalars):
    """Check the metadata of a ``moe_unpermute`` call and plan its outputs.

    ``arrays`` is an :class:`UnpermuteArrays` of :class:`ArrayMeta`, ``scalars`` the call's
    :class:`UnpermuteScalars`. Raises ``TypeError``/``ValueError`` naming the argument.
    """
    s = scalars
    mix_precision = check_bool("using_mix_precision", s.using_mix_precision)
    weighted = check_bool("using_weighted_combine", s.using_weighted_combine)
    validate = check_bool("validate", s.validate)
    num_tokens = check_int("total_zipped_tokens", s.total_zipped_tokens, 0)
    num_experts = check_int("num_experts", s.num_experts, 1)

    rows_shape, dtype = arrays.hidden_states_unzipped
    check_ndim("hidden_states_unzipped", rows_shape, 2, "[rows, hidden]")
    check_dtype("hidden_states_unzipped", dtype, COMBINE_DTYPES)
    num_rows, hidden = rows_shape
    if hidden < 1:
        raise ValueError(
            f"hidden_states_unzipped must have at least one column; got shape {rows_shape}"
        )

    rowmap_shape, rowmap_dtype = arrays.zipped_expertwise_rowmap
    check_dtype("zipped_expertwise_rowmap", rowmap_dtype, INT32)
    check_shape(
        "zipped_expertwise_rowmap",
        rowmap_shape,
        (num_tokens, num_experts),
        "[total_zipped_tokens, num_experts]",
    )
    routemap_shape, routemap_dtype = arrays.expert_routemap_topk
    check_ndim("expert_routemap_topk", routemap_shape, 2, "[total_zipped_tokens, topk]")
    check_dtype("expert_routemap_topk", routemap_dtype, ROUTEMAP_DTYPES)
    topk = routemap_shape[1]
    check_shape(
        "expert_routemap_topk", routemap_shape, (num_tokens, topk), "[total_zipped_tokens, topk]"
    )
    if topk < 1:
        raise ValueError(f"expert_routemap_topk must have topk >= 1 columns; got {routemap_shape}")

    prob_shape, prob_dtype = arrays.token_prob_unzipped
    check_dtype("token_prob_unzipped", prob_dtype, FLOAT32)
    prob_shape = tuple(prob_shape)
    if prob_shape not in ((num_rows,), (num_rows, 1)):
        raise ValueError(
            f"token_prob_unzipped must have shape [rows] or [rows, 1] with rows = {num_rows} "
            f"(the rows of hidden_states_unzipped); got {prob_shape}"
        )
    return UnpermutePlan(
        num_tokens=num_tokens,
        hidden=hidden,
        topk=topk,
        num_experts=num_experts,
        num_rows=num_rows,
        dtype=dtype,
        data_type=COMBINE_DTYPES[dtype],
        weighted=weighted,
        mix_precision=mix_precision,
        validate=validate,
    )


def _token_slot(flat, width):
    return divmod(int(flat), width)


def raise_for_permute_status(status, plan: PermutePlan):
    """Raise the ``ValueError`` that ``status`` (``abi.PERMUTE_*``) reports, if any."""
    if status[abi.PERMUTE_BAD_ID] >= 0:
        t, k = _token_slot(status[abi.PERMUTE_BAD_ID], plan.topk)
        raise ValueError(
            f"expert_routemap_topk[{t}, {k}] = {int(status[abi.PERMUTE_BAD_ID_VALUE])} is not "
            f"an expert id: ids must be -1 or in [0, num_experts={plan.num_experts})"
        )
    if status[abi.PERMUTE_DUPLICATE] >= 0:
        t, k = _token_slot(status[abi.PERMUTE_DUPLICATE], plan.topk)
        raise ValueError(
            f"expert_routemap_topk[{t}, {k}] = {int(status[abi.PERMUTE_DUPLICATE_VALUE])} "
            f"repeats an expert of an earlier slot of token {t}: each token may name an "
            "expert once"
        )
    if status[abi.PERMUTE_MISMATCH] >= 0:
        e = int(status[abi.PERMUTE_MISMATCH])
        raise ValueError(
            f"tokens_per_expert[{e}] = {int(plan.capacities[e])} but the routing map sends "
            f"{int(status[abi.PERMUTE_MISMATCH_COUNT])} tokens to expert {e}"
        )
    if status[abi.PERMUTE_ROWS_NEEDED] >= 0:
        raise ValueError(
            f"override_buffer_size = {plan.num_rows} rows is too small: the routing map needs "
            f"{int(status[abi.PERMUTE_ROWS_NEEDED])} rows with padding_alignment = "
            f"{plan.alignment}"
        )


def raise_for_unpermute_status(status, plan: UnpermutePlan):
    """Raise the ``ValueError`` that ``status`` (``abi.UNPERMUTE_*``) reports, if any."""
    if status[abi.UNPERMUTE_BAD_ROW] >= 0:
        t, e = _token_slot(status[abi.UNPERMUTE_BAD_ROW], plan.num_experts)
        raise ValueError(
            f"zipped_expertwise_rowmap[{t}, {e}] = {int(status[abi.UNPERMUTE_BAD_ROW_VALUE])} "
            f"is not a row: entries must be -1 or in [0, rows={plan.num_rows})"
        )
    if status[abi.UNPERMUTE_BAD_ID] >= 0:
        t, k = _token_slot(status[abi.UNPERMUTE_BAD_ID], plan.topk)
        raise ValueError(
            f"expert_routemap_topk[{t}, {k}] = {int(status[abi.UNPERMUTE_BAD_ID_VALUE])} is "
            f"not an expert id: ids must be -1 or in [0, num_experts={plan.num_experts})"
        )
