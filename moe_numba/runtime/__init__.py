"""The CUDA runtime of the GPU backend: host plumbing between a planned call and the driver.

It knows neither the kernels' code (:mod:`moe_numba.kernels`) nor any array library: a
planner hands it compiled kernels, their geometry and parameter words, and device buffers.

==============  ==============================================================================
module          what it holds
==============  ==============================================================================
_launch         the raw launcher (``cuda.core.launch`` or the driver) and ``RawKernel``
_driver         kernel launches through the CUDA driver's C API (ctypes)
_driver_c       the launch sequences' C half (Cython, built with the package)
_sequence       a call's launches, planned once per call key and run by every call
_staged         values the host hands the kernels through pinned, device-mapped memory
_status         status words in mapped host memory, and the wait for them
_recording      a call's launches recorded once and replayed by later calls of its key
_buffer         ``DeviceBuffer``: what a kernel sees of an array (address and size)
_sim            whether numba runs CUDA code in its simulator
==============  ==============================================================================
"""
