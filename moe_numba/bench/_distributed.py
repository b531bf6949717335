"""``python -m moe_numba.bench._distributed``: where the expert-parallel layer's time
goes, stage by stage (counts / permute / all-to-all / sort / experts / unpermute), forward and
backward.

It starts ``--ranks`` processes on this machine (gloo over 127.0.0.1; on CPUs each process
gets an equal share of the cores for moe_cpu's and torch's threads) and times a training step
of a layer with a grouped-GEMM expert (one matmul per local expert). Per stage it prints the
slowest rank's mean over the timed steps. ``run_bench`` does the same inside a process group
that is already set up (the NCCL example in docs/examples/expert_parallel.py uses it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist


def grouped_gemm(weights):
    """An expert function: rows of local expert j times ``weights[j]`` ([H, H_out]), one
    matmul per expert (a stand-in for a grouped GEMM), the probability applied by the
    combine."""

    def expert_fn(rows, tokens_per_expert, probs):
        parts = torch.split(rows, list(tokens_per_expert))
        return torch.cat([part @ w for part, w in zip(parts, weights, strict=True)])

    return expert_fn


def run_bench(*, tokens, hidden, experts, topk, alignment, dtype, steps, warmup, group=None):
    """Time ``steps`` training steps on this rank (after ``warmup``); every rank calls it.

    Returns ``{"forward": {stage: seconds}, "backward": {stage: seconds}}``: per stage the
    slowest rank's mean per step.
    """
    from ..torch.distributed import LayerTimer, expert_parallel_moe, local_experts

    rank = dist.get_rank(group)
    device = torch.device("cuda", torch.cuda.current_device()) if _on_cuda(group) else "cpu"
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(tokens, hidden, generator=generator).to(dtype).to(device)
    scores = torch.randn(tokens, experts, generator=generator).to(device)
    probs, routemap = torch.softmax(scores, 1).topk(topk, 1)
    own = local_experts(experts, group)
    weights = [
        (torch.randn(hidden, hidden, generator=generator) / hidden**0.5)
        .to(dtype)
        .to(device)
        .requires_grad_(True)
        for _ in own
    ]
    expert_fn = grouped_gemm(weights)
    for step in range(warmup + steps):
        if step in (0, warmup):  # the warm-up's times are dropped
            timer = LayerTimer()
        y = expert_parallel_moe(
            x.detach().requires_grad_(True),
            routemap,
            probs.detach().requires_grad_(True),
            expert_fn,
            experts,
            group=group,
            padding_alignment=alignment,
            timer=timer,
        )
        y.float().square().mean().backward()
    times = torch.tensor(
        [timer.forward[s] / steps for s in timer.STAGES]
        + [timer.backward[s] / steps for s in timer.STAGES],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    values = times.tolist()
    n = len(timer.STAGES)
    return {
        "forward": dict(zip(timer.STAGES, values[:n], strict=True)),
        "backward": dict(zip(timer.STAGES, values[n:], strict=True)),
    }


def _on_cuda(group):
    return dist.get_backend(group) == "nccl"


def format_split(split, title):
    """The split as a table of milliseconds and shares of the step."""
    total = sum(split["forward"].values()) + sum(split["backward"].values())
    lines = [title, f"{'stage':<12}{'forward ms':>12}{'backward ms':>13}{'share':>8}"]
    for stage in split["forward"]:
        f, b = split["forward"][stage] * 1e3, split["backward"][stage] * 1e3
        share = (f + b) / (total * 1e3) if total else 0.0
        lines.append(f"{stage:<12}{f:>12.2f}{b:>13.2f}{share:>8.1%}")
    forward = sum(split["forward"].values()) * 1e3
    backward = sum(split["backward"].values()) * 1e3
    lines.append(f"{'total':<12}{forward:>12.2f}{backward:>13.2f}{1:>8.0%}")
    return "\n".join(lines)


def join_local_group(rank, ranks, port, *, backend="gloo", timeout=300, threads=None):
    """Join a process group of ``ranks`` processes on this machine (TCP on 127.0.0.1:port).

    With gloo, ``threads`` (default: an equal share of the cores) is set for moe_cpu and
    torch: the CPU backend's OpenMP threads and torch's (another OpenMP runtime) wait for
    each other when the processes together run more threads than there are cores.
    """
    if backend == "gloo":
        import moe_cpu

        threads = threads or max(1, (os.cpu_count() or 1) // ranks)
        moe_cpu.set_num_threads(threads)
        torch.set_num_threads(threads)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=ranks,
        timeout=datetime.timedelta(seconds=timeout),
    )


def _worker(rank, ranks, port, options, results):
    join_local_group(rank, ranks, port)
    try:
        split = run_bench(**options)
        if rank == 0:
            results.put(split)
        dist.barrier()  # (gloo aborts a process whose peer leaves the group first)
    finally:
        dist.destroy_process_group()


def main(argv=None):
    """Parse the command line, run the processes, print the split."""
    parser = argparse.ArgumentParser(
        prog="python -m moe_numba.bench._distributed",
        description="time the expert-parallel layer's stages (gloo on this machine's CPUs)",
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--topk", type=int, default=4)
    parser.add_argument("--alignment", type=int, default=1)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    options = dict(
        tokens=args.tokens,
        hidden=args.hidden,
        experts=args.experts,
        topk=args.topk,
        alignment=args.alignment,
        dtype=getattr(torch, args.dtype),
        steps=args.steps,
        warmup=args.warmup,
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(
        _worker,
        args=(args.ranks, port, options, results),
        nprocs=args.ranks,
        start_method="spawn",
    )
    split = results.get()
    title = (
        f"expert-parallel layer, gloo, {args.ranks} ranks x {os.cpu_count() // args.ranks or 1} "
        f"CPU threads: T={args.tokens} per rank, H={args.hidden}, E={args.experts}, "
        f"K={args.topk}, A={args.alignment}, {args.dtype}; mean of {args.steps} steps, "
        "slowest rank"
    )
    print(format_split(split, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
