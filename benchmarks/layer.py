"""The transformers experts layer for real model shapes: moe-numba against transformers' own.

::

    python -m benchmarks layer [--decode]
        [--models qwen3-30b-a3b,mixtral-8x7b,deepseek-v3,gpt-oss-20b]
        [--tokens 16,512,4096,16384] [--impls moe_numba,grouped_mm,batched_mm,eager]
        [--iters 10] [--warmup 3] [--batched-limit-gib 8] [--json FILE]

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

``--decode`` times decode steps instead: for each model, T (1, 4, 16, 64 by default) and
implementation (``moe_numba`` and ``batched_mm`` by default; ``grouped_mm`` too if asked;
``eager`` reads the routing on the host, which a graph cannot capture), the forward under
``torch.no_grad`` captured in a CUDA graph and replayed, and the same forward launched
without the graph, each in every mode of the bench's GPU timer (GPU time with the host
running ahead, one step right after a sync, host time), and whether the graph's output equals
the eager call's bit for bit. moe-numba's layer is capturable as it is: its permute sizes the
buffer itself (``override_buffer_size``) and checks nothing on the host (``validate=False``).
"""

from __future__ import annotations

import argparse
import math
import sys

from moe_numba._errors import install_extra

from . import environment, records
from .options import (
    LIMITS,
    check_writable,
    float_in,
    number,
    record_option,
    torch_cuda_problem,
)
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
# --decode: a forward step captured in a CUDA graph and replayed. transformers' eager backend
# reads the routing on the host (a loop over the experts hit), which a graph cannot capture.
DECODE_TOKENS = (1, 4, 16, 64)
DECODE_IMPLS = ("moe_numba", "batched_mm")
CAPTURABLE = ("moe_numba", "grouped_mm", "batched_mm")


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


def parser():
    """The command line's parser."""
    command = argparse.ArgumentParser(
        prog="python -m benchmarks layer",
        description="Time the transformers experts layer: moe-numba against transformers' "
        "grouped_mm, batched_mm and eager (CUDA GPU only); with --decode, a forward step "
        "captured in a CUDA graph and replayed.",
    )
    command.add_argument(
        "--decode",
        action="store_true",
        help="time decode steps: the forward at small T captured in a CUDA graph and replayed "
        "(and launched without the graph), for moe_numba and batched_mm by default",
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
        help="comma-separated token counts T (default: "
        f"{','.join(map(str, TOKENS))}; with --decode {','.join(map(str, DECODE_TOKENS))})",
    )
    command.add_argument(
        "--impls",
        type=lambda t: _names(t, IMPLS),
        help=f"comma-separated, of {', '.join(IMPLS)} (default: all; with --decode "
        f"{','.join(DECODE_IMPLS)}, and eager cannot be captured)",
    )
    number(command, "iters", default=10)
    number(command, "warmup", default=3)
    command.add_argument(
        "--batched-limit-gib",
        type=float_in(lambda v: 0 < v < math.inf, "a positive number of GiB"),
        default=8.0,
        help="skip batched_mm where its per-pair weight copies pass this many GiB (default 8)",
    )
    record_option(command)
    return command


def options(command, args):
    """``args`` with the defaults that depend on ``--decode``, every option checked against
    the others (``command.error``, exit status 2)."""
    if args.tokens is None:
        args.tokens = list(DECODE_TOKENS if args.decode else TOKENS)
    if args.impls is None:
        args.impls = list(DECODE_IMPLS if args.decode else IMPLS)
    refused = [impl for impl in args.impls if impl not in CAPTURABLE]
    if args.decode and refused:
        command.error(
            f"argument --impls: {refused[0]} reads the routing on the host, which a CUDA graph "
            f"cannot capture: with --decode choose from {', '.join(CAPTURABLE)}"
        )
    if args.json:
        check_writable(command, "--json", args.json)
    return args


def parse_args(argv=None):
    """The command line, checked (``SystemExit``, exit status 2, with a message naming the
    option for a bad one) before any work; the GPU and transformers are checked too."""
    command = parser()
    args = options(command, command.parse_args(argv))
    problem = torch_cuda_problem()
    if problem:
        command.error(f"needs torch with a CUDA GPU; {problem}")
    try:
        from transformers.integrations.moe import ExpertsInterface  # noqa: F401
    except ImportError:
        command.error(f"needs transformers>=5: {install_extra('transformers')}")
    return args


