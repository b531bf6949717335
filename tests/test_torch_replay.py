"""Replays of untraced calls on torch CUDA tensors (moe_numba/torch/_replay.py).

The first call of a key with ``validate=False`` is recorded and later ones replay it: the
same outputs and scratch allocated again, the same launches with the new addresses. Every
replayed output equals the NumPy oracle bit for bit, in memory that held other bytes before;
a call of another key (an input address of other alignment, new capacities, a gradient to
record, ``validate=True``) takes the full path.
"""

from __future__ import annotations

import numpy as np
import pytest

import moe_numba
from _torch_cases import CUDA, assert_same_bits, routing, to_numpy, to_torch, torch  # noqa: F401
from moe_numba import (
    moe_permute,
    moe_permute_backward,
    moe_unpermute,
    moe_unpermute_backward,
    oracle,
)
from moe_numba.ops import PERMUTE  # noqa: E402

pytestmark = CUDA.marks


OPS = ("permute", "unpermute", "permute_backward", "unpermute_backward", "sort_chunks")


class _ReplaysRun:
    """``counter["calls"]``: the replays of every op that ran since the counter was made (a
    replay that finds it cannot run is not one), as ``moe_numba.torch.routes`` counts them."""

    def __init__(self):
        from moe_numba.torch import routes

        self._routes = routes
        routes.reset()

    def __getitem__(self, name):
        assert name == "calls"
        return sum(self._routes[op, "replay"] for op in OPS)


@pytest.fixture
def replays():
    """Counts of the replays that ran during the test, which starts with nothing recorded
    and no capacities met (the schedule of recordings depends on both)."""
    moe_numba.clear()
    return _ReplaysRun()


def _poison():
    """Fill memory that the allocator hands out next with 0xFF bytes (freed at once)."""
    blocks = [torch.full((n,), -1, dtype=torch.uint8, device="cuda") for n in (1 << 20, 4096, 512)]
    torch.cuda.synchronize()
    del blocks


def _case(seed, alignment=2, **kwargs):
    case = routing(seed, num_tokens=37, topk=3, num_experts=6, alignment=alignment, hidden=24)
    case.update(kwargs)
    tensors = {
        k: to_torch(v, "cuda")
        for k, v in case.items()
        if k in ("hidden_states", "expert_routemap_topk", "expert_prob_topk")
    }
    return case, tensors


def _permute(t, case, validate=False, **kwargs):
    return moe_permute(
        t["hidden_states"],
        None,
        t["expert_routemap_topk"],
        t["expert_prob_topk"],
        case["num_experts"],
        case["tokens_per_expert"],
        case["padding_alignment"],
        validate=validate,
        **kwargs,
    )


def _expected_permute(case, **kwargs):
    outputs, _ = oracle.permute(
        case["hidden_states"],
        None,
        case["expert_routemap_topk"],
        case["expert_prob_topk"],
        case["num_experts"],
        case["tokens_per_expert"],
        case["padding_alignment"],
        **kwargs,
    )
    return outputs


