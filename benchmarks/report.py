"""The printed table of a run (``python -m benchmarks compare`` compares two runs' records)."""

from __future__ import annotations

import sys

from .records import MODE_TITLES

_OP = 44  # width of the operation column (indented under its case)
# what "% copy" compares on the CPU, printed under the titles of a CPU run
CPU_COPY_NOTE = (
    "(CPU: the copy is moe_cpu's parallel copy of the same bytes, reading as many as it "
    "writes,\n one equal chunk per thread; a permute reads each row once and writes it to "
    "every expert\n it goes to, its rows handed out as threads free up: it can pass 100%)"
)


def copy_name(op):
    """The row of the copy that moves the bytes of ``op`` (the operation it is printed
    above, and those after it of the same operation that move as many bytes)."""
    return f"copy for {op}"


def _family(op):
    """The operation whatever its options and implementation: ``"permute"`` for
    ``"permute validate=False"`` and for a peer's ``"permute, TE"``."""
    return op.split(",")[0].removesuffix(" validate=False")


def _rows(results):
    """``(case or None, name, figures, result or None, is_copy)`` per printed row: a heading
    per case, then per result its copy (where the bytes or the operation change) and
    itself."""
    case = served = None
    for r in results:
        if r.case != case:
            case, served = r.case, None
            yield r.case, None, None, None, False
        if (r.nbytes, _family(r.op)) != served:
            served = (r.nbytes, _family(r.op))
            yield None, copy_name(r.op), r.copy_us, r, True
        yield None, r.op, r.us, r, False


def print_table(results, out=None, header=True):
    """Print one row per result under a heading per case: its median time in every mode,
    GB/s and % of the copy from the first mode, and the speed-up over NumPy where measured.

    The copy of the same bytes, in the same modes, is printed above the results it serves
    and names the first of them. ``header``: print the column titles first (a run that
    prints each case as it finishes prints them once).
    """
    if not results:
        return
    out = out or sys.stdout  # looked up per call, so redirections of sys.stdout apply
    modes = results[0].modes
    numpy = any(r.numpy_us for r in results)
    widths = [max(10, len(MODE_TITLES[m]) + 3) for m in modes]  # (a title and " us")
    titles = f"{'operation':<{_OP}} {MODE_TITLES[modes[0]] + ' us':>10} {'GB/s':>8} {'% copy':>7}"
    titles += "".join(
        f" {MODE_TITLES[m] + ' us':>{w}}" for m, w in zip(modes[1:], widths[1:], strict=True)
    )
    titles += f" {'vs NumPy':>9}" if numpy else ""
    if header:
        print(titles, file=out)
        print("-" * len(titles), file=out)
        if modes[0] == "wall":
            print(CPU_COPY_NOTE, file=out)
    for case, name, figures, r, is_copy in _rows(results):
        if case is not None:
            print(case.label(), file=out)
            continue
        gbps = r.copy_gbps if is_copy else r.gbps
        percent = 100.0 if is_copy else r.percent
        line = f"  {name:<{_OP - 2}} {figures[modes[0]].median:10.1f} {gbps:8.1f} {percent:6.1f}%"
        line += "".join(
            f" {figures[m].median:{w}.1f}" for m, w in zip(modes[1:], widths[1:], strict=True)
        )
        if numpy and not is_copy and r.numpy_us:
            line += f" {r.numpy_us.median / r.us[modes[0]].median:8.1f}x"
        print(line, file=out)
