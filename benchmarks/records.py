"""The record a benchmark run writes, and the bench's timed operations in it.

A record (JSON, format 3) is the run's header (:func:`.environment.header`: what ran, the
commit and whether the checkout had changes, the date, the command, the device and its
clocks, the versions) and its rows. Each row has a ``key`` that names it across runs, a
``unit``, its ``figures`` and, where the run had one, the ``copy`` of the same bytes that is
its roofline; each figure is a :class:`Figure` (min, median and max over the timed
repetitions, and their number ``n``); lower is better for every figure. GPU runs keep their
records under ``benchmarks/results/<card>/`` (:func:`default_path`); ``python -m benchmarks
compare`` compares two, ``python -m benchmarks tables`` renders the docs' tables from them.

The bench's rows are its :class:`Result`: times in microseconds per call, by mode:

- ``gpu``: the GPU's time per call with the host running ahead (CUDA events around a batch
  enqueued while the stream is held);
- ``one_call``: one call's latency right after a host sync (event, call, event, sync);
- ``host``: the host's time for the call to return, the GPU idle (``perf_counter``);
- ``host_busy``: the host's time per call with work ahead of it on the GPU, as in a training
  step (back-to-back calls enqueued behind a held stream);
- ``wall``: on the CPU backend, the wall time per call (it stands in for ``gpu``).

Each result carries the same figures for a copy of the same bytes, measured in the same run
in the same modes, and bandwidths are taken from the first mode's median (``gpu`` or
``wall``).
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

from .cases import Case

CUDA_MODES = ("gpu", "one_call", "host", "host_busy")
CPU_MODES = ("wall",)
MODE_TITLES = {
    "gpu": "GPU",
    "one_call": "1-call",
    "host": "host",
    "host_busy": "busy host",
    "wall": "wall",
}

# Of the JSON file. Format 1 (no "format" field) kept one time per operation, format 2 the
# medians of every mode without the run's header; both are refused.
FORMAT = 3
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
_CASE_FIELDS = tuple(f.name for f in fields(Case))


class Figure(NamedTuple):
    """One figure of a run: the min, median and max of its ``n`` timed samples."""

    min: float
    median: float
    max: float
    n: int

    @classmethod
    def of(cls, samples, scale=1.0):
        """The figure of ``samples``, each multiplied by ``scale``."""
        values = [s * scale for s in samples]
        return cls(min(values), statistics.median(values), max(values), len(values))

    def record(self):
        """The figure as a JSON-ready dict."""
        return self._asdict()

    @classmethod
    def from_record(cls, record):
        """The inverse of :meth:`record`."""
        return cls(*(record[name] for name in cls._fields))


def figures_record(figures):
    """``{name: Figure}`` as a JSON-ready dict."""
    return {name: figure.record() for name, figure in figures.items()}


def figures_from_record(record):
    """The inverse of :func:`figures_record`."""
    return {name: Figure.from_record(value) for name, value in record.items()}


@dataclass(frozen=True)
class Result:
    """One timed operation of one case.

    Attributes
    ----------
    case : Case
        The shape.
    op : str
        The operation, e.g. ``"permute validate=False"``.
    nbytes : int
        Bytes the call must move (:mod:`.bytes`).
    us : dict
        Microseconds per call, a :class:`Figure` per mode (:data:`CUDA_MODES` or
        :data:`CPU_MODES`).
    copy_us : dict
        The same figures for a copy of ``nbytes`` bytes in the same run.
    numpy_us : Figure or None
        Microseconds of the vectorised NumPy implementation (CPU backend only).
    """

    case: Case
    op: str
    nbytes: int
    us: dict[str, Figure]
    copy_us: dict[str, Figure]
    numpy_us: Figure | None = None

    @property
    def modes(self):
        """The modes measured, the bandwidth's mode first."""
        return tuple(self.us)

    @property
    def gbps(self):
        """Effective bandwidth in GB/s (1e9 bytes), from the first mode's median."""
        return self.nbytes / self.us[self.modes[0]].median / 1e3

    @property
    def copy_gbps(self):
        """The copy's bandwidth in GB/s, from the same mode."""
        return self.nbytes / self.copy_us[self.modes[0]].median / 1e3

    @property
    def percent(self):
        """Effective bandwidth in % of the copy's."""
        return 100.0 * self.gbps / self.copy_gbps

    def key(self):
        """What names the result across runs: the shape and the operation."""
        return f"{self.case.label()} | {self.op}"

    def record(self):
        """The result as a record's row (derived figures included, for readers)."""
        return dict(
            key=self.key(),
            unit="us",
            figures=figures_record(self.us),
            copy=figures_record(self.copy_us),
            **asdict(self.case),
            op=self.op,
            bytes=self.nbytes,
            numpy=None if self.numpy_us is None else self.numpy_us.record(),
            gbps=self.gbps,
            copy_gbps=self.copy_gbps,
            percent=self.percent,
        )

    @classmethod
    def from_record(cls, record):
        """The inverse of :meth:`record` (derived figures are recomputed, not read)."""
        return cls(
            Case(**{name: record[name] for name in _CASE_FIELDS}),
            record["op"],
            record["bytes"],
            figures_from_record(record["figures"]),
            figures_from_record(record["copy"]),
            None if record["numpy"] is None else Figure.from_record(record["numpy"]),
        )


