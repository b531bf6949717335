"""``python -m benchmarks bench --peers``: moe-numba beside the permute and unpermute ops that
NVIDIA Transformer Engine and vLLM publish, on the same inputs on one GPU.

The peers' code is downloaded from their published wheels when a run asks for it (``pip
download`` into a cache folder outside any checkout; :func:`fetch`), never installed:

- **TE**: Transformer Engine's Triton kernels of the mask-map permutation
  (``make_row_id_map``, ``permute_with_mask_map``, ``unpermute_with_mask_map``), two source
  files of its wheel, imported under empty stand-ins for TE's packages (:func:`load_te`);
- **vLLM**: vLLM's compiled CUDA ops ``torch.ops._moe_C.moe_permute_with_scratch`` and
  ``moe_unpermute``, from its wheel's library built on libtorch's stable ABI
  (:func:`load_vllm`; it needs a CUDA build of torch to load).

Before timing, each peer's outputs are checked against moe-numba's (:func:`check_rows`,
:func:`check_close`); then every operation is timed by the bench's own timer, beside a
device copy of the bytes it moves (:mod:`.bytes`), and printed like any bench result. The
gradient ops and a training step beside TE's are in :mod:`.peer_gradients`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from dataclasses import dataclass, field

from moe_numba import moe_permute, moe_unpermute

from .bytes import dense_permute_bytes, permute_bytes, unpermute_bytes
from .cases import Case, make_inputs
from .cuda import warn_hold_timeouts
from .options import torch_cuda_problem
from .workload import Operation, time_operations

# The peers' published versions this bench was written against, and what is taken from them.
TE_SPEC = "transformer_engine==2.20.2"
TE_FILES = (
    "transformer_engine/common/triton/permutation.py",  # the Triton kernels
    "transformer_engine/pytorch/triton/permutation.py",  # their torch launchers
)
VLLM_SPEC = "vllm==0.33.0"
VLLM_SO = "vllm/_moe_C_stable_libtorch.abi3.so"
VLLM_SO_SHA256 = "99682a5814b3081de7e4e95cc2c1cf1ba8f6139514ac4c5563dbad16c229a4c0"
# vLLM publishes Linux x86-64 wheels only; the library is abi3, so any CPython's wheel has it
VLLM_WHEEL = ("--platform", "manylinux_2_28_x86_64", "--python-version", "3.12")
DOWNLOAD_NOTE = "about 340 MB, most of it vLLM's wheel, of which about 46 MB stays in the cache"

TE, VLLM = "TE", "vLLM"
OURS = "moe-numba"

# The shapes of the published comparison (the default of --peers): T, H, E, K, A, dtype.
CASES = (
    Case(16384, 7168, 64, 8, 128, "bf16"),
    Case(16384, 7168, 64, 8, 128, "fp8"),
    Case(4096, 7168, 256, 8, 128, "bf16"),
    Case(65536, 4096, 16, 4, 16, "bf16"),
    Case(256, 7168, 64, 8, 16, "bf16"),
    Case(256, 7168, 64, 8, 1, "bf16"),
)


def default_cache():
    """The cache folder the peers are downloaded to unless ``--peers-cache`` says otherwise:
    ``moe-numba/peers`` under ``$XDG_CACHE_HOME``, else under ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "moe-numba", "peers")


