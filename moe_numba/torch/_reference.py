"""A plain torch reference of the SPEC 5 gradient ops, standing in for the library's own.

It follows the formulas of SPEC 5 (the data gradient of the permute sums in ascending expert
id in float32 and rounds once; a duplicate slot gets no probability gradient; the unpermute's
row gradient is one float32 product), but not the fixed summation order of the probability
gradient's dot product, the canonical NaN, or the ``validate=True`` errors. Every step is a
device op without a host synchronisation, so it also runs inside a CUDA graph.
"""

import numpy as np
import torch

from ._bridge import from_numpy, to_numpy


def _as_tensors(arrays):
    """``(tensors, back)``: NumPy arrays as CPU tensors (shared memory), and the conversion
    of results back to the caller's kind."""
    if any(isinstance(a, np.ndarray) for a in arrays):
        return [from_numpy(a) for a in arrays], to_numpy
    return list(arrays), lambda t: t


def _routes(rowmap, routemap, num_rows):
    """Per slot (t, k): the row it was filled from and whether it is the counted slot."""
    num_tokens, num_experts = rowmap.shape
    ids = routemap.long()
    in_range = (ids >= 0) & (ids < num_experts)
    rows = rowmap.long().gather(1, torch.where(in_range, ids, 0))
    counted = torch.ones_like(in_range)
    for k in range(1, ids.shape[1]):
        counted[:, k] = ~(ids[:, :k] == ids[:, k : k + 1]).any(dim=1)
    mapped = in_range & (rows >= 0) & (rows < num_rows)
    return torch.where(mapped, rows, 0), mapped, counted


def permute_backward(
    grad_hidden_states_unzipped,
    grad_token_prob_unzipped,
    zipped_expertwise_rowmap,
    expert_routemap_topk,
    *,
    validate=True,
):
    """Reference ``moe_permute_backward`` (see the module docstring for what it omits)."""
    (grad_rows, grad_probs, rowmap, routemap), back = _as_tensors(
        (
            grad_hidden_states_unzipped,
            grad_token_prob_unzipped,
            zipped_expertwise_rowmap,
            expert_routemap_topk,
        )
    )
    given = grad_rows if grad_rows is not None else grad_probs
    num_rows = given.shape[0]
    num_tokens, num_experts = rowmap.shape
    valid = (rowmap >= 0) & (rowmap < num_rows)
    rows = torch.where(valid, rowmap, 0).long()
    grad_hidden = grad_slots = None
    if grad_rows is not None:
        acc = grad_rows.new_zeros((num_tokens, grad_rows.shape[1]), dtype=torch.float32)
        if num_rows:
            source = grad_rows.float()
            for e in range(num_experts):  # ascending expert id
                acc = torch.where(valid[:, e, None], acc + source[rows[:, e]], acc)
        grad_hidden = back(acc.to(grad_rows.dtype))
    if grad_probs is not None:
        slot_rows, mapped, counted = _routes(rowmap, routemap, num_rows)
        picked = (
            grad_probs[slot_rows] if num_rows else torch.zeros_like(slot_rows, dtype=torch.float32)
        )
        grad_slots = back(torch.where(mapped & counted, picked, 0.0))
    return grad_hidden, grad_slots


def unpermute_backward(
    grad_hidden_states,
    grad_expert_prob_topk,
    hidden_states_unzipped,
    zipped_expertwise_rowmap,
    expert_routemap_topk,
    token_prob_unzipped,
    *,
    using_weighted_combine,
    num_rows,
    validate=True,
):
    """Reference ``moe_unpermute_backward`` (see the module docstring for what it omits)."""
    (grad_out, grad_slots, rows_in, rowmap, routemap, probs), back = _as_tensors(
        (
            grad_hidden_states,
            grad_expert_prob_topk,
            hidden_states_unzipped,
            zipped_expertwise_rowmap,
            expert_routemap_topk,
            token_prob_unzipped,
        )
    )
    if grad_out is None and grad_slots is None:
        return None, None
    num_tokens, num_experts = rowmap.shape
    flat = rowmap.reshape(-1).long()
    valid = (flat >= 0) & (flat < num_rows)
    # the token of every row (slot num_rows collects the unmapped entries)
    token_of = torch.full((num_rows + 1,), -1, dtype=torch.long, device=rowmap.device)
    tokens = torch.arange(num_tokens, device=rowmap.device).repeat_interleave(num_experts)
    token_of.scatter_(0, torch.where(valid, flat, num_rows), tokens)
    token_of = token_of[:num_rows]
    filled = token_of >= 0
    source = torch.where(filled, token_of, 0)
    grad_probs = torch.zeros((num_rows,), dtype=torch.float32, device=rowmap.device)
    grad_rows = None
    if grad_out is not None:
        width = grad_out.shape[1]
        if num_tokens:
            gathered = grad_out[source]
        else:
            gathered = grad_out.new_zeros((num_rows, width))
        if using_weighted_combine:
            weights = probs.reshape(-1)[:, None]
            grad_rows = (gathered.float() * weights).to(grad_out.dtype)
        else:
            grad_rows = gathered.clone()
        grad_rows = torch.where(filled[:, None], grad_rows, torch.zeros_like(grad_rows))
        if using_weighted_combine and rows_in is not None:
            dot = (gathered.float() * rows_in.float()).sum(dim=1)
            grad_probs = torch.where(filled, dot, 0.0)
        grad_rows = back(grad_rows)
    if grad_slots is not None:
        slot_rows, mapped, _ = _routes(rowmap, routemap, num_rows)
        for k in range(routemap.shape[1]):  # ascending k
            target = torch.where(mapped[:, k], slot_rows[:, k], num_rows)
            padded = torch.cat([grad_probs, grad_probs.new_zeros(1)])
            padded = padded.index_add(0, target, grad_slots[:, k])
            grad_probs = padded[:num_rows]
    return grad_rows, back(grad_probs)
