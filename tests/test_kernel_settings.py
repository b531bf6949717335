"""The GPU kernels' tunables: one frozen ``moe_numba.kernels.Settings``, swapped for a block by
``use_settings``, which the launch plans follow."""

import pytest
from numba import config

from moe_numba import kernels
from moe_numba.kernels import Settings, permute, settings, use_settings


def test_the_settings_in_force_are_the_defaults_outside_any_block():
    assert settings() == Settings()
    assert settings().token_warps == 4096 and settings().batch_groups == ((4, 8, 16, 28), (4, 8))


def test_a_block_swaps_the_settings_and_forgets_the_launch_plans_both_ways():
    permute.LAUNCH_PLANS.put("a key", "a plan")
    with use_settings(token_warps=1, one_block_slots=0) as inside:
        assert settings() is inside and inside.token_warps == 1
        assert inside.one_block_slots == 0 and inside.part_batch == Settings().part_batch
        assert len(permute.LAUNCH_PLANS) == 0  # planned under the other settings
        permute.LAUNCH_PLANS.put("a key", "a plan")
        with use_settings(part_batch=2):  # (changes of the settings in force)
            assert (settings().token_warps, settings().part_batch) == (1, 2)
        assert settings() is inside
    assert settings() == Settings() and len(permute.LAUNCH_PLANS) == 0


def test_a_block_takes_whole_settings():
    chosen = Settings(token_blocks=7)
    with use_settings(chosen, part_words=3) as inside:
        assert (inside.token_blocks, inside.part_words) == (7, 3)


def test_the_planners_read_the_settings():
    """A row of 64 hidden words: one part for a call of at least token_warps tokens, else
    parts of at least part_batch words per lane."""
    assert permute._row_parts(10, 64) == (1, 64)  # (by default a part has 4 * 32 words)
    with use_settings(token_warps=40, part_batch=1):
        assert permute._row_parts(10, 64) == (2, 32)
        assert permute._row_parts(40, 64) == (1, 64)


@pytest.mark.parametrize(
    "changes, error, message",
    [
        (dict(tokens=3), TypeError, r"\['tokens'\] are no fields of Settings"),
        (dict(token_warps=2.0), TypeError, r"Settings.token_warps must be an int; got 2.0"),
        (dict(token_warps=True), TypeError, r"Settings.token_warps must be an int; got True"),
        (dict(token_warps=0), ValueError, r"Settings.token_warps must be >= 1; got 0"),
        (dict(one_block_slots=-1), ValueError, r"Settings.one_block_slots must be >= 0; got -1"),
        (
            dict(batch_words=[4, 8]),
            TypeError,
            r"batch_words must hold tuples of ints; got \[4, 8\]",
        ),
        (dict(batch_words=(8, 4)), ValueError, r"batch_words must hold non-empty tuples of rising"),
        (dict(batch_words=()), ValueError, r"batch_words must hold non-empty tuples of rising"),
        (dict(batch_groups=((4,),)), TypeError, r"batch_groups must be a tuple of two tuples"),
        (dict(batch_groups=((4,), (0,))), ValueError, r"batch_groups must hold non-empty"),
        (dict(pad_rows=33), ValueError, r"pad_rows must be at most gather_lanes \(32\); got 33"),
    ],
)
def test_bad_settings_are_refused_with_their_name(changes, error, message):
    with pytest.raises(error, match=message), use_settings(**changes):
        pass
    assert settings() == Settings()


def test_only_settings_are_taken_whole():
    with pytest.raises(TypeError, match=r"settings must be a moe_numba.kernels.Settings; got"):
        with use_settings({"token_warps": 1}):
            pass


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="the simulator takes compiled-in changes")
@pytest.mark.parametrize("name", ["ct", "etile", "rmt", "gather_lanes", "lmax"])
def test_compiled_in_settings_change_only_in_the_simulator(name):
    changes = {name: 64 if name == "ct" else 16}
    if name == "gather_lanes":
        changes["pad_rows"] = 16  # (at most the lanes)
    with pytest.raises(ValueError, match=rf"\['{name}'\] are compiled into the kernels"):
        with use_settings(**changes):
            pass
    assert settings() == Settings()


def test_a_ct_that_is_no_multiple_of_32_is_refused():
    with pytest.raises(ValueError, match=r"Settings.ct must be a multiple of 32; got 48"):
        Settings(ct=48)


@pytest.mark.sim
def test_in_the_simulator_the_kernels_constants_follow_the_settings():
    from moe_numba.kernels import combine, count, gather

    with use_settings(ct=32, etile=4, rmt=3, gather_lanes=4, pad_rows=3, lmax=2):
        assert (count.CT, count.ETILE, count.COUNT_BITS, count.RMT) == (32, 4, 4, 3)
        assert (gather.LANES, combine.LMAX) == (4, 2)
    assert (count.CT, count.ETILE, count.COUNT_BITS, count.RMT) == (256, 1024, 8192, 2048)
    assert (gather.LANES, combine.LMAX) == (32, 256)


def test_the_package_names_its_seams():
    assert {"Settings", "settings", "use_settings"} <= set(kernels.__all__)
