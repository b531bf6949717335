"""Peak GPU memory of one forward + backward step of the training page's MoE layer.

The layer without the experts' GEMMs: permute -> each row times its probability (the
"expert", as in docs/examples/moe_layer.py) -> unweighted unpermute; then permute ->
unpermute with the weighted combine. Run on a CUDA GPU::

    python -m benchmarks memory [--json FILE]

The run's record (sizes in bytes) goes to ``--json FILE`` or under
``benchmarks/results/<card>/``.

:func:`measure` takes any step function, so a benchmark can time a peer's layer (Transformer
Engine's, say) on the same inputs and compare the figures.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from moe_numba import moe_permute, moe_unpermute, oracle
from moe_numba.__main__ import check_fits, check_topk

from . import environment, records
from .footprint import memory_need
from .options import check_writable, number, record_option, torch_cuda_problem
from .records import Figure


def measure(step, *args):
    """Run ``step(*args)`` once on CUDA and report its memory.

    Returns
    -------
    dict
        ``peak_bytes``: the most memory allocated above what was allocated before the call;
        ``held_bytes``: what the call left allocated (what ``step`` returned and kept).
    """
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    kept = step(*args)
    torch.cuda.synchronize()
    result = {
        "peak_bytes": torch.cuda.max_memory_allocated() - base,
        "held_bytes": torch.cuda.memory_allocated() - base,
    }
    del kept
    return result


def layer_inputs(num_tokens, hidden, topk, num_experts, alignment, *, seed=0, device="cuda"):
    """Rows, probabilities, routing, the output's gradient and the row count of one step."""
    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(num_tokens, hidden, device=device, dtype=torch.bfloat16, generator=generator)
    logits = torch.randn(num_tokens, num_experts, device=device, generator=generator)
    probs, ids = torch.topk(logits.softmax(dim=1), topk, dim=1)
    counts = torch.bincount(ids.flatten(), minlength=num_experts)
    num_rows = int(oracle.padded_rows(counts.tolist(), alignment).sum())
    grad_out = torch.randn(num_tokens, hidden, device=device, generator=generator)
    return dict(
        x=x.requires_grad_(),
        probs=probs.contiguous().requires_grad_(),
        routemap=ids.to(torch.int32),
        grad_out=grad_out.to(torch.bfloat16),
        num_experts=num_experts,
        alignment=alignment,
        num_rows=num_rows,
    )


def forward(inputs, weighted=False):
    """The layer's output (the graph for its backward attached)."""
    rows, rowmap, row_probs, _ = moe_permute(
        inputs["x"],
        None,
        inputs["routemap"],
        inputs["probs"],
        inputs["num_experts"],
        None,
        inputs["alignment"],
        override_buffer_size=inputs["num_rows"],
        validate=False,
    )
    expert = rows if weighted else rows * row_probs[:, None].to(rows.dtype)
    out, _ = moe_unpermute(
        expert,
        rowmap,
        inputs["routemap"],
        row_probs,
        inputs["x"].shape[0],
        inputs["num_experts"],
        using_weighted_combine=weighted,
        validate=False,
    )
    return out


def step(inputs, weighted=False):
    """One forward + backward of the layer; the gradients land in ``x.grad``, ``probs.grad``."""
    forward(inputs, weighted).backward(inputs["grad_out"])


def report(num_tokens, hidden, topk, num_experts, alignment, weighted=False):
    """The figures of one shape: the step's peak, what the forward keeps for the backward,
    and both in units of one ``[T, H]`` bf16 tensor."""
    inputs = layer_inputs(num_tokens, hidden, topk, num_experts, alignment)
    step(inputs, weighted)  # warm-up: kernels compiled, allocator pools filled
    inputs["x"].grad = inputs["probs"].grad = None
    forward_only = measure(forward, inputs, weighted)
    inputs["x"].grad = inputs["probs"].grad = None
    whole = measure(step, inputs, weighted)
    unit = num_tokens * hidden * 2
    return {
        "shape": dict(
            num_tokens=num_tokens,
            hidden=hidden,
            topk=topk,
            num_experts=num_experts,
            alignment=alignment,
            num_rows=inputs["num_rows"],
            weighted=weighted,
        ),
        "step_peak_bytes": whole["peak_bytes"],
        "forward_held_bytes": forward_only["held_bytes"],
        "step_peak_in_TH": whole["peak_bytes"] / unit,
        "forward_held_in_TH": forward_only["held_bytes"] / unit,
    }


def parser():
    """The command line's parser."""
    command = argparse.ArgumentParser(
        prog="python -m benchmarks memory", description=__doc__.partition("\n\n")[0]
    )
    for name, default in (
        ("tokens", 16384),
        ("hidden", 7168),
        ("topk", 8),
        ("experts", 64),
        ("alignment", 128),
    ):
        number(command, name, default=default)
    record_option(command)
    return command


def settings(command, args):
    """The shape, every option checked (``command.error``, exit status 2, before any work)."""
    check_topk(command, args.topk, args.experts)
    if args.json:
        check_writable(command, "--json", args.json)
    problem = torch_cuda_problem()
    if problem:
        command.error(f"needs torch with a CUDA GPU; {problem}")
    shape = (args.tokens, args.hidden, args.topk, args.experts, args.alignment)
    label = "T={} H={} K={} E={} A={}".format(*shape)
    check_fits(command, "cuda", [(memory_need(*shape), f"the layer step {label}")])
    return shape


def record_row(measured):
    """The record row of one :func:`report` (sizes in bytes, measured once)."""
    shape = measured["shape"]
    key = "T={num_tokens} H={hidden} K={topk} E={num_experts} A={alignment}".format(**shape)
    key += " weighted" if shape["weighted"] else " unweighted"
    sizes = dict(step_peak=measured["step_peak_bytes"], forward_held=measured["forward_held_bytes"])
    return dict(
        measured,
        key=key,
        unit="bytes",
        figures={name: Figure.of([value]).record() for name, value in sizes.items()},
    )


def main(argv=None):
    """Check the options, measure both layers, print the figures and write the record;
    returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = parser()
    args = command.parse_args(argv)
    shape = settings(command, args)
    results = [report(*shape, weighted) for weighted in (False, True)]
    print(json.dumps(results, indent=2))
    header = environment.header("memory", "cuda", ["memory", *argv], "cuda (torch tensors)")
    path = records.write(header, [record_row(r) for r in results], args.json)
    print(f"record: {path}", file=sys.stderr)
    return 0
