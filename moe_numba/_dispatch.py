"""Which backend runs a call, whether its arrays are given and can go there, and what its
checks depend on.

A call's arrays are either all host arrays (NumPy arrays or torch CPU tensors: CPU backend) or
all CUDA arrays of one library (GPU backend). Every object is looked at through
:func:`moe_numba._libraries.classify`, the one classifier, so an object passes :func:`locate`
exactly when an adapter serves it.
"""

from __future__ import annotations

import functools
import typing

from ._libraries import array_library, classify, refusal_hint, served_type


def _name_of(x):
    return f"{type(x).__module__}.{type(x).__name__}"


def _refusal(name, x):
    """The TypeError for an argument that no adapter serves."""
    return TypeError(
        f"{name} must be a NumPy array, a torch CPU tensor or a CUDA array (torch CUDA tensor, "
        "CuPy array, numba device array or other __cuda_array_interface__ object); got "
        f"{_name_of(x)}" + refusal_hint(name, x)
    )


def check_given(arrays):
    """Every array of ``arrays`` (an op's arrays NamedTuple) must be given unless its field
    is annotated ``... | None``: ``TypeError`` naming the first that is None."""
    optional = _optional_fields(type(arrays))
    for name, x in zip(arrays._fields, arrays, strict=True):
        if x is None and name not in optional:
            raise TypeError(
                f"{name} must be a NumPy array, a torch CPU tensor or a CUDA array; got None"
            )


@functools.cache
def _optional_fields(arrays_type):
    hints = typing.get_type_hints(arrays_type)
    return frozenset(
        name for name in arrays_type._fields if type(None) in typing.get_args(hints[name])
    )


def locate(arrays):
    """Decide the backend for a call from its named arrays.

    Parameters
    ----------
    arrays : dict of str to array or None
        The call's array arguments by name; ``None`` entries are skipped.

    Returns
    -------
    str
        ``"cpu"`` when every array is a host array (NumPy array, torch CPU tensor), ``"cuda"``
        when every array is a CUDA array.

    Raises
    ------
    TypeError
        For an object no array library of moe-numba serves, host and device arrays mixed in
        one call, a meta tensor beside a tensor that holds data (its outputs would never be
        written), or meta tensors alone (no backend runs them).
    """
    first = {}  # location -> name of its first argument
    for name, x in arrays.items():
        if x is None:
            continue
        adapter = classify(x)
        if adapter is None:
            raise _refusal(name, x)
        first.setdefault(adapter.location, name)
        if len(first) > 1:
            raise _mixed(arrays, first)
    location = next(iter(first), "cpu")
    if location == "meta":
        raise TypeError(
            f"{first['meta']} is a meta tensor, which holds no data: pass NumPy arrays, torch "
            "tensors on the CPU or CUDA arrays (the torch custom ops torch.ops.moe_numba.* "
            "give the shapes of meta tensors' outputs)"
        )
    return location


def _mixed(arrays, first):
    """The TypeError for arrays of two locations (``first``: location -> the name of its first
    argument; two entries)."""
    if "meta" not in first:
        host, device = first["cpu"], first["cuda"]
        return TypeError(
            f"{host} is a {_name_of(arrays[host])} (host array) but {device} is a "
            f"{_name_of(arrays[device])} (CUDA array): pass all arrays on the host or all "
            "on one GPU; nothing is copied between host and device"
        )
    (name_a, name_b) = first.values()
    return _on_two_devices(arrays, name_a, name_b)


def _device_name(x):
    """Where ``x`` lives, as a message names it: ``cpu``, ``meta``, ``cuda:0``."""
    device = array_library(x).device(x)
    if isinstance(device, tuple):
        kind, index = device
        return f"{kind}:{index}" if isinstance(index, int) else f"{kind} ({index})"
    return str(device)


def _on_two_devices(arrays, name_a, name_b):
    """The TypeError for ``arrays[name_a]`` and ``arrays[name_b]`` on different devices."""
    device_a, device_b = _device_name(arrays[name_a]), _device_name(arrays[name_b])
    meta = " (a meta tensor holds no data)" if "meta" in (device_a, device_b) else ""
    return TypeError(
        f"{name_a} is on {device_a} but {name_b} is on {device_b}{meta}: pass all arrays on "
        "one device"
    )


def check_devices(arrays):
    """Every array of ``arrays`` (dict of str to array or None) on one device: ``TypeError``
    naming the first two arguments on different devices and both devices.

    Reads nothing but the arrays' adapters, so it serves fake and meta tensors too: torch runs
    a custom op's fake (meta) kernel for any call with a meta tensor among its inputs, and
    that kernel must refuse a meta tensor mixed with tensors that hold data as the
    implementation would.
    """
    devices = {}  # device -> name of its first argument
    for name, x in arrays.items():
        if x is not None:
            devices.setdefault(array_library(x).device(x), name)
            if len(devices) > 1:
                raise _on_two_devices(arrays, *devices.values())


def check_arrays(arrays):
    """Every array C-contiguous (kernels index rows linearly) and all on one device.

    Raises ``ValueError`` for a strided array, ``TypeError`` for arrays on two devices.
    """
    for name, x in arrays.items():
        if x is None:
            continue
        library = array_library(x)
        if not library.is_contiguous(x):
            raise ValueError(
                f"{name} must be C-contiguous; got a strided view of shape "
                f"{tuple(library.shape(x))} (make a contiguous copy first)"
            )
    check_devices(arrays)


def call_key(arrays, scalars):
    """A hashable key for what a call's checks depend on, or None when there is none.

    Per array its type, shape, dtype, strides and device (so location, metadata and
    contiguity checks can be remembered), per scalar its type and value. Only arrays of a
    type that has been classified before get a key: the first call always runs every check.
    (An equal key means an equal type and device, so the adapter that served the first call's
    arrays serves these too.)
    """
    key = []
    for x in arrays:
        if x is None:
            key.append(None)
            continue
        library = served_type(type(x))
        k = None if library is None else library.key(x)
        if k is None:
            return None
        key.append(k)
    scalars = tuple(scalars)
    key = (*key, scalars, tuple(map(type, scalars)))
    try:
        hash(key)
    except TypeError:  # an unhashable scalar
        return None
    return key
