"""The driver launch path (moe_numba/runtime/_driver.py, and its C half _driver_c) against a
stand-in libcuda, swapped in through the runtime's seam (``get_runtime().use_driver``): the
structures' layout is cuda.h's, and a launch hands the driver the kernel, the geometry, the
stream, the dependence attribute and the arguments as packed int64 words, whether ctypes or
C packs and calls; a launch sequence (_sequence.py) fills each kernel's template with the
call's values.

The real driver runs it on a GPU (every kernel launch of the GPU tests goes through it).
"""

import ctypes

import pytest

from moe_numba.kernels import permute
from moe_numba.runtime import _driver, _driver_c, get_runtime

# how the launcher packs and calls: ctypes, or the C extension (built with the package)
_PACKERS = pytest.mark.parametrize("c", [False, True], ids=["ctypes", "c"])


def test_c_structures_have_the_layout_of_cuda_h():
    layout = _driver_c.layout()
    assert layout["config"] == (56, 32, 40, 48)
    assert layout["attribute"] == (72, 8)


def test_structures_have_the_layout_of_cuda_h():
    # CUlaunchConfig: 7 unsigned ints, then the stream, the attributes, their count
    assert ctypes.sizeof(_driver._LaunchConfig) == 56
    assert _driver._LaunchConfig.hStream.offset == 32
    assert _driver._LaunchConfig.attrs.offset == 40
    assert _driver._LaunchConfig.numAttrs.offset == 48
    # CUlaunchAttribute: the id padded to 8 bytes, then a 64-byte union
    assert ctypes.sizeof(_driver._LaunchAttribute) == 72
    assert _driver._LaunchAttribute.val.offset == 8


