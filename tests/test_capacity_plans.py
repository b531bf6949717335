"""The capacities' plan of a permute call (``_contract.with_capacities``) is remembered per
metadata plan object and per ``tokens_per_expert`` value: equal plans that are different
objects, changed counts and counts of another type each get their own, right, plan."""

import numpy as np
import pytest

from moe_numba import _api
from moe_numba._contract import PermuteArrays, with_capacities


def _plan(num_experts=3, alignment=2):
    x = np.zeros((4, 2), np.float32)
    arrays = PermuteArrays(x, None, np.zeros((4, 1), np.int32), np.zeros((4, 1), np.float32))
    scalars = _api.permute_scalars(num_experts, alignment, True, False, False, -1, True)
    return _api._prepare(_api._permute_calls, arrays, scalars, _api.check_permute_metadata)[1]


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
