"""Programmatic dependent launch (Hopper and newer): a kernel may start before the kernel
ahead of it in the stream has finished, and waits for it only where it needs its results.

``trigger()`` lets the next kernel (launched with ``dependent=True``, see
:class:`._launch.Launcher`) start once every block of this one has called it or ended;
``wait()`` blocks the calling thread until every kernel this one depends on has completed and
its writes are visible. The first kernel of a call is such a dependent too: it waits before
it touches anything, so that its launch overlaps the end of whatever kernel the caller ran
before it; the kernels after it may touch the call's inputs before they wait, as every
kernel ahead of them in the call has waited for the caller's work first. The PTX instructions
(``griddepcontrol.*``) exist from sm_90 on; the code is compiled in only when NVVM's
``__CUDA_ARCH`` is 900 or more, elsewhere both are no-ops (and the launcher does not ask for
the overlap). In the simulator, kernels run one after another and both are no-ops.
"""

from __future__ import annotations

from ._primitives import SIM, device

if not SIM:
    from llvmlite import ir
    from numba.core import cgutils
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    _I8P = ir.IntType(8).as_pointer()
    _I32 = ir.IntType(32)

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

    _trigger = _sm90_asm("griddepcontrol.launch_dependents;")
    _wait = _sm90_asm("griddepcontrol.wait;")

    @device
    def trigger():
        """Let the dependent kernel start (once every block of this one has called this)."""
        _trigger()

    @device
    def wait():
        """Wait until the kernels this one depends on have completed, their writes visible."""
        _wait()

else:

    @device
    def trigger():
        """No-op: the simulator runs kernels one after another."""

    @device
    def wait():
        """No-op: the simulator runs kernels one after another."""
