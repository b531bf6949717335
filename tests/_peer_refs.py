"""Plain torch references for the peer grid (``test_peer_grid.py``).

The grid follows Transformer Engine's permutation tests; the references follow the Paddle
contract (docs/contract.rst, docs/gradients.rst). The layout is computed from the routing
alone (a running count per expert), never from the library's row map; every result is made
of index_select,
index_copy, index_add, scatter, gather and masked ops on CPU tensors.

Two kinds of reference:

- exact ones, which follow the contract's arithmetic step by step (copies; the float32
  combine in ascending expert id, rounded once; the unpermute's row gradient, one float32
  product) and are compared bit for bit;
- float64 ones, rounded once at the end, for the results whose float32 summation order the
  contract fixes in a way plain torch cannot reproduce (the weighted combine's fused
  multiply-adds, the probability gradient's dot products); those are compared with
  Transformer Engine's tolerances (:data:`TE_TOLERANCES`).
"""

from __future__ import annotations

import torch

# Transformer Engine's ``dtype_tols``: what its permutation tests allow for every computed
# (not copied) result of that dtype.
TE_TOLERANCES = {
    torch.float32: dict(rtol=1.0e-6, atol=1.0e-6),
    torch.float16: dict(rtol=3.0e-3, atol=1.0e-5),
    torch.bfloat16: dict(rtol=2.0e-2, atol=1.0e-5),
}


# ------------------------------------------------------------------------------------------
# routing


def index_routing(generator, num_tokens, num_experts, topk):
    """TE's index map: each token picks ``topk`` distinct experts, in random slot order
    (``[T, K]`` int32)."""
    keys = torch.rand((num_tokens, num_experts), generator=generator)
    return keys.argsort(dim=1)[:, :topk].to(torch.int32)


def mask_routing(generator, num_tokens, num_experts, pairs):
    """TE's mask map: exactly ``pairs`` (token, expert) pairs drawn over the whole ``[T, E]``
    grid, so a token may have no expert or many; as a routing map ``[T, K]`` with K the most
    experts of any token (at least 1), each token's experts in random slots, -1 in the rest."""
    flat = torch.zeros(num_tokens * num_experts, dtype=torch.bool)
    flat[torch.randperm(num_tokens * num_experts, generator=generator)[:pairs]] = True
    mask = flat.view(num_tokens, num_experts)
    keys = torch.rand((num_tokens, num_experts), generator=generator) + (~mask) * 2.0
    width = max(1, int(mask.sum(dim=1).max())) if num_tokens else 1
    ids = keys.argsort(dim=1)[:, :width]  # the chosen experts first, shuffled
    return torch.where(mask.gather(1, ids), ids, -1).to(torch.int32)


def dense(values, routemap, num_experts):
    """``[T, E]``: ``values[t, k]`` at ``(t, routemap[t, k])``, 0 where no slot names the
    expert (the routing maps here never name an expert twice in one row)."""
    ids = routemap.long()
    columns = torch.where(ids >= 0, ids, num_experts)  # -1 slots land in a spare column
    out = values.new_zeros((routemap.shape[0], num_experts + 1))
    return out.scatter(1, columns, values)[:, :num_experts]


def routed(routemap, num_experts):
    """``[T, E]`` bool: the (token, expert) pairs of the routing map."""
    ones = torch.ones(routemap.shape, dtype=torch.float32)
    return dense(ones, routemap, num_experts) > 0


def layout(mask, capacities, alignment, num_rows=None):
    """``(rowmap, R)`` of the contract: expert-major, token-ascending, the first ``capacities[e]``
    tokens of expert e in ``ceil(n_e / A) * A`` rows; with ``num_rows``
    (``override_buffer_size``) R is that and rows at or past it are dropped."""
    rank = mask.long().cumsum(dim=0) - 1  # the token's place among the expert's tokens
    capacities = torch.as_tensor(capacities, dtype=torch.long)
    padded = (capacities + alignment - 1) // alignment * alignment
    rows = padded.cumsum(dim=0) - padded + rank
    num_rows = int(padded.sum()) if num_rows is None else num_rows
    kept = mask & (rank < capacities) & (rows < num_rows)
    return torch.where(kept, rows, -1).to(torch.int32), num_rows


def pairs(rowmap):
    """Token, expert and row of every mapped pair, token-major (``rowmap`` on the CPU)."""
    tokens, experts = (rowmap >= 0).nonzero(as_tuple=True)
    return tokens, experts, rowmap[tokens, experts].long()


