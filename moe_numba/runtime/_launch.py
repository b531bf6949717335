"""The raw launcher: numba compiles, the driver (:mod:`._driver`, or ``cuda.core``) launches.

numba's dispatcher spends far more host time on a launch (argument typing, DLPack exports, a
context lookup) than the small kernels of a call take on the GPU; a kernel compiled for an
explicit signature of ``CPointer``s and int64 scalars and launched with ``cuda.core.launch``
costs a fraction of that (docs/lab-notes.rst). So every kernel of this package is

- a lazy ``@cuda.jit`` dispatcher (nothing compiles at import), declared by a
  :class:`moe_numba.kernels._family.KernelFamily`,
- compiled once per explicit signature on first use (``dispatcher.compile(sig)``), its
  ``cuda.core`` kernel object cached per device,
- launched with raw device addresses (Python ints) on the caller's stream, through
  ``cuLaunchKernelEx`` (:mod:`._driver`: packed and called from C by :mod:`._driver_c`
  where that extension is built, else with ctypes), or through ``cuda.core.launch`` where
  libcuda cannot be opened that way. A call's launches, planned once per call key as a
  :class:`._sequence.LaunchSequence`, go to the driver in one call from Python
  (:meth:`Launcher.sequence`).

Under the CUDA simulator the same dispatcher is called the normal way with the NumPy arrays
that back the simulated buffers (``DeviceBuffer.kernel_arg``); the simulator ignores the
signature.

``kernel.compile(sig)`` relies on numba-cuda internals (``_Kernel.library.get_cufunc()
.kernel``, present since 0.23); the package pins numba-cuda to 0.30.x.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .._errors import INSTALL_GPU_EXTRA, MISSING_TOOLKIT_ERRORS, GPUUnavailableError
from ._driver import launch_dims
from ._runtime import RUNTIME
from ._sim import SIM

if not SIM:
    from cuda.bindings import driver as _driver
    from cuda.core import LaunchConfig, Stream, launch


def optional_arg(buf, dtype):
    """The argument for a pointer parameter of element type ``dtype`` whose buffer may be
    absent: ``buf.kernel_arg(dtype)``, or for None a null pointer (in the simulator, a small
    dummy array)."""
    if buf is None:
        return np.zeros(2, dtype) if SIM else 0
    return buf.kernel_arg(dtype)


class RawKernel:
    """One kernel body compiled for one explicit signature."""

    __slots__ = ("dispatcher", "name", "signature", "_by_device", "_handles")

    def __init__(self, dispatcher, signature, name=None):
        self.dispatcher = dispatcher
        self.signature = signature
        self.name = name or getattr(dispatcher, "__name__", "kernel")
        self._by_device = {}
        self._handles = {}

    def handle(self, device_id):
        """The kernel's driver handle (``CUkernel``) for ``device_id``, as an int."""
        handle = self._handles.get(device_id)
        if handle is None:
            handle = self._handles[device_id] = int(self.cu_kernel(device_id).handle)
        return handle

    @property
    def py_func(self):
        return self.dispatcher.py_func

    def cu_kernel(self, device_id):
        """The ``cuda.core`` kernel for ``device_id`` (compiled and loaded on first use)."""
        kernel = self._by_device.get(device_id)
        if kernel is None:
            try:
                compiled = self.dispatcher.compile(self.signature)
            except Exception as error:
                if type(error).__name__ not in MISSING_TOOLKIT_ERRORS:
                    raise
                raise GPUUnavailableError(
                    f"cannot compile the GPU kernel {self.name}: {error}; " + INSTALL_GPU_EXTRA
                ) from error
            kernel = compiled.library.get_cufunc().kernel
            expected = len(self.signature.args)
            if kernel.num_arguments != expected:  # cuda.core does not check argument counts
                raise RuntimeError(
                    f"{self.name}: compiled kernel takes {kernel.num_arguments} parameters, "
                    f"expected {expected}"
                )
            self._by_device[device_id] = kernel
        return kernel


def current_device():
    """The device of the calling thread's current context; device 0's primary context
    (numba's) is made current where the thread has none."""
    driver = RUNTIME.driver
    device = None if driver is None else driver.current_device()
    if device is not None:
        return device
    success = _driver.CUresult.CUDA_SUCCESS
    err, device = _driver.cuCtxGetDevice()
    if err != success:
        cuda.current_context()  # no current context: numba makes device 0's primary current
        err, device = _driver.cuCtxGetDevice()
        if err != success:
            raise RuntimeError(f"no current CUDA context ({err})")
    return int(device)


def _griddep_capable(device):
    """Whether ``device`` runs programmatic dependent launches (compute capability >= 9.0)
    and the launch path can ask for them (the driver's can; older ``cuda.core`` releases
    cannot)."""
    capable = RUNTIME.griddep.get(device)
    if capable is None:
        driver = RUNTIME.driver
        if driver is not None:
            capable = driver.capability_major(device) >= 9
        else:
            attribute = _driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
            err, major = _driver.cuDeviceGetAttribute(attribute, _driver.CUdevice(device))
            capable = err == _driver.CUresult.CUDA_SUCCESS and major >= 9
            if capable:
                try:
                    LaunchConfig(grid=1, block=32, programmatic_stream_serialization=True)
                except TypeError:
                    capable = False
        RUNTIME.griddep[device] = capable
    return capable


