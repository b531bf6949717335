"""One timed operation of one case, and the JSON file that keeps a run's results.

Times are medians in microseconds per call, by mode:

- ``gpu``: the GPU's time per call with the host running ahead (CUDA events around a batch
  enqueued while the stream is held);
- ``one_call``: one call's latency right after a host sync (event, call, event, sync);
- ``host``: the host's time for the call to return, the GPU idle (``perf_counter``);
- ``host_busy``: the host's time per call with work ahead of it on the GPU, as in a training
  step (back-to-back calls enqueued behind a held stream);
- ``wall``: on the CPU backend, the wall time per call (it stands in for ``gpu``).

Each result carries the same figures for a copy of the same bytes, measured in the same run
in the same modes, and bandwidths are taken from the first mode (``gpu`` or ``wall``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

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

FORMAT = 2  # of the JSON file; files without a "format" field come from the first version
_CASE_FIELDS = tuple(f.name for f in fields(Case))


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
        Median microseconds per call, by mode (:data:`CUDA_MODES` or :data:`CPU_MODES`).
    copy_us : dict
        The same figures for a copy of ``nbytes`` bytes in the same run.
    numpy_us : float or None
        Median microseconds of the vectorised NumPy implementation (CPU backend only).
    """

    case: Case
    op: str
    nbytes: int
    us: dict[str, float]
    copy_us: dict[str, float]
    numpy_us: float | None = None

    @property
    def modes(self):
        """The modes measured, the bandwidth's mode first."""
        return tuple(self.us)

    @property
    def gbps(self):
        """Effective bandwidth in GB/s (1e9 bytes), from the first mode's time."""
        return self.nbytes / self.us[self.modes[0]] / 1e3

    @property
    def copy_gbps(self):
        """The copy's bandwidth in GB/s, from the same mode."""
        return self.nbytes / self.copy_us[self.modes[0]] / 1e3

    @property
    def percent(self):
        """Effective bandwidth in % of the copy's."""
        return 100.0 * self.gbps / self.copy_gbps

    def key(self):
        """What identifies the result across runs: the operation and the shape."""
        return (self.op, self.case)

    def record(self):
        """The result as a JSON-ready dict (derived figures included, for readers)."""
        return dict(
            asdict(self.case),
            op=self.op,
            bytes=self.nbytes,
            us=dict(self.us),
            copy_us=dict(self.copy_us),
            numpy_us=self.numpy_us,
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
            dict(record["us"]),
            dict(record["copy_us"]),
            record["numpy_us"],
        )


def save(path, backend, results):
    """Write ``results`` of a run on ``backend`` (its description) to ``path`` as JSON."""
    document = dict(format=FORMAT, backend=backend, results=[r.record() for r in results])
    with open(path, "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")


def load(path):
    """Read a file written by :func:`save`.

    Returns
    -------
    tuple
        ``(backend, results)``: the backend's description and a list of :class:`Result`.

    Raises
    ------
    ValueError
        If the file cannot be read or is not a bench JSON of this format; the message says
        which and why.
    """
    try:
        with open(path) as f:
            document = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(document, dict) or "results" not in document:
        raise ValueError(f"{path} is not a moe-numba bench JSON file (no 'results')")
    version = document.get("format")
    if version != FORMAT:
        written_by = (
            "an older moe-numba (one time per operation)"
            if version is None
            else f"format {version!r}"
        )
        raise ValueError(
            f"{path} was written by {written_by}; this bench reads format {FORMAT}: "
            "run the bench again with --json to get a file to compare with"
        )
    try:
        results = [Result.from_record(r) for r in document["results"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: a result is malformed ({type(e).__name__}: {e})") from None
    return document.get("backend", "?"), results
