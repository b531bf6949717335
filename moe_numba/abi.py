"""What the API and the two backends exchange: status words and data-type codes.

Both backends (``moe_cpu`` and ``moe_numba.kernels``) report the value errors of the contract
(docs/contract.rst, "Validation and malformed input") in a small int64 array instead of
raising themselves, so that the GPU needs a single read-back and both backends share one set
of messages (``raise_for_permute_status`` and ``raise_for_unpermute_status`` in
``moe_numba._contract``, ``raise_for_sort_status`` in ``moe_numba._contract_sort``). Every
slot holds -1 when there is nothing to report; a backend asked for the words writes every
slot. ``moe_cpu``, built apart, publishes the same numbers and
:func:`check_tables` compares them when the CPU backend loads.

Indices are flat: a slot of ``expert_routemap_topk`` is ``t * K + k``, an entry of
``zipped_expertwise_rowmap`` is ``t * E + e``. When several entries are at fault, the smallest
index is reported, so the message does not depend on the backend or the thread count.
"""

# moe_permute
PERMUTE_BAD_ID = 0  # smallest flat slot whose expert id is outside [-1, E)
PERMUTE_BAD_ID_VALUE = 1  # the id found there
PERMUTE_DUPLICATE = 2  # smallest flat slot repeating an id of an earlier slot of its token
PERMUTE_DUPLICATE_VALUE = 3  # the repeated expert id
PERMUTE_MISMATCH = 4  # smallest expert e whose count c_e differs from tokens_per_expert[e]
PERMUTE_MISMATCH_COUNT = 5  # that c_e
PERMUTE_ROWS_NEEDED = 6  # sum of padded_e when it exceeds override_buffer_size, else -1
PERMUTE_STATUS_LEN = 7

# moe_unpermute
UNPERMUTE_BAD_ID = 0  # smallest flat slot of the routing map outside [-1, E)
UNPERMUTE_BAD_ID_VALUE = 1
UNPERMUTE_BAD_ROW = 2  # smallest flat rowmap entry outside [-1, R)
UNPERMUTE_BAD_ROW_VALUE = 3
UNPERMUTE_STATUS_LEN = 4

# moe_permute_backward: the UNPERMUTE_* slots above (UNPERMUTE_STATUS_LEN words); it checks
# the same two maps.
# moe_unpermute_backward: the UNPERMUTE_* slots, then a row that two valid rowmap entries
# name (the forward moe_permute never writes that; the row's gradients are then zero).
UNPERMUTE_BACKWARD_DUPLICATE_ROW = 4  # smallest such row
UNPERMUTE_BACKWARD_DUPLICATE_FIRST = 5  # smallest flat rowmap entry naming it
UNPERMUTE_BACKWARD_DUPLICATE_SECOND = 6  # the next flat entry naming it
UNPERMUTE_BACKWARD_STATUS_LEN = 7


# moe_sort_chunks (split sizes read on the device; chunk indices are positions in
# split_sizes; a negative size counts as 0 for the starts of the chunks after it)
SORT_BAD_SIZE = 0  # smallest chunk c with split_sizes[c] < 0
SORT_BAD_SIZE_VALUE = 1  # that size
SORT_PAST_END = 2  # smallest chunk c that ends past the last row of x
SORT_PAST_END_SIZE = 3  # its size
SORT_PAST_END_START = 4  # the row it starts at (<= the rows of x)
SORT_STATUS_LEN = 5

# element type of the rows that moe_unpermute combines (the rows travel as float32 or as the
# uint16 bit patterns of a 16-bit float)
DATA_FLOAT32 = 0
DATA_BFLOAT16 = 1
DATA_FLOAT16 = 2

# The combine writes NaN results as these quiet NaNs (the sign and payload of a NaN depend on
# the hardware, so they are made canonical to keep every backend bit-identical).
CANONICAL_NAN_FLOAT32 = 0x7FC00000
CANONICAL_NAN_BFLOAT16 = 0x7FC0
CANONICAL_NAN_FLOAT16 = 0x7E00

# The tables a backend built apart from this module (moe_cpu) publishes too; each op's status
# slots are named after the op (a new op adds its prefix here).
_OPS = ("PERMUTE_", "UNPERMUTE_", "SORT_")
STATUS_SLOTS = {name: value for name, value in list(globals().items()) if name.startswith(_OPS)}
DATA_TYPES = {name: value for name, value in list(globals().items()) if name.startswith("DATA_")}


def check_tables(backend, status_slots, data_types):
    """Raise ImportError unless a backend's status slots and data-type codes equal these.

    Parameters
    ----------
    backend : str
        The backend's name, for the message.
    status_slots, data_types : dict of str to int
        The backend's tables, by the names used here.
    """
    differences = []
    for what, ours, theirs in (
        ("STATUS_SLOTS", STATUS_SLOTS, status_slots),
        ("DATA_TYPES", DATA_TYPES, data_types),
    ):
        for name in sorted(ours.keys() | theirs.keys()):
            if ours.get(name) != theirs.get(name):
                differences.append(
                    f"{what}[{name!r}] is {ours.get(name)} in moe_numba.abi but "
                    f"{theirs.get(name)} in {backend}"
                )
    if differences:
        raise ImportError(
            f"{backend} was built from other sources than moe_numba ("
            + "; ".join(differences)
            + "): reinstall both from one checkout"
        )