def source_checkout():
    """The moe-numba source checkout these benchmarks run from, or None (a copy of the
    ``benchmarks`` folder outside a checkout)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    markers = ("pyproject.toml", ".git")
    return root if all(os.path.exists(os.path.join(root, m)) for m in markers) else None


def cache_problem(path, checkout=None):
    """Why ``path`` cannot be the peers' cache folder, or None when it can.

    Peer code must never land in moe-numba's repository, so a folder inside the checkout
    (``checkout``; :func:`source_checkout` by default) is refused, as is a path that names
    a file.
    """
    path = os.path.realpath(path)
    checkout = source_checkout() if checkout is None else checkout
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path} is a file; give a folder"
    if checkout is not None:
        root = os.path.realpath(checkout)
        if os.path.commonpath([path, root]) == root:
            return (
                f"{path} is inside the moe-numba checkout {root}; the peers' code must stay "
                "out of it: give a folder elsewhere (the default is "
                f"{default_cache()})"
            )
    return None


@dataclass(frozen=True)
class PeerFiles:
    """Where the peers' files are in a cache folder (:func:`fetch` fills it)."""

    cache: str

    @property
    def te(self):
        """The folder that holds ``transformer_engine/`` (the two files of :data:`TE_FILES`)."""
        return os.path.join(self.cache, TE_SPEC.replace("==", "-"))

    @property
    def vllm_so(self):
        """vLLM's op library."""
        return os.path.join(self.cache, VLLM_SPEC.replace("==", "-"), os.path.basename(VLLM_SO))

    @property
    def sources(self):
        """The record of the wheels the files came from (name and sha256 of each)."""
        return os.path.join(self.cache, "SOURCES")

    def te_present(self):
        return all(os.path.isfile(os.path.join(self.te, f)) for f in TE_FILES)

    def vllm_present(self):
        return os.path.isfile(self.vllm_so)


def sha256(path):
    """The hex SHA-256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip_download(spec, folder, options, run):
    """Download ``spec``'s wheel alone into ``folder`` with pip; its path."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    command += ["--only-binary=:all:", "--dest", folder, *options, spec]
    print(f"peers: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    os.makedirs(folder, exist_ok=True)
    done = run(command, check=False)
    wheels = [f for f in os.listdir(folder) if f.endswith(".whl")]
    if done.returncode != 0 or len(wheels) != 1:
        raise RuntimeError(
            f"pip could not download {spec} (exit status {done.returncode}); the peers bench "
            "needs the package index once, to fill its cache"
        )
    return os.path.join(folder, wheels[0])


def _extract(wheel, members, folder):
    """Copy ``members`` of the zip ``wheel`` to the same paths under ``folder``."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        missing = [m for m in members if m not in names]
        if missing:
            raise RuntimeError(f"{os.path.basename(wheel)} has no {', '.join(missing)}")
        for member in members:
            target = os.path.join(folder, member)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with archive.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)


def _record(files, spec, wheel):
    lines = []
    if os.path.exists(files.sources):
        with open(files.sources) as f:
            lines = [line for line in f.read().splitlines() if not line.startswith(spec + " ")]
    lines.append(f"{spec} {os.path.basename(wheel)} sha256:{sha256(wheel)}")
    with open(files.sources, "w") as f:
        f.write("\n".join(lines) + "\n")


def fetch(cache, run=subprocess.run):
    """Download what the cache folder ``cache`` lacks of the peers, and check it.

    What is there already is kept (the vLLM library only if its checksum is right); the
    wheels are read in a temporary folder inside ``cache`` and deleted. ``run`` runs pip
    (tests pass a stand-in).

    Returns
    -------
    PeerFiles
        Where the files are.

    Raises
    ------
    RuntimeError
        If pip fails or a wheel does not hold what this bench was written against.
    """
    files = PeerFiles(cache)
    os.makedirs(cache, exist_ok=True)
    if files.vllm_present() and sha256(files.vllm_so) != VLLM_SO_SHA256:
        os.remove(files.vllm_so)  # a partial or foreign file: fetch it again
    wanted = [(TE_SPEC, files.te_present()), (VLLM_SPEC, files.vllm_present())]
    if all(present for _, present in wanted):
        return files
    print(f"peers: downloading into {cache}: {DOWNLOAD_NOTE}", file=sys.stderr, flush=True)
    scratch = tempfile.mkdtemp(prefix=".download-", dir=cache)
    try:
        if not files.te_present():
            wheel = _pip_download(TE_SPEC, os.path.join(scratch, "te"), (), run)
            _extract(wheel, TE_FILES, os.path.join(scratch, "te-files"))
            _replace(os.path.join(scratch, "te-files"), files.te)
            _record(files, TE_SPEC, wheel)
        if not files.vllm_present():
            wheel = _pip_download(VLLM_SPEC, os.path.join(scratch, "vllm"), VLLM_WHEEL, run)
            _extract(wheel, [VLLM_SO], os.path.join(scratch, "vllm-files"))
            so = os.path.join(scratch, "vllm-files", VLLM_SO)
            got = sha256(so)
            if got != VLLM_SO_SHA256:
                raise RuntimeError(
                    f"{VLLM_SO} of {os.path.basename(wheel)} has sha256 {got}; this bench "
                    f"was written against {VLLM_SO_SHA256}"
                )
            _replace(os.path.dirname(so), os.path.dirname(files.vllm_so))
            _record(files, VLLM_SPEC, wheel)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return files


def _replace(source, target):
    """Move folder ``source`` to ``target``, replacing what is there."""
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(source, target)


def load_te(folder):
    """TE's launcher module, imported from the two files under ``folder``.

    TE's packages are replaced by empty stand-ins, so nothing else of TE (its compiled
    core) is needed; the launchers import the kernels' module by its name.
    """
    for package in (
        "transformer_engine",
        "transformer_engine.common",
        "transformer_engine.common.triton",
        "transformer_engine.pytorch",
        "transformer_engine.pytorch.triton",
    ):
        if package not in sys.modules:
            sys.modules[package] = types.ModuleType(package)
            sys.modules[package].__path__ = []
    module = None
    for path in TE_FILES:  # the kernels first
        name = path[:-3].replace("/", ".")
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, path))
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def load_vllm(so):
    """``torch.ops._moe_C``, from vLLM's library ``so`` after its checksum is checked."""
    import torch

    got = sha256(so)
    if got != VLLM_SO_SHA256:
        raise RuntimeError(f"{so} has sha256 {got}, not vLLM's {VLLM_SO_SHA256}")
    torch.ops.load_library(so)
    return torch.ops._moe_C


