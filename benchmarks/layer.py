"""The transformers experts layer for real model shapes: moe-numba against transformers' own.

::

    python -m benchmarks layer [--models qwen3-30b-a3b,mixtral-8x7b,deepseek-v3,gpt-oss-20b]
        [--tokens 16,512,4096,16384] [--impls moe_numba,grouped_mm,batched_mm,eager]
        [--iters 10] [--warmup 3] [--json PATH]

Needs a CUDA GPU and transformers>=5. Each model's own experts class is built with the
model's expert shapes (random bfloat16 weights, random top-k routing with bfloat16 weights)
and run through each experts implementation of ``ExpertsInterface``: ``moe_numba``
(:mod:`moe_numba.transformers`) and transformers' ``grouped_mm``, ``batched_mm`` and
``eager``. For every token count T it times the forward (under ``torch.no_grad``) and the
forward plus backward (weights, hidden states and routing weights requiring gradients), as
the median of CUDA-event times after warm-up, and the share of moe-numba's layer spent in its
permute and unpermute (those two ops and the routing clean-up, timed alone on the same
inputs); the GPU time of the permute and unpermute alone (with their backward for
forward+backward) with the host running ahead, beside a device copy of the bytes they move;
and, for the forward, the largest difference between moe-numba's output and
``grouped_mm``'s relative to the largest value of the latter. ``batched_mm`` copies one
weight matrix per (token, slot) pair; a case whose copies would pass ``--batched-limit-gib``
is skipped. The run's record (:mod:`.records`; each time a figure over the timed runs, in
microseconds) goes to ``--json FILE`` or under ``benchmarks/results/<card>/``.
"""

from __future__ import annotations

import argparse
import math
import sys

from . import environment, records
from .options import LIMITS, check_writable, number, torch_cuda_problem
from .records import Figure

# name -> (transformers model type, its experts class, config keyword arguments, top-k)
MODELS = {
    "qwen3-30b-a3b": (
        "qwen3_moe",
        "Qwen3MoeExperts",
        {"hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 128},
        8,
    ),
    "mixtral-8x7b": (
        "mixtral",
        "MixtralExperts",
        {"hidden_size": 4096, "intermediate_size": 14336, "num_local_experts": 8},
        2,
    ),
    "deepseek-v3": (
        "deepseek_v3",
        "DeepseekV3Experts",
        {"hidden_size": 7168, "moe_intermediate_size": 2048, "n_routed_experts": 256},
        8,
    ),
    "gpt-oss-20b": (
        "gpt_oss",
        "GptOssExperts",
        {"hidden_size": 2880, "intermediate_size": 2880, "num_local_experts": 32},
        4,
    ),
}
IMPLS = ("moe_numba", "grouped_mm", "batched_mm", "eager")
OPS = "permute+unpermute"  # the figure of the layer's permute and unpermute alone
TOKENS = (16, 512, 4096, 16384)


def _names(text, allowed):
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(allowed)}; got {text!r}"
        )
    return names


def _tokens(text):
    low, high = LIMITS["tokens"]
    try:
        values = [int(n) for n in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(low <= v <= high for v in values):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of integers from {low} to {high}; got {text!r}"
        )
    return values


def _gib(text):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number of GiB; got {text!r}")
    return value


def parser():
    """The command line's parser."""
    command = argparse.ArgumentParser(
        prog="python -m benchmarks layer",
        description="Time the transformers experts layer: moe-numba against transformers' "
        "grouped_mm, batched_mm and eager (CUDA GPU only).",
    )
    command.add_argument(
        "--models",
        type=lambda t: _names(t, tuple(MODELS)),
        default=list(MODELS),
        help=f"comma-separated, of {', '.join(MODELS)} (default: all)",
    )
    command.add_argument(
        "--tokens",
        type=_tokens,
        default=list(TOKENS),
        help="comma-separated token counts T (default: %(default)s)",
    )
    command.add_argument(
        "--impls",
        type=lambda t: _names(t, IMPLS),
        default=list(IMPLS),
        help=f"comma-separated, of {', '.join(IMPLS)} (default: all)",
    )
    number(command, "iters", default=10)
    number(command, "warmup", default=3)
    command.add_argument(
        "--batched-limit-gib",
        type=_gib,
        default=8.0,
        help="skip batched_mm where its per-pair weight copies pass this many GiB (default 8)",
    )
    command.add_argument(
        "--json",
        metavar="FILE",
        help="write the run's record there (default: under benchmarks/results/CARD/)",
    )
    return command


