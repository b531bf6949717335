"""A call survives its environment and its caller (SPEC.md section 3, issue 18).

Misuse as a hostile user would try it: fork after use, huge thread counts, an input rewritten
while a call runs, ``None`` for an array, sizes whose row count overflows, odd and huge scalars.
Whatever can kill or hang the interpreter runs in a child process with a time bound, so that a
regression fails one test instead of the whole suite.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import moe_cpu
from moe_numba import _oracle, moe_permute, moe_unpermute

CHILD_TIMEOUT_S = 120


def second_pass(item):
    return pytest.mark.xfail(strict=True, reason=f"issue 18 item {item}: fixed in the second pass")


def run_python(code, *, env=None, timeout=CHILD_TIMEOUT_S):
    """Run ``code`` in a fresh interpreter; fail (not hang) when it outlives ``timeout``."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the child ran past {timeout} s (hung?); its stderr: {expired.stderr!r}")


def assert_survived(done, marker):
    died = f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0 else ""
    assert done.returncode == 0 and marker in done.stdout, (
        f"the child exited with {done.returncode} {died}\nstdout: {done.stdout}\n"
        f"stderr: {done.stderr[-3000:]}"
    )


@pytest.fixture(autouse=True)
def default_threads():
    yield
    moe_cpu.set_num_threads(None)


def small_case(num_tokens=64, hidden=8, topk=2, num_experts=4, seed=0):
    """A routing map of distinct experts per token, its counts, rows and probabilities."""
    rng = np.random.default_rng(seed)
    scores = rng.random((num_tokens, num_experts))
    routemap = np.argsort(scores, axis=1)[:, :topk].astype(np.int32)
    counts = np.bincount(routemap.ravel(), minlength=num_experts).tolist()
    hidden_states = rng.standard_normal((num_tokens, hidden), dtype=np.float32)
    probs = rng.random((num_tokens, topk), dtype=np.float32)
    return hidden_states, routemap, probs, counts


def permute_args(**changes):
    """Keyword arguments of a valid moe_permute call (4 tokens, K=2, E=4), with changes."""
    args = dict(
        hidden_states=np.arange(32, dtype=np.float32).reshape(4, 8),
        scale=None,
        expert_routemap_topk=np.array([[0, 1], [1, 2], [2, 3], [3, 0]], np.int32),
        expert_prob_topk=np.full((4, 2), 0.5, np.float32),
        num_experts=4,
        tokens_per_expert=[2, 2, 2, 2],
        padding_alignment=1,
    )
    args.update(changes)
    return args


# ------------------------------------------------------------------------ 1: fork after use


def _check_against_oracle(num_experts=4):
    """Permute and unpermute a small case; compare every output with the oracle, bit for bit."""
    hidden_states, routemap, probs, counts = small_case(num_experts=num_experts)
    got = moe_permute(hidden_states, None, routemap, probs, num_experts, counts, 4)
    want, _ = _oracle.permute(hidden_states, None, routemap, probs, num_experts, counts, 4)
    for g, w in zip(got[:3], want[:3], strict=True):
        np.testing.assert_array_equal(g, w)
    rows, rowmap, row_probs = got[:3]
    got = moe_unpermute(rows, rowmap, routemap, row_probs, len(routemap), num_experts)
    want, _ = _oracle.unpermute(rows, rowmap, routemap, row_probs, len(routemap), num_experts)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))


