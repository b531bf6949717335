"""The shapes the bench times, and their inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import ml_dtypes
import numpy as np

DTYPES = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
    "fp8": np.dtype(ml_dtypes.float8_e4m3fn),
}

SCALE_BLOCK = 128  # float8 rows carry one float32 scale per this many columns


@dataclass(frozen=True)
class Case:
    """One benchmark shape: T tokens of H columns, E experts, K experts per token,
    padding alignment A, row dtype (a key of :data:`DTYPES`)."""

    tokens: int
    hidden: int
    experts: int
    topk: int
    alignment: int
    dtype: str

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}; got {self.dtype!r}")
        if not 1 <= self.topk <= self.experts:
            raise ValueError(
                f"topk must be in [1, experts = {self.experts}] (distinct experts per token); "
                f"got {self.topk}"
            )

    @property
    def itemsize(self):
        """Bytes per element of a row."""
        return DTYPES[self.dtype].itemsize

    @property
    def scale_width(self):
        """float32 scales per row: one per :data:`SCALE_BLOCK` columns for float8, else 0."""
        return -(-self.hidden // SCALE_BLOCK) if self.itemsize == 1 else 0

    @property
    def has_unpermute(self):
        """Whether the weighted unpermute is timed (it combines 16- and 32-bit rows only)."""
        return self.itemsize >= 2

    def label(self):
        """The shape in the contract's symbols, e.g. ``bf16 T=256 H=7168 E=64 K=8 A=16``."""
        return (
            f"{self.dtype} T={self.tokens} H={self.hidden} E={self.experts} "
            f"K={self.topk} A={self.alignment}"
        )


# The one-shape defaults: a training-sized call on the GPU, a smaller one on the CPU.
CPU_DEFAULT = dict(tokens=4096, hidden=2048, experts=32, topk=8, alignment=16, dtype="bf16")
CUDA_DEFAULT = dict(tokens=16384, hidden=7168, experts=64, topk=8, alignment=128, dtype="bf16")

# timed repetitions per measurement by (device, --quick)
REPEATS = {("cpu", False): 7, ("cpu", True): 3, ("cuda", False): 15, ("cuda", True): 5}


def defaults(device):
    """The one-shape defaults of ``device`` (``"cpu"`` or ``"cuda"``) as a dict."""
    return dict(CPU_DEFAULT if device == "cpu" else CUDA_DEFAULT)


def one_case(device, **given):
    """The default shape of ``device`` with the options that were given (None: not given)."""
    values = defaults(device)
    values.update({name: value for name, value in given.items() if value is not None})
    return Case(**values)


def sweep(device, quick=False):
    """The standard sweep of ``device``: T, then E, K and dtypes around its default shape."""
    if device == "cpu":
        tokens = [256, 1024, 4096] if quick else [256, 1024, 4096, 16384]
        return (
            [Case(t, 2048, 32, 8, 16, "bf16") for t in tokens]
            + [Case(4096, 2048, e, 8, 16, "bf16") for e in (8, 256)]
            + [Case(4096, 2048, 32, 8, 16, d) for d in ("fp32", "fp8")]
        )
    tokens = [256, 4096, 16384] if quick else [256, 1024, 4096, 16384, 32768]
    return (
        [Case(t, 7168, 64, 8, 128, "bf16") for t in tokens]
        + [Case(16384, 7168, 64, 8, 128, d) for d in ("fp8", "fp16")]
        + [Case(4096, 7168, e, 8, 128, "bf16") for e in (8, 256, 1024)]
        + [Case(4096, 4096, 64, k, 128, "bf16") for k in (2, 16)]
    )


class Inputs(NamedTuple):
    """NumPy inputs of one case (``scale`` is None unless the rows are float8)."""

    hidden: np.ndarray
    scale: np.ndarray | None
    routemap: np.ndarray
    probs: np.ndarray
    counts: list[int]


def make_inputs(case, seed=0):
    """Random rows, per-block float32 scales for float8 rows, K distinct experts per token
    (uniform random scores, so every slot is routed)."""
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((case.tokens, case.hidden), dtype=np.float32)
    hidden = hidden.astype(DTYPES[case.dtype])
    scale = None
    if case.scale_width:
        scale = rng.random((case.tokens, case.scale_width), dtype=np.float32)
    scores = rng.random((case.tokens, case.experts), dtype=np.float32)
    routemap = np.argpartition(scores, case.topk - 1, axis=1)[:, : case.topk].astype(np.int32)
    probs = rng.random(routemap.shape, dtype=np.float32)
    counts = np.bincount(routemap.reshape(-1), minlength=case.experts).tolist()
    return Inputs(hidden, scale, routemap, probs, counts)
