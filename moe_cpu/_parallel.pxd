# Thread control shared by every kernel module of moe_cpu.

# Threads for the parallel loops of the call that asks, once per call: never more than
# thread_limit(), 1 in a child forked after a team ran, and by default fewer while the
# processors are busy with other work. Any count gives the same results.
cdef int num_threads() noexcept nogil
