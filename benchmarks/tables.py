"""``python -m benchmarks tables --check | --write``: the tables of figures in the README and
the docs, generated from the benchmarks' records.

Each such table sits in a block between two markers; the first names how to lay it out and
which record it comes from::

    <!-- generated table: layout=peers; record=newest:nvidia-h100-80gb-hbm3/peers -->
    ...
    <!-- end of generated table -->

in Markdown, and in reStructuredText the same words as comments (``.. generated table:
...`` and ``.. end of generated table``). ``record=`` is a record's path from the checkout's
root, or ``newest:CARD/WHAT``: the newest record of that card's folder under
``benchmarks/results/`` that a ``WHAT`` run wrote. ``--write`` renders every block that has a
record; ``--check`` renders them and fails (exit status 1) listing every block that differs
from its rendering, every marker it cannot read and every table of figures outside a block on
the pages of figures (:data:`PAGES`).

A table measured before the records existed says so: ``record=none (why)``, and its block
must hold the sentence :data:`NO_RECORD` for its readers; ``--check`` lists those blocks
(``--strict`` fails on them).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from dataclasses import dataclass

from . import records
from .environment import CHECKOUT
from .peers import OURS, TE, VLLM

# the pages of figures: every table on them (in README.md, below its heading) must be generated
PAGES = {
    "README.md": "## Performance",
    "docs/performance.rst": None,
    "docs/peers.rst": None,
    "docs/transformers.rst": None,
}
NO_RECORD = "from a run without a record"
_OPEN = re.compile(r"^(?:<!--|\.\.) generated table: (?P<params>.*?)(?: -->)?\s*$")
_CLOSE = re.compile(r"^(?:<!--|\.\.) end of generated table(?: -->)?\s*$")
_TABLE_STARTS = (
    re.compile(r"^\|( *:?-+:? *\|)+\s*$"),  # Markdown: the line under the titles
    re.compile(r"^\.\. (list-table|csv-table|table)::"),
    re.compile(r"^=+( +=+)+\s*$"),  # a simple table's border
    re.compile(r"^\+(-+\+)+\s*$"),  # a grid table's border
)


class TableError(ValueError):
    """A block that cannot be rendered: a bad marker, a record that is not there."""


@dataclass
class Block:
    """A generated table in a file: its parameters and the lines between its markers."""

    path: str  # from the root
    line: int  # of the opening marker, from 1
    params: dict
    body: list  # the lines between the markers
    start: int  # index of the first body line
    end: int  # index of the closing marker

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    @property
    def markdown(self):
        return self.path.endswith(".md")


def parse_params(text):
    """``key=value; key=value`` as a dict (values keep their spaces)."""
    params = {}
    for part in text.split(";"):
        key, sep, value = part.strip().partition("=")
        if not sep or not key.strip():
            raise TableError(f"expected key=value parts separated by ';'; got {part.strip()!r}")
        params[key.strip()] = value.strip()
    for needed in ("layout", "record"):
        if needed not in params:
            raise TableError(f"the marker names no {needed}")
    return params


def blocks(path, root):
    """The generated tables of the file ``path`` (from ``root``), and its problems: markers
    that do not pair up or cannot be read (``(where, message)`` each)."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    found, problems, opened = [], [], None
    for i, line in enumerate(lines):
        if _OPEN.match(line):
            if opened is not None:
                problems.append((f"{path}:{opened + 1}", "a block opened inside another"))
            opened = i
        elif _CLOSE.match(line):
            if opened is None:
                problems.append((f"{path}:{i + 1}", "an end marker without its start"))
                continue
            try:
                params = parse_params(_OPEN.match(lines[opened])["params"])
            except TableError as e:
                problems.append((f"{path}:{opened + 1}", str(e)))
            else:
                found.append(Block(path, opened + 1, params, lines[opened + 1 : i], opened + 1, i))
            opened = None
    if opened is not None:
        problems.append((f"{path}:{opened + 1}", "a block without its end marker"))
    return found, problems


