"""The GPU backend: numba.cuda kernels for moe_permute / moe_unpermute.

``permute.permute`` and ``unpermute.unpermute`` take :class:`~._buffer.DeviceBuffer`
arguments (addresses and sizes, never library objects), an ``alloc(nbytes)`` callable for
stream-ordered scratch memory and a raw ``CUstream`` handle; they enqueue the kernels and
return without synchronising. Kernels compile lazily, once per signature, and launch through
``cuda.core.launch`` (see ``_launch``). Importing this package compiles nothing.
"""
