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
import sys

import torch
import torch.distributed as dist

from moe_numba.__main__ import check_topk

from . import environment, records
from .options import check_writable, number, record_option
from .records import Figure


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

    Returns ``{"forward": {stage: Figure}, "backward": {stage: Figure}}``: per stage the
    microseconds of the slowest rank in each timed step, their min, median and max over the
    steps (:class:`.records.Figure`).
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
    stages = LayerTimer.STAGES
    timed = []  # per timed step: the seconds of each stage, forward then backward
    for step in range(warmup + steps):
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
        if step >= warmup:
            timed.append([timer.forward[s] for s in stages] + [timer.backward[s] for s in stages])
    times = torch.tensor(timed, dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)  # each step's slowest rank
    figures = [Figure.of(column, 1e6) for column in times.T.tolist()]
    n = len(stages)
    return {
        "forward": dict(zip(stages, figures[:n], strict=True)),
        "backward": dict(zip(stages, figures[n:], strict=True)),
    }


def record_rows(split):
    """The record rows of a split (:func:`run_bench`): one per pass and stage."""
    return [
        dict(key=f"{part} {stage}", unit="us", figures={"slowest rank": figure.record()})
        for part, stages in split.items()
        for stage, figure in stages.items()
    ]


def _on_cuda(group):
    return dist.get_backend(group) == "nccl"


def format_split(split, title):
    """The split as a table of milliseconds (medians) and shares of the step."""
    forward = {stage: f.median / 1e3 for stage, f in split["forward"].items()}
    backward = {stage: f.median / 1e3 for stage, f in split["backward"].items()}
    total = sum(forward.values()) + sum(backward.values())
    lines = [title, f"{'stage':<12}{'forward ms':>12}{'backward ms':>13}{'share':>8}"]
    for stage in forward:
        f, b = forward[stage], backward[stage]
        share = (f + b) / total if total else 0.0
        lines.append(f"{stage:<12}{f:>12.2f}{b:>13.2f}{share:>8.1%}")
    totals = sum(forward.values()), sum(backward.values())
    lines.append(f"{'total':<12}{totals[0]:>12.2f}{totals[1]:>13.2f}{1:>8.0%}")
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
    record_option(command, "under benchmarks/results/CARD/ for an NCCL run, none for gloo")
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
    if args.json:
        check_writable(command, "--json", args.json)
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
        f"A={options['alignment']}, {str(options['dtype']).removeprefix('torch.')}; per "
        f"stage the median over {options['steps']} steps of the slowest rank"
    )


def report(split, backend, ranks, threads, options, argv, path):
    """Print the split; write its record to ``path`` (None: under ``benchmarks/results/``
    for an NCCL run, nowhere for a gloo run)."""
    print(format_split(split, _title(backend, ranks, threads, options)))
    if path is None and backend != "nccl":
        return
    kind = "cuda" if backend == "nccl" else "cpu"
    described = f"{backend}, {ranks} ranks" + (f" x {threads} CPU threads" if threads else "")
    header = environment.header("distributed", kind, ["distributed", *argv], described)
    path = records.write(header, record_rows(split), path)
    print(f"record: {path}", file=sys.stderr)


def _under_torchrun(world, options, argv, path):
    """This process's part of a torchrun launch: join torchrun's group, time, report on rank
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
            report(split, backend, ranks, threads, options, argv, path)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def main(argv=None):
    """Check the options, run the processes (or this one, under torchrun), report the
    split; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = parser()
    world = torchrun_world()
    args = command.parse_args(argv)
    ranks, options = settings(command, args, world)
    if world is not None:
        return _under_torchrun(world, options, argv, args.json)
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
    report(split, "gloo", ranks, threads, options, argv, args.json)
    return 0
