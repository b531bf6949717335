"""Each kernel declared once: a :class:`KernelFamily` per kernel, a NamedTuple key per variant.

::

    key, e.g. GatherKey(hidden_word=16, scale_word=4, batch=28, index_bits=32)
     |-- variant_name(key)   "gather_h16_s4_b28_i32"        (the key's TAGS, in one place)
     |-- params(key)         [("hidden", CPointer(uint64)), ..., ("ct", int64)]
     |                        -> the signature, and the order of the launch tuple
     |-- body(key)           the Python function (the stage module's factory)
     '-- get(key)            RawKernel: compiled on first launch, cached per key

A host planner names every argument of a call's kernels once, in a dict; ``FAMILY.args(values)``
picks the kernel's parameters from it in order (an ``operator.itemgetter`` built once per
family): two pointers cannot be swapped, and a missing name raises TypeError.
``variants()`` lists every key the host can launch; tests/test_ptx.py compiles them, and
tests/test_kernel_families.py checks that ``params(key)`` names the parameters of
``body(key)``.
"""

from __future__ import annotations

from operator import itemgetter
from typing import NamedTuple

from numba import cuda
from numba.cuda import types

from ..runtime._launch import RawKernel

INT = types.int64  # every scalar parameter
INDEX_TYPES = {32: types.int32, 64: types.int64}  # routing map ids, by their bits


def ptr(element_type):
    """A pointer parameter (a raw device address at launch)."""
    return types.CPointer(element_type)


class NoKey(NamedTuple):
    """The key of a kernel with a single variant."""

    TAGS = ()


class RoutingKey(NamedTuple):
    """Variants that differ only in the routing map's id type (int32 or int64)."""

    index_bits: int

    TAGS = ("i",)


def routing_variants():
    """The keys of a kernel whose variants differ only in the routing map's id type."""
    return [RoutingKey(bits) for bits in INDEX_TYPES]


def variant_name(family, key):
    """``family`` and each key field behind its tag: ``gather_h16_s4_b28_i32``."""
    tags = zip(key.TAGS, key, strict=True)
    return "_".join([family, *(f"{tag}{int(value)}" for tag, value in tags)])


class KernelFamily:
    """One kernel: its parameters, its body and its compiled variants.

    Parameters
    ----------
    name : str
        The kernel's name; a variant's name adds its key (:func:`variant_name`).
    params : callable
        ``params(key) -> [(name, numba type), ...]``: the kernel's parameters in order.
        The names are the same for every key (only types vary).
    make_body : callable
        ``make_body(key)`` returns the kernel's Python function.
    variants : callable
        ``variants()`` yields every key the host may launch.
    """

    __slots__ = (
        "_bodies",
        "_kernels",
        "_make_body",
        "_params",
        "_pick",
        "_variants",
        "name",
        "names",
    )

    def __init__(self, name, params, make_body, variants):
        self.name = name
        self._params = params
        self._make_body = make_body
        self._variants = variants
        self._bodies = {}
        self._kernels = {}
        self.names = tuple(n for n, _ in params(next(iter(variants()))))
        if len(self.names) == 1:
            only = self.names[0]
            self._pick = lambda values: (values[only],)
        else:
            self._pick = itemgetter(*self.names)

    def __repr__(self):
        return f"KernelFamily({self.name!r})"

    def variants(self):
        """Every key the host may launch."""
        return list(self._variants())

    def variant_name(self, key):
        """The name of the variant ``key`` (as in the PTX test's ids)."""
        return variant_name(self.name, key)

    def params(self, key):
        """``[(name, numba type), ...]`` of the variant ``key``."""
        return self._params(key)

    def signature(self, key):
        """The explicit signature the variant ``key`` is compiled for."""
        params = self._params(key)
        names = tuple(n for n, _ in params)
        if names != self.names:
            raise TypeError(
                f"{self.variant_name(key)} declares the parameters {names}; every variant of "
                f"{self.name} must declare {self.names}"
            )
        return types.void(*(t for _, t in params))

    def body(self, key):
        """The Python function of the variant ``key`` (built once)."""
        body = self._bodies.get(key)
        if body is None:
            body = self._bodies[key] = self._make_body(key)
        return body

    def get(self, key):
        """The :class:`RawKernel` of the variant ``key`` (compiled on its first launch)."""
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = RawKernel(
                cuda.jit(self.body(key)), self.signature(key), self.variant_name(key)
            )
            self._kernels[key] = kernel
        return kernel

    def args(self, values):
        """The launch tuple: the kernel's parameters, in order, looked up by name in
        ``values`` (a mapping that may hold more: every argument of a call's kernels)."""
        try:
            return self._pick(values)
        except KeyError:
            missing = [n for n in self.names if n not in values]
            raise TypeError(
                f"{self.name} takes the arguments ({', '.join(self.names)}); missing {missing}"
            ) from None
