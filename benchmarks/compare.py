"""``python -m benchmarks compare OLD.json NEW.json``: two records of one card, row by row.

Every figure that both records have (the medians; each row's copy too, which shows how much
the machine itself moved) is printed old -> new with the ratio new / old, and flagged
``WORSE`` where the new one is more than ``--threshold`` percent (default 5) higher: every
figure is a time or a size, so higher is worse. Rows that only one record has are listed.
The exit status is 1 when a figure is flagged, else 0; records of different cards or of
different benchmarks are refused (exit status 2).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NamedTuple

from . import records
from .options import float_in

THRESHOLD = 5.0  # percent


class Change(NamedTuple):
    """One figure of one row in both records."""

    key: str
    name: str  # the figure's name, ``copy <name>`` for the copy's
    unit: str
    old: float  # medians
    new: float
    worse: bool

    @property
    def ratio(self):
        """New / old (> 1: slower, or bigger, now)."""
        return self.new / self.old if self.old else math.inf


def _named(row):
    figures = dict(row["figures"])
    figures.update({f"copy {name}": value for name, value in (row.get("copy") or {}).items()})
    return figures


def changes(old_rows, new_rows, threshold=THRESHOLD):
    """``(changes, only_old, only_new)``: a :class:`Change` per figure of each row (by
    ``key``) that both lists of record rows have, in ``new_rows``' order, and the keys of
    the rows that only one of them has."""
    old = {row["key"]: row for row in old_rows}
    new_keys = {row["key"] for row in new_rows}
    found = []
    for row in new_rows:
        before = old.get(row["key"])
        if before is None:
            continue
        then = _named(before)
        for name, figure in _named(row).items():
            if name in then:
                a, b = then[name]["median"], figure["median"]
                worse = b > a * (1 + threshold / 100)
                found.append(Change(row["key"], name, row["unit"], a, b, worse))
    only_old = [key for key in old if key not in new_keys]
    only_new = [row["key"] for row in new_rows if row["key"] not in old]
    return found, only_old, only_new


def describe(record):
    """One line on where ``record`` came from."""
    h = record.header
    commit = (h["commit"] or "no commit")[:7] + (" (changed)" if h["dirty"] else "")
    return f"{record.path}: {h['what']}, commit {commit}, {h['date']}, {record.card}"


def print_comparison(old, new_rows, new_name, threshold=THRESHOLD, out=None):
    """Print the figures of ``new_rows`` (a run's record rows, ``new_name`` naming them)
    against the record ``old``, row by row; returns how many are more than ``threshold``
    percent worse."""
    out = out or sys.stdout
    found, only_old, only_new = changes(old.rows, new_rows, threshold)
    print(f"old: {describe(old)}\nnew: {new_name}", file=out)
    print(
        f"medians, old -> new and new / old (> 1: slower now); WORSE: more than {threshold:g}% "
        "worse",
        file=out,
    )
    key = None
    for change in found:
        if change.key != key:
            key = change.key
            print(key, file=out)
        flag = "  WORSE" if change.worse else ""
        print(
            f"  {change.name:<16} {change.old:12.2f} -> {change.new:12.2f} {change.unit:<5} "
            f"{change.ratio:6.3f}{flag}",
            file=out,
        )
    for keys, where in ((only_old, "old"), (only_new, "new")):
        for missing in keys:
            print(f"only in the {where} record: {missing}", file=out)
    worse = sum(change.worse for change in found)
    print(
        f"{len(found)} figures compared, {worse} more than {threshold:g}% worse"
        f"{': ' + ', '.join(sorted({c.key for c in found if c.worse})) if worse else ''}",
        file=out,
    )
    return worse


def parser():
    """The command line's parser."""
    command = argparse.ArgumentParser(
        prog="python -m benchmarks compare",
        description="Compare two records of one card row by row; exit status 1 when a "
        "figure of NEW is more than --threshold percent worse than OLD's.",
    )
    command.add_argument("old", metavar="OLD.json", help="the earlier record")
    command.add_argument("new", metavar="NEW.json", help="the later record")
    command.add_argument(
        "--threshold",
        type=float_in(lambda v: 0 <= v <= 1000, "a percentage from 0 to 1000"),
        default=THRESHOLD,
        metavar="PERCENT",
        help=f"flag a figure this much worse (default {THRESHOLD:g})",
    )
    return command


def check_same_card(command, option, old, card, new_name):
    """``command.error`` (naming ``option``) unless the record ``old`` was made on ``card``,
    the device of ``new_name``."""
    if old.card != card:
        command.error(
            f"argument {option}: {old.path} was made on {old.card}, {new_name} on {card}: "
            "compare records of one card"
        )


def main(argv=None):
    """Check both records, compare them; returns the exit status (1: a figure is worse)."""
    command = parser()
    args = command.parse_args(argv)
    loaded = {}
    for option, path in (("OLD.json", args.old), ("NEW.json", args.new)):
        try:
            loaded[option] = records.load(path)
        except ValueError as e:
            command.error(f"argument {option}: {e}")
    old, new = loaded["OLD.json"], loaded["NEW.json"]
    check_same_card(command, "NEW.json", old, new.card, new.path)
    if old.header["what"] != new.header["what"]:
        command.error(
            f"argument NEW.json: a record of {new.header['what']!r}, {old.path} of "
            f"{old.header['what']!r}: compare records of one benchmark"
        )
    worse = print_comparison(old, new.rows, describe(new), args.threshold)
    return 1 if worse else 0