def main(argv=None):
    """Run the benchmark after its checks (:func:`parse_args`), write its record; returns
    the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    import torch

    from moe_numba import transformers as backend

    backend.register()
    what = "decode" if args.decode else "layer"
    header = environment.header(what, "cuda", ["layer", *argv], "cuda (torch tensors)")
    path = args.json or records.default_path(header)
    if args.decode:
        return decode(torch, args, header, path)
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


# ------------------------------------------------------------------------------ --decode


def decode(torch, args, header, path):
    """Decode steps: per model, T and implementation, the forward captured in a CUDA graph
    and replayed, and the same forward launched without the graph, each timed in every mode
    of :class:`.timers.CudaTimer`; the record's rows, written to ``path``. Returns 0."""
    rows = []
    print(f"device: {torch.cuda.get_device_name()}; µs per step, medians of {args.iters}")
    titles = ["model", "T", "impl", "graph GPU", "graph 1-call", "graph host"]
    print(" | ".join([*titles, "eager GPU", "eager 1-call", "eager host", "graph = eager"]))
    for model in args.models:
        experts, top_k = _experts(torch, model)
        for tokens in args.tokens:
            for impl in args.impls:
                row = decode_row(torch, experts, top_k, tokens, impl, args)
                row = dict(key=f"{model} T={tokens} {impl}", model=model, T=tokens, **row)
                rows.append(row)
                print(" | ".join(decode_cells(row)), flush=True)
                records.save(path, header, rows)
        del experts
        torch.cuda.empty_cache()
    print(f"record: {path}", file=sys.stderr)
    return 0


def decode_cells(row):
    """The printed cells of a decode row."""
    cells = [row["model"], str(row["T"]), row["impl"]]
    if row["skipped"]:
        return [*cells, f"skipped: {row['skipped']}"]
    figures = row["figures"]
    for kind in ("graph", "eager"):
        for mode in ("gpu", "one_call", "host"):
            name = f"{kind} {mode}"
            cells.append(f"{figures[name]['median']:.1f}" if name in figures else "-")
    same = row["graph_equals_eager"]
    cells.append("-" if same is None else "yes" if same else "NO")
    return cells


def decode_row(torch, experts, top_k, tokens, impl, args):
    """One decode case (but its key): ``figures`` ``graph MODE`` and ``eager MODE`` in
    microseconds, whether the graph's output equals the eager call's bit for bit, and why
    the case was skipped (batched_mm's weight copies past ``--batched-limit-gib``, a layer
    the graph could not capture), where it was."""
    from .timers import CudaTimer

    row = dict(unit="us", impl=impl, figures={}, skipped=None, graph_equals_eager=None)
    if impl == "batched_mm":
        pair_bytes = experts.gate_up_proj[0].nbytes + experts.down_proj[0].nbytes
        if tokens * top_k * pair_bytes > args.batched_limit_gib * 2**30:
            row["skipped"] = f"per-pair weight copies over {args.batched_limit_gib:g} GiB"
            return row
    generator = torch.Generator(device="cuda").manual_seed(tokens)
    num_experts = experts.num_experts
    width = experts.down_proj.shape[-1] if experts.is_transposed else experts.down_proj.shape[1]
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16, generator=generator)
    logits = torch.randn(tokens, num_experts, device="cuda", generator=generator)
    weights, index = torch.topk(logits.softmax(-1), top_k, dim=-1)
    weights = weights.to(torch.bfloat16)
    experts.config._experts_implementation = impl

    def step():
        return experts(x, index, weights)

    timer = CudaTimer(args.iters, batch=10, warmup=args.warmup)
    with torch.no_grad():
        eager = step().clone()
        row["figures"].update({f"eager {m}": f.record() for m, f in timer.time(step).items()})
        try:
            graph, out = capture(torch, step, args.warmup)
        except Exception as error:  # (a layer a graph cannot capture: its row says why)
            row["skipped"] = f"capture failed: {type(error).__name__}: {error}"[:300]
            return row
        graph.replay()
        torch.cuda.synchronize()
        row["graph_equals_eager"] = bool(torch.equal(out, eager))
        figures = timer.time(graph.replay)
        row["figures"].update({f"graph {m}": f.record() for m, f in figures.items()})
    return row


def capture(torch, step, warmup):
    """``(graph, output)``: ``step()`` run ``warmup`` times (at least once) on a side stream,
    as torch asks before a capture (kernels compiled, allocator pools filled), then captured
    in a CUDA graph whose replays write ``output``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = step()
    return graph, output
