"""The expert-parallel cases, and the worker process that runs them (tests/test_expert_parallel.py
spawns it; it imports no pytest).

Every rank builds the same global batch from the case's seed, runs the one-process layer on
all of it, then the expert-parallel layer on its own slice, forward and backward, and reports
per case whether its slice of the output and of every gradient has the same bits.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class Case:
    name: str
    tokens: tuple[int, ...]  # per rank
    num_experts: int
    topk: int
    hidden: int = 6
    dtype: str = "bfloat16"
    alignment: int = 1
    weighted: bool = True
    validate: bool = True
    unused_experts: tuple[int, ...] = ()  # no token routes there
    malformed: bool = False  # repeated experts and out-of-range ids (validate=False rules)
    seed: int = 0
    bad_rank: int | None = None  # this rank's routing map gets an id outside [-1, E)
    probs_in_experts: bool = True  # the expert function uses the probabilities
    strided_out: bool = False  # the expert function returns rows that are not contiguous
    # the inputs (of "x", "routemap", "probs") that rank strided_rank passes as strided views
    strided: tuple[str, ...] = ()
    strided_rank: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def ranks(self):
        return len(self.tokens)


def global_batch(case):
    """(x, routemap, probs, dy, weights) of the whole batch, the same on every rank."""
    rng = np.random.default_rng(case.seed)
    total = sum(case.tokens)
    E, K = case.num_experts, case.topk
    allowed = np.array([e for e in range(E) if e not in case.unused_experts])
    routemap = np.full((total, K), -1, np.int64)
    for t in range(total):
        used = min(K, len(allowed), int(rng.integers(0, K + 1)))
        routemap[t, rng.choice(K, used, replace=False)] = rng.choice(allowed, used, replace=False)
    if case.malformed:
        for t in range(0, total, 3):
            routemap[t, -1] = routemap[t, 0]  # a repeated expert: counted once
        if total:
            routemap[total // 2, 0] = E + 3  # outside [-1, E): treated as -1
    dtype = DTYPES[case.dtype]
    x = torch.from_numpy(rng.standard_normal((total, case.hidden)).astype(np.float32)).to(dtype)
    probs = torch.from_numpy(rng.random((total, K), dtype=np.float32))
    dy = torch.from_numpy(rng.standard_normal((total, case.hidden)).astype(np.float32)).to(dtype)
    weights = torch.from_numpy(rng.standard_normal(E).astype(np.float32) + 2)
    return x, torch.from_numpy(routemap), probs, dy, weights


def elementwise_experts(weights, first, case, seen):
    """An expert function that treats each row on its own: ``row * w_e + p * row**2``
    (the probability enters, so its gradient flows through the experts too), or ``row * w_e``
    for a case whose experts ignore the probabilities; it records the counts it was called
    with in ``seen``."""

    def expert_fn(rows, tokens_per_expert, probs):
        seen.append(list(tokens_per_expert))
        assert all(n % case.alignment == 0 for n in tokens_per_expert), tokens_per_expert
        assert sum(tokens_per_expert) == rows.shape[0]
        # each row's weight, from views only (no host-device traffic inside the layer)
        w = torch.cat(
            [weights[first + j : first + j + 1].expand(n) for j, n in enumerate(tokens_per_expert)]
            + [weights[:0]]
        )
        w = w.to(rows.dtype).unsqueeze(1)
        if not case.probs_in_experts:
            out = rows * w
        else:
            out = rows * w + probs.to(rows.dtype).unsqueeze(1) * rows * rows
        # column-major: the same values, not C-contiguous (where there are rows)
        return out.t().contiguous().t() if case.strided_out else out

    return expert_fn


def _bits(t):
    t = t.detach().contiguous()
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32).clone()


def _leaves(case, x, probs, weights):
    return (
        x.clone().requires_grad_(True),
        probs.clone().requires_grad_(True),
        weights.clone().requires_grad_(True),
    )


def strided(tensor):
    """The values of a 2-D ``tensor`` as a strided view (a column slice of a wider tensor,
    not C-contiguous where there are two rows or more); differentiable in ``tensor``."""
    return torch.cat([tensor, tensor], 1)[:, : tensor.shape[1]]


def one_process(case, x, routemap, probs, dy, weights, flags):
    """The reference: one process, the whole batch, every expert, forward and backward;
    its output and its leaves (x, probs, weights) holding the gradients."""
    from moe_numba.torch.distributed import single_process_moe

    leaves = _leaves(case, x, probs, weights)
    experts = elementwise_experts(leaves[2], 0, case, [])
    y = single_process_moe(leaves[0], routemap, leaves[1], experts, case.num_experts, **flags)
    y.backward(dy)
    return y, leaves


def run_case(case, rank, group=None):
    """This rank's verdicts for ``case``: a dict of check name -> bool (or an error)."""
    from moe_numba.torch.distributed import (
        expert_parallel_moe,
        local_experts,
    )

    x, routemap, probs, dy, weights = global_batch(case)
    flags = dict(
        padding_alignment=case.alignment,
        using_weighted_combine=case.weighted,
        validate=case.validate,
    )
    start = sum(case.tokens[:rank])
    mine = slice(start, start + case.tokens[rank])
    if case.bad_rank is not None:
        bad = routemap.clone()
        if rank == case.bad_rank and case.tokens[rank]:
            bad[mine][0, 0] = case.num_experts  # one id past the last expert
        try:
            experts = elementwise_experts(
                weights, local_experts(case.num_experts, group).start, case, []
            )
            expert_parallel_moe(
                x[mine], bad[mine], probs[mine], experts, case.num_experts, group=group, **flags
            )
        except ValueError as error:
            return {"raised": True, "message": str(error)}
        return {"raised": False, "message": ""}

    y_ref, (rx, rp, rw) = one_process(case, x, routemap, probs, dy, weights, flags)

    results = {}
    outputs = []
    for _attempt in range(2):  # twice: run to run determinism
        lx, lp, lw = _leaves(case, x[mine], probs[mine], weights)
        experts = local_experts(case.num_experts, group)
        seen = []
        inputs = {"x": lx, "routemap": routemap[mine], "probs": lp}
        if rank == case.strided_rank:
            inputs.update({name: strided(inputs[name]) for name in case.strided})
        y = expert_parallel_moe(
            inputs["x"],
            inputs["routemap"],
            inputs["probs"],
            elementwise_experts(lw, experts.start, case, seen),
            case.num_experts,
            group=group,
            **flags,
        )
        if rank == case.strided_rank:
            results["inputs strided"] = not any(inputs[n].is_contiguous() for n in case.strided)
        y.backward(dy[mine])
        outputs.append((_bits(y), _bits(lx.grad), _bits(lp.grad), lw.grad.clone()))
        results["expert_fn called once"] = len(seen) == 1
    (y, gx, gp, gw), again = outputs
    results["y"] = torch.equal(y, _bits(y_ref[mine]))
    results["grad x"] = torch.equal(gx, _bits(rx.grad[mine]))
    results["grad probs"] = torch.equal(gp, _bits(rp.grad[mine]))
    results["deterministic"] = all(
        torch.equal(a, b) for a, b in zip(outputs[0], again, strict=True)
    )
    # expert weights: the reduction over rows is the expert function's own (torch's sum);
    # here only this rank's experts get a gradient, and unused experts get exact zeros
    local = list(experts)
    results["grad weights (local experts, close)"] = torch.allclose(
        gw[local], rw.grad[local], rtol=2e-2, atol=1e-3
    )
    others = [e for e in range(case.num_experts) if e not in local]
    results["grad weights (remote experts zero)"] = bool((gw[others] == 0).all())
    unused = [e for e in case.unused_experts if e in local]
    results["grad weights (unused experts zero)"] = bool((gw[unused] == 0).all())
    results["shapes"] = tuple(lx.grad.shape) == (case.tokens[rank], case.hidden)
    return results


