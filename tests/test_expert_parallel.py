"""The expert-parallel layer over gloo, 2 and 4 processes on 127.0.0.1, against one process.

One group of processes per world size runs every case (starting processes costs more than
the cases); each test then reads its case's verdicts from every rank. The group has a hard
deadline, each collective a timeout, and each process ends by itself after its cases.
"""

import multiprocessing
import queue as queue_module
import socket
import time

import pytest

torch = pytest.importorskip("torch", reason="the expert-parallel layer needs torch")
dist = pytest.importorskip("torch.distributed", reason="needs torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this torch build has no gloo backend", allow_module_level=True)

from _expert_parallel_cases import (  # noqa: E402
    TIMEOUT,
    Case,
    Failure,
    Outsider,
    nccl_worker,
    timeout_worker,
    worker,
)

DEADLINE = 240  # seconds for a whole group (process start-up included)

CASES = {
    2: [
        Case("bf16 weighted", (5, 7), num_experts=4, topk=2),
        Case(
            "float32 probs in the experts, alignment 3",
            (6, 4),
            4,
            3,
            dtype="float32",
            alignment=3,
            weighted=False,
            seed=1,
        ),
        Case("a rank with no tokens", (0, 6), 4, 2, alignment=2, seed=2),
        Case("an expert with no tokens", (4, 5), 6, 2, unused_experts=(1, 4), seed=3),
        Case("no tokens anywhere", (0, 0), 2, 1, seed=4),
        Case("experts ignore the probabilities", (4, 6), 4, 2, probs_in_experts=False, seed=9),
        Case("expert output not contiguous", (0, 6), 4, 2, strided_out=True, seed=10),
        Case("bad id on rank 1 raises on every rank", (3, 3), 4, 2, bad_rank=1, seed=5),
    ],
    4: [
        Case(
            "bf16 alignment 2, repeats and bad ids (validate=False)",
            (3, 0, 5, 4),
            8,
            3,
            alignment=2,
            validate=False,
            malformed=True,
            seed=6,
        ),
        Case(
            "float32 weighted, wide",
            (4, 6, 2, 3),
            8,
            4,
            hidden=33,
            dtype="float32",
            unused_experts=(0, 7),
            seed=7,
        ),
        Case("bad id on rank 2 raises on every rank", (2, 2, 2, 2), 4, 1, bad_rank=2, seed=8),
    ],
}


DISAGREE = "the ranks disagree on "
# (every rank raises: the error, text in its message; a failure found on one rank names it)
FAILURES = {
    2: [
        Failure(
            "num_experts",
            1,
            "num_experts",
            "ValueError",
            DISAGREE + "num_experts: rank 0 has 4, rank 1 has 8",
        ),
        Failure(
            "padding_alignment",
            1,
            "padding_alignment",
            "ValueError",
            DISAGREE + "padding_alignment: rank 0 has 1, rank 1 has 2",
            (0, 3),
        ),
        Failure(
            "validate",
            1,
            "validate",
            "ValueError",
            DISAGREE + "validate: rank 0 has True, rank 1 has False",
        ),
        Failure(
            "using_weighted_combine",
            0,
            "using_weighted_combine",
            "ValueError",
            DISAGREE + "using_weighted_combine: rank 0 has False, rank 1 has True",
        ),
        Failure(
            "hidden width",
            1,
            "hidden",
            "ValueError",
            DISAGREE + "the hidden width x.shape[1]: rank 0 has 6, rank 1 has 5",
            (0, 3),
        ),
        Failure(
            "dtype",
            1,
            "dtype",
            "TypeError",
            DISAGREE + "x.dtype: rank 0 has torch.bfloat16, rank 1 has torch.float32",
        ),
        Failure(
            "x requires grad on one rank",
            1,
            "x no grad",
            "ValueError",
            DISAGREE + "whether x requires a gradient: rank 0 has True, rank 1 has False",
        ),
        Failure(
            "routemap dtype on one rank",
            1,
            "routemap dtype",
            "TypeError",
            "routemap must have dtype torch.int32, torch.int64; got torch.float32",
        ),
        Failure(
            "num_experts not a multiple on one rank",
            0,
            "num_experts not a multiple",
            "ValueError",
            "num_experts = 3 must be a multiple of the process group's size (2)",
            (3, 0),
        ),
        Failure(
            "bad id on an empty-handed group",
            0,
            "bad id",
            "ValueError",
            "is not an expert id",
            (2, 0),
        ),
        Failure("expert output rows", 1, "output rows", "ValueError", "expert_fn must return a ["),
        Failure(
            "expert output dtype",
            0,
            "output dtype",
            "TypeError",
            "expert_fn must return bfloat16, float16 or float32 rows; got torch.float64",
        ),
        Failure(
            "expert output sparse",
            1,
            "output layout",
            "TypeError",
            "expert_fn must return a dense (strided) tensor; got torch.sparse_coo",
        ),
        Failure(
            "expert output width",
            1,
            "output width",
            "ValueError",
            DISAGREE + "the width of expert_fn's output: rank 0 has 6, rank 1 has 12",
        ),
        Failure(
            "expert output without grad",
            0,
            "output no grad",
            "ValueError",
            DISAGREE
            + "whether expert_fn's output requires a gradient: rank 0 has False, rank 1 has True",
        ),
        Failure(
            "expert_fn raises on an empty rank",
            1,
            "experts raise",
            "ExpertParallelError",
            "expert_fn raised ZeroDivisionError: an expert divided by zero",
            (3, 0),
        ),
    ],
    4: [
        Failure(
            "num_experts on rank 2",
            2,
            "num_experts",
            "ValueError",
            DISAGREE + "num_experts: rank 0 has 4, rank 2 has 8",
            (2, 0, 3, 1),
        ),
        Failure(
            "expert_fn raises on rank 3",
            3,
            "experts raise",
            "ExpertParallelError",
            "expert_fn raised ZeroDivisionError",
            (2, 2, 0, 3),
        ),
    ],
}
SECONDS = 10  # "within seconds": the most a failing call may take on any rank


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_group(ranks, cases=None, target=worker, timeout=60, deadline=DEADLINE):
    """Start ``ranks`` processes on every case of that size; their verdicts by case.
    ``timeout``: the process group's (seconds a collective waits for a peer); ``deadline``:
    the seconds the whole group may take, process start-up included."""
    cases = CASES[ranks] if cases is None else cases
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    arguments = (port, cases, queue, timeout) if target is worker else (port, queue)
    stop = context.Event()  # set once rank 0 has ended: timeout_worker's idle rank may end
    if target is timeout_worker:
        arguments += (stop,)
    processes = [
        context.Process(target=target, args=(rank, ranks, *arguments), daemon=True)
        for rank in range(ranks)
    ]
    for p in processes:
        p.start()
    verdicts = {case.name: {} for case in cases}
    expected = len(cases) * ranks
    deadline = time.monotonic() + deadline
    received = 0
    try:
        while received < expected:
            try:
                name, rank, result = queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue_module.Empty:
                break
            verdicts[name][rank] = result
            received += 1
            if "error" in result:
                break
        for p in processes:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
            stop.set()
    finally:
        for p in processes:
            if p.is_alive():
                p.kill()
                p.join()
    return verdicts, [p.exitcode for p in processes]


