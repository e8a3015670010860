"""The Configuration type: problems are listed, a sound configuration has none."""

from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.hardware import parse_layout


def _config(**placements):
    layout = parse_layout("3g@0,2g@4,1g@6", "a100-40gb")
    modes = ((SharingMode.MPS, SharingMode.TIME_SLICE, SharingMode.PRIORITY_FILL),)
    return Configuration((layout,), modes, placements)


def test_sound_configuration_has_no_problems():
    config = _config(a=TenantPlacement(0, 0, 60, 8), b=TenantPlacement(0, 0, 40, 4), c=TenantPlacement(0, 2))
    assert config.problems(["a", "b", "c"]) == []
    assert config.tenants_in(0, 0) == ["a", "b"]


def test_problems_name_each_fault():
    config = _config(a=TenantPlacement(0, 3), b=TenantPlacement(1, 0), c=TenantPlacement(0, 0, 0.0, 0))
    problems = " | ".join(config.problems(["a", "b", "c", "d"]))
    for words in ("instance 3", "GPU 1 does not exist", "mps_pct 0.0", "batch_size 0", "tenant d has no instance"):
        assert words in problems


def test_invalid_layout_and_mode_count_are_problems():
    layout = parse_layout("3g@0,4g@0", "a100-40gb")
    config = Configuration((layout,), ((SharingMode.MPS,),), {})
    problems = " | ".join(config.problems())
    assert "memory-overlap" in problems and "1 sharing modes for 2 instances" in problems


def test_gpu_without_mig_is_one_instance():
    layout = parse_layout("", "v100-16gb")
    config = Configuration((layout,), ((SharingMode.MPS,),), {"a": TenantPlacement(0, 0, 50)})
    assert config.problems(["a"]) == []


def test_each_tenant_s_gi_mode_and_company_are_read_from_its_placement():
    config = _config(a=TenantPlacement(0, 0, 60, 8), b=TenantPlacement(0, 0, 40, 4), c=TenantPlacement(0, 2), d=TenantPlacement(0, 1))
    layout = config.layouts[0]
    assert config.placed_in == {"a": (0, layout.instances[0], SharingMode.MPS, 2), "b": (0, layout.instances[0], SharingMode.MPS, 2),
                                "c": (0, layout.instances[2], SharingMode.PRIORITY_FILL, 1),
                                "d": (0, layout.instances[1], SharingMode.TIME_SLICE, 1)}
    assert config.tenants_in(0, 0) == ["a", "b"] and config.tenants_in(0, 2) == ["c"] and config.tenants_in(0, 1) == ["d"]
    config.tenants_in(0, 0).append("e")  # a caller's list: the configuration is unchanged
    assert config.tenants_in(0, 0) == ["a", "b"]
    plain = Configuration((parse_layout("", "v100-16gb"),), ((SharingMode.MPS,),), {"a": TenantPlacement(0, 0, 50)})
    assert plain.placed_in == {"a": (0, None, SharingMode.MPS, 1)}


def test_placement_keys_are_equal_exactly_where_placements_are():
    config = _config(a=TenantPlacement(0, 0, 60, 8), b=TenantPlacement(0, 0, 40, 4), c=TenantPlacement(0, 2), d=TenantPlacement(0, 1))
    # The same placements in another configuration (b left the GI, a's GI holds one tenant less).
    other = _config(a=TenantPlacement(0, 0, 60.0, 8), b=TenantPlacement(0, 2), c=TenantPlacement(0, 2), d=TenantPlacement(0, 1))
    keys, other_keys = config.placement_keys, other.placement_keys
    assert [keys[n] == other_keys[n] for n in "abcd"] == [True, False, True, True]
    assert len(set(keys.values())) == 4  # another share, batch, GI or mode: another key
    assert keys["a"] == (0, 0, config.layouts[0].instances[0].profile, 60.0, 8, "mps")
    plain = Configuration((parse_layout("", "v100-16gb"),), ((SharingMode.MPS,),), {"a": TenantPlacement(0, 0, 50)})
    assert plain.placement_keys == {"a": (0, None, None, 50.0, 1, "mps")}