def _assert_outputs(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        if e is None:
            assert a is None
        else:
            assert_same_bits(a, np.asarray(e))


@pytest.mark.parametrize("alignment", [1, 4])
@pytest.mark.parametrize("indices", [False, True])
def test_replayed_permutes_equal_the_oracle(replays, alignment, indices):
    case, t = _case(1, alignment)
    expected = _expected_permute(case, return_expert_indices=indices)
    kept = []
    # full path (recorded with its capacities staged), full path again (capacities met
    # before: recorded with a device copy of them), replayed, replayed
    for _ in range(4):
        _poison()
        kept.append(_permute(t, case, return_expert_indices=indices))
        _assert_outputs(kept[-1], expected)
    assert replays["calls"] == 2


def _rotations(counts, n):
    """``n`` distinct rotations of ``counts`` (the same row count at any alignment)."""
    lists = [counts[i:] + counts[:i] for i in range(n)]
    assert len({tuple(x) for x in lists}) == n
    return lists


@pytest.mark.parametrize("alignment", [1, 4])
def test_new_capacities_of_a_recorded_row_count_replay(replays, alignment):
    """Every call passes new capacities (a training step's): the first call of a row count
    is recorded, the later ones replay it with their own capacities staged."""
    case, t = _case(7, alignment)
    kept = []
    for counts in _rotations(case["tokens_per_expert"], 6):
        new = dict(case, tokens_per_expert=counts)
        _poison()
        kept.append(_permute(t, new))
        _assert_outputs(kept[-1], _expected_permute(new))
    assert replays["calls"] == 5
    # capacities that the contract refuses, of the same row count: the full path's errors
    bad = list(case["tokens_per_expert"])
    bad[0], bad[1] = bad[0] + bad[1] + alignment, -alignment
    assert sum(bad) == sum(case["tokens_per_expert"])
    with pytest.raises(ValueError, match=r"tokens_per_expert must be >= 0"):
        _permute(t, dict(case, tokens_per_expert=bad))
    with pytest.raises(TypeError, match="tokens_per_expert must hold ints"):
        _permute(t, dict(case, tokens_per_expert=[float(n) for n in case["tokens_per_expert"]]))
    assert replays["calls"] == 5


def test_staged_replays_queued_behind_a_busy_gpu_keep_their_own_counts(replays):
    """Calls queued while the GPU is held: each stages its counts in a block that no call in
    flight reads (the pool grows), so every output is that of its own capacities."""
    case, t = _case(10)
    rng = np.random.default_rng(10)
    lists = {tuple(rng.permutation(case["tokens_per_expert"]).tolist()) for _ in range(200)}
    lists = [list(x) for x in sorted(lists)][:60]
    assert len(lists) == 60
    _permute(t, dict(case, tokens_per_expert=lists[0]))  # (full path, recorded)
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)  # (about 50 ms: every call below is queued behind it)
    queued = [_permute(t, dict(case, tokens_per_expert=counts)) for counts in lists[1:]]
    torch.cuda.synchronize()
    assert replays["calls"] == len(queued)
    for counts, outputs in zip(lists[1:], queued, strict=True):
        _assert_outputs(outputs, _expected_permute(dict(case, tokens_per_expert=counts)))


def test_a_graph_captured_with_new_capacities_reads_its_own(replays):
    """A staged replay is not captured (the graph would read its pinned block again after
    later calls rewrote it): the capture takes the full path, which uploads the counts."""
    case, t = _case(8)
    lists = _rotations(case["tokens_per_expert"], 5)
    for counts in lists[:3]:
        _permute(t, dict(case, tokens_per_expert=counts))
    assert replays["calls"] == 2
    captured_case = dict(case, tokens_per_expert=lists[3])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _permute(t, captured_case)
    assert replays["calls"] == 2
    for _ in range(2):
        later = _permute(t, dict(case, tokens_per_expert=lists[4]))  # (a staged replay)
        for out in captured:
            out.fill_(7)
        graph.replay()
        torch.cuda.synchronize()
        _assert_outputs(captured, _expected_permute(captured_case))
        _assert_outputs(later, _expected_permute(dict(case, tokens_per_expert=lists[4])))
    assert replays["calls"] == 3  # (the second call of lists[4] takes the full path)