def load(files):
    """``{peer: its ops, or the reason they did not load}`` (a peer that fails to load is
    reported in its rows; the others still run)."""
    peers = {}
    for name, loader, path in ((TE, load_te, files.te), (VLLM, load_vllm, files.vllm_so)):
        try:
            peers[name] = loader(path)
        except Exception as error:  # any failure of a peer's import is that peer's result
            peers[name] = _reason(error)
    return peers


def _reason(error):
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]


# ---------------------------------------------------------------------------------- checks


def _bits(torch, x):
    return x.contiguous().view(torch.uint8)


def check_rows(torch, got, want):
    """``"identical"`` when every tensor of ``got`` has the bits of its ``want``, else
    ``"DIFFERENT"``."""
    same = all(
        g.shape == w.shape and torch.equal(_bits(torch, g), _bits(torch, w))
        for g, w in zip(got, want, strict=True)
    )
    return "identical" if same else "DIFFERENT"


def check_close(torch, got, want):
    """``"close"`` when ``got`` is within about one bfloat16 step of ``want`` everywhere
    (each implementation sums in float32 in its own order), else ``"DIFFERENT"``; with the
    largest difference."""
    # (detached: the layer step's outputs carry autograd, which a comparison does not need)
    got, want = got.detach().float(), want.detach().float()
    diff = (got - want).abs()
    ok = bool((diff <= want.abs() / 64 + 1e-3).all())
    return f"{'close' if ok else 'DIFFERENT'} (max |diff| {float(diff.max()):.2g})"


def op_name(op, impl):
    """The name of ``impl``'s ``op`` in the table."""
    return f"{op}, {impl}"


# ---------------------------------------------------------------------------------- the run