def unmarked_tables(path, root, heading=None):
    """``(where, message)`` per table of figures in ``path`` outside a generated block (only
    below ``heading`` up to the next heading of its level, where given)."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    inside = set()
    for block in blocks(path, root)[0]:
        inside.update(range(block.start, block.end))
    begin, end = 0, len(lines)
    if heading is not None:
        level = heading.split(" ")[0] + " "
        begin = next((i for i, line in enumerate(lines) if line == heading), len(lines))
        end = next((i for i in range(begin + 1, end) if lines[i].startswith(level)), end)
    found, borders = [], 0
    for i in range(begin, end):
        line = lines[i]
        if i in inside:
            continue
        if borders and _TABLE_STARTS[2].match(line):  # a simple table's later borders
            borders -= 1
            continue
        if i > begin and _TABLE_STARTS[3].match(line) and lines[i - 1][:1] in ("+", "|"):
            continue  # a grid table's later borders
        if any(p.match(line) for p in _TABLE_STARTS):
            borders = 2 if _TABLE_STARTS[2].match(line) else 0
            found.append((f"{path}:{i + 1}", "a table of figures outside a generated block"))
    return found


# ------------------------------------------------------------------------------ the records


def resolve(spec, root):
    """The record a block names (``newest:CARD/WHAT`` or a path), or None for ``none``."""
    if spec == "none" or spec.startswith("none "):
        return None
    if spec.startswith("newest:"):
        card, _, what = spec.removeprefix("newest:").partition("/")
        folder = os.path.join(root, "benchmarks", "results", card)
        pattern = re.compile(rf"^\d{{4}}-\d{{2}}-\d{{2}}-.+-{re.escape(what)}(-\d+)?\.json$")
        names = (
            sorted(name for name in os.listdir(folder) if pattern.match(name))
            if os.path.isdir(folder)
            else []
        )
        if not names:
            raise TableError(f"no record of {what!r} under {os.path.relpath(folder, root)}")
        loaded = [records.load(os.path.join(folder, name)) for name in names]
        return max(loaded, key=lambda r: (r.header["date"], r.path))
    return records.load(os.path.join(root, spec))


def _ms(us):
    return f"{us / 1e3:.3f}"


def _family_and_impl(op):
    family, _, impl = op.partition(", ")
    return family, impl or OURS


def layout_peers(record, ops="permute|unpermute weighted", cells="all"):
    """Rows (shape, op) against columns copy / moe-numba / each peer: GPU ms, one call ms
    and host µs per cell (``cells=gpu``: GPU ms), moe-numba's share of the copy's speed."""
    results = record.results()
    families = ops.split("|")
    impls = [i for i in (OURS, TE, VLLM) if any(_family_and_impl(r.op)[1] == i for r in results)]
    table = {}
    for r in results:
        family, impl = _family_and_impl(r.op)
        table.setdefault((r.case, family), {})[impl] = r

    def cell(figures, percent=None):
        text = f"{_ms(figures['gpu'].median)} ms" if cells == "gpu" else _ms(figures["gpu"].median)
        if percent is not None:
            text += f" ({percent:.1f}%)" if cells == "gpu" else f" ({percent:.0f}%)"
        if cells != "gpu":
            text += f" / {_ms(figures['one_call'].median)} / {figures['host'].median:.0f}"
        return text

    rows = []
    cases = list(dict.fromkeys(case for case, _ in table))
    for case in cases:
        for family in families:
            found = table.get((case, family), {})
            ours = found.get(OURS)
            if ours is None:
                continue
            row = [f"{case.label()}, {family}", cell(ours.copy_us)]
            for impl in impls:
                r = found.get(impl)
                row.append("-" if r is None else cell(r.us, r.percent if impl == OURS else None))
            rows.append(row)
    return ["shape, op", "copy", *impls], rows


def layout_results(record):
    """One row per result: GPU, one-call and host µs and % of the copy (on the CPU: wall µs,
    % of the copy, the speed-up over NumPy)."""
    rows, cpu = [], False
    for r in record.results():
        family, impl = _family_and_impl(r.op)
        if "wall" in r.us:
            cpu = True
            speedup = f"{r.numpy_us.median / r.us['wall'].median:.1f}x" if r.numpy_us else "-"
            rows.append(
                [r.case.label(), r.op, f"{r.us['wall'].median:.1f}", f"{r.percent:.1f}%", speedup]
            )
        else:
            us = r.us
            rows.append(
                [r.case.label(), family, impl, f"{us['gpu'].median:.1f}", f"{r.percent:.1f}%"]
                + [f"{us['one_call'].median:.1f}", f"{us['host'].median:.1f}"]
            )
    if cpu:
        return ["shape", "op", "wall us", "% copy", "vs NumPy"], rows
    return ["shape", "op", "who", "GPU us", "% copy", "1-call us", "host us"], rows


def layout_sweep(record):
    """% of the copy per shape (rows) and operation (columns)."""
    results = record.results()
    ops = list(dict.fromkeys(r.op for r in results))
    cases = list(dict.fromkeys(r.case for r in results))
    found = {(r.case, r.op): r for r in results}
    rows = [
        [case.label()]
        + [f"{found[case, op].percent:.1f}" if (case, op) in found else "-" for op in ops]
        for case in cases
    ]
    return ["shape", *ops], rows


def layout_layer(record):
    """The transformers layer: ms per implementation, the glue's share, moe-numba's time
    over grouped_mm's, the permute and unpermute alone and their copy (GPU µs)."""
    from .layer import IMPLS, OPS

    impls = [
        i for i in IMPLS if any(i in row["figures"] or i in row["skipped"] for row in record.rows)
    ]
    rows = []
    for row in record.rows:
        figures = row["figures"]
        cells = [row["model"], str(row["T"]), row["pass"]]
        for impl in impls:
            if impl in figures:
                cells.append(_ms(figures[impl]["median"]))
            else:
                cells.append("skip" if impl in row["skipped"] else "-")
        share = row["glue_share"]
        cells.append("-" if share is None else f"{100 * share:.0f}%")
        if "moe_numba" in figures and "grouped_mm" in figures:
            cells.append(f"{figures['moe_numba']['median'] / figures['grouped_mm']['median']:.2f}")
        else:
            cells.append("-")
        for part in (figures, row["copy"]):
            cells.append(f"{part[OPS]['median']:.1f}" if OPS in part else "-")
        rows.append(cells)
    titles = ["model", "T", "pass", *impls, "share", "ratio", "p+u GPU", "copy GPU"]
    return titles, rows