@dataclass(frozen=True)
class Failure:
    """A call that fails: rank ``rank`` changes its call by ``CHANGES[change]``; every rank
    must raise ``error`` with ``text`` in its message."""

    name: str
    rank: int
    change: str
    error: str
    text: str
    tokens: tuple[int, ...] = (3, 3)


def _wrap_experts(change):
    """The changed expert function of ``change`` (a name starting with "output" or
    "experts"), around ``rows * 2``."""

    def expert_fn(rows, tokens_per_expert, probs):
        out = rows * 2
        if change == "output rows":
            return out[1:]
        if change == "output dtype":
            return out.double()
        if change == "output width":
            return torch.cat([out, out], 1)
        if change == "output layout":
            return out.to_sparse()
        if change == "output no grad":
            return out.detach()
        if change == "experts raise":
            raise ZeroDivisionError("an expert divided by zero")
        return out

    return expert_fn


def _change(call, change):
    """Apply ``change`` to the keyword arguments ``call`` of one rank's layer call."""
    if change in ("num_experts", "padding_alignment"):
        call[change] = {"num_experts": 8, "padding_alignment": 2}[change]
    elif change == "num_experts not a multiple":
        call["num_experts"] = 3
    elif change in ("validate", "using_weighted_combine"):
        call[change] = False
    elif change == "hidden":
        call["x"] = call["x"][:, :5].detach().requires_grad_(True)
    elif change == "dtype":
        call["x"] = call["x"].detach().float().requires_grad_(True)
    elif change == "x no grad":
        call["x"] = call["x"].detach()
    elif change == "routemap dtype":
        call["routemap"] = call["routemap"].float()
    elif change == "bad id":
        call["routemap"][0, 0] = call["num_experts"]
    elif change.startswith(("output", "experts")):
        call["expert_fn"] = _wrap_experts(change)
    else:
        raise AssertionError(f"no change {change!r}")


