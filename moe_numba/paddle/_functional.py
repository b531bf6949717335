"""``moe_permute`` and ``moe_unpermute`` with the signatures of ``paddle.nn.functional``
(Paddle 3.3): code written for Paddle's functions runs by changing the import. They are the
public functions (:mod:`moe_numba._api`, which send Paddle tensors to :mod:`._calls`) with
Paddle's parameters: ``validate`` is always on, and there is no ``return_expert_offsets``."""

from __future__ import annotations

from collections.abc import Sequence

import paddle

from .. import _api


def moe_permute(
    hidden_states: paddle.Tensor,
    scale: paddle.Tensor | None,
    expert_routemap_topk: paddle.Tensor,
    expert_prob_topk: paddle.Tensor,
    num_experts: int,
    tokens_per_expert: Sequence[int] | paddle.Tensor,
    padding_alignment: int,
    do_gather: bool = True,
    using_ue8m0_scale: bool = False,
    return_expert_indices: bool = False,
    override_buffer_size: int = -1,
    name: str | None = None,
) -> tuple[paddle.Tensor, ...]:
    """``paddle.nn.functional.moe_permute`` on every place: copy each (token, expert) pair
    into an expert-major, padded buffer ("unzip").

    The contract is :func:`moe_numba.moe_permute`'s (docs/contract.rst), with Paddle's
    parameters, defaults, outputs and shapes; docs/paddle.rst lists where it differs from
    Paddle's GPU kernel. Differentiable: gradients flow to ``hidden_states`` (unless float8)
    and ``expert_prob_topk``.

    Parameters
    ----------
    hidden_states : paddle.Tensor of shape (T, H)
        bfloat16, float16, float32, float8_e4m3fn or float8_e5m2, on the CPU or a GPU.
    scale : paddle.Tensor of shape (T, S), or None
        float32, or int32 holding four packed UE8M0 bytes with ``using_ue8m0_scale=True``;
        gathered like the rows. Required for float8 rows.
    expert_routemap_topk : paddle.Tensor of shape (T, K), int32 or int64
        Expert id of each slot; -1 marks an empty slot.
    expert_prob_topk : paddle.Tensor of shape (T, K), float32
        Routing probability of each slot.
    num_experts : int
        E >= 1 (Paddle's kernel stops at 64; this one does not).
    tokens_per_expert : sequence of E ints, or a CPU paddle.Tensor of E ints
        Rows reserved for each expert. Ignored when ``override_buffer_size >= 0``.
    padding_alignment : int
        Each expert's block is padded to a multiple of this many rows (any value >= 1).
    do_gather : bool, default True
        False: ``hidden_states_unzipped`` is an empty (0, H) tensor; the maps are computed.
    using_ue8m0_scale : bool, default False
        The scale holds packed UE8M0 exponents (int32).
    return_expert_indices : bool, default False
        Also return the owning expert of every row.
    override_buffer_size : int, default -1
        If >= 0, the number of rows R, with each expert's count taken from the routing map.
    name : str, optional
        Accepted and ignored.

    Returns
    -------
    hidden_states_unzipped : paddle.Tensor of shape (R, H)
    zipped_expertwise_rowmap : paddle.Tensor of shape (T, E), int32
    token_prob_unzipped : paddle.Tensor of shape (R,), float32
    scale_unzipped : paddle.Tensor of shape (R, S), or empty (0,) float32
    expert_indices : paddle.Tensor of shape (R,), int32
        Only with ``return_expert_indices=True``.

    Raises
    ------
    TypeError
        An argument that is no Paddle tensor moe-numba serves, a wrong dtype, tensors on two
        places, or a tensor of a static graph.
    ValueError
        A wrong shape or value.

    Examples
    --------
    >>> import paddle
    >>> from moe_numba.paddle import moe_permute
    >>> x = paddle.arange(6, dtype="float32").reshape([3, 2]).astype("bfloat16")
    >>> routes = paddle.to_tensor([[0, 2], [1, -1], [1, 0]], dtype="int32")
    >>> probs = paddle.full([3, 2], 0.5, dtype="float32")
    >>> rows, rowmap, row_probs, _ = moe_permute(x, None, routes, probs, 3, [2, 2, 1], 2)
    >>> rowmap.tolist()
    [[0, -1, 4], [-1, 2, -1], [1, 3, -1]]
    """
    return _api.moe_permute(**locals())  # (the public function's parameters, by name)


def moe_unpermute(
    hidden_states_unzipped: paddle.Tensor,
    zipped_expertwise_rowmap: paddle.Tensor,
    expert_routemap_topk: paddle.Tensor,
    token_prob_unzipped: paddle.Tensor,
    total_zipped_tokens: int,
    num_experts: int,
    using_mix_precision: bool = True,
    using_weighted_combine: bool = False,
    name: str | None = None,
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """``paddle.nn.functional.moe_unpermute`` on every place: sum each token's expert rows
    back into one row ("zip").

    The contract is :func:`moe_numba.moe_unpermute`'s (docs/contract.rst), with Paddle's
    parameters, defaults and outputs. Differentiable: gradients flow to
    ``hidden_states_unzipped`` and ``token_prob_unzipped``.

    Parameters
    ----------
    hidden_states_unzipped : paddle.Tensor of shape (R, H)
        bfloat16, float16 or float32.
    zipped_expertwise_rowmap : paddle.Tensor of shape (T, E), int32
        As ``moe_permute`` returned it.
    expert_routemap_topk : paddle.Tensor of shape (T, K), int32 or int64
        The routing map given to ``moe_permute``.
    token_prob_unzipped : paddle.Tensor of shape (R,) or (R, 1), float32
        Probability of each row.
    total_zipped_tokens : int
        T.
    num_experts : int
        E.
    using_mix_precision : bool, default True
        True: accumulate in float32 and round once. False: round after every row.
    using_weighted_combine : bool, default False
        Weight each row by its probability (fused multiply-add), single-row tokens included.
    name : str, optional
        Accepted and ignored.

    Returns
    -------
    hidden_states : paddle.Tensor of shape (T, H)
        Dtype of ``hidden_states_unzipped``; +0.0 for tokens with no rows.
    expert_prob_topk : paddle.Tensor of shape (T, K), float32

    Raises
    ------
    TypeError
        As :func:`moe_permute`.
    ValueError
        A wrong shape or value.

    Examples
    --------
    >>> import paddle
    >>> from moe_numba.paddle import moe_unpermute
    >>> rows = paddle.to_tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> rowmap = paddle.to_tensor([[0, 1]], dtype="int32")
    >>> routes = paddle.to_tensor([[1, 0]], dtype="int32")
    >>> probs = paddle.to_tensor([0.25, 0.75])
    >>> out, slot_probs = moe_unpermute(rows, rowmap, routes, probs, 1, 2,
    ...                                 using_weighted_combine=True)
    >>> out.tolist(), slot_probs.tolist()
    ([[2.5, 3.5]], [[0.75, 0.25]])
    """
    return _api.moe_unpermute(**locals())