@dataclass
class PeerBench:
    """The peers' side of one bench run: their ops per case, their checks, their failures.

    Parameters
    ----------
    peers : dict
        ``{peer: ops, or why they did not load}`` (:func:`load`).
    gradients : callable, optional
        The gradients' bench beside Transformer Engine's
        (:func:`.peer_gradients.bench_gradients`, which builds on this module), or None.
    """

    peers: dict
    gradients: object = None
    notes: list = field(default_factory=list)  # (case, line) in order: checks, failures

    def bench_case(self, case, target, timer):
        """Results of moe-numba's permute and weighted unpermute (``validate=False``, as
        the peers check nothing) and of each peer's on the same inputs (``target``: torch
        tensors on the GPU), each timed by ``timer`` beside a copy of its bytes."""
        import torch

        before = timer.hold_timeouts
        x = make_inputs(case)
        hidden, scale, routemap, probs = (
            target.upload(a) for a in (x.hidden, x.scale, x.routemap, x.probs)
        )
        args = (hidden, scale, routemap, probs, case.experts, x.counts, case.alignment)
        ours = moe_permute(*args, validate=False)
        inputs = types.SimpleNamespace(
            case=case, hidden=hidden, scale=scale, routemap=routemap, probs=probs, counts=x.counts
        )
        builders = {OURS: _our_ops, TE: _te_ops, VLLM: _vllm_ops}
        copies, results = {}, []
        for impl, build in builders.items():
            try:
                peer = self.peers.get(impl, None)
                if isinstance(peer, str):
                    raise RuntimeError(peer)
                ops = build(torch, peer, inputs, ours, self._checked(case))
                results += time_operations(case, ops, target, timer, copies)
            except Exception as error:  # one implementation's failure is its row, not the run's
                self.notes.append((case, f"{impl} FAILED: {_reason(error)}"))
        order = {op: i for i, op in enumerate(_op_order(case))}
        results.sort(key=lambda r: order.get(r.op, len(order)))
        if self.gradients is not None and case.dtype == "bf16":
            try:
                peer = self.peers.get(TE)
                if isinstance(peer, str):
                    raise RuntimeError(peer)
                results += self.gradients(torch, peer, inputs, ours, target, timer, self._note)
            except Exception as error:  # as above: the forward results stand
                self.notes.append((case, f"gradients beside {TE} FAILED: {_reason(error)}"))
        warn_hold_timeouts(case, timer.hold_timeouts - before)
        return results

    def _note(self, case, line):
        self.notes.append((case, line))

    def _checked(self, case):
        def note(op, verdict):
            self.notes.append((case, f"check {op}: {verdict}"))

        return note

    def print_notes(self, case, out=None):
        """Print what was checked (and what failed) in ``case``."""
        out = out or sys.stdout
        for noted, line in self.notes:
            if noted == case:
                print(f"  {line}", file=out)

    def status(self):
        """The run's exit status: 1 if some peer's output differs from moe-numba's."""
        return 1 if any("DIFFERENT" in line for _, line in self.notes) else 0


def _op_order(case):
    ops = ["permute"] + (["unpermute weighted"] if case.has_unpermute else [])
    return [op_name(op, impl) for op in ops for impl in (OURS, TE, VLLM)]


def _our_ops(torch, _lib, inputs, ours, note):
    c = inputs.case
    args = (inputs.hidden, inputs.scale, inputs.routemap, inputs.probs, c.experts)
    args += (inputs.counts, c.alignment)
    ops = [
        Operation(
            op_name("permute", OURS),
            lambda: moe_permute(*args, validate=False),
            permute_bytes(c, inputs.counts),
            False,
        )
    ]
    if c.has_unpermute:
        rows, rowmap, row_probs, _ = ours
        combine = (rows, rowmap, inputs.routemap, row_probs, c.tokens, c.experts)
        ops.append(
            Operation(
                op_name("unpermute weighted", OURS),
                lambda: moe_unpermute(*combine, using_weighted_combine=True, validate=False)[0],
                unpermute_bytes(c),
                False,
            )
        )
    return ops