@dataclass(frozen=True)
class Record:
    """A record read back: its header (``what``, ``commit``, ``device``, ...), its rows and
    where it was read from."""

    header: dict
    rows: list
    path: str

    @property
    def card(self):
        """The name of the device the record was made on."""
        return self.header["device"]["name"]

    def results(self):
        """The rows as the bench's :class:`Result` (a bench or gradients record)."""
        try:
            return [Result.from_record(r) for r in self.rows]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"{self.path}: a row is not the bench's ({type(e).__name__}: {e})"
            ) from None


def save(path, header, rows):
    """Write the record of ``header`` (:func:`.environment.header`) and ``rows`` (dicts,
    each with ``key``, ``unit`` and ``figures``) to ``path``."""
    document = dict(format=FORMAT, **header, rows=rows)
    with open(path, "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")


def write(header, rows, path=None):
    """:func:`save` to ``path``, or to :func:`default_path` where it is None; returns the
    path."""
    path = path or default_path(header)
    save(path, header, rows)
    return path


def save_results(path, header, results):
    """:func:`save` of the bench's :class:`Result` list."""
    save(path, header, [r.record() for r in results])


def default_path(header, results=RESULTS):
    """``results/<card>/<date>-<commit>-<what>.json`` for a record of ``header`` (``-dirty``
    after the commit where the checkout had changes, ``nocommit`` outside a git checkout; a
    number after it where the name is taken); its folder is made."""
    folder = os.path.join(results, header["device"]["slug"])
    os.makedirs(folder, exist_ok=True)
    commit = header["commit"][:7] if header["commit"] else "nocommit"
    commit += "-dirty" if header["dirty"] else ""
    stem = f"{header['date'][:10]}-{commit}-{header['what']}"
    path, n = os.path.join(folder, f"{stem}.json"), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(folder, f"{stem}-{n}.json")
    return path


def load(path):
    """Read a record written by :func:`save`.

    Returns
    -------
    Record

    Raises
    ------
    ValueError
        If the file cannot be read or is not a record of this format; the message says
        which and why.
    """
    try:
        with open(path) as f:
            document = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(document, dict) or not ("rows" in document or "results" in document):
        raise ValueError(f"{path} is not a moe-numba benchmark record (no 'rows')")
    version = document.get("format")
    if version != FORMAT:
        written_by = {
            None: "an older moe-numba (one time per operation)",
            2: "an older moe-numba (medians only, no commit or device)",
        }.get(version, f"format {version!r}")
        raise ValueError(
            f"{path} was written by {written_by}; the benchmarks read records of format "
            f"{FORMAT}: run the benchmark again to get a record to compare with"
        )
    rows = document.pop("rows")
    for i, row in enumerate(rows):
        try:
            figures_from_record(row["figures"])
            figures_from_record(row.get("copy") or {})
            missing = [name for name in ("key", "unit") if name not in row]
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}: row {i} is malformed ({type(e).__name__}: {e})") from None
        if missing:
            raise ValueError(f"{path}: row {i} is malformed (no {missing[0]!r})")
    for field in ("what", "device", "commit", "date", "command", "versions"):
        if field not in document:
            raise ValueError(f"{path}: the record has no {field!r}")
    return Record(document, rows, str(path))