def layout_decode(record):
    """Decode steps (``python -m benchmarks layer --decode``): µs per step replayed from a
    CUDA graph and launched without one (GPU time with the host running ahead, one step
    right after a sync), and whether the graph's output equals the eager call's."""
    rows = []
    for row in record.rows:
        cells = [row["model"], str(row["T"]), row["impl"]]
        figures = row["figures"]
        for name in ("graph gpu", "graph one_call", "eager gpu", "eager one_call"):
            cells.append(f"{figures[name]['median']:.1f}" if name in figures else "-")
        same = row["graph_equals_eager"]
        cells.append("skipped" if row["skipped"] else "yes" if same else "NO")
        rows.append(cells)
    titles = ["model", "T", "impl", "graph GPU us", "graph 1-call us", "eager GPU us"]
    return [*titles, "eager 1-call us", "graph = eager"], rows


LAYOUTS = {
    "peers": layout_peers,
    "results": layout_results,
    "sweep": layout_sweep,
    "layer": layout_layer,
    "decode": layout_decode,
}


# ------------------------------------------------------------------------------ rendering


def markdown_table(titles, rows):
    """A Markdown (pipe) table."""
    lines = ["| " + " | ".join(titles) + " |", "| " + " | ".join("---" for _ in titles) + " |"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def rst_table(titles, rows):
    """A reStructuredText simple table."""
    widths = [max(len(str(c)) for c in column) for column in zip(titles, *rows, strict=True)]
    border = "  ".join("=" * w for w in widths)

    def line(cells):
        return "  ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True)).rstrip()

    return [border, line(titles), border, *(line(row) for row in rows), border]


def render(block, record, root):
    """The body of ``block`` rendered from ``record`` (its path shown from ``root``): where
    it comes from, then the table."""
    params = dict(block.params)
    layout = params.pop("layout")
    params.pop("record")
    if layout not in LAYOUTS:
        raise TableError(f"layout {layout!r} is none of {', '.join(LAYOUTS)}")
    try:
        titles, rows = LAYOUTS[layout](record, **params)
    except TypeError as e:
        raise TableError(f"layout {layout!r}: {e}") from None
    h = record.header
    commit = (h["commit"] or "no commit")[:7] + (" with changes" if h["dirty"] else "")
    path = os.path.relpath(record.path, root)
    if block.markdown:
        source = f"*From the record `{path}` ({record.card}, {h['date'][:10]}, commit {commit}).*"
        return [source, "", *markdown_table(titles, rows)]
    source = f"From the record ``{path}`` ({record.card}, {h['date'][:10]}, commit {commit})."
    return ["", source, "", *rst_table(titles, rows), ""]


# ------------------------------------------------------------------------------ check, write


@dataclass
class Outcome:
    """What the check found in one block: ``state`` is ``agrees``, ``differs``, ``no record``
    or ``error``; ``lines``: the details."""

    block: Block
    state: str
    lines: list


def examine(block, root):
    """The :class:`Outcome` of one block, and its rendering (None where there is none)."""
    try:
        record = resolve(block.params["record"], root)
        if record is None:
            text = " ".join(block.body).lower()
            if NO_RECORD not in text:
                message = f"record=none, and the block does not say {NO_RECORD!r}"
                return Outcome(block, "error", [message]), None
            return Outcome(block, "no record", [block.params["record"]]), None
        rendered = render(block, record, root)
    except (TableError, ValueError, OSError) as e:
        return Outcome(block, "error", [str(e)]), None
    have = [line.rstrip() for line in block.body]
    if have == rendered:
        return Outcome(block, "agrees", [os.path.relpath(record.path, root)]), rendered
    differences = [
        f"line {block.start + i + 1}: the page has {a!r}, the record gives {b!r}"
        for i, (a, b) in enumerate(zip(have, rendered, strict=False))
        if a != b
    ]
    if len(have) != len(rendered):
        differences.append(f"{len(have)} lines on the page, {len(rendered)} from the record")
    return Outcome(block, "differs", [os.path.relpath(record.path, root), *differences]), rendered


def default_files(root):
    """README.md and every page of the docs."""
    docs = sorted(glob.glob(os.path.join(root, "docs", "*.rst")))
    return ["README.md", *(os.path.relpath(p, root) for p in docs)]


def run(files, root, write=False):
    """Examine (and with ``write``, regenerate) every block of ``files``; returns
    ``(outcomes, problems)``: an :class:`Outcome` per block and ``(where, message)`` per
    marker that cannot be read or table outside a block on a page of figures."""
    outcomes, problems = [], []
    for path in files:
        found, broken = blocks(path, root)
        problems += broken
        if path in PAGES:
            problems += unmarked_tables(path, root, PAGES[path])
        renderings = []
        for block in found:
            outcome, rendered = examine(block, root)
            outcomes.append(outcome)
            if write and rendered is not None and outcome.state == "differs":
                renderings.append((block, rendered))
        if renderings:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                lines = f.read().splitlines()
            for block, rendered in sorted(renderings, key=lambda br: -br[0].start):
                lines[block.start : block.end] = rendered
            with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
            for outcome in outcomes:
                if outcome.block in [b for b, _ in renderings]:
                    outcome.state = "written"
    return outcomes, problems


def report(outcomes, problems, strict=False, out=None):
    """Print what :func:`run` found; returns the exit status (1: a block differs from its
    record or has an error, a marker or a table is out of place; with ``strict``, also a
    block without a record)."""
    out = out or sys.stdout
    for o in outcomes:
        head = f"{o.block.where}: {o.block.params['layout']}"
        if o.state == "agrees":
            print(f"{head}: agrees with {o.lines[0]}", file=out)
        elif o.state == "written":
            print(f"{head}: written from its record", file=out)
        elif o.state == "no record":
            print(f"{head}: no record ({o.lines[0].removeprefix('none').strip(' ()')})", file=out)
        else:
            what = "DIFFERS from " + o.lines[0] if o.state == "differs" else "ERROR: " + o.lines[0]
            print(f"{head}: {what}", file=out)
            for line in o.lines[1:]:
                print(f"  {line}", file=out)
    for where, message in problems:
        print(f"{where}: ERROR: {message}", file=out)
    counts = {}
    for o in outcomes:
        counts[o.state] = counts.get(o.state, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none"
    print(f"{len(outcomes)} generated tables: {summary}; {len(problems)} other problems", file=out)
    bad = problems or any(o.state in ("differs", "error") for o in outcomes)
    return 1 if bad or (strict and counts.get("no record")) else 0


def parser():
    """The command line's parser."""
    command = argparse.ArgumentParser(
        prog="python -m benchmarks tables",
        description="Check (or write) the tables of figures in the README and the docs "
        "against the records they name.",
    )
    action = command.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="fail on a table that differs")
    action.add_argument("--write", action="store_true", help="render every table from its record")
    command.add_argument(
        "--strict", action="store_true", help="also fail on a table without a record"
    )
    command.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="from the checkout's root (default: README.md and docs/*.rst)",
    )
    return command


def main(argv=None):
    """Check or write the tables; returns the exit status."""
    command = parser()
    args = command.parse_args(argv)
    files = args.files or default_files(CHECKOUT)
    for path in files:
        if not os.path.isfile(os.path.join(CHECKOUT, path)):
            command.error(f"argument FILE: {path} is not a file under {CHECKOUT}")
    outcomes, problems = run(files, CHECKOUT, write=args.write)
    return report(outcomes, problems, args.strict)