def _reference_y(ours, inputs):
    rows, rowmap, row_probs, _ = ours
    c = inputs.case
    return moe_unpermute(
        rows, rowmap, inputs.routemap, row_probs, c.tokens, c.experts, using_weighted_combine=True
    )[0]


class TeInputs:
    """TE's form of one case's routing: a (T, E) mask and probabilities, and the padding
    rows before each expert (None without padding), built outside the timing."""

    def __init__(self, torch, inputs):
        c = inputs.case
        slots = inputs.routemap.long()
        device = inputs.routemap.device
        self.mask = torch.zeros(c.tokens, c.experts, dtype=torch.bool, device=device)
        self.mask.scatter_(1, slots, True)
        self.probs = torch.zeros(c.tokens, c.experts, device=device).scatter_(
            1, slots, inputs.probs
        )
        counts = torch.tensor(inputs.counts, device=device)
        pads = (counts + c.alignment - 1) // c.alignment * c.alignment - counts
        self.pad_offsets = None if c.alignment == 1 else torch.cumsum(pads, 0) - pads
        self.rows = int((counts + pads).sum())
        self.scale_width = None if inputs.scale is None else inputs.scale.shape[1]


def _checked_unpermute(impl, torch, unpermute, ours, inputs, note):
    """A peer's weighted unpermute as an :class:`Operation`, its output checked first against
    moe-numba's combine of the same rows."""
    name = op_name("unpermute weighted", impl)
    note(name, check_close(torch, unpermute(), _reference_y(ours, inputs)))
    return Operation(name, unpermute, unpermute_bytes(inputs.case), False)


def _te_ops(torch, te, inputs, ours, note):
    c = inputs.case
    t = TeInputs(torch, inputs)

    def permute():  # the row-id map is made in every permute, as TE's permute op does
        row_id_map = te.make_row_id_map(t.mask, c.tokens, c.experts)
        out = te.permute_with_mask_map(
            inputs.hidden,
            row_id_map,
            t.probs,
            inputs.scale,
            t.pad_offsets,
            c.tokens,
            c.experts,
            t.rows,
            c.hidden,
            t.scale_width,
        )
        return (*out, row_id_map)

    rows, row_scale, row_probs, row_id_map = permute()
    want, got = [ours[0], ours[2]], [rows, row_probs]
    if inputs.scale is not None:
        want.append(ours[3])
        got.append(row_scale)
    note(op_name("permute", TE), check_rows(torch, got, want))
    ops = [Operation(op_name("permute", TE), permute, permute_bytes(c, inputs.counts), False)]
    if c.has_unpermute:

        def unpermute():
            return te.unpermute_with_mask_map(
                rows, row_id_map, t.probs, None, t.pad_offsets, c.tokens, c.experts, c.hidden
            )[0]

        ops.append(_checked_unpermute(TE, torch, unpermute, ours, inputs, note))
    return ops


