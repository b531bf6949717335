"""Kernel launches through the CUDA driver's C API, called with ctypes.

Every parameter of this package's kernels is 8 bytes (a ``CPointer`` or an int64,
:mod:`._family`), so a launch's arguments are one packed array of int64 words, handed to
``cuLaunchKernelEx`` as its ``extra`` buffer (``CU_LAUNCH_PARAM_BUFFER_POINTER``): one
``struct.pack_into`` and one foreign call, where ``cuda.core.launch`` converts and boxes every
argument on its own. A launch configuration (``CUlaunchConfig`` and its attribute) is built
once per grid, block, shared memory, stream and dependence, and kept in a bounded cache.

Where the package's C extension :mod:`._driver_c` is built, the packing and the call happen
in C (the driver's function found through the ctypes handle), and whole sequences of launches
(:mod:`._sequence`) run in one call from Python; ``MOE_NUMBA_C_LAUNCH=0`` turns that off.

:func:`driver_launcher` returns None where libcuda cannot be opened with ctypes (then
:mod:`._launch` uses ``cuda.core``).
"""

from __future__ import annotations

import ctypes
import struct
import threading

from .._cache import BoundedCache
from .._environment import switch

_CU_LAUNCH_PARAM_END = 0
_CU_LAUNCH_PARAM_BUFFER_POINTER = 1
_CU_LAUNCH_PARAM_BUFFER_SIZE = 2
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
_MOST_WORDS = 64  # the most parameters of a kernel (this package's have at most 30)


def c_launcher():
    """The C extension :mod:`._driver_c`, or None where it is not built or is turned off."""
    if not switch("MOE_NUMBA_C_LAUNCH", True):
        return None
    try:
        from . import _driver_c
    except ImportError:  # (a source tree run without building the extensions)
        return None
    return _driver_c


class _LaunchAttributeValue(ctypes.Union):
    # CUlaunchAttributeValue: a union of 64 bytes; the launches here set one int of it
    _fields_ = [("pad", ctypes.c_char * 64), ("value", ctypes.c_int)]


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: the id, padded to 8 bytes, then the value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("val", _LaunchAttributeValue)]


class _LaunchConfig(ctypes.Structure):
    # CUlaunchConfig
    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