def run_failure(failure, rank, group=None):
    """This rank's exception for ``failure``: its type, message and seconds to raise."""
    from moe_numba.torch.distributed import expert_parallel_moe

    generator = torch.Generator().manual_seed(rank)
    tokens = failure.tokens[rank]
    call = dict(
        x=torch.randn(tokens, 6, generator=generator).to(torch.bfloat16).requires_grad_(True),
        routemap=torch.randint(0, 4, (tokens, 1), generator=generator),
        probs=torch.rand(tokens, 1, generator=generator),
        expert_fn=_wrap_experts(None),
        num_experts=4,
    )
    if rank == failure.rank:
        _change(call, failure.change)
    start = time.perf_counter()
    try:
        expert_parallel_moe(group=group, **call).float().sum().backward()
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error), "seconds": _since(start)}
    return {"type": None, "message": "", "seconds": _since(start)}


@dataclass(frozen=True)
class Outsider:
    """Every rank makes a group of rank 0 alone; rank 0 runs the layer in it, the other
    ranks call :func:`local_experts` and the layer with it, which must refuse them at once."""

    name: str


def run_outsider(case, rank, group=None):
    """This rank's verdicts for an :class:`Outsider` case."""
    from moe_numba.torch.distributed import expert_parallel_moe, local_experts

    alone = dist.new_group([0])  # (every rank of the world makes it)
    x, routemap, probs = torch.ones(3, 4), torch.tensor([[0], [1], [3]]), torch.ones(3, 1)
    results = {}
    for call in ("local_experts", "layer"):
        start = time.perf_counter()
        try:
            if call == "local_experts":
                got = local_experts(4, alone)
            else:
                got = expert_parallel_moe(x, routemap, probs, lambda r, c, p: r * 2, 4, group=alone)
        except ValueError as error:
            results[call] = {"type": "ValueError", "message": str(error), "got": None}
        else:
            results[call] = {"type": None, "message": "", "got": _shown(got)}
        results[call]["seconds"] = _since(start)
    return results


def _shown(value):
    return repr(value) if isinstance(value, range) else value.tolist()


def _since(start):
    return time.perf_counter() - start


def _exit_cleanly(queue):
    """End a rank that finished without an error: gloo's worker threads can abort a process
    while its interpreter shuts down ("terminate called without an active exception"), after
    the group was destroyed and every verdict sent (``queue``'s feeder is flushed first)."""
    queue.close()
    queue.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


RUNS = {Failure: run_failure, Outsider: run_outsider, Case: run_case}


def worker(rank, ranks, port, cases, queue, timeout=60):
    """One process of the group: every case in turn, verdicts to ``queue``; stops by itself.
    ``timeout``: the process group's, in seconds (what a collective waits for a peer)."""
    from benchmarks.distributed import join_local_group

    try:
        join_local_group(rank, ranks, port, timeout=timeout, threads=1)  # several per core
        for case in cases:
            try:
                run = RUNS[type(case)]
                queue.put((case.name, rank, run(case, rank)))
            except Exception:
                queue.put((case.name, rank, {"error": traceback.format_exc()}))
                raise
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    _exit_cleanly(queue)


TIMEOUT = 3  # seconds: the process group's timeout in timeout_worker


