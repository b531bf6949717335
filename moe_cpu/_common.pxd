# Declarations shared by the kernel modules of moe_cpu: the index type of routing maps, and the
# numbers moe_cpu exchanges with its caller (status slots and data-type codes).
#
# The numbers are those of moe_numba/abi.py, which documents what each slot holds. moe_cpu
# does not import moe_numba; it publishes them instead (moe_cpu.STATUS_SLOTS, DATA_TYPES) and
# moe_numba checks at import that both tables agree.

from libc.stdint cimport int32_t, int64_t

# expert ids of a routing map
ctypedef fused index_t:
    int32_t
    int64_t

# An input may be rewritten by another thread while a call reads it (docs/contract.rst: the
# call may compute garbage, never index out of bounds). Every id or row number that indexes
# memory is therefore loaded once, through these, into a local that is checked and then
# used: a plain load of the same element may legally be repeated by the compiler, and the
# second load would bypass the check. A relaxed atomic load is a plain move on x86-64 and
# AArch64; it only forbids the compiler to split, repeat or drop it.
cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define MOE_LOAD_ONCE(type, p) __atomic_load_n((p), __ATOMIC_RELAXED)
    #else
    #define MOE_LOAD_ONCE(type, p) (*(const volatile type *)(p))
    #endif
    static inline int64_t moe_load_i32(const int32_t *p) { return MOE_LOAD_ONCE(int32_t, p); }
    static inline int64_t moe_load_i64(const int64_t *p) { return MOE_LOAD_ONCE(int64_t, p); }
    """
    int64_t load_i32 "moe_load_i32"(const int32_t* p) noexcept nogil
    int64_t load_i64 "moe_load_i64"(const int64_t* p) noexcept nogil


cdef inline int64_t load_id(const index_t* ids, int64_t i) noexcept nogil:
    """``ids[i]``, loaded once (an id that indexes memory: see above)."""
    if index_t is int32_t:
        return load_i32(ids + i)
    else:
        return load_i64(ids + i)


# moe_permute's status words
cdef enum:
    PERMUTE_BAD_ID = 0
    PERMUTE_BAD_ID_VALUE = 1
    PERMUTE_DUPLICATE = 2
    PERMUTE_DUPLICATE_VALUE = 3
    PERMUTE_MISMATCH = 4
    PERMUTE_MISMATCH_COUNT = 5
    PERMUTE_ROWS_NEEDED = 6
    PERMUTE_STATUS_LEN = 7

# moe_unpermute's status words
cdef enum:
    UNPERMUTE_BAD_ID = 0
    UNPERMUTE_BAD_ID_VALUE = 1
    UNPERMUTE_BAD_ROW = 2
    UNPERMUTE_BAD_ROW_VALUE = 3
    UNPERMUTE_STATUS_LEN = 4

# moe_sort_chunks's status words
cdef enum:
    SORT_BAD_SIZE = 0
    SORT_BAD_SIZE_VALUE = 1
    SORT_PAST_END = 2
    SORT_PAST_END_SIZE = 3
    SORT_PAST_END_START = 4
    SORT_STATUS_LEN = 5

# element type of the rows that the combine reads (_combine.h switches on the same values as
# MOE_DATA_*, which _unpermute checks at import)
cdef enum:
    DATA_FLOAT32 = 0
    DATA_BFLOAT16 = 1
    DATA_FLOAT16 = 2


cdef inline object shape_error(str name, tuple got, str meaning, tuple expected):
    """The ValueError for an argument whose shape disagrees with the others."""
    return ValueError(f"{name} must have shape {meaning} = {expected}; got {got}")

# moe_unpermute_backward's status words after moe_unpermute's (moe_permute_backward writes
# moe_unpermute's)
cdef enum:
    UNPERMUTE_BACKWARD_DUPLICATE_ROW = 4
    UNPERMUTE_BACKWARD_DUPLICATE_FIRST = 5
    UNPERMUTE_BACKWARD_DUPLICATE_SECOND = 6
    UNPERMUTE_BACKWARD_STATUS_LEN = 7
