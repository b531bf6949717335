"""A call survives its environment and its caller (docs/contract.rst, issue 18).

Misuse as a hostile user would try it: fork after use, huge thread counts, busy processors,
an input rewritten while a call runs (the odd arguments are in test_reliability_arguments.py).
Whatever can kill or hang the interpreter runs in a child process with a time bound, so that a
regression fails one test instead of the whole suite.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import moe_cpu
from moe_numba import moe_permute, moe_unpermute, oracle

CHILD_TIMEOUT_S = 120


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


# ------------------------------------------------------------------------ 1: fork after use


def _check_against_oracle(num_experts=4):
    """Permute and unpermute a small case; compare every output with the oracle, bit for bit."""
    hidden_states, routemap, probs, counts = small_case(num_experts=num_experts)
    got = moe_permute(hidden_states, None, routemap, probs, num_experts, counts, 4)
    want, _ = oracle.permute(hidden_states, None, routemap, probs, num_experts, counts, 4)
    for g, w in zip(got[:3], want[:3], strict=True):
        np.testing.assert_array_equal(g, w)
    rows, rowmap, row_probs = got[:3]
    got = moe_unpermute(rows, rowmap, routemap, row_probs, len(routemap), num_experts)
    want, _ = oracle.unpermute(rows, rowmap, routemap, row_probs, len(routemap), num_experts)
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

# A thread rewrites an input as fast as it can while the other calls without validation, for
# a few seconds: the outputs are garbage, but no access may leave the arrays (the backend
# reads an id, checks it, and must index with what it checked).
RACE_SETUP = """
import threading, time
import numpy as np
from moe_numba import moe_permute, moe_unpermute
T, K, E = 4096, 4, 8
rng = np.random.default_rng(0)
routemap = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.{dtype})
x = np.ones((T, 16), np.float32)
p = np.ones((T, K), np.float32)
rows, rowmap, row_probs, _ = moe_permute(x, None, routemap, p, E, None, 1,
                                         override_buffer_size=T * K)
stop = False

def flip(column, far):
    good = column.copy()
    while not stop:
        column[:] = far
        column[:] = good

def race(target, far, call):
    global stop
    threading.Thread(target=flip, args=(target, far), daemon=True).start()
    end = time.monotonic() + 3
    while time.monotonic() < end:
        call()
    stop = True
    print("survived")
"""

PERMUTE_CALL = (
    "lambda: moe_permute(x, None, routemap, p, E, None, 1, override_buffer_size=T * K, "
    "validate=False)"
)
UNPERMUTE_CALL = (
    "lambda: moe_unpermute(rows, rowmap, routemap, row_probs, T, E, "
    "using_weighted_combine=True, validate=False)"
)
RACES = {
    # (routing map dtype, the array rewritten, the values written, the call)
    "permute-int64-ids": ("int64", "routemap[:, 0]", "2**40", PERMUTE_CALL),
    "permute-int32-ids": ("int32", "routemap[:, 0]", "-2**30", PERMUTE_CALL),
    "unpermute-rows": ("int32", "rowmap[:, 1]", "2**30", UNPERMUTE_CALL),
    "unpermute-ids": ("int64", "routemap[:, 1]", "2**40", UNPERMUTE_CALL),
}


@pytest.mark.parametrize("race", RACES.values(), ids=RACES.keys())
def test_input_rewritten_during_call_never_crashes(race):
    dtype, target, far, call = race
    done = run_python(RACE_SETUP.format(dtype=dtype) + f"race({target}, {far}, {call})\n")
    assert_survived(done, "survived")
