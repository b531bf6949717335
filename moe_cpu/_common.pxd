# Declarations shared by the kernel modules of moe_cpu: the index type of routing maps, and the
# numbers moe_cpu exchanges with its caller (status slots and data-type codes).
#
# The numbers are those of moe_numba/_abi.py, which documents what each slot holds. moe_cpu
# does not import moe_numba; it publishes them instead (moe_cpu.STATUS_SLOTS, DATA_TYPES) and
# moe_numba checks at import that both tables agree.

from libc.stdint cimport int32_t, int64_t

# expert ids of a routing map
ctypedef fused index_t:
    int32_t
    int64_t

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