def test_a_replayed_unpermute_and_the_gradients_equal_the_oracle(replays):
    case, t = _case(2)
    rows, rowmap, row_probs, _ = _permute(t, case)
    routes = t["expert_routemap_topk"]
    T, E = case["hidden_states"].shape[0], case["num_experts"]
    rng = np.random.default_rng(5)
    dy = rng.standard_normal((T, rows.shape[1])).astype(np.float32)
    dp = rng.standard_normal((T, routes.shape[1])).astype(np.float32)
    n_rows, n_map, n_probs = to_numpy(rows), to_numpy(rowmap), to_numpy(row_probs)
    n_routes = case["expert_routemap_topk"]
    calls = {
        "unpermute": (
            lambda: moe_unpermute(
                rows, rowmap, routes, row_probs, T, E, using_weighted_combine=True, validate=False
            ),
            oracle.unpermute(n_rows, n_map, n_routes, n_probs, T, E, True, True)[0],
        ),
        "permute_backward": (
            lambda: moe_permute_backward(rows, row_probs, rowmap, routes, validate=False),
            oracle.permute_backward(n_rows, n_probs, n_map, n_routes)[0],
        ),
        "unpermute_backward": (
            lambda: moe_unpermute_backward(
                to_torch(dy, "cuda"),
                to_torch(dp, "cuda"),
                rows,
                rowmap,
                routes,
                row_probs,
                using_weighted_combine=True,
                num_rows=rows.shape[0],
                validate=False,
            ),
            oracle.unpermute_backward(dy, dp, n_rows, n_map, n_routes, n_probs, True, len(n_rows))[
                0
            ],
        ),
    }
    before = replays["calls"]
    for name, (call, expected) in calls.items():
        for _ in range(4):  # recorded, then replayed
            _poison()
            _assert_outputs(call(), expected)
        assert replays["calls"] - before == 3, name
        before = replays["calls"]


def test_calls_of_other_keys_take_the_full_path(replays):
    case, t = _case(3)
    for _ in range(3):
        _permute(t, case)
    assert replays["calls"] == 1
    # an input whose address has other low bits (two bytes on): another key
    x = t["hidden_states"]
    wide = torch.zeros(x.numel() + 8, dtype=x.dtype, device="cuda")
    shifted = wide[1 : 1 + x.numel()].view(x.shape)
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 != x.data_ptr() % 16
    for _ in range(2):  # (recorded, replayed)
        _assert_outputs(_permute({**t, "hidden_states": shifted}, case), _expected_permute(case))
    assert replays["calls"] == 2
    # new capacities of a new row count and validate=True: the full path
    more = dict(case, tokens_per_expert=[n + 1 for n in case["tokens_per_expert"]])
    _assert_outputs(_permute(t, more), _expected_permute(more))
    _assert_outputs(_permute(t, case, validate=True), _expected_permute(case))
    assert replays["calls"] == 2
    # a call that autograd records replays inside its autograd Function (no grad there)
    xg = t["hidden_states"].clone().requires_grad_(True)
    recorded = _permute({**t, "hidden_states": xg}, case)
    assert recorded[0].grad_fn is not None
    _assert_outputs([r.detach() for r in recorded], _expected_permute(case))
    assert replays["calls"] == 3
    for _ in range(2):  # (the recorded key still replays)
        _assert_outputs(_permute(t, case), _expected_permute(case))
    assert replays["calls"] == 5


def test_a_bool_where_an_int_was_recorded_is_refused(replays):
    case = routing(6, num_tokens=9, topk=1, num_experts=1, alignment=2, hidden=8)
    t = {k: to_torch(v, "cuda") for k, v in case.items() if isinstance(v, np.ndarray)}
    for _ in range(3):
        _assert_outputs(_permute(t, case), _expected_permute(case))
    assert replays["calls"] == 1
    with pytest.raises(TypeError, match="num_experts must be an int; got bool True"):
        _permute(t, {**case, "num_experts": True})


