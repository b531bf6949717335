"""Everything the device code does differently on a GPU and in numba's CUDA simulator.

Stage code (count, scan, gather, combine, check) calls only the names of this module for
such things and never asks which target it runs on. Each name is bound once, at import, to
the real version (an LLVM intrinsic, inline PTX or numba's warp functions) or to its
simulator twin (plain Python that does the same, slowly and obviously). The twins are
checked against each other in the tests: the twin's behaviour in the simulator
(tests/test_cuda_kernels.py), the real version's instruction in the PTX (tests/test_ptx.py).

=========================  =======================================  =======================
name                       GPU                                      simulator
=========================  =======================================  =======================
device                     ``cuda.jit(device=True, forceinline)``   ``cuda.jit(device=True)``,
                                                                    keywords bound
ld16, st16                 ``ld/st.global.v2.u64`` (16-byte words)  two 8-byte accesses
st16_streaming             ``st.global.cs.v2.u64``                  st16
load_cg                    ``ld.global.cg`` (L2, coherent)          a plain load
read_volatile              ``ld.volatile.global.u32``               a plain load
atomic_add, atomic_min     atomics on a pointer parameter           atomics on an array
syncwarp                   ``bar.warp.sync``                        the block barrier
pause                      ``nanosleep`` (about 1 us)               nothing
griddep_wait, _trigger     ``griddepcontrol.*`` on sm_90 and newer  nothing
f32_from_bits, ...         libdevice bit casts                      NumPy views
f16_to_f32                 ``cvt.f32.f16``                          NumPy
warp/block scans, min      warp shuffles + one word per warp        shared memory, a word
                                                                    per thread
warp_sum_butterfly         ``shfl.sync.bfly`` (xor shuffles)        shared memory, a word
                                                                    per thread
=========================  =======================================  =======================

The host side has its own two seams: :mod:`._launch` (how a kernel is launched and what its
pointer arguments are) and :mod:`._status` (where status words are written).
"""

from __future__ import annotations

import functools
import inspect

import numpy as np
from numba import cuda

from ..runtime._sim import SIM  # noqa: E402  (one reading of the switch)

# Shared scratch one block primitive needs (``tmp``): a word per warp on a GPU, a word per
# thread in the simulator (whose blocks stay small).
TMP_WORDS = 1024 if SIM else 32

# Most warps in a block of a kernel that calls syncwarp: in the simulator syncwarp is the
# block barrier, so such blocks hold one warp there.
SYNCWARP_WARPS = 1 if SIM else 32

FULL_MASK = 0xFFFFFFFF

__all__ = [
    "SIM",
    "SYNCWARP_WARPS",
    "TMP_WORDS",
    "atomic_add",
    "atomic_min",
    "bits_from_f32",
    "block_exclusive_scan_i64",
    "block_min_i64",
    "device",
    "f16_to_f32",
    "f32_from_bits",
    "griddep_trigger",
    "griddep_wait",
    "ld16",
    "load_cg",
    "pause",
    "read_volatile",
    "st16",
    "st16_streaming",
    "syncwarp",
    "warp_exclusive_scan_i64",
    "warp_sum_butterfly",
]


def device(fn):
    """``cuda.jit(device=True)``, force-inlined on a GPU. The simulator takes no such flag,
    and its device functions take no keyword arguments: its twin binds them first."""
    if not SIM:
        return cuda.jit(device=True, forceinline=True)(fn)
    twin = cuda.jit(device=True)(fn)
    bind = inspect.signature(fn).bind

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return twin(*bind(*args, **kwargs).args) if kwargs else twin(*args)

    return call


# Rules for the block primitives (warp and block scans, block min), both versions:
# - every thread of the block calls them, in uniform control flow (no early return before);
# - the block is one-dimensional and its size a multiple of 32 on a GPU;
# - ``tmp`` is ``cuda.shared.array(TMP_WORDS, int64)`` (float32 for warp_sum_butterfly);
# - each synchronises the block before it returns, so ``tmp`` may be reused at once (the
#   warp scan needs no block barrier on a GPU, but its twin has one, so it follows the rule).

