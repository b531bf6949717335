"""The capacities' plan of a permute call (``_capacities.with_capacities``) is remembered per
metadata plan object and per ``tokens_per_expert`` value: equal plans that are different
objects, changed counts and counts of another type each get their own, right, plan."""

import numpy as np
import pytest

from _cases import metadata
from moe_numba._capacities import with_capacities
from moe_numba.ops import PERMUTE, PermuteArrays, PermuteScalars


def _plan(num_experts=3, alignment=2):
    x = np.zeros((4, 2), np.float32)
    arrays = PermuteArrays(x, None, np.zeros((4, 1), np.int32), np.zeros((4, 1), np.float32))
    scalars = PermuteScalars(num_experts=num_experts, padding_alignment=alignment)
    return PERMUTE.check(metadata(arrays), scalars)  # (a plan without capacities)


def test_counts_decide_the_rows():
    plan = _plan()
    first = with_capacities(plan, [1, 2, 0])
    assert first.num_rows == 4 and list(first.capacities) == [1, 2, 0]
    assert with_capacities(plan, [1, 2, 0]) is first  # remembered
    changed = with_capacities(plan, [3, 0, 1])
    assert changed.num_rows == 6 and list(changed.capacities) == [3, 0, 1]


def test_an_equal_plan_of_another_object_gets_its_own_entry():
    plan = _plan()
    twin = plan._replace()  # equal, another object
    assert twin == plan and twin is not plan
    a, b = with_capacities(plan, [2, 2, 2]), with_capacities(twin, [2, 2, 2])
    assert a is not b
    assert a.num_rows == b.num_rows == 6 and list(a.capacities) == list(b.capacities)


def test_the_counts_type_is_part_of_the_key():
    plan = _plan()
    assert with_capacities(plan, [1, 1, 1]).num_rows == 6
    with pytest.raises(TypeError, match="tokens_per_expert"):
        with_capacities(plan, [1.0, 1, 1])


@pytest.mark.parametrize("alignment", [1, 3, 128, 2**40])
def test_lists_of_ints_plan_as_the_checked_path_does(alignment):
    """Lists and tuples of Python ints take a path of their own (no NumPy per call); its
    capacities and rows are those of the checked path, for any values and alignment."""
    from moe_numba import _capacities

    rng = np.random.default_rng(alignment)
    plan = _plan(num_experts=5, alignment=alignment)
    for values in [[0] * 5, [2**62, 1, 0, 7, 2**63 - 1], *rng.integers(0, 1000, (20, 5)).tolist()]:
        for given in (values, tuple(values)):
            capacities, rows = _capacities._plain_capacities(given, 5, alignment)
            checked = _capacities.capacities_from(np.array(given, dtype=np.uint64), 5)
            assert capacities.dtype == np.int64 and list(capacities) == list(checked)
            assert rows == _capacities._rows_needed(checked, alignment)
            if rows <= _capacities.MAX_ROWS:  # (and the whole plan)
                planned = with_capacities(plan, given)
                assert planned.num_rows == rows and list(planned.capacities) == values
    # anything else goes to the checked path, which refuses it or plans it the same way
    for other in (
        [1, 2, 3, 4],
        [1, 2, 3, 4, True],
        [1, 2, 3, 4, np.int64(5)],
        [1.0] * 5,
        [-1, 0, 0, 0, 0],
        [2**63, 0, 0, 0, 0],
        np.arange(5),
    ):
        assert _capacities._plain_capacities(other, 5, alignment) is None