def _vllm_ops(torch, ops_lib, inputs, ours, note):
    """vLLM's ops into buffers allocated once (its ``_with_scratch`` form): dense T*K rows
    sorted by expert, no padding and no scales; the int32 ids and the ``arange`` of slots
    are made outside the timing."""
    c = inputs.case
    n = c.tokens * c.topk
    device = inputs.hidden.device

    def i32(*shape):
        return torch.empty(shape, dtype=torch.int32, device=device)

    slots = torch.arange(n, dtype=torch.int32, device=device).view(c.tokens, c.topk)
    rows = torch.empty(n, c.hidden, dtype=inputs.hidden.dtype, device=device)
    offsets = torch.empty(c.experts + 1, dtype=torch.int64, device=device)
    inverse = i32(c.tokens, c.topk)
    order = torch.full((n,), n, dtype=torch.int32, device=device)
    workspace_bytes = int(ops_lib.moe_permute_sort_workspace_size(n, c.experts))
    workspace = torch.empty(workspace_bytes, dtype=torch.int8, device=device)
    scratch = (workspace, i32(c.tokens, c.topk), i32(c.tokens, c.topk), i32(c.tokens, c.topk))
    y = torch.empty(c.tokens, c.hidden, dtype=inputs.hidden.dtype, device=device)
    ids = inputs.routemap.int()

    def permute():
        ops_lib.moe_permute_with_scratch(
            inputs.hidden,
            ids,
            slots,
            None,
            c.experts,
            c.experts,
            c.topk,
            rows,
            offsets,
            inverse,
            order,
            *scratch,
        )

    def unpermute():
        ops_lib.moe_unpermute(rows, inputs.probs, inverse, offsets, c.topk, y)
        return y

    permute()
    rowmap = ours[1]
    filled = rowmap[rowmap >= 0].sort().values.long()  # moe-numba's rows that hold a token
    counts = torch.tensor(inputs.counts, device=device)
    same = check_rows(torch, [rows], [ours[0][filled]]) == "identical"
    same = same and torch.equal(offsets.diff(), counts)
    verdict = "DIFFERENT" if not same else "identical" if c.alignment == 1 else "same per expert"
    note(op_name("permute", VLLM), verdict)
    ops = [Operation(op_name("permute", VLLM), permute, dense_permute_bytes(c), False)]
    if c.has_unpermute:
        ops.append(_checked_unpermute(VLLM, torch, unpermute, ours, inputs, note))
    return ops


# ------------------------------------------------------------------------- the command line


def add_options(parser):
    """Add ``--peers``, ``--peers-cache`` and ``--gradients`` to the bench's ``parser``."""
    parser.add_argument(
        "--peers",
        action="store_true",
        help=f"time beside NVIDIA Transformer Engine's ({TE_SPEC}) and vLLM's ({VLLM_SPEC}) "
        "permute/unpermute on the same inputs, after checking their outputs against "
        "moe-numba's; needs torch with a CUDA GPU, and downloads the peers' wheels the first "
        f"time ({DOWNLOAD_NOTE}); without shape options, the published comparison's shapes",
    )
    parser.add_argument(
        "--peers-cache",
        metavar="DIR",
        help="where --peers keeps the peers' files, outside any moe-numba checkout "
        f"(default {default_cache()})",
    )
    parser.add_argument(
        "--gradients",
        action="store_true",
        help="with --peers: also the gradient ops and a layer's forward and backward beside "
        "TE's, per bf16 shape",
    )


def peer_target(parser, args):
    """The torch GPU target of a ``--peers`` run, every peer option checked first
    (``parser.error``, exit status 2, otherwise: the refusal without a GPU among them)."""
    for option in ("peers_cache", "gradients"):
        if getattr(args, option) and not args.peers:
            parser.error(f"argument --{option.replace('_', '-')}: only with --peers")
    if args.sweep:
        parser.error("argument --sweep: not allowed with --peers (it has its own shapes)")
    if args.backend == "cpu":
        parser.error("argument --backend: --peers times CUDA ops on torch tensors; got cpu")
    problem = cache_problem(args.peers_cache or default_cache())
    if problem:
        parser.error(f"argument --peers-cache: {problem}")
    why = torch_cuda_problem()
    if why:
        parser.error(f"argument --peers: needs torch with a CUDA GPU; {why}")
    from .target import CudaTarget

    return CudaTarget("torch")


def prepare(parser, args):
    """The :class:`PeerBench` of a ``--peers`` run: the peers fetched into the cache where
    they are not there yet (``parser.error`` if that fails), then loaded."""
    cache = args.peers_cache or default_cache()
    try:
        files = fetch(cache)
    except (OSError, RuntimeError) as error:
        parser.error(f"argument --peers: cannot fetch the peers into {cache}: {error}")
    peers = load(files)
    for name, peer in peers.items():
        state = f"FAILED to load: {peer}" if isinstance(peer, str) else "loaded"
        print(f"peers: {name} {state}", file=sys.stderr)
    return PeerBench(peers)