if not SIM:
    from llvmlite import ir
    from numba.core import cgutils
    from numba.cuda import types
    from numba.cuda.extending import intrinsic
    from numba.cuda.np.numpy_support import carray

    _I8P = ir.IntType(8).as_pointer()
    _I32 = ir.IntType(32)
    _I64 = ir.IntType(64)
    _V2 = ir.VectorType(_I64, 2)

    # --- 16-byte words. numba emits one 8-byte access per uint64 element at most; these
    # load and store a <2 x i64> vector with 16-byte alignment. The pointer is a
    # CPointer(uint64), the index counts 16-byte words; the caller guarantees alignment.

    def _vector_pointer(builder, ptr, index):
        element = builder.gep(ptr, [builder.shl(index, ir.Constant(_I64, 1))])
        return builder.bitcast(element, _V2.as_pointer())

    @intrinsic
    def ld16(typingctx, ptr, index):
        """Load 16-byte word ``index`` of ``ptr`` (a uint64 pointer) as two uint64."""
        sig = types.UniTuple(types.uint64, 2)(ptr, types.int64)

        def codegen(context, builder, sig, args):
            vec = builder.load(_vector_pointer(builder, args[0], args[1]), align=16)
            lo = builder.extract_element(vec, ir.Constant(_I32, 0))
            hi = builder.extract_element(vec, ir.Constant(_I32, 1))
            return context.make_tuple(builder, sig.return_type, (lo, hi))

        return sig, codegen

    @intrinsic
    def st16(typingctx, ptr, index, lo, hi):
        """Store two uint64 as 16-byte word ``index`` of ``ptr`` (a uint64 pointer)."""
        sig = types.void(ptr, types.int64, types.uint64, types.uint64)

        def codegen(context, builder, sig, args):
            vec = ir.Constant(_V2, ir.Undefined)
            vec = builder.insert_element(vec, args[2], ir.Constant(_I32, 0))
            vec = builder.insert_element(vec, args[3], ir.Constant(_I32, 1))
            builder.store(vec, _vector_pointer(builder, args[0], args[1]), align=16)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def st16_streaming(typingctx, ptr, index, lo, hi):
        """:func:`st16` with the streaming cache hint (``st.global.cs``: the L2 evicts those
        lines first), for rows written once and not read again by the same kernel."""
        sig = types.void(ptr, types.int64, types.uint64, types.uint64)

        def codegen(context, builder, sig, args):
            address = builder.ptrtoint(_vector_pointer(builder, args[0], args[1]), _I64)
            asm = ir.InlineAsm(
                ir.FunctionType(ir.VoidType(), [_I64, _I64, _I64]),
                "{ .reg .u64 g; cvta.to.global.u64 g, $0; st.global.cs.v2.u64 [g], {$1, $2}; }",
                "l,l,l,~{memory}",
                side_effect=True,
            )
            builder.call(asm, [address, args[2], args[3]])
            return context.get_dummy_value()

        return sig, codegen

    # --- loads that bypass the caches the compiler knows about

    @device
    def load_cg(array, i):
        """``array[i]`` read from L2 (``ld.global.cg``): sees other blocks' writes of this
        launch once they are published (threadfence + atomic ticket)."""
        return cuda.ldcg(array, i)

    @intrinsic
    def read_volatile(typingctx, ptr):
        """``ld.volatile.global.u32`` of ``ptr[0]``: an asm statement with side effects, so
        the compiler neither caches the value nor hoists the load out of a loop (a plain or
        ``ld.cv`` load was hoisted, and a spin on it never saw the host's write)."""
        sig = types.int32(ptr)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(32), [_I64])
            asm = ir.InlineAsm(fnty, "ld.volatile.global.u32 $0, [$1];", "=r,l", side_effect=True)
            return builder.call(asm, [builder.ptrtoint(args[0], _I64)])

        return sig, codegen

    # --- atomics on pointer parameters (numba's atomics take arrays: view the pointer as one)

    @device
    def atomic_add(ptr, i, v):
        """``cuda.atomic.add`` on element ``i`` of a pointer parameter; returns the old
        value."""
        return cuda.atomic.add(carray(ptr, i + 1), i, v)

    @device
    def atomic_min(ptr, i, v):
        """``cuda.atomic.min`` on element ``i`` of a pointer parameter; returns the old
        value."""
        return cuda.atomic.min(carray(ptr, i + 1), i, v)

    # --- the warp and the clock

    @device
    def syncwarp():
        """``__syncwarp()``: the warp's threads meet, their memory accesses ordered."""
        cuda.syncwarp()

    @device
    def pause():
        """Sleep about a microsecond (``nanosleep``)."""
        cuda.nanosleep(1000)

    # --- programmatic dependent launch (sm_90 and newer): a kernel launched as a dependent
    # (:class:`._launch.Launcher`, ``dependent=True``) may start before the kernel ahead of it
    # ends. ``griddep_trigger()`` lets the next kernel start once every block of this one
    # has called it or ended; ``griddep_wait()`` blocks until every kernel this one depends
    # on has completed, its writes visible. The first kernel of a call waits before it
    # touches anything, so that its launch overlaps the end of the caller's kernel; later
    # kernels may read the call's inputs before they wait. The instructions are compiled in
    # only where NVVM's ``__CUDA_ARCH`` is 900 or more (no-ops elsewhere, and the launcher
    # does not ask for the overlap there).

    def _sm90_asm(text):
        @intrinsic
        def emit(typingctx):
            def codegen(context, builder, sig, args):
                module = builder.module
                reflect = cgutils.get_or_insert_function(
                    module, ir.FunctionType(_I32, [_I8P]), "__nvvm_reflect"
                )
                name = "_moe_reflect_cuda_arch"
                arch_name = module.globals.get(name)
                if arch_name is None:
                    arch_name = cgutils.global_constant(
                        module, name, cgutils.make_bytearray(b"__CUDA_ARCH\x00")
                    )
                arch = builder.call(reflect, [builder.bitcast(arch_name, _I8P)])
                with builder.if_then(builder.icmp_signed(">=", arch, ir.Constant(_I32, 900))):
                    asm = ir.InlineAsm(
                        ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True
                    )
                    builder.call(asm, [])
                return context.get_dummy_value()

            return types.void(), codegen

        return emit

    _launch_dependents = _sm90_asm("griddepcontrol.launch_dependents;")
    _wait = _sm90_asm("griddepcontrol.wait;")

    @device
    def griddep_trigger():
        """Let the dependent kernel start (once every block of this one has called this)."""
        _launch_dependents()

    @device
    def griddep_wait():
        """Wait until the kernels this one depends on have completed, their writes visible."""
        _wait()

    # --- float32 bit patterns

    @device
    def f32_from_bits(u):
        """The float32 whose bit pattern is the uint32 ``u``."""
        return cuda.libdevice.int_as_float(np.int32(u))

    @device
    def bits_from_f32(f):
        """The bit pattern of the float32 ``f`` as uint32."""
        return np.uint32(cuda.libdevice.float_as_int(f))

    @intrinsic
    def _cvt_f32_f16(typingctx, h):
        sig = types.float32(types.uint16)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.FloatType(), [ir.IntType(16)])
            asm = ir.InlineAsm(fnty, "cvt.f32.f16 $0, $1;", "=f,h")
            return builder.call(asm, [args[0]])

        return sig, codegen

    @device
    def f16_to_f32(h):
        """float16 bits (low half of a uint32) -> float32, exact (subnormals included)."""
        return _cvt_f32_f16(np.uint16(h & np.uint32(0xFFFF)))

    # --- warp and block primitives, from warp shuffles

    @device
    def _warp_place():
        """(lane, warp, number of warps) of the calling thread in its block."""
        tid = cuda.threadIdx.x
        return tid & 31, tid >> 5, cuda.blockDim.x >> 5

    @device
    def block_min_i64(value, tmp):
        """Minimum of an int64 over the block, returned to every thread."""
        lane, warp, nwarps = _warp_place()
        v = value
        d = 16
        while d > 0:
            o = cuda.shfl_down_sync(FULL_MASK, v, d)
            if o < v:
                v = o
            d >>= 1
        if lane == 0:
            tmp[warp] = v
        cuda.syncthreads()
        m = tmp[0]
        for w in range(1, nwarps):
            o = tmp[w]
            if o < m:
                m = o
        cuda.syncthreads()
        return m

    @device
    def _warp_inclusive_scan(x, lane):
        """Inclusive prefix sum of ``x`` over the warp, in lane order."""
        d = 1
        while d < 32:
            y = cuda.shfl_up_sync(FULL_MASK, x, d)
            if lane >= d:
                x += y
            d <<= 1
        return x

    @device
    def block_exclusive_scan_i64(value, tmp):
        """(exclusive prefix sum over the block in thread order, block total), int64."""
        lane, warp, nwarps = _warp_place()
        x = _warp_inclusive_scan(value, lane)
        if lane == 31:
            tmp[warp] = x
        cuda.syncthreads()
        base = 0
        total = 0
        for w in range(nwarps):
            c = tmp[w]
            if w < warp:
                base += c
            total += c
        cuda.syncthreads()
        return base + x - value, total

    @device
    def warp_exclusive_scan_i64(value, tmp):
        """(exclusive prefix sum over the thread's warp in lane order, warp total), int64;
        ``tmp`` is unused (the twin needs it)."""
        x = _warp_inclusive_scan(value, cuda.threadIdx.x & 31)
        return x - value, cuda.shfl_sync(FULL_MASK, x, 31)

    @device
    def warp_sum_butterfly(value, tmp):
        """The float32 sum of ``value`` over the warp in butterfly order: for ``off`` = 16,
        8, 4, 2, 1 every lane adds the value of lane ``lane ^ off`` to its own (float32
        additions, so every lane ends with the same sum); ``tmp`` is unused (the twin needs
        it)."""
        v = value
        off = 16
        while off > 0:
            v = v + cuda.shfl_xor_sync(FULL_MASK, v, off)
            off >>= 1
        return v