def parse_args(argv=None):
    """The command line, checked (``SystemExit``, exit status 2, with a message naming the
    option for a bad one) before any work; the GPU and transformers are checked too."""
    command = parser()
    args = command.parse_args(argv)
    if args.json:
        check_writable(command, "--json", args.json)
    problem = torch_cuda_problem()
    if problem:
        command.error(f"needs torch with a CUDA GPU; {problem}")
    try:
        from transformers.integrations.moe import ExpertsInterface  # noqa: F401
    except ImportError:
        command.error("needs transformers>=5: pip install 'moe-numba[transformers]'")
    return args


def main(argv=None):
    """Run the benchmark after its checks (:func:`parse_args`), write its record; returns
    the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    import torch

    from moe_numba import transformers as backend

    backend.register()
    header = environment.header("layer", "cuda", ["layer", *argv], "cuda (torch tensors)")
    path = args.json or records.default_path(header)
    rows = []
    print(f"device: {torch.cuda.get_device_name()}; times in ms (median of {args.iters})")
    titles = ["model", "T", "pass", *args.impls, "permute+unpermute share"]
    titles += ["permute+unpermute GPU us", "copy GPU us", "max rel diff"]
    print(" | ".join(titles))
    for model in args.models:
        experts, top_k = _experts(torch, model)
        for tokens in args.tokens:
            for backward in (False, True):
                row = _case(torch, backend, experts, top_k, tokens, backward, args)
                row = dict(key=f"{model} T={tokens} {row['pass']}", model=model, T=tokens, **row)
                rows.append(row)
                print(" | ".join(_cells(row, args.impls)), flush=True)
                records.save(path, header, rows)
        del experts
        torch.cuda.empty_cache()
    print(f"record: {path}", file=sys.stderr)
    return 0


def _cells(row, impls):
    """The printed cells of a row: ms per implementation, the share, the µs, the diff."""
    figures = row["figures"]
    cells = [row["model"], str(row["T"]), row["pass"]]
    for impl in impls:
        cells.append("skip" if impl in row["skipped"] else f"{figures[impl]['median'] / 1e3:.3f}")
    share = row["glue_share"]
    cells.append("-" if share is None else f"{100 * share:.0f}%")
    for part in (figures, row["copy"]):
        cells.append(f"{part[OPS]['median']:.1f}" if OPS in part else "-")
    diff = row["rel_diff_vs_grouped_mm"]
    cells.append("-" if diff is None else f"{diff:.1e}")
    return cells


def _experts(torch, model):
    """The model's experts module on the GPU, bfloat16, weights ~ N(0, 0.02)."""
    import importlib

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    family, class_name, sizes, top_k = MODELS[model]
    config = CONFIG_MAPPING[family](**sizes, num_experts_per_tok=top_k)
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cls = getattr(modeling, class_name)
    with torch.device("meta"):
        experts = cls(config).to(torch.bfloat16)
    experts = experts.to_empty(device="cuda")
    with torch.no_grad():
        for parameter in experts.parameters():
            parameter.normal_(0.0, 0.02)
    return experts, top_k