_groups = {}


def _verdicts(ranks):
    """The verdicts of the group of ``ranks`` processes: one case (the first call's start-up
    time is not a failure's), the failures, then the other cases (which pass only if every
    rank left every failure outside a collective)."""
    if ranks not in _groups:
        cases = CASES[ranks]
        _groups[ranks] = _run_group(ranks, cases[:1] + FAILURES[ranks] + cases[1:])
    return _groups[ranks]


@pytest.mark.parametrize(
    "ranks,case",
    [(r, c) for r, cases in CASES.items() for c in cases],
    ids=[f"{r}ranks-{c.name}" for r, cases in CASES.items() for c in cases],
)
def test_against_one_process(ranks, case):
    verdicts, exitcodes = _verdicts(ranks)
    per_rank = verdicts[case.name]
    assert sorted(per_rank) == list(range(ranks)), (
        f"verdicts from ranks {sorted(per_rank)} only (exit codes {exitcodes}); "
        f"errors: {[v.get('error') for v in per_rank.values()]}"
    )
    for rank, result in per_rank.items():
        assert "error" not in result, f"rank {rank}:\n{result['error']}"
        if case.bad_rank is not None:
            assert result["raised"], f"rank {rank} did not raise"
            where = "this rank" if rank == case.bad_rank else f"rank {case.bad_rank}"
            assert "is not an expert id" in result["message"]
            assert f"(on {where}; every rank raises)" in result["message"], result["message"]
            continue
        failed = [check for check, ok in result.items() if not ok]
        assert not failed, f"rank {rank}: {failed}"


@pytest.mark.parametrize(
    "ranks,failure",
    [(r, f) for r, failures in FAILURES.items() for f in failures],
    ids=[f"{r}ranks-{f.name}" for r, failures in FAILURES.items() for f in failures],
)
def test_every_rank_raises_the_same(ranks, failure):
    verdicts, exitcodes = _verdicts(ranks)
    per_rank = verdicts[failure.name]
    assert sorted(per_rank) == list(range(ranks)), f"exit codes {exitcodes}: {per_rank}"
    for rank, result in per_rank.items():
        assert "error" not in result, f"rank {rank}:\n{result['error']}"
        assert result["type"] == failure.error, f"rank {rank}: {result}"
        assert failure.text in result["message"], f"rank {rank}: {result['message']}"
        if failure.text.startswith(DISAGREE):
            assert f"(this is rank {rank}); every rank" in result["message"]
        else:  # found on one rank: named
            where = "this rank" if rank == failure.rank else f"rank {failure.rank}"
            assert f"(on {where}; every rank raises)" in result["message"], result["message"]
        assert result["seconds"] < SECONDS, f"rank {rank} took {result['seconds']:.1f} s"


