"""``python -m benchmarks distributed``: where the expert-parallel layer's time goes, stage by
stage (counts / permute / all-to-all / sort / experts / unpermute), forward and backward.

It starts ``--ranks`` processes on this machine (gloo over 127.0.0.1; each process gets an
equal share of the cores for moe_cpu's and torch's threads) and times a training step of a
layer with a grouped-GEMM expert (one matmul per local expert). Per stage it prints the
slowest rank's mean over the timed steps. Under ``torchrun`` (``torchrun --nproc-per-node 2
-m benchmarks distributed``) it runs in the processes torchrun started instead: NCCL where
each has a GPU of its own, else gloo. ``run_bench`` does the same inside a process group that
is already set up.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket

import torch
import torch.distributed as dist

from moe_numba.__main__ import check_topk

from .options import number


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
    from moe_numba.torch.distributed import LayerTimer, expert_parallel_moe, local_experts

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


DEFAULTS = dict(ranks=2, tokens=4096, hidden=1024, experts=16, topk=4, alignment=1, steps=5)
DEFAULTS.update(warmup=2)


def parser():
    """The command line's parser."""
    command = argparse.ArgumentParser(
        prog="python -m benchmarks distributed",
        description="Time the expert-parallel layer's stages: --ranks gloo processes on this "
        "machine's CPUs, or, under torchrun, the processes torchrun started (NCCL where each "
        "has a GPU).",
    )
    meanings = dict(
        ranks="processes started on this machine (not under torchrun)",
        tokens="tokens T per rank",
        experts="experts E, a multiple of the ranks",
    )
    for name, default in DEFAULTS.items():
        shown = {"topk": f"{default}, or E if fewer"}.get(name, default)
        given = None if name in ("ranks", "topk") else default
        number(command, name, given, shown, meanings.get(name))
    command.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    return command


def torchrun_world(environ=None):
    """``(rank, world size, local world size)`` when torchrun started this process, else
    None."""
    environ = os.environ if environ is None else environ
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    world = int(environ["WORLD_SIZE"])
    return int(environ["RANK"]), world, int(environ.get("LOCAL_WORLD_SIZE", world))


def settings(command, args, world=None):
    """``(ranks, options of run_bench)``, every option checked against the others
    (``command.error``, exit status 2, before any process starts); ``world``:
    :func:`torchrun_world`."""
    if world is not None and args.ranks is not None:
        command.error(
            f"argument --ranks: torchrun started the processes ({world[1]} of them); "
            "give --ranks only without torchrun"
        )
    if world is not None:
        ranks, source = world[1], f"torchrun's {world[1]} processes"
    elif args.ranks is not None:
        ranks, source = args.ranks, f"--ranks {args.ranks}"
    else:
        ranks, source = DEFAULTS["ranks"], f"the default --ranks {DEFAULTS['ranks']}"
    if args.experts % ranks:
        command.error(
            f"argument --experts: must be a multiple of the number of ranks ({source}): each "
            f"rank owns experts / ranks of them; got {args.experts}"
        )
    topk = check_topk(command, args.topk, args.experts, default=DEFAULTS["topk"])
    options = dict(
        tokens=args.tokens,
        hidden=args.hidden,
        experts=args.experts,
        topk=topk,
        alignment=args.alignment,
        dtype=getattr(torch, args.dtype),
        steps=args.steps,
        warmup=args.warmup,
    )
    return ranks, options


def _title(backend, ranks, threads, options):
    kind = f"{threads} CPU threads" if backend == "gloo" else "1 GPU"
    return (
        f"expert-parallel layer, {backend}, {ranks} ranks x {kind}: T={options['tokens']} per "
        f"rank, H={options['hidden']}, E={options['experts']}, K={options['topk']}, "
        f"A={options['alignment']}, {str(options['dtype']).removeprefix('torch.')}; mean of "
        f"{options['steps']} steps, slowest rank"
    )


def _under_torchrun(world, options):
    """This process's part of a torchrun launch: join torchrun's group, time, print on rank
    0."""
    rank, ranks, local_ranks = world
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks
    backend, threads = (
        ("nccl", 0) if on_gpu else ("gloo", max(1, (os.cpu_count() or 1) // local_ranks))
    )
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    else:
        import moe_cpu

        moe_cpu.set_num_threads(threads)
        torch.set_num_threads(threads)
    dist.init_process_group(backend)
    try:
        split = run_bench(**options)
        if rank == 0:
            print(format_split(split, _title(backend, ranks, threads, options)))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def main(argv=None):
    """Check the options, run the processes (or this one, under torchrun), print the split;
    returns the exit status."""
    command = parser()
    world = torchrun_world()
    ranks, options = settings(command, command.parse_args(argv), world)
    if world is not None:
        return _under_torchrun(world, options)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(
        _worker,
        args=(ranks, port, options, results),
        nprocs=ranks,
        start_method="spawn",
    )
    split = results.get()
    threads = max(1, (os.cpu_count() or 1) // ranks)
    print(format_split(split, _title("gloo", ranks, threads, options)))
    return 0
