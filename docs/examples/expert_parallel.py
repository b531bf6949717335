"""Expert parallelism: a Mixture-of-Experts layer whose experts live on different ranks.

Run it with one process per rank (CPUs: gloo; one GPU per process: NCCL)::

    torchrun --nproc-per-node 2 docs/examples/expert_parallel.py
    python docs/examples/expert_parallel.py    # starts 2 processes on this machine itself

Every rank routes its own tokens over E experts; rank p owns experts [p E/P, (p+1) E/P). The
layer sends the rows to their experts' ranks, runs a grouped GEMM there, brings the results
back and combines them. The script checks the output and every gradient against one process
that runs the whole batch with all the experts, and prints the comparison. (Where the
layer's time goes, stage by stage: ``python -m benchmarks distributed`` in a checkout.)
"""

import os

# NVLink multicast (NCCL's NVLS, PyTorch's symmetric-memory multicast, NVSHMEM's NVLS) is not
# needed for all_to_all, and on a host whose GPUs are shared a program that uses it can put
# them out of service for everyone: keep it off (set before NCCL starts).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

RANKS = 2  # when the script starts its processes itself


def skip_reason():
    """Why this example cannot run here, or None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return "needs PyTorch"
    if not dist.is_available() or not dist.is_gloo_available():
        return "needs torch.distributed with gloo"
    return None


def run():
    """This rank of the example: join the group, run the layer and the check."""
    import torch
    import torch.distributed as dist

    import moe_cpu

    ranks = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= ranks
    if on_gpu:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # the processes share the cores: give each an equal share for moe_cpu and torch
        threads = max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"]))
        moe_cpu.set_num_threads(threads)
        torch.set_num_threads(threads)
    dist.init_process_group("nccl" if on_gpu else "gloo")
    try:
        compare(rank, ranks, device, on_gpu)
        dist.barrier()
    finally:  # (a gloo process that exits without this aborts, hiding the traceback)
        dist.destroy_process_group()


def compare(rank, ranks, device, on_gpu):
    """The layer on this rank's tokens against one process on all of them."""
    import torch
    import torch.distributed as dist

    from moe_numba.torch.distributed import (
        expert_parallel_moe,
        local_experts,
        single_process_moe,
    )

    # The global batch, the same on every rank (a seed); each rank takes its own tokens.
    num_experts, topk, hidden = 4 * ranks, 2, 64
    tokens = [48 + 16 * r for r in range(ranks)]
    g = torch.Generator().manual_seed(0)
    x_all = torch.randn(sum(tokens), hidden, generator=g).to(torch.bfloat16)
    logits = torch.randn(sum(tokens), num_experts, generator=g)
    probs_all, routemap_all = logits.softmax(1).topk(topk, 1)
    weights_all = (torch.randn(num_experts, hidden, hidden, generator=g) / 8).to(torch.bfloat16)
    dy_all = torch.randn(sum(tokens), hidden, generator=g).to(torch.bfloat16)
    x_all, probs_all, routemap_all, weights_all, dy_all = (
        t.to(device) for t in (x_all, probs_all, routemap_all, weights_all, dy_all)
    )
    start = sum(tokens[:rank])
    mine = slice(start, start + tokens[rank])

    def grouped_gemm(weights):
        # rows arrive expert-major with tokens_per_expert rows each: one matmul per expert
        def expert_fn(rows, tokens_per_expert, probs):
            parts = torch.split(rows, list(tokens_per_expert))
            return torch.cat([part @ w for part, w in zip(parts, weights, strict=True)])

        return expert_fn

    # expert parallel: this rank's tokens, this rank's experts
    own = local_experts(num_experts)
    x = x_all[mine].clone().requires_grad_(True)
    probs = probs_all[mine].clone().requires_grad_(True)
    weights = weights_all[own.start : own.stop].clone().requires_grad_(True)
    y = expert_parallel_moe(x, routemap_all[mine], probs, grouped_gemm(weights), num_experts)
    y.backward(dy_all[mine])

    # one process: the whole batch, every expert
    x_ref = x_all.clone().requires_grad_(True)
    probs_ref = probs_all.clone().requires_grad_(True)
    weights_ref = weights_all.clone().requires_grad_(True)
    y_ref = single_process_moe(
        x_ref, routemap_all, probs_ref, grouped_gemm(weights_ref), num_experts
    )
    y_ref.backward(dy_all)

    checks = {
        "output": (y, y_ref[mine]),
        "grad x": (x.grad, x_ref.grad[mine]),
        "grad probs": (probs.grad, probs_ref.grad[mine]),
        "grad expert weights": (weights.grad, weights_ref.grad[own.start : own.stop]),
    }
    # per check, over all ranks: the largest difference and whether every bit agrees
    summary = torch.tensor(
        [
            value
            for a, b in checks.values()
            for value in ((a.float() - b.float()).abs().max().item(), float(torch.equal(a, b)))
        ],
        device=device,
    )
    worst = summary.clone()
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    agree = summary.clone()
    dist.all_reduce(agree, op=dist.ReduceOp.MIN)
    if rank == 0:
        kind = f"{ranks} GPUs, NCCL" if on_gpu else f"{ranks} CPU processes, gloo"
        print(
            f"expert-parallel MoE layer: {kind}; E={num_experts}, K={topk}, H={hidden}, "
            f"tokens per rank {tokens}, bfloat16"
        )
        for i, name in enumerate(checks):
            same = "identical bits" if agree[2 * i + 1] == 1 else "differs"
            print(f"  {name:<20} vs one process: max |diff| {worst[2 * i]:.3g} ({same})")
    # the combine and the permute's gradient are bit-exact; the GEMMs may block differently
    # for different row counts (and so round differently), the weight gradients add rows in
    # another order
    assert worst[0] <= 0.05 and worst[2] <= 0.05 and worst[4] <= 0.05 and worst[6] <= 0.5


def main():
    """Under torchrun: run this rank. Otherwise: start RANKS local processes running it."""
    if "RANK" in os.environ:
        run()
        # gloo's worker threads can abort the process while the interpreter shuts down
        # ("terminate called without an active exception"), after the group was destroyed
        # and every result printed: end here instead, with the status of a clean exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    processes = []
    for rank in range(RANKS):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(RANKS),
            LOCAL_WORLD_SIZE=str(RANKS),
        )
        processes.append(subprocess.Popen([sys.executable, __file__], env=env))
    try:
        codes = [p.wait(timeout=300) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    assert codes == [0] * RANKS, f"exit codes {codes}"


if __name__ == "__main__":
    main()
