# Thread control shared by every kernel module of moe_cpu.

cdef int num_threads() noexcept nogil
