"""The gradient ops in the bench: each against a copy of the same bytes, on a GPU.

::

    python -m benchmarks gradients [--tokens 16384] [--hidden 7168] [--experts 64]
        [--topk 8] [--alignment 128] [--dtype bf16] [--repeat 15] [--check] [--json FILE]

prints the bench's table (:func:`.report.print_table`: GPU time per call with the host
running ahead, one call's latency after a host sync, host time per call, GB/s and % of the
copy) for, each with ``validate=True`` and ``validate=False``:

- ``permute_backward``: both gradients; reads the T*K routed rows of the gradient, writes
  the T rows of the data gradient;
- ``unpermute_backward weighted``: the row and probability gradients of a weighted combine;
  reads dY (T rows) and the T*K routed rows of Xu, writes the R rows of dXu (padding rows
  too: they are zeroed);
- ``unpermute_backward``: unweighted; reads dY, writes dXu.

Index and probability traffic is not counted (as in :mod:`.bytes`). The inputs come from a
forward ``moe_permute`` of the case's rows on the GPU, so the row map is the real layout.
``--check`` first compares every output with the CPU backend's, bit for bit. The run's
record goes to ``--json FILE`` or under ``benchmarks/results/<card>/``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from moe_numba import moe_permute, moe_permute_backward, moe_unpermute_backward
from moe_numba.__main__ import check_fits, check_topk

from . import environment, records
from .bytes import padded_rows
from .cases import DTYPES, Case, defaults, make_inputs
from .footprint import gradients_need
from .options import check_writable, number, record_option
from .report import print_table
from .target import NoGPUError, choose
from .workload import Operation, time_operations


def _name(op, validate):
    return op if validate else f"{op} validate=False"


def gradient_calls(case, target, seed=1):
    """``{name: (call, nbytes, arrays, flags)}`` of the three gradient calls of ``case``
    (``call(validate)`` runs one on ``target``; ``arrays`` are its NumPy inputs)."""
    inputs = make_inputs(case)
    (rows, rowmap, row_probs, _), _ = _forward(case, inputs, target)
    rowmap, rows, row_probs = (target.to_host(x) for x in (rowmap, rows, row_probs))
    rng = np.random.default_rng(seed)
    dtype = DTYPES[case.dtype]
    R, T, H = rows.shape[0], case.tokens, case.hidden
    row_bytes = H * case.itemsize
    routed = T * case.topk  # make_inputs routes every slot
    assert R == padded_rows(inputs.counts, case.alignment)
    grad_rows = rng.standard_normal((R, H), dtype=np.float32).astype(dtype)
    grad_row_probs = rng.standard_normal(R, dtype=np.float32)
    dy = rng.standard_normal((T, H), dtype=np.float32).astype(dtype)
    g = rng.standard_normal((T, case.topk), dtype=np.float32)
    maps = (rowmap, inputs.routemap)
    weighted = dict(using_weighted_combine=True, num_rows=R)
    unweighted = dict(using_weighted_combine=False, num_rows=R)
    return {
        "permute_backward": (
            moe_permute_backward,
            (routed + T) * row_bytes,
            (grad_rows, grad_row_probs, *maps),
            {},
        ),
        "unpermute_backward weighted": (
            moe_unpermute_backward,
            (T + routed + R) * row_bytes,
            (dy, g, rows, *maps, row_probs),
            weighted,
        ),
        "unpermute_backward": (
            moe_unpermute_backward,
            (T + R) * row_bytes,
            (dy, g, None, *maps, None),
            unweighted,
        ),
    }


def _forward(case, inputs, target):
    args = (inputs.hidden, inputs.scale, inputs.routemap, inputs.probs)
    uploaded = [target.upload(x) for x in args]
    return moe_permute(*uploaded, case.experts, inputs.counts, case.alignment), uploaded


def operations(case, target, validates=(True, False)):
    """The gradient calls of ``case`` on ``target`` as timed :class:`.workload.Operation`
    (inputs uploaded once), once per value in ``validates``."""
    ops = []
    for name, (op, nbytes, arrays, flags) in gradient_calls(case, target).items():
        uploaded = [target.upload(x) for x in arrays]
        for validate in validates:
            ops.append(
                Operation(
                    _name(name, validate),
                    lambda op=op, a=uploaded, f=flags, v=validate: op(*a, **f, validate=v),
                    nbytes,
                    validate,
                )
            )
    return ops


def check(case, target):
    """Every output of the three calls on ``target`` equals the CPU backend's, bit for bit;
    raises AssertionError naming the first that does not."""
    for name, (op, _, arrays, flags) in gradient_calls(case, target).items():
        expected = op(*arrays, **flags)
        actual = op(*(target.upload(x) for x in arrays), **flags)
        for i, (a, b) in enumerate(zip(actual, expected, strict=True)):
            if not np.array_equal(target.to_host(a).view(np.uint8), b.view(np.uint8)):
                raise AssertionError(f"{case.label()}: {name}: output {i} differs from the CPU's")
        print(f"check: {name}: every output equals the CPU backend's", file=sys.stderr)


def parser():
    """The command line of the module docstring."""
    command = argparse.ArgumentParser(
        prog="python -m benchmarks gradients",
        description="Time the gradient ops (with and without validation) against a copy of "
        "the same bytes, on a CUDA GPU.",
    )
    for name, value in defaults("cuda").items():
        if name != "dtype":
            number(command, name, default=value)
    command.add_argument(
        "--dtype",
        choices=[d for d in DTYPES if d != "fp8"],
        default="bf16",
        help="row dtype (the gradients of float8 rows are not computed)",
    )
    number(command, "repeat", default=15)
    command.add_argument("--check", action="store_true", help="compare with the CPU first")
    record_option(command)
    return command


def settings(command, args, choose=choose):
    """``(case, target)``, every option checked (``command.error``, exit status 2, before
    any work); ``choose(backend)`` finds the GPU (:func:`.target.choose`)."""
    check_topk(command, args.topk, args.experts)
    if args.json:
        check_writable(command, "--json", args.json)
    names = ("tokens", "hidden", "experts", "topk", "alignment", "dtype")
    case = Case(**{n: getattr(args, n) for n in names})
    try:
        target = choose("cuda")
    except NoGPUError as e:
        command.error(f"needs a CUDA GPU: {e}")
    check_fits(command, target.device, [(gradients_need(case), case.label())])
    return case, target


def main(argv=None):
    """Check the options, time the gradient ops, write the record; returns the exit
    status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = parser()
    args = command.parse_args(argv)
    case, target = settings(command, args)
    if args.check:
        check(case, target)
    from .timers import CudaTimer

    results = time_operations(case, operations(case, target), target, CudaTimer(args.repeat))
    print(f"{target.description}; {case.label()}")
    print_table(results)
    header = environment.header("gradients", "cuda", ["gradients", *argv], target.description)
    path = records.write(header, [r.record() for r in results], args.json)
    print(f"record: {path}", file=sys.stderr)
    return 0