def test_a_strided_view_of_a_recorded_shape_takes_the_full_path(replays):
    """The key holds no strides: a view of the recorded shape, dtype and address bits that is
    not contiguous must miss it and raise the full path's error."""
    case, t = _case(11)
    for _ in range(3):
        _permute(t, case)
    replayed = replays["calls"]
    assert replayed >= 1  # (the key of this shape replays)
    routes = t["expert_routemap_topk"]
    wide = torch.empty((routes.shape[0], 2 * routes.shape[1]), dtype=routes.dtype, device="cuda")
    strided = wide[:, : routes.shape[1]]
    strided.copy_(routes)
    assert strided.shape == routes.shape and not strided.is_contiguous()
    assert strided.data_ptr() % 16 == routes.data_ptr() % 16
    with pytest.raises(ValueError, match="expert_routemap_topk must be C-contiguous"):
        _permute({**t, "expert_routemap_topk": strided}, case)
    assert replays["calls"] == replayed


def test_a_replay_runs_on_the_current_stream_and_in_a_cuda_graph(replays):
    case, t = _case(4)
    for _ in range(2):
        _permute(t, case)
    # on another stream, behind a write of new rows: a replay on any other stream would
    # read the rows before the write
    other, _ = _case(5)
    x = t["hidden_states"].clone()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1 << 24)
        x.copy_(to_torch(other["hidden_states"], "cuda"))
        outputs = _permute({**t, "hidden_states": x}, case)
    stream.synchronize()
    _assert_outputs(outputs, _expected_permute({**case, "hidden_states": other["hidden_states"]}))
    assert replays["calls"] == 1
    # a replay without capacities is captured; one that holds a device copy of them is not
    # (the full path keeps them for the graph)
    over = dict(override_buffer_size=outputs[0].shape[0])
    for _ in range(2):  # (recorded, replayed)
        _permute(t, case, **over)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _permute(t, case, **over)
        captured_counts = _permute(t, case)
    assert replays["calls"] == 3
    for _ in range(2):
        for out in (*captured, *captured_counts):
            out.fill_(7)
        graph.replay()
        torch.cuda.synchronize()
        _assert_outputs(captured, _expected_permute(case, **over))
        _assert_outputs(captured_counts, _expected_permute(case))


def test_a_graph_keeps_its_capacities_after_the_caches_dropped_them(replays):
    """Calls with more distinct capacities than any cache holds, and memory that held their
    copies written over, between the replays of a graph captured with capacities."""
    case, t = _case(9)
    for _ in range(3):
        _permute(t, case)  # (staged, then a device copy and its recording, then a replay)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _permute(t, case)
    counts = case["tokens_per_expert"]
    for i in range(300):  # (twice each: staged, then a device copy)
        for _ in range(2):
            _permute(t, dict(case, tokens_per_expert=[n + i % 7 for n in counts[:-1]] + [i]))
    for _ in range(2):
        litter = [torch.full((64,), -1, dtype=torch.int64, device="cuda") for _ in range(2000)]
        for out in captured:
            out.fill_(7)
        graph.replay()
        torch.cuda.synchronize()
        del litter
        _assert_outputs(captured, _expected_permute(case))


def test_the_librarys_clear_forgets_the_replays(replays):
    """``moe_numba.clear()`` forgets the recorded calls: the call right after it takes the
    full path, where it would have replayed."""
    case, t = _case(6)
    for _ in range(3):
        _permute(t, case)
    ran = replays["calls"]
    assert ran >= 1
    moe_numba.clear()
    _assert_outputs(_permute(t, case), _expected_permute(case))
    assert replays["calls"] == ran


def test_cleared_replays_record_anew(replays):
    """After ``clear()`` a key is new again: a full call that records it, then replays (what
    ``tools/split_rows.py`` relies on when it changes the kernels' settings)."""
    from moe_numba.torch import _replay

    case, t = _case(5)
    expected = _expected_permute(case)
    for _ in range(3):
        _permute(t, case)
    assert replays["calls"] == 1
    _replay.REPLAYS[PERMUTE].clear()  # (the backend keeps its device copy of the capacities)
    for n in (1, 2, 3):  # full path (its capacities' device copy kept), replayed, replayed
        _assert_outputs(_permute(t, case), expected)
        assert replays["calls"] == n