# ------------------------------------------------------------------------------------------
# forward


def permuted(x, rowmap, num_rows):
    """``hidden_states_unzipped`` (and ``scale_unzipped``): row copies, zero padding."""
    tokens, _, rows = pairs(rowmap)
    out = x.new_zeros((num_rows, *x.shape[1:]))
    return out.index_copy(0, rows, x.index_select(0, tokens))


def row_values(values, rowmap, num_rows, fill=0):
    """``[R]``: ``values[t, e]`` (a ``[T, E]`` tensor) at row ``rowmap[t, e]``, ``fill`` in
    the other rows (``token_prob_unzipped``, ``expert_indices``)."""
    tokens, experts, rows = pairs(rowmap)
    out = torch.full((num_rows,), fill, dtype=values.dtype)
    return out.index_copy(0, rows, values[tokens, experts])


def slot_values(row_vector, rowmap, routemap):
    """``[T, K]``: ``row_vector[rowmap[t, routemap[t, k]]]`` for a routed, mapped slot, else 0
    (the unpermute's ``expert_prob_topk``; the permute's probability gradient, every routed
    slot being the counted one here)."""
    ids = routemap.long()
    slot_rows = rowmap.long().gather(1, ids.clamp(min=0))
    mapped = (ids >= 0) & (slot_rows >= 0)
    picked = row_vector[slot_rows.clamp(min=0)] if row_vector.numel() else 0.0
    return torch.where(mapped, picked, 0.0)


def combine(source, rowmap):
    """The unweighted mixed-precision combine, exactly: a float32 accumulator from +0.0 adds
    row ``rowmap[t, e]`` of ``source`` for e ascending, then rounds once to the source dtype
    (``moe_unpermute``, and the permute's data gradient)."""
    num_tokens = rowmap.shape[0]
    mapped = rowmap >= 0
    width = int(mapped.sum(dim=1).max()) if num_tokens else 0
    # column j: each token's j-th mapped expert, in ascending expert id (a stable sort)
    order = (~mapped).int().argsort(dim=1, stable=True)[:, :width]
    slot_rows = rowmap.gather(1, order).long()
    acc = torch.zeros((num_tokens, source.shape[1]), dtype=torch.float32)
    for j in range(width):
        rows = slot_rows[:, j]
        acc = torch.where((rows >= 0)[:, None], acc + source[rows.clamp(min=0)].float(), acc)
    return acc.to(source.dtype)


def weighted_combine(source, row_probs, rowmap):
    """The weighted combine in float64, rounded once to the source dtype (the contract's
    float32 fused multiply-adds round at every step, which plain torch cannot express)."""
    tokens, _, rows = pairs(rowmap)
    terms = source[rows].double() * row_probs.double()[rows, None]
    out = torch.zeros((rowmap.shape[0], source.shape[1]), dtype=torch.float64)
    return out.index_add(0, tokens, terms).to(source.dtype)


# ------------------------------------------------------------------------------------------
# gradients


def spread(grad_out, rowmap, num_rows, row_probs=None):
    """The unpermute's row gradient, exactly: token t's gradient row copied to each of its
    rows, or (weighted) ``rnd(float32(g) * p[r])``; +0.0 in every other row."""
    tokens, _, rows = pairs(rowmap)
    gathered = grad_out.index_select(0, tokens)
    if row_probs is not None:
        gathered = (gathered.float() * row_probs[rows, None]).to(grad_out.dtype)
    out = grad_out.new_zeros((num_rows, grad_out.shape[1]))
    return out.index_copy(0, rows, gathered)


def row_prob_grad(rowmap, routemap, num_rows, *, grad_out=None, rows_in=None, grad_slots=None):
    """The unpermute's probability gradient in float64, rounded once to float32: per mapped
    row, the dot product of ``grad_out[t]`` and ``rows_in[r]`` (when both are given, the
    weighted case) plus the gradient of the slot that the forward filled from the row."""
    tokens, experts, rows = pairs(rowmap)
    out = torch.zeros((num_rows,), dtype=torch.float64)
    if grad_out is not None and rows_in is not None:
        dots = (grad_out[tokens].double() * rows_in[rows].double()).sum(dim=1)
        out = out.index_add(0, rows, dots)
    if grad_slots is not None:
        slots = dense(grad_slots, routemap, rowmap.shape[1])[tokens, experts]
        out = out.index_add(0, rows, slots.double())
    return out.float()