def launch_dims(shape):
    """A grid or block (an int or up to 3 ints) as 3 ints."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return (*shape, 1, 1)[:3]


class _Words(threading.local):
    """A thread's argument buffer and, per parameter count, the ``extra`` array that points
    at it and at that count's size (the driver copies the arguments during the call, so
    each thread needs one buffer only)."""

    def __init__(self):
        self.buffer = (ctypes.c_int64 * _MOST_WORDS)()
        self._sizes = {}  # the size words the extra arrays point at (kept alive here)
        self._extras = {}
        self.extras = {}  # parameter count -> address of its extra array

    def extra(self, n):
        """The address of the ``extra`` array for ``n`` parameters (built on first use)."""
        size = self._sizes[n] = ctypes.c_size_t(8 * n)
        extra = self._extras[n] = (ctypes.c_void_p * 5)(
            _CU_LAUNCH_PARAM_BUFFER_POINTER,
            ctypes.addressof(self.buffer),
            _CU_LAUNCH_PARAM_BUFFER_SIZE,
            ctypes.addressof(size),
            _CU_LAUNCH_PARAM_END,
        )
        address = self.extras[n] = ctypes.addressof(extra)
        return address


class DriverLauncher:
    """``launch(function, config, args, name=None)``: one kernel launch.

    ``function`` is the kernel's ``CUfunction``/``CUkernel`` handle as an int, ``config`` the
    address from :meth:`config`, ``args`` the kernel's parameters as ints, ``name`` the
    kernel's name for an error. ``libcuda`` is the driver library opened with ctypes;
    ``c_launcher``, the :mod:`._driver_c` module or None, packs and calls in C instead
    (its sequences call the driver at :attr:`address`).
    """

    def __init__(self, libcuda, c_launcher=None):
        self._launch = libcuda.cuLaunchKernelEx
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.c_void_p] * 4
        self._error_string = libcuda.cuGetErrorString
        self._error_string.restype = ctypes.c_int
        self._error_string.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._get_device = libcuda.cuCtxGetDevice
        self._get_device.restype = ctypes.c_int
        self._get_device.argtypes = [ctypes.POINTER(ctypes.c_int)]
        self._attribute = libcuda.cuDeviceGetAttribute
        self._attribute.restype = ctypes.c_int
        self._attribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        self._configs = BoundedCache(4096)  # grids vary with the token count
        self._packs = {}  # parameter count -> struct.pack_into of that many int64 words
        self._words = _Words()
        self.c = c_launcher  # the C extension, or None
        self.address = ctypes.cast(self._launch, ctypes.c_void_p).value  # of cuLaunchKernelEx
        self.get_device_address = ctypes.cast(self._get_device, ctypes.c_void_p).value
        # (for the C helpers of staged replays, :mod:`._staged`)
        self.event_query_address = ctypes.cast(libcuda.cuEventQuery, ctypes.c_void_p).value
        self.event_record_address = ctypes.cast(libcuda.cuEventRecord, ctypes.c_void_p).value

    def current_device(self):
        """The device of the calling thread's current context, or None without one."""
        if self.c is not None:
            device = self.c.context_device(self.get_device_address)
            return None if device < 0 else device
        device = ctypes.c_int(0)
        if self._get_device(ctypes.byref(device)):
            return None
        return device.value

    def capability_major(self, device):
        """The major compute capability of ``device`` (an ordinal), or -1 where the driver
        does not give it."""
        value = ctypes.c_int(-1)
        if self._attribute(
            ctypes.byref(value), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device
        ):
            return -1
        return value.value

    def forget_configs(self):
        """Forget the launch configurations built so far (a launch holds its own)."""
        self._configs.clear()

    def config(self, grid, block, shmem, stream, dependent):
        """``(configuration, its address)``: the launch configuration, built once per argument
        set (hold the pair while launching with the address)."""
        key = (grid, block, shmem, stream, dependent)
        entry = self._configs.get(key)
        if entry is None:
            config = _LaunchConfig(*launch_dims(grid), *launch_dims(block), shmem, stream)
            if dependent:
                attribute = _LaunchAttribute()
                attribute.id = _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                attribute.val.value = 1
                config._attribute = attribute  # (kept alive with the config)
                config.attrs = ctypes.pointer(attribute)
                config.numAttrs = 1
            entry = self._configs.put(key, (config, ctypes.addressof(config)))
        return entry

    def __call__(self, function, config, args, name=None):
        if self.c is not None:
            err = self.c.launch(self.address, config, function, tuple(args))
        else:
            n = len(args)
            pack = self._packs.get(n)
            if pack is None:
                if n > _MOST_WORDS:
                    raise ValueError(f"a kernel takes at most {_MOST_WORDS} parameters; got {n}")
                pack = self._packs[n] = struct.Struct(f"{n}q").pack_into
            words = self._words
            pack(words.buffer, 0, *args)
            extra = words.extras.get(n) or words.extra(n)
            err = self._launch(config, function, None, extra)
        if err:
            raise self.error(err, name)

    def error(self, err, kernel=None):
        """The RuntimeError for the driver's result ``err`` of a launch (of ``kernel``, a
        name, when given)."""
        message = ctypes.c_char_p()
        self._error_string(err, ctypes.byref(message))
        text = message.value.decode() if message.value else "unknown error"
        of = f" ({kernel})" if kernel else ""
        return RuntimeError(f"cuLaunchKernelEx failed{of}: CUDA error {err} ({text})")


def driver_launcher():
    """A :class:`DriverLauncher` over this process's libcuda, or None if ctypes cannot open
    it (another platform's driver library, or a libcuda without ``cuLaunchKernelEx``)."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            libcuda = ctypes.CDLL(name)
            return DriverLauncher(libcuda, c_launcher())
        except (OSError, AttributeError):
            continue
    return None
