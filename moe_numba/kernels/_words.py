"""16-byte loads and stores for the copy loops.

numba emits one 8-byte access per ``uint64`` element at most; these intrinsics load and store
a ``<2 x i64>`` vector with 16-byte alignment, which the NVPTX backend turns into
``ld.global.v2.u64`` / ``st.global.v2.u64`` (checked in tests/test_ptx.py). The pointer is a
``CPointer(uint64)`` and the index counts 16-byte words; the caller guarantees alignment.
:func:`st16_streaming` is the store with the streaming cache hint (``st.global.cs``: the L2
evicts those lines first), for rows written once and not read again by the same kernel.
In the simulator they are two plain 8-byte accesses.
"""

from __future__ import annotations

from ._primitives import SIM, device

if not SIM:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    _I64 = ir.IntType(64)
    _I32 = ir.IntType(32)
    _V2 = ir.VectorType(_I64, 2)

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
        """:func:`st16` with the streaming hint (``st.global.cs.v2.u64``)."""
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