class Launcher:
    """Launches kernels on one stream of the current device (one per library call).

    ``stream`` is a ``CUstream`` handle as an int (0: the legacy default stream).
    """

    __slots__ = ("device", "handle", "overlap", "stream")

    def __init__(self, stream):
        if SIM:
            self.device = self.handle = self.stream = None
            self.overlap = False
            return
        self.device = current_device()
        self.handle = int(stream)
        self.overlap = _griddep_capable(self.device)
        self.stream = None  # its cuda.core Stream, made when a launch needs it

    def __call__(self, kernel, grid, block, args, shmem=0, dependent=False):
        """Launch ``kernel`` (a :class:`RawKernel`) with ``args`` (ints or simulator arrays).

        ``dependent=True``: ``kernel`` calls :func:`._intrinsics.griddep_wait` before it
        touches anything the kernel ahead of it in the stream reads or writes (whoever
        launched that one), or only touches what that kernel does not; on sm_90 and newer it
        is then launched as a programmatic dependent, which may start before the kernel
        ahead ends.
        """
        if SIM:
            kernel.dispatcher[grid, block, 0, shmem](*args)
            return
        overlap = dependent and self.overlap
        driver = RUNTIME.driver
        if driver is not None:
            config = driver.config(grid, block, shmem, self.handle, overlap)
            driver(kernel.handle(self.device), config[1], args, kernel.name)
            return
        key = (grid, block, shmem, overlap)
        configs = RUNTIME.configs
        launch_config = configs.get(key)
        if launch_config is None:
            options = {"programmatic_stream_serialization": True} if overlap else {}
            launch_config = configs.put(
                key, LaunchConfig(grid=grid, block=block, shmem_size=shmem, **options)
            )
        if self.stream is None:
            key = (self.device, self.handle)
            streams = RUNTIME.streams
            stream = streams.get(key)
            if stream is None:
                stream = streams[key] = Stream.from_handle(self.handle)
            self.stream = stream
        launch(self.stream, launch_config, kernel.cu_kernel(self.device), *args)

    def sequence(self, sequence, values, start, stop):
        """Launch steps ``start`` to ``stop - 1`` of ``sequence`` (a
        :class:`._sequence.LaunchSequence`) with the call's ``values``, each as a programmatic
        dependent where the device allows (see :meth:`__call__`): through the C launcher in
        one call where it is built, else one launch at a time."""
        self.run(sequence, values, None, 0, start, stop)

    def run(self, sequence, values, status=None, final=0, start=0, stop=None):
        """Launch every step of ``sequence`` (from ``start`` up to ``stop``; default: all)
        with the call's ``values`` (a tuple in slot order), as :meth:`sequence` does; with
        ``status`` (the call's :class:`._status.StatusWords`), mark its words written right
        after the first ``final`` steps, the ones that finish them. The call's kernels go
        from the planner to the C launcher through this one Python frame."""
        stop = len(sequence.steps) if stop is None else stop
        driver = None if SIM else RUNTIME.driver
        if driver is None or driver.c is None:
            for i in range(start, stop):
                if status is not None and i == final:
                    status.written()
                step = sequence.steps[i]
                args = sequence.args(i, values)
                self(step.kernel, step.grid, step.block, args, step.shmem, dependent=True)
            if status is not None and final >= stop:
                status.written()
            return
        key = (self.device, self.overlap)
        bound = sequence.bound(key, lambda: _bind(driver, sequence, *key))
        if status is None:
            failed = bound.run(self.handle, values, start, stop)
        else:
            failed = bound.run(self.handle, values, start, final)
            if failed is None:
                status.written()
                failed = bound.run(self.handle, values, final, stop)
        if failed is not None:
            step, err = failed
            raise driver.error(err, sequence.steps[step].kernel.name)


def launcher_for(stream):
    """The :class:`Launcher` of a call on ``stream`` (a ``CUstream`` handle), or ``stream``
    itself where it is a launcher that records (:class:`._recording.RecordingLauncher`)."""
    return stream if getattr(stream, "records", False) else Launcher(stream)


def c_step(step, device, overlap, template, slots):
    """A :class:`._sequence.Step` as a step of the C launcher's ``LaunchSequence``, with its
    kernel's handle on ``device`` and its words ``template`` and ``slots``."""
    grid, block = launch_dims(step.grid), launch_dims(step.block)
    handle = step.kernel.handle(device)
    return (handle, grid, block, step.shmem, overlap, list(template), list(slots))


def _bind(driver, sequence, device, overlap):
    """``sequence`` as the C launcher's of ``driver``, with the kernels' handles on
    ``device``."""
    steps = [
        c_step(step, device, overlap, *sequence.words(i)) for i, step in enumerate(sequence.steps)
    ]
    return driver.c.LaunchSequence(driver.address, steps)