class _FakeCuda:
    """cuLaunchKernelEx, cuGetErrorString, cuCtxGetDevice, cuDeviceGetAttribute (the compute
    capability's major: ``major``), cuEventQuery and cuEventRecord as C callbacks that
    record."""

    def __init__(self, result=0, device=3, major=9):
        self.launches = []
        self.events = []
        self.attributes = []
        config_p = ctypes.POINTER(_driver._LaunchConfig)
        launch_type = ctypes.CFUNCTYPE(
            ctypes.c_int, config_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
        )
        error_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
        device_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))
        self._message = ctypes.c_char_p(b"an invalid argument")

        def launch(config, function, params, extra):
            c = config.contents
            words = ctypes.cast(extra, ctypes.POINTER(ctypes.c_void_p))
            assert (words[0], words[2], words[4] or 0) == (1, 2, 0)
            size = ctypes.cast(words[3], ctypes.POINTER(ctypes.c_size_t))[0]
            args = ctypes.cast(words[1], ctypes.POINTER(ctypes.c_int64))[: size // 8]
            attrs = [(c.attrs[i].id, c.attrs[i].val.value) for i in range(c.numAttrs)]
            self.launches.append(
                dict(
                    function=function,
                    grid=(c.gridDimX, c.gridDimY, c.gridDimZ),
                    block=(c.blockDimX, c.blockDimY, c.blockDimZ),
                    shmem=c.sharedMemBytes,
                    stream=c.hStream or 0,
                    params=params,
                    attrs=attrs,
                    args=args,
                )
            )
            return result

        def error_string(err, out):
            out[0] = self._message.value
            return 0

        def get_device(out):
            out[0] = device
            return 0

        def attribute(out, which, ordinal):
            self.attributes.append((which, ordinal))
            out[0] = major
            return 0

        def event_query(event):
            self.events.append(("query", event))
            return 600 if event == 13 else 0  # (CUDA_ERROR_NOT_READY)

        def event_record(event, stream):
            self.events.append(("record", event, stream or 0))
            return result

        attribute_type = ctypes.CFUNCTYPE(
            ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int
        )
        query_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
        record_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
        # (kept referenced: ctypes does not keep callbacks alive)
        self.cuLaunchKernelEx = launch_type(launch)
        self.cuGetErrorString = error_type(error_string)
        self.cuCtxGetDevice = device_type(get_device)
        self.cuDeviceGetAttribute = attribute_type(attribute)
        self.cuEventQuery = query_type(event_query)
        self.cuEventRecord = record_type(event_record)


def _driver_of(fake, c=False):
    """The runtime while ``fake`` stands in for libcuda (``c``: whether the C extension
    packs and calls); its driver is the launcher over ``fake``."""
    return get_runtime().use_driver(fake, c_launch=c)


@_PACKERS
def test_a_launch_hands_the_driver_its_words(c):
    fake = _FakeCuda()
    args = (0x7F00_0000_1000, -1, 0, 2**40, 7)
    with _driver_of(fake, c) as runtime:
        launch = runtime.driver
        launch(0x1234, launch.config((5, 2), 128, 64, 0xBEEF, True)[1], args)
        launch(0x1234, launch.config(9, 32, 0, 0, False)[1], args[:2])
        assert launch.current_device() == 3
        assert launch.capability_major(3) == 9
    first, second = fake.launches
    assert first["function"] == 0x1234 and first["params"] is None
    assert (first["grid"], first["block"], first["shmem"]) == ((5, 2, 1), (128, 1, 1), 64)
    assert first["stream"] == 0xBEEF
    assert first["attrs"] == [(6, 1)]  # programmatic stream serialization, on
    assert first["args"] == list(args)
    assert (second["grid"], second["attrs"], second["args"]) == ((9, 1, 1), [], list(args[:2]))
    assert fake.attributes == [(75, 3)]  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR


def test_the_capability_attribute_is_cuda_hs():
    driver = pytest.importorskip("cuda.bindings.driver")
    attribute = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    fake = _FakeCuda()
    with _driver_of(fake) as runtime:
        runtime.driver.capability_major(0)
    assert fake.attributes == [(int(attribute), 0)]


def test_configurations_are_built_once_per_geometry_and_stream_until_a_reset():
    with _driver_of(_FakeCuda()) as runtime:
        launch = runtime.driver
        a = launch.config(4, 32, 0, 1, True)
        assert launch.config(4, 32, 0, 1, True) is a
        assert launch.config(4, 32, 0, 2, True)[1] != a[1]
        assert launch.config(4, 32, 0, 1, False)[1] != a[1]
        runtime.reset()
        assert launch.config(4, 32, 0, 1, True) is not a


@_PACKERS
def test_a_driver_error_is_raised_with_its_text(c):
    with _driver_of(_FakeCuda(result=1), c) as runtime:
        launch = runtime.driver
        with pytest.raises(RuntimeError, match=r"CUDA error 1 \(an invalid argument\)"):
            launch(1, launch.config(1, 32, 0, 0, False)[1], (1, 2))


@_PACKERS
def test_too_many_parameters_are_refused(c):
    with _driver_of(_FakeCuda(), c) as runtime:
        launch = runtime.driver
        with pytest.raises(ValueError, match="at most 64 parameters; got 65"):
            launch(1, launch.config(1, 32, 0, 0, False)[1], (0,) * 65)


def _launcher_module():
    from moe_numba.runtime import _launch

    if _launch.SIM:
        pytest.skip("the simulator calls kernels directly")
    return _launch


@pytest.mark.parametrize("major", [9, 8])
def test_the_launcher_passes_kernel_geometry_stream_and_dependence(major):
    """``_launch.Launcher`` on the driver path: the kernel's handle for the current device,
    a configuration with the call's stream, the dependence where the device has it
    (compute capability 9 and newer)."""
    _launch = _launcher_module()
    fake = _FakeCuda(device=2, major=major)

    class Kernel:
        name = "k"

        def handle(self, device):
            return 0x5000 + device

    with _driver_of(fake):
        launch = _launch.Launcher(0xABC)
        assert (launch.device, launch.handle, launch.overlap) == (2, 0xABC, major >= 9)
        launch(Kernel(), (3, 4), 64, (11, 12, 13), shmem=128, dependent=True)
        launch(Kernel(), 1, 32, (14,))
        _launch.Launcher(0xABC)  # (the device's capability is asked once)
    first, second = fake.launches
    assert first["function"] == 0x5002 and first["stream"] == 0xABC
    assert (first["grid"], first["block"], first["shmem"]) == ((3, 4, 1), (64, 1, 1), 128)
    assert first["attrs"] == ([(6, 1)] if major >= 9 else []) and first["args"] == [11, 12, 13]
    assert second["attrs"] == [] and second["args"] == [14]  # not dependent: no attribute
    assert fake.attributes == [(75, 2)]


class _Family:
    """A stand-in kernel family: its name and parameter names."""

    def __init__(self, name, names):
        self.name, self.names = name, names


class _Kernel:
    def __init__(self, name):
        self.name = name

    def handle(self, device):
        return 0x5000 + device


def _sequence():
    from moe_numba.runtime._sequence import LaunchSequence, Step

    steps = [
        Step(_Kernel("a"), _Family("a", ("x", "n", "y")), (3, 2), 64),
        Step(_Kernel("b"), _Family("b", ("m", "y")), 5, 128, shmem=16),
    ]
    return LaunchSequence(steps, {"n": 7, "m": -3}, ("x", "y"))


@_PACKERS
@pytest.mark.parametrize("overlap", [True, False])
def test_a_sequence_fills_each_template_with_the_call_values(c, overlap):
    _launch = _launcher_module()
    fake = _FakeCuda(device=1, major=9 if overlap else 7)
    sequence = _sequence()
    values = (2**40 + 8, 2**45)
    with _driver_of(fake, c):
        _launch.Launcher(0xD00).run(sequence, values)
        _launch.Launcher(0xE00).sequence(sequence, (1, 2), 1, 2)  # the second step only
    first, second, third = fake.launches
    attrs = [(6, 1)] if overlap else []
    assert (first["function"], first["stream"], first["args"]) == (
        0x5001,
        0xD00,
        [2**40 + 8, 7, 2**45],
    )
    assert (first["grid"], first["block"], first["shmem"], first["attrs"]) == (
        (3, 2, 1),
        (64, 1, 1),
        0,
        attrs,
    )
    assert (second["args"], second["grid"], second["block"], second["shmem"]) == (
        [-3, 2**45],
        (5, 1, 1),
        (128, 1, 1),
        16,
    )
    assert (third["stream"], third["args"]) == (0xE00, [-3, 2])


@_PACKERS
def test_a_failed_launch_in_a_sequence_names_its_kernel_and_stops_it(c):
    _launch = _launcher_module()
    fake = _FakeCuda(result=1)
    with (
        _driver_of(fake, c),
        pytest.raises(RuntimeError, match=r"failed \(a\): CUDA error 1 \(an invalid argument\)"),
    ):
        _launch.Launcher(0).run(_sequence(), (1, 2))
    assert len(fake.launches) == 1  # b was not launched


class _Status:
    """A stand-in for a call's status words: when they were marked written."""

    def __init__(self, fake):
        self.fake, self.after = fake, None

    def written(self):
        self.after = len(self.fake.launches)


@_PACKERS
@pytest.mark.parametrize("final", [0, 1, 2])
def test_a_run_marks_the_status_words_written_after_the_steps_that_finish_them(c, final):
    """The launches of a call go from its planner to the launcher in one call, which marks
    the status words written right after the first ``final`` steps (those that compute
    them) and launches the rest after."""
    _launch = _launcher_module()
    fake = _FakeCuda()
    status = _Status(fake)
    with _driver_of(fake, c):
        _launch.Launcher(0).run(_sequence(), (1, 2), status, final)
    assert len(fake.launches) == 2 and status.after == final


def test_the_driver_swap_sets_the_runtimes_state_aside_and_brings_it_back():
    """Inside ``use_driver`` the runtime holds nothing of the driver before (its state comes
    back after the block), and the library's caches are cleared on the way in and out."""
    runtime = get_runtime()
    before = runtime.driver
    runtime.griddep[-7] = True  # (a device no call asks about)
    plans = permute.LAUNCH_PLANS
    plans.put("key", "plan")
    with runtime.use_driver(_FakeCuda()) as inside:
        assert inside is runtime and runtime.driver is not before
        assert -7 not in runtime.griddep and len(plans) == 0
        runtime.griddep[-8] = False
        plans.put("key", "plan")
    assert runtime.driver is before and runtime.griddep.get(-7) is True
    assert -8 not in runtime.griddep and len(plans) == 0
    del runtime.griddep[-7]


def test_no_driver_launches_through_cuda_core():
    with get_runtime().use_driver(None) as runtime:
        assert runtime.driver is None


@pytest.mark.parametrize("c_launch", [1, "yes"])
def test_a_c_launch_that_is_no_bool_is_refused(c_launch):
    with (
        pytest.raises(TypeError, match=f"c_launch must be a bool or None; got {c_launch!r}"),
        get_runtime().use_driver(_FakeCuda(), c_launch=c_launch),
    ):
        pass


def test_a_sequence_refuses_a_parameter_neither_given_nor_planned():
    from moe_numba.runtime._sequence import LaunchSequence, Step

    step = Step(_Kernel("k"), _Family("k", ("x", "z")), 1, 32)
    with pytest.raises(TypeError, match=r"k takes \['z'\]: neither given nor planned"):
        LaunchSequence([step], {}, ("x",))


def test_a_c_sequence_refuses_values_it_lacks():
    sequence = _driver_c.LaunchSequence(0, [(1, (1, 1, 1), (32, 1, 1), 0, False, [0, 5], [0, -1])])
    with pytest.raises(IndexError, match="step 0 takes value 0; 0 given"):
        sequence.run(0, (), 0, 1)
    with pytest.raises(IndexError, match="steps 0..2 of a sequence of 1"):
        sequence.run(0, (1,), 0, 2)


def test_the_staging_helpers_call_the_driver_with_the_event_and_stream():
    cuda = _FakeCuda(result=0)
    launcher = _driver.DriverLauncher(cuda, _driver_c)
    query, record = launcher.event_query_address, launcher.event_record_address
    assert _driver_c.event_query(query, 12) == 0 and _driver_c.event_query(query, 13) == 600
    assert _driver_c.event_record(record, 12, 77) == 0
    assert cuda.events == [("query", 12), ("query", 13), ("record", 12, 77)]


def test_staged_words_are_written_as_int64():
    words = (ctypes.c_int64 * 4)()
    _driver_c.write_words(ctypes.addressof(words), (0, 7, 2**63 - 1))
    assert list(words) == [0, 7, 2**63 - 1, 0]


@pytest.mark.parametrize("alignment", [1, 3, 128, 2**40])
def test_a_replays_row_count_is_the_checked_paths(alignment):
    """The row count that a staged replay's key takes (C, on the tuple of the call's
    capacities) is the plain capacities' (Python), where both find them allowed and at most
    MAX_ROWS; both refuse the same others (the full path then raises its errors)."""
    import random

    from moe_numba import _capacities
    from moe_numba._contract import MAX_ROWS

    rng = random.Random(alignment)
    values = [0, 1, 5, 100, 2**28, 2**62, 2**63 - 1, 2**63, -1, True, 1.0]
    for _ in range(2000):
        n = rng.randint(1, 6)
        counts = [rng.choice(values) for _ in range(n)]
        E = rng.choice([n, n, n + 1])
        plain = _capacities._plain_capacities(counts, E, alignment)
        expected = -1 if plain is None or plain[1] > MAX_ROWS else plain[1]
        assert _driver_c.padded_rows(tuple(counts), E, alignment, MAX_ROWS) == expected
    assert _driver_c.padded_rows((1, 2), 2, 0, MAX_ROWS) == -1