def timeout_worker(rank, ranks, port, queue, stop):
    """Rank 1 never calls the layer (as if it had raised before it) and stays alive until
    rank 0 has ended (``stop``, set by the parent; gloo may abort a process whose peer left
    first); rank 0 calls it and waits in the first agreement until the group's timeout."""
    from benchmarks.distributed import join_local_group

    join_local_group(rank, ranks, port, timeout=TIMEOUT, threads=1)
    name = "a rank that never calls the layer"
    if rank == 0:
        queue.put((name, rank, run_failure(Failure(name, -1, "", "", ""), rank)))
    else:
        queue.put((name, rank, {"type": None, "message": "did not call", "seconds": 0.0}))
        stop.wait(TIMEOUT + 5)
    _exit_cleanly(queue)


_SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's sync debug mode, per sync


def nccl_worker(rank, ranks, port, queue):
    """One GPU per process over NCCL: the layer against one process on the GPU, bit for
    bit, and its host synchronisations counted: one read per forward with validate=False,
    three torch reads with validate=True (the agreements' too) and one wait for status
    words (the permute's check of the routing map, a driver call torch does not see);
    none in the backward."""
    import warnings

    from benchmarks.distributed import join_local_group
    from moe_numba.runtime import get_runtime

    try:
        torch.cuda.set_device(rank)
        join_local_group(rank, ranks, port, backend="nccl", timeout=120)
        from moe_numba.torch.distributed import (
            expert_parallel_moe,
            local_experts,
        )

        case = Case("nccl", tuple(5 + 3 * r for r in range(ranks)), 4 * ranks, 3, alignment=2)
        device = torch.device("cuda", rank)
        x, routemap, probs, dy, weights = (t.to(device) for t in global_batch(case))
        start = sum(case.tokens[:rank])
        mine = slice(start, start + case.tokens[rank])
        flags = dict(padding_alignment=case.alignment)
        y_ref, (rx, rp, rw) = one_process(case, x, routemap, probs, dy, weights, flags)

        lx, lp, lw = _leaves(case, x[mine], probs[mine], weights)
        experts = elementwise_experts(lw, local_experts(case.num_experts).start, case, [])
        y = expert_parallel_moe(lx, routemap[mine], lp, experts, case.num_experts, **flags)
        torch.cuda.synchronize()
        syncs, status_reads = {}, {}
        y_fast = leaves_fast = None  # (the forward's, whose backward is counted next)
        for phase in ("forward", "backward", "forward, validate"):
            torch.cuda.synchronize()
            reads_before = get_runtime().status_reads
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                if phase == "backward":
                    y_fast.backward(dy[mine])
                else:
                    lx2, lp2, lw2 = _leaves(case, x[mine], probs[mine], weights)
                    experts = elementwise_experts(
                        lw2, local_experts(case.num_experts).start, case, []
                    )
                    # validate=False: the agreements are skipped on a GPU
                    y2 = expert_parallel_moe(
                        lx2,
                        routemap[mine],
                        lp2,
                        experts,
                        case.num_experts,
                        **flags,
                        validate=phase != "forward",
                    )
                    if phase == "forward":
                        y_fast, leaves_fast = y2, (lx2, lp2)
                torch.cuda.set_sync_debug_mode("default")
            # (set_sync_debug_mode's own warning says "synchronizing" too: not a sync)
            syncs[phase] = [str(w.message) for w in caught if _SYNC_WARNING in str(w.message)]
            status_reads[phase] = get_runtime().status_reads - reads_before
        checked = syncs["forward, validate"]
        results = {
            "y": torch.equal(_bits(y), _bits(y_ref[mine])),
            "y again": torch.equal(_bits(y_fast), _bits(y_ref[mine])),
            "y validated": torch.equal(_bits(y2), _bits(y_ref[mine])),
            "grad x": torch.equal(_bits(leaves_fast[0].grad), _bits(rx.grad[mine])),
            "grad probs": torch.equal(_bits(leaves_fast[1].grad), _bits(rp.grad[mine])),
            f"one host sync in the forward (warnings: {syncs['forward']})": len(syncs["forward"])
            == 1,
            f"no host sync in the backward (warnings: {syncs['backward']})": not syncs["backward"],
            f"three with validate: the agreements' (warnings: {checked})": len(checked) == 3,
            f"status words read only by the validated forward's permute ({status_reads})": (
                status_reads == {"forward": 0, "backward": 0, "forward, validate": 1}
            ),
        }
        queue.put(("nccl", rank, results))
        dist.barrier()
    except Exception:
        queue.put(("nccl", rank, {"error": traceback.format_exc()}))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