def _wait_or_kill(pid, timeout):
    """The exit status of child ``pid``, or None after killing it when it outlives ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork does not exist on this platform")
def test_fork_after_use_child_calls_work():
    """A child forked after the parent ran parallel loops computes the same outputs, serially.

    libgomp's thread pool belongs to the parent: a child that starts a team of two threads
    waits forever for workers that were never forked.
    """
    moe_cpu.set_num_threads(2)  # a team of two even on a one-core machine
    _check_against_oracle()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            _check_against_oracle()
            assert moe_cpu.get_num_threads() == 1
            moe_cpu.set_num_threads(2)  # accepted, and still serial
            assert moe_cpu.get_num_threads() == 1
            _check_against_oracle()
            code = 0
        except BaseException as error:  # report anything, then leave
            os.write(2, f"child: {error!r}\n".encode())
        finally:
            os._exit(code)
    status = _wait_or_kill(pid, timeout=30)
    assert status is not None, "the forked child hung in its first moe_cpu call"
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child's outputs were wrong"
    # the parent keeps its threads
    assert moe_cpu.get_num_threads() == (2 if moe_cpu.openmp_enabled() else 1)
    _check_against_oracle()


def test_fork_before_use_keeps_threads():
    """A process forked before any parallel loop ran has the normal thread count."""
    done = run_python(
        """
        import os
        import moe_cpu
        moe_cpu.set_num_threads(2)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if moe_cpu.get_num_threads() == (2 if moe_cpu.openmp_enabled() else 1)
                     else 1)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        """
    )
    assert_survived(done, "child 0")


# ------------------------------------------------------------------------ 3: thread counts


@pytest.mark.skipif(not moe_cpu.openmp_enabled(), reason="thread counts are ignored without OpenMP")
@pytest.mark.parametrize("n", [32768, 65536, 1 << 31, 1 << 63, 1 << 64])
def test_huge_thread_count_refused(n):
    limit = moe_cpu.thread_limit()
    if n <= limit:
        pytest.skip(f"this machine allows {limit} threads")
    with pytest.raises(ValueError, match=rf"n must be at most {limit} .*; got {n}$"):
        moe_cpu.set_num_threads(n)
    assert moe_cpu.get_num_threads() <= limit  # unchanged by the refusal


@pytest.mark.skipif(not moe_cpu.openmp_enabled(), reason="thread counts are ignored without OpenMP")
def test_thread_limit_works():
    """The largest accepted count runs; one more is refused with the limit and the reason."""
    limit = moe_cpu.thread_limit()
    if hasattr(os, "sched_getaffinity") and "OMP_THREAD_LIMIT" not in os.environ:
        assert limit == moe_cpu._parallel.THREADS_PER_PROCESSOR * len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match=rf"processor.*; got {limit + 1}$"):
        moe_cpu.set_num_threads(limit + 1)
    done = run_python(
        f"""
        import moe_cpu, numpy as np
        from moe_numba import moe_permute, moe_unpermute
        moe_cpu.set_num_threads({limit})
        assert moe_cpu.get_num_threads() == {limit}
        x = np.ones((4096, 4), np.float32)
        rm = np.zeros((4096, 1), np.int32)
        p = np.ones((4096, 1), np.float32)
        rows, rowmap, probs, _ = moe_permute(x, None, rm, p, 1, [4096], 1)
        out, _ = moe_unpermute(rows, rowmap, rm, probs, 4096, 1)
        assert (out == x).all()
        print("ran")
        """
    )
    assert_survived(done, "ran")


@pytest.mark.skipif(not moe_cpu.openmp_enabled(), reason="OMP_NUM_THREADS is read by OpenMP")
@pytest.mark.parametrize("value", ["32768", "100000"])
def test_absurd_omp_num_threads_is_clamped(value):
    """The default count from the environment never exceeds what the runtime can start."""
    done = run_python(
        """
        import moe_cpu, numpy as np
        from moe_numba import moe_permute, moe_unpermute
        x = np.ones((4096, 4), np.float32)
        rm = np.zeros((4096, 1), np.int32)
        p = np.ones((4096, 1), np.float32)
        rows, rowmap, probs, _ = moe_permute(x, None, rm, p, 1, [4096], 1)
        moe_unpermute(rows, rowmap, rm, probs, 4096, 1)
        print("threads", moe_cpu.get_num_threads())
        """,
        env={"OMP_NUM_THREADS": value},
    )
    assert_survived(done, "threads")
    used = int(done.stdout.split()[-1])
    assert 1 <= used <= moe_cpu.thread_limit()


@pytest.mark.skipif(not moe_cpu.openmp_enabled(), reason="OMP_THREAD_LIMIT is read by OpenMP")
def test_omp_thread_limit_is_the_limit():
    done = run_python(
        """
        import moe_cpu
        assert moe_cpu.thread_limit() == 3, moe_cpu.thread_limit()
        assert moe_cpu.get_num_threads() == 3  # OMP_NUM_THREADS=8, clamped
        moe_cpu.set_num_threads(3)
        try:
            moe_cpu.set_num_threads(4)
        except ValueError as e:
            print("refused:", e)
        """,
        env={"OMP_THREAD_LIMIT": "3", "OMP_NUM_THREADS": "8"},
    )
    assert_survived(done, "refused: n must be at most 3 ")


# ------------------------------------------------------------------ 10: the cores are shared

needs_load_sensing = pytest.mark.skipif(
    not moe_cpu._parallel._load_sensing_supported(), reason="load sensing needs OpenMP on POSIX"
)


@pytest.fixture
def load_sensing():
    """The load sensing, reset, with its default back-off restored afterwards."""
    previous = moe_cpu._parallel._set_load_sensing(True)
    yield moe_cpu._parallel
    moe_cpu._parallel._set_load_sensing(*previous)


@needs_load_sensing
def test_load_sensing_halves_backs_off_and_recovers(load_sensing):
    """A team whose caller waited for a processor is halved for a pause that doubles up to
    its cap, and grows back when the pause is over."""
    load_sensing._set_load_sensing(True, backoff_min_s=0.010, backoff_max_s=0.040)
    steps = [  # (time, the caller's wait on a run queue so far, threads wanted), in s
        (0.000, 0.000, 4),  # the first call
        (0.001, 0.000, 4),  # no wait since the last sample
        (0.002, 0.001, 2),  # waited all the time: half the team, until 0.012
        (0.003, 0.001, 2),
        (0.004, 0.002, 1),  # again: half again, for 20 ms
        (0.010, 0.002, 1),
        (0.025, 0.002, 2),  # the pause is over: double, then one step per 10 ms
        (0.030, 0.002, 2),
        (0.036, 0.002, 4),
        (0.037, 0.002, 4),  # all threads undisturbed: the pause is 10 ms again
        (0.038, 0.003, 2),  # until 0.048
        (0.049, 0.003, 4),
        (0.050, 0.004, 2),  # 20 ms: until 0.070
        (0.069, 0.004, 2),
        (0.071, 0.004, 4),
        (0.072, 0.005, 2),  # 40 ms, the cap: until 0.112
        (0.111, 0.005, 2),
        (0.113, 0.005, 4),
        (0.114, 0.005, 4),
        (0.115, 0.006, 2),  # 10 ms again: until 0.125
        (0.126, 0.006, 4),
    ]
    got = [load_sensing._decide_threads(4, wait, now) for now, wait, _ in steps]
    assert got == [threads for _, _, threads in steps]
    assert load_sensing._narrowed_calls() == sum(threads < 4 for _, _, threads in steps)


@needs_load_sensing
def test_load_sensing_extends_a_busy_pause(load_sensing):
    """A caller that keeps waiting for a processor during a pause starts a longer one."""
    load_sensing._set_load_sensing(True, backoff_min_s=0.010, backoff_max_s=0.040)
    steps = [
        (0.000, 0.000, 2),
        (0.010, 0.001, 2),  # waited 10 % of the time: fine
        (0.020, 0.005, 1),  # 40 %: halved, until 0.030
        (0.025, 0.006, 1),
        (0.031, 0.008, 1),  # waited 3 of the pause's 11 ms (> 1/8): 20 ms more
        (0.052, 0.009, 2),  # 1 of 21 ms: the team again
        (0.060, 0.009, 2),
    ]
    got = [load_sensing._decide_threads(2, wait, now) for now, wait, _ in steps]
    assert got == [threads for _, _, threads in steps]


@needs_load_sensing
def test_load_sensing_without_samples_keeps_the_team(load_sensing):
    assert [load_sensing._decide_threads(2, None, t / 1000) for t in range(5)] == [2] * 5


@needs_load_sensing
def test_explicit_thread_count_is_used_as_it_is(load_sensing):
    load_sensing._set_load_sensing(True, backoff_min_s=60, backoff_max_s=60)
    moe_cpu.set_num_threads(2)
    assert [load_sensing._threads_now() for _ in range(3)] == [2, 2, 2]
    moe_cpu.set_num_threads(None)
    default = moe_cpu.get_num_threads()
    now = time.monotonic()  # the clock of the load sensing
    load_sensing._decide_threads(default, 0.0, now)
    load_sensing._decide_threads(default, 1.0, now + 0.001)  # waited: fewer for a minute
    assert load_sensing._threads_now() < default or default == 1
    assert moe_cpu.get_num_threads() == default  # the count in use when the cores are free


@needs_load_sensing
@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="pins two processors",
)
def test_shared_cores_never_much_slower_than_one_thread():
    """Two processors, one busy loop on them: a default call takes at most 1.5x one thread.

    A team of threads that wait for a processor stalls at every barrier (tens of times slower
    than one thread); the default runs serially while this process's threads are preempted.
    """
    done = run_python(
        """
        import os, statistics, subprocess, sys, time
        cpus = sorted(os.sched_getaffinity(0))[:2]
        os.sched_setaffinity(0, cpus)
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(hog.pid, cpus)
        try:
            import ml_dtypes, numpy as np
            import moe_cpu
            from moe_numba import moe_permute, moe_unpermute
            rng = np.random.default_rng(0)
            T, H, E, K = 256, 2048, 32, 8
            x = rng.standard_normal((T, H), dtype=np.float32).astype(ml_dtypes.bfloat16)
            rm = np.argsort(rng.random((T, E)), axis=1)[:, :K].astype(np.int32)
            p = rng.random((T, K), dtype=np.float32)
            counts = np.bincount(rm.ravel(), minlength=E).tolist()
            rows, rowmap, rp, _ = moe_permute(x, None, rm, p, E, counts, 16)
            calls = {
                "permute": lambda: moe_permute(x, None, rm, p, E, counts, 16),
                "unpermute": lambda: moe_unpermute(rows, rowmap, rm, rp, T, E,
                                                   using_weighted_combine=True),
            }
            for name, call in calls.items():
                times = {1: [], None: []}
                end = time.monotonic() + 3
                while time.monotonic() < end:
                    for n in (1, None):  # interleaved: both see the same background
                        moe_cpu.set_num_threads(n)
                        start = time.perf_counter()
                        call()
                        times[n].append(time.perf_counter() - start)
                ratio = statistics.median(times[None]) / statistics.median(times[1])
                print(name, f"{ratio:.2f}", len(times[1]))
            print("narrowed calls", moe_cpu._parallel._narrowed_calls())
        finally:
            hog.kill()
            hog.wait()
        """
    )
    assert_survived(done, "narrowed calls")
    lines = dict(line.rsplit(" ", 2)[0:2] for line in done.stdout.splitlines()[:2])
    for name, ratio in lines.items():
        assert float(ratio) <= 1.5, f"{name}: {ratio}x one thread's time\n{done.stdout}"


# ----------------------------------------------------------- 2: inputs rewritten during a call


@second_pass(2)
def test_routing_map_rewritten_during_call_never_crashes():
    """A thread flips ids between 0 and 2**40 while the other permutes without validation.

    The outputs are garbage, but no access may leave the arrays.
    """
    done = run_python(
        """
        import threading, time
        import numpy as np
        from moe_numba import moe_permute
        T, K, E = 4096, 4, 8
        rng = np.random.default_rng(0)
        routemap = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int64)
        x = np.ones((T, 16), np.float32)
        p = np.ones((T, K), np.float32)
        stop = False

        def flip():
            column = routemap[:, 0]
            while not stop:
                column[:] = 2**40
                column[:] = 0

        threading.Thread(target=flip, daemon=True).start()
        end = time.monotonic() + 4
        while time.monotonic() < end:
            moe_permute(x, None, routemap, p, E, None, 1, override_buffer_size=T * K,
                        validate=False)
        stop = True
        print("survived")
        """
    )
    assert_survived(done, "survived")


# ----------------------------------------------------------------- 4: None for a required array

REQUIRED_ARRAYS = [
    ("moe_permute", "hidden_states"),
    ("moe_permute", "expert_routemap_topk"),
    ("moe_permute", "expert_prob_topk"),
    ("moe_unpermute", "hidden_states_unzipped"),
    ("moe_unpermute", "zipped_expertwise_rowmap"),
    ("moe_unpermute", "expert_routemap_topk"),
    ("moe_unpermute", "token_prob_unzipped"),
]


@second_pass(4)
@pytest.mark.parametrize("op,name", REQUIRED_ARRAYS)
def test_none_for_required_array(op, name):
    """A TypeError naming the argument, raised before numba is imported."""
    done = run_python(
        f"""
        import json, sys
        import numpy as np
        from moe_numba import moe_permute, moe_unpermute
        x = np.ones((4, 8), np.float32)
        routemap = np.array([[0, 1], [1, 2], [2, 3], [3, 0]], np.int32)
        probs = np.full((4, 2), 0.5, np.float32)
        rows, rowmap, row_probs, _ = moe_permute(x, None, routemap, probs, 4, [2, 2, 2, 2], 1)
        if "{op}" == "moe_permute":
            call = moe_permute
            args = dict(hidden_states=x, scale=None, expert_routemap_topk=routemap,
                        expert_prob_topk=probs, num_experts=4, tokens_per_expert=[2, 2, 2, 2],
                        padding_alignment=1)
        else:
            call = moe_unpermute
            args = dict(hidden_states_unzipped=rows, zipped_expertwise_rowmap=rowmap,
                        expert_routemap_topk=routemap, token_prob_unzipped=row_probs,
                        total_zipped_tokens=4, num_experts=4)
        args["{name}"] = None
        try:
            call(**args)
            error = ("no error", "")
        except Exception as e:
            error = (type(e).__name__, str(e))
        print(json.dumps([*error, "numba" in sys.modules]))
        """
    )
    assert_survived(done, "[")
    kind, message, numba_imported = json.loads(done.stdout.splitlines()[-1])
    assert kind == "TypeError", f"{kind}: {message}"
    assert re.search(rf"\b{name}\b", message), message
    assert not numba_imported, "a host call with None imported numba"


# --------------------------------------------------------------- 5: row counts that overflow


@second_pass(5)
def test_padding_overflow_refused():
    """4 experts padded to 2**62 + 1 rows each need more than 2**63 rows (it wrapped to 4)."""
    with pytest.raises(ValueError, match="padding_alignment"):
        moe_permute(**permute_args(padding_alignment=2**62 + 1))


@second_pass(5)
def test_capacity_sum_overflow_refused():
    """Capacities summing to 2**64 gave R = 0 without validation."""
    with pytest.raises(ValueError, match="tokens_per_expert"):
        moe_permute(**permute_args(tokens_per_expert=[2**62] * 4), validate=False)


# H = 2**16: the current code's allocation fails at once instead of filling memory
WIDE = np.ones((4, 1 << 16), np.float32)


@second_pass(5)
def test_rows_past_int32_refused_capacities():
    """R = 2**31 rows cannot be addressed by the int32 row map."""
    with pytest.raises(ValueError, match=r"tokens_per_expert.*2\*\*31|2\*\*31.*tokens_per_expert"):
        moe_permute(
            **permute_args(hidden_states=WIDE, tokens_per_expert=[2**29] * 4), validate=False
        )


@second_pass(5)
def test_rows_past_int32_refused_override():
    with pytest.raises(ValueError, match=r"override_buffer_size.*2\*\*31|2\*\*31.*override_buffer"):
        moe_permute(
            **permute_args(hidden_states=WIDE, tokens_per_expert=None, override_buffer_size=2**31)
        )


# ----------------------------------------------------------------- 6: odd tokens_per_expert


@second_pass(6)
def test_tokens_per_expert_of_0d_arrays_accepted():
    plain = moe_permute(**permute_args())
    odd = moe_permute(**permute_args(tokens_per_expert=[np.array(2)] * 4))
    for a, b in zip(plain, odd, strict=True):
        np.testing.assert_array_equal(a, b)


@second_pass(6)
def test_tokens_per_expert_nested_list_refused():
    with pytest.raises(TypeError, match="tokens_per_expert"):
        moe_permute(**permute_args(tokens_per_expert=[[2], [2], [2], [2]]))


# ------------------------------------------------------------------------ 7: huge scalars

HUGE_SCALARS = [
    ("padding_alignment", dict(padding_alignment=2**63), "9223372036854775808"),
    (
        "override_buffer_size",
        dict(tokens_per_expert=None, override_buffer_size=2**63),
        "9223372036854775808",
    ),
    (
        "num_experts",
        dict(num_experts=2**64, tokens_per_expert=None, override_buffer_size=16),
        "18446744073709551616",
    ),
    (
        "tokens_per_expert",
        dict(tokens_per_expert=np.full(4, 2**63, np.uint64)),
        "9223372036854775808",
    ),
    (
        "tokens_per_expert",
        dict(tokens_per_expert=np.full(4, 2**64 - 1, np.uint64)),
        "18446744073709551615",
    ),
]


@second_pass(7)
@pytest.mark.parametrize(
    "name,changes,value", HUGE_SCALARS, ids=[f"{n}={v}" for n, _, v in HUGE_SCALARS]
)
def test_huge_scalar_named_with_its_value(name, changes, value):
    with pytest.raises((TypeError, ValueError), match=rf"{name}.*{value}") as raised:
        moe_permute(**permute_args(**changes), validate=False)
    assert not isinstance(raised.value, OverflowError)


TOO_LARGE_FOR_MEMORY = [
    ("tokens_per_expert", dict(hidden_states=WIDE, tokens_per_expert=[2**28] * 4)),
    (
        "override_buffer_size",
        dict(hidden_states=WIDE, tokens_per_expert=None, override_buffer_size=2**30),
    ),
    ("num_experts", dict(num_experts=2**40, tokens_per_expert=None, override_buffer_size=16)),
]


@second_pass(7)
@pytest.mark.parametrize(
    "name,changes", TOO_LARGE_FOR_MEMORY, ids=[n for n, _ in TOO_LARGE_FOR_MEMORY]
)
def test_memory_error_names_the_argument(name, changes):
    with pytest.raises(MemoryError, match=name):
        moe_permute(**permute_args(**changes), validate=False)


# ------------------------------------------- 8: a device array as tokens_per_expert (simulator)


@second_pass(8)
@pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="checks the CUDA simulator's arrays"
)
def test_simulator_device_tokens_per_expert_refused():
    """As on a real GPU: counts on the device are refused, never copied to the host."""
    from numba import cuda

    args = {
        k: cuda.to_device(v) if isinstance(v, np.ndarray) else v for k, v in permute_args().items()
    }
    args["tokens_per_expert"] = cuda.to_device(np.array([2, 2, 2, 2], np.int64))
    with pytest.raises(TypeError, match=r"tokens_per_expert must be a host sequence"):
        moe_permute(**args)


def test_permute_args_are_valid():
    """The base case of the tests above is a valid call (so each refusal is the change's)."""
    want, _ = _oracle.permute(**permute_args())
    for got, expected in zip(moe_permute(**permute_args()), want, strict=True):
        np.testing.assert_array_equal(got, expected)