def test_a_rank_that_never_calls_times_out():
    """The one failure no agreement can see: a rank that never reaches the layer. The others
    wait in the first agreement until the process group's timeout, then raise torch's
    error."""
    cases = [Failure("a rank that never calls the layer", -1, "", "", "")]
    verdicts, exitcodes = _run_group(2, cases, timeout_worker)
    per_rank = verdicts[cases[0].name]
    assert sorted(per_rank) == [0, 1], f"exit codes {exitcodes}: {per_rank}"
    waited = per_rank[0]
    assert waited["type"] is not None and "error" not in waited, waited
    assert TIMEOUT - 0.5 <= waited["seconds"] < TIMEOUT + SECONDS, waited
    assert exitcodes == [0, 0]


# One rank's layout (issue 43): strided inputs on one rank only must not strand the others,
# and a rank outside the group is refused at once. Their own group, with a short timeout: a
# rank left waiting in a collective fails its case within LAYOUT_TIMEOUT seconds, and the
# group within LAYOUT_DEADLINE, process start-up included.
LAYOUT_TIMEOUT = 15
LAYOUT_DEADLINE = 150
STRIDED = [
    Case(f"{', '.join(inputs)} strided on rank {rank}", (4, 5), 4, 2, strided=inputs,
         strided_rank=rank, seed=11 + rank)
    for inputs, rank in (
        (("x",), 1),
        (("routemap",), 0),
        (("probs",), 1),
        (("x", "routemap", "probs"), 0),
    )
]  # fmt: skip
OUTSIDER = Outsider("a rank outside group")


def _layout_verdicts():
    if "layouts" not in _groups:
        _groups["layouts"] = _run_group(
            2, [*STRIDED, OUTSIDER], timeout=LAYOUT_TIMEOUT, deadline=LAYOUT_DEADLINE
        )
    return _groups["layouts"]


@pytest.mark.parametrize("case", STRIDED, ids=[c.name for c in STRIDED])
def test_strided_inputs_on_one_rank_give_the_one_process_bits(case):
    """A strided view is copied to a C-contiguous tensor on the rank that passes it, before
    anything else: the output and every gradient are the one-process bits on every rank."""
    verdicts, exitcodes = _layout_verdicts()
    per_rank = verdicts[case.name]
    assert sorted(per_rank) == [0, 1], f"exit codes {exitcodes}: {per_rank}"
    for rank, result in per_rank.items():
        assert "error" not in result, f"rank {rank}:\n{result['error']}"
        failed = [check for check, ok in result.items() if not ok]
        assert not failed, f"rank {rank}: {failed}"
    assert "inputs strided" in per_rank[case.strided_rank]


def test_a_rank_outside_group_is_refused_at_once():
    verdicts, exitcodes = _layout_verdicts()
    per_rank = verdicts[OUTSIDER.name]
    assert sorted(per_rank) == [0, 1], f"exit codes {exitcodes}: {per_rank}"
    assert "error" not in per_rank[1], per_rank[1]["error"]
    for call in ("local_experts", "layer"):
        inside, outside = per_rank[0][call], per_rank[1][call]
        assert inside["type"] is None, inside
        assert outside["type"] == "ValueError", outside
        assert outside["message"].startswith("this rank is not a member of group"), outside
        assert outside["seconds"] < SECONDS, outside
    assert per_rank[0]["local_experts"]["got"] == "range(0, 4)"
    assert per_rank[0]["layer"]["got"] == [[2.0] * 4] * 3


def test_the_layout_group_ends_by_itself():
    _, exitcodes = _layout_verdicts()
    assert exitcodes == [0, 0]


@pytest.mark.parametrize("ranks", sorted(CASES))
def test_every_process_ends_by_itself(ranks):
    _, exitcodes = _verdicts(ranks)
    assert exitcodes == [0] * ranks


@pytest.mark.gpu
@pytest.mark.parametrize("ranks", [1, 2])
def test_nccl_on_gpus_one_host_read_per_forward(ranks):
    """One GPU per process over NCCL (runs where that many GPUs are present; one GPU checks
    every kernel of the layer, two the exchange too): the same bits as one process on the
    GPU, one host synchronisation per forward with validate=False (the split sizes), three
    with validate=True (the agreements' too) and one wait for the permute's status words
    (its check of the routing map), none in the backward."""
    if torch.cuda.device_count() < ranks or not dist.is_nccl_available():
        pytest.skip(f"needs {ranks} CUDA GPU(s) and NCCL")
    cases = [Case("nccl", (5,) * ranks, 4 * ranks, 3)]
    verdicts, exitcodes = _run_group(ranks, cases=cases, target=nccl_worker)
    per_rank = verdicts["nccl"]
    assert sorted(per_rank) == list(range(ranks)), f"exit codes {exitcodes}: {per_rank}"
    for rank, result in per_rank.items():
        assert "error" not in result, f"rank {rank}:\n{result['error']}"
        failed = [check for check, ok in result.items() if not ok]
        assert not failed, f"rank {rank}: {failed}"
    assert exitcodes == [0] * ranks
