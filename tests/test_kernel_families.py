"""Each GPU kernel is declared once (``moe_numba.kernels._family``): its parameters match its
body for every variant, launches are packed by name, and the variants are the ones the host
planners can launch. Pure Python: runs with the real CUDA target and in the simulator."""

import inspect

import pytest

from benchmarks import hold as _hold
from moe_numba import abi, kernels
from moe_numba.kernels._family import KernelFamily, NoKey, RoutingKey, variant_name
from moe_numba.kernels.combine import CombineKey
from moe_numba.kernels.gather import GatherKey
from moe_numba.kernels.sort_chunks import CopyKey, SizesKey

FAMILIES = (*kernels.families(), _hold.HOLD)
VARIANTS = [(family, key) for family in FAMILIES for key in family.variants()]


@pytest.mark.parametrize(
    "family,key", VARIANTS, ids=[family.variant_name(key) for family, key in VARIANTS]
)
def test_declared_parameters_are_the_body_parameters(family, key):
    declared = [name for name, _ in family.params(key)]
    assert declared == list(inspect.signature(family.body(key)).parameters)
    assert tuple(declared) == family.names
    assert len(family.signature(key).args) == len(declared)


def test_every_launch_variant_is_listed():
    by_family = {family.name: family.variants() for family in FAMILIES}
    names = [family.variant_name(key) for family, key in VARIANTS]
    assert len(set(names)) == len(names)
    assert by_family["init"] == [NoKey()] and by_family["hold"] == [NoKey()]
    for name in ("count", "scan", "count_scan", "check"):
        assert by_family[name] == [RoutingKey(32), RoutingKey(64)]
    for bits in (32, 64):
        gathers = [k for k in by_family["gather"] if k.index_bits == bits]
        combines = [k for k in by_family["combine"] if k.index_bits == bits]
        # hidden words 16 (4 batch sizes), 8, 4, 2, 1 bytes, times scale words 16, 8, 4 bytes
        assert len(gathers) == 3 * (4 + 4) == len(set(gathers))
        # float32: words 16, 8, 4 bytes; bfloat16 and float16 also 2 bytes; times 4 flags
        assert len(combines) == 4 * (3 + 4 + 4) == len(set(combines))
    assert GatherKey(16, 4, 28, 64) in by_family["gather"]
    assert CombineKey(2, abi.DATA_FLOAT16, True, False, 32) in by_family["combine"]
    assert CombineKey(2, abi.DATA_FLOAT32, True, False, 32) not in by_family["combine"]
    assert by_family["sort_plan"] == [SizesKey(32), SizesKey(64)]
    assert by_family["sort_copy"] == [CopyKey(w) for w in (16, 8, 4, 2, 1)]


def test_variant_names_come_from_the_key():
    assert variant_name("count", RoutingKey(64)) == "count_i64"
    assert variant_name("init", NoKey()) == "init"
    assert variant_name("gather", GatherKey(16, 4, 28, 32)) == "gather_h16_s4_b28_i32"
    assert variant_name("sort_plan", SizesKey(32)) == "sort_plan_i32"
    assert variant_name("sort_copy", CopyKey(16)) == "sort_copy_w16"
    key = CombineKey(16, abi.DATA_BFLOAT16, True, False, 64)
    assert variant_name("combine", key) == f"combine_w16_d{abi.DATA_BFLOAT16}_wt1_mix0_i64"


def _toy_family(params):
    def body(a, n):
        pass

    return KernelFamily("toy", params, lambda key: body, lambda: [RoutingKey(32), RoutingKey(64)])


def _toy_params(key):
    return [("a", object()), ("n", object())]


def test_launch_arguments_are_picked_by_name():
    family = _toy_family(_toy_params)
    assert family.args({"n": 5, "a": 7}) == (7, 5)
    assert family.args({"n": 5, "b": 6, "a": 7}) == (7, 5)  # (another kernel's argument)
    single = KernelFamily("one", lambda key: [("a", None)], lambda key: None, lambda: [NoKey()])
    assert single.args({"a": 3}) == (3,)


def test_a_missing_launch_argument_is_named():
    family = _toy_family(_toy_params)
    with pytest.raises(TypeError, match=r"toy takes the arguments \(a, n\); missing \['n'\]"):
        family.args({"a": 1, "m": 2})


def test_every_variant_declares_the_same_names():
    def params(key):
        names = ("a", "n") if key.index_bits == 32 else ("a", "m")
        return [(name, None) for name in names]

    family = _toy_family(params)
    with pytest.raises(
        TypeError,
        match=r"toy_i64 declares the parameters \('a', 'm'\); every variant of toy must "
        r"declare \('a', 'n'\)",
    ):
        family.signature(RoutingKey(64))