def _case(torch, backend, experts, top_k, tokens, backward, args):
    """The record row of one (T, pass) case, but its key: microseconds of every
    implementation (``figures[impl]``) and of the glue, the glue's share, the permute and
    unpermute alone beside their copy (``figures[OPS]``, ``copy[OPS]``), and the difference
    to ``grouped_mm``'s output."""
    generator = torch.Generator(device="cuda").manual_seed(tokens)
    num_experts = experts.num_experts
    width = experts.down_proj.shape[-1] if experts.is_transposed else experts.down_proj.shape[1]
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16, generator=generator)
    logits = torch.randn(tokens, num_experts, device="cuda", generator=generator)
    weights, index = torch.topk(logits.softmax(-1), top_k, dim=-1)
    weights = weights.to(torch.bfloat16)
    grad = torch.randn_like(x)
    out = dict(
        unit="us",
        figures={},
        copy={},
        skipped=[],
        glue_share=None,
        rel_diff_vs_grouped_mm=None,
    )
    out["pass"] = "fwd+bwd" if backward else "fwd"
    if not backward and {"moe_numba", "grouped_mm"} <= set(args.impls):
        # the same layer, so the same result up to bfloat16 rounding
        results = []
        for impl in ("moe_numba", "grouped_mm"):
            experts.config._experts_implementation = impl
            with torch.no_grad():
                results.append(experts(x, index, weights).float())
        difference = (results[0] - results[1]).abs().max() / results[1].abs().max()
        out["rel_diff_vs_grouped_mm"] = difference.item()
    for impl in args.impls:
        if impl == "batched_mm":
            pair_bytes = experts.gate_up_proj[0].nbytes + experts.down_proj[0].nbytes
            if tokens * top_k * pair_bytes > args.batched_limit_gib * 2**30:
                out["skipped"].append(impl)
                continue
        experts.config._experts_implementation = impl

        def layer(impl=impl):
            return experts(*_inputs(x, index, weights, backward))

        out["figures"][impl] = _timed(torch, layer, grad if backward else None, experts, args)

    if "moe_numba" in args.impls:

        def glue():
            x_, index_, weights_ = _inputs(x, index, weights, backward)
            return _glue(backend, x_, index_, weights_, num_experts)

        figure = _timed(torch, glue, grad if backward else None, experts, args)
        out["figures"]["glue"] = figure
        out["glue_share"] = figure["median"] / out["figures"]["moe_numba"]["median"]
        out["figures"][OPS], out["copy"][OPS] = _against_copy(
            torch, backend, x, index, weights, num_experts, grad if backward else None, args
        )
    return out


def _against_copy(torch, backend, x, index, weights, num_experts, grad, args):
    """GPU microseconds per call (record figures), the host running ahead
    (:meth:`.timers.CudaTimer.gpu_samples`),
    of the layer's permute and unpermute on its cleaned-up routing (with their backward
    when ``grad`` is given), and of a device copy of the bytes they move
    (:mod:`.bytes`: the layer's buffer is unpadded, so its routed rows are T*K)."""
    from .bytes import permute_bytes, step_bytes, unpermute_bytes
    from .cases import Case
    from .target import CudaTarget
    from .timers import CudaTimer

    tokens, top_k = index.shape
    case = Case(tokens, x.shape[1], num_experts, top_k, 1, "bf16")
    counts = [tokens * top_k]
    if grad is None:
        nbytes = permute_bytes(case, counts) + unpermute_bytes(case)
    else:
        nbytes = step_bytes(case, counts)
    with torch.no_grad():
        routes, probs = backend.merged_routing(index, weights, num_experts)

    def ops():
        rows, row_probs = x, probs
        if grad is not None:
            rows, row_probs = x.detach().requires_grad_(), probs.detach().requires_grad_()
        permuted = backend.permute_routes(rows, routes, row_probs, num_experts)
        combined = backend.combine_rows(permuted[0], permuted[1], routes, permuted[2], num_experts)
        if grad is not None:
            combined.backward(grad)

    timer = CudaTimer(args.iters, batch=10, warmup=args.warmup)
    copy = CudaTarget("torch").copier(nbytes)
    with torch.no_grad() if grad is None else torch.enable_grad():
        for _ in range(args.warmup + 1):
            ops()
        ops_us = Figure.of(timer.gpu_samples(ops))
    copy()
    return ops_us.record(), Figure.of(timer.gpu_samples(copy)).record()


def _inputs(x, index, weights, backward):
    if backward:
        return x.detach().requires_grad_(), index, weights.detach().requires_grad_()
    return x, index, weights


def _glue(backend, x, index, weights, num_experts):
    """The moe-numba layer without its GEMMs: routing clean-up, permute (with the offsets),
    unpermute (the permuted rows combined as they are)."""
    routes, permuted = backend.permute_rows(x, index, weights, num_experts)
    rows, rowmap, row_probs = permuted[0], permuted[1], permuted[2]
    return backend.combine_rows(rows, rowmap, routes, row_probs, num_experts)


def _timed(torch, function, grad, experts, args):
    """Microseconds of ``function()`` (and its backward with ``grad``), a record figure over
    ``args.iters`` runs after ``args.warmup``."""
    times = []
    context = torch.no_grad() if grad is None else torch.enable_grad()
    with context:
        for i in range(args.warmup + args.iters):
            experts.zero_grad(set_to_none=True)
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            result = function()
            if grad is not None:
                result.backward(grad)
            stop.record()
            stop.synchronize()
            if i >= args.warmup:
                times.append(start.elapsed_time(stop))
    return Figure.of(times, 1e3).record()