else:

    @device
    def ld16(ptr, index):
        """Load 16-byte word ``index`` of ``ptr`` (a uint64 array) as two uint64."""
        return ptr[2 * index], ptr[2 * index + 1]

    @device
    def st16(ptr, index, lo, hi):
        """Store two uint64 as 16-byte word ``index`` of ``ptr`` (a uint64 array)."""
        ptr[2 * index] = lo
        ptr[2 * index + 1] = hi

    st16_streaming = st16

    @device
    def load_cg(array, i):
        """``array[i]`` (the simulator has one coherent memory)."""
        return array[i]

    @device
    def read_volatile(ptr):
        """``ptr[0]``, read again at every call."""
        return ptr[0]

    @device
    def atomic_add(ptr, i, v):
        """``cuda.atomic.add`` on element ``i`` (the simulator passes arrays)."""
        return cuda.atomic.add(ptr, i, v)

    @device
    def atomic_min(ptr, i, v):
        """``cuda.atomic.min`` on element ``i`` (the simulator passes arrays)."""
        return cuda.atomic.min(ptr, i, v)

    @device
    def syncwarp():
        """The block barrier: kernels that call this launch blocks of one warp here
        (:data:`SYNCWARP_WARPS`)."""
        cuda.syncthreads()

    @device
    def pause():
        """Nothing (the simulator's threads take turns anyway)."""

    @device
    def griddep_trigger():
        """Nothing: the simulator runs kernels one after another."""

    @device
    def griddep_wait():
        """Nothing: the simulator runs kernels one after another."""

    @device
    def f32_from_bits(u):
        """The float32 whose bit pattern is the uint32 ``u``."""
        return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)

    @device
    def bits_from_f32(f):
        """The bit pattern of the float32 ``f`` as uint32."""
        return np.float32(f).view(np.uint32)

    @device
    def f16_to_f32(h):
        """float16 bits (low half of a uint32) -> float32, exact."""
        return np.float32(np.uint16(int(h) & 0xFFFF).view(np.float16))

    @device
    def block_min_i64(value, tmp):
        """Minimum of an int64 over the block, returned to every thread."""
        tid = cuda.threadIdx.x
        tmp[tid] = value
        cuda.syncthreads()
        m = tmp[0]
        for i in range(1, cuda.blockDim.x):
            if tmp[i] < m:
                m = tmp[i]
        cuda.syncthreads()
        return m

    @device
    def _group_exclusive_scan(value, tmp, size):
        """(exclusive prefix sum over the thread's group of ``size`` consecutive threads, the
        group's total), int64."""
        tid = cuda.threadIdx.x
        tmp[tid] = value
        cuda.syncthreads()
        first = tid - tid % size
        before = 0
        total = 0
        for i in range(first, first + size):
            c = tmp[i]
            if i < tid:
                before += c
            total += c
        cuda.syncthreads()
        return before, total

    @device
    def block_exclusive_scan_i64(value, tmp):
        """(exclusive prefix sum over the block in thread order, block total), int64."""
        return _group_exclusive_scan(value, tmp, cuda.blockDim.x)

    @device
    def warp_exclusive_scan_i64(value, tmp):
        """(exclusive prefix sum over the thread's group of 32 threads in thread order, the
        group's total), int64."""
        return _group_exclusive_scan(value, tmp, 32)

    @device
    def warp_sum_butterfly(value, tmp):
        """The float32 butterfly sum over the thread's group of 32 threads: for ``off`` =
        16, 8, 4, 2, 1 every thread adds the value of thread ``tid ^ off`` to its own, the
        values passed through ``tmp`` (float32, a word per thread)."""
        tid = cuda.threadIdx.x
        v = value
        off = 16
        while off > 0:
            tmp[tid] = v
            cuda.syncthreads()
            v = v + tmp[tid ^ off]
            cuda.syncthreads()
            off >>= 1
        return v
