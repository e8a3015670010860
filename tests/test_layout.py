"""The layout model: counts from gpu-facts.md, validation rules, enumeration, change plans."""

from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.hardware import (
    GpuInstance,
    Layout,
    LayoutError,
    change_plan,
    enumerate_layouts,
    is_maximal,
    layout_violation,
    load_gpu,
    parse_layout,
    validate_layout,
)
from rlsched.hardware.layout import RULES


@pytest.mark.parametrize("gpu", ["a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"])
def test_maximal_layout_counts_match_gpu_facts(gpu):
    maximal = enumerate_layouts(gpu, maximal=True)
    assert len(maximal) == 19
    assert len({frozenset(layout.profile_counts().items()) for layout in maximal}) == 14
    # Drivers before R510 rejected 4g+3g: the papers' 18.
    assert len(enumerate_layouts(gpu, maximal=True, driver_major=470)) == 18
    # With the 2-memory-slice 1g under the memory-slice rule alone (UNCONFIRMED): 78 / 38.
    with_double = enumerate_layouts(gpu, variants=("standard", "double-memory"), maximal=True)
    assert len(with_double) == 78
    assert len({frozenset(layout.profile_counts().items()) for layout in with_double}) == 38


def test_a30_has_four_slices():
    maximal = {layout.spec() for layout in enumerate_layouts("a30-24gb", maximal=True)}
    assert "4g.24gb@0" in maximal and "2g.12gb@0,2g.12gb@2" in maximal
    assert "1g.6gb@0,1g.6gb@1,1g.6gb@2,1g.6gb@3" in maximal


def test_no_mig_gpu_has_no_layouts_and_rejects_any():
    assert enumerate_layouts("v100-16gb") == []
    layout = Layout("v100-16gb", (GpuInstance(0, "1g.5gb"),))
    assert layout_violation(layout).rule == "mig-unsupported"


@pytest.mark.parametrize(
    "spec, rule",
    [
        ("1g@7", "start-slot"),
        ("2g@6", "start-slot"),
        ("3g@2", "start-slot"),
        ("3g@0,4g@0", "memory-overlap"),
        ("2g@0,1g@1", "memory-overlap"),
        ("1g.5gb+me@0,1g.5gb+me@1", "max-count"),
    ],
)
def test_each_rule_is_named(spec, rule):
    with pytest.raises(LayoutError) as info:
        validate_layout(parse_layout(spec, "a100-40gb"))
    assert info.value.rule == rule


def test_compute_slice_rule(tmp_path):
    # On real A100/H100 start slots make the compute-slice rule redundant with the memory
    # rule; a catalog with fewer compute slices shows it is enforced.
    raw = yaml.safe_load(Path(load_gpu("a100-40gb").source_file).read_text())
    raw["compute_slices"] = 6
    raw["gi_profiles"] = [p for p in raw["gi_profiles"] if p["compute_slices"] <= 6]
    raw["forbidden_combinations"] = []
    raw["unconfirmed"] = {}
    path = tmp_path / "six.yaml"
    path.write_text(yaml.safe_dump(raw))
    gpu = load_gpu(path)
    assert layout_violation(parse_layout("3g@0,3g@4", gpu), gpu) is None
    violation = layout_violation(parse_layout("4g@0,3g@4", gpu), gpu)
    assert violation.rule == "compute-slices" and "7 compute slices" in str(violation)


def test_spec_parsing_round_trips_and_rejects_garbage():
    layout = parse_layout("3g.20gb@0, 2g@4,1g@6", "a100-40gb")
    assert layout.spec() == "3g.20gb@0,2g.10gb@4,1g.5gb@6"
    assert parse_layout(layout.spec(), "a100-40gb") == layout
    assert parse_layout("", "a100-40gb").instances == ()
    for bad, rule in [("3g", "syntax"), ("3g@x", "syntax"), ("3g@0,,1g@4", "syntax"), ("5g@0", "unknown-profile")]:
        with pytest.raises(LayoutError) as info:
            parse_layout(bad, "a100-40gb")
        assert info.value.rule == rule


def test_layout_equality_ignores_order():
    a = Layout("a100-40gb", (GpuInstance(4, "3g.20gb"), GpuInstance(0, "3g.20gb")))
    b = parse_layout("3g@0,3g@4", "a100-40gb")
    assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize("gpu", ["a100-40gb", "h100-80gb", "a30-24gb"])
def test_every_enumerated_layout_validates_and_maximal_is_a_subset(gpu):
    every = enumerate_layouts(gpu)
    assert len(set(every)) == len(every)
    for layout in every:
        validate_layout(layout)
    maximal = enumerate_layouts(gpu, maximal=True)
    assert set(maximal) <= set(every)
    assert all(is_maximal(layout) for layout in maximal)
    assert sum(is_maximal(layout) for layout in every) == len(maximal)


def _all_candidates(gpu_name):
    gpu = load_gpu(gpu_name)
    return [GpuInstance(start, p.name) for p in gpu.profiles.values() for start in range(gpu.memory_slices)]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_gi_sets_validate_or_fail_with_a_named_rule(data):
    gpu = data.draw(st.sampled_from(["a100-40gb", "h100-80gb", "a30-24gb"]))
    chosen = data.draw(st.lists(st.sampled_from(_all_candidates(gpu)), max_size=8))
    layout = Layout(gpu, tuple(chosen))
    violation = layout_violation(layout)
    valid_standard = set(enumerate_layouts(gpu, variants=("standard", "double-memory", "media-extension")))
    if violation is None:
        assert not chosen or layout in valid_standard
        gpu_spec = load_gpu(gpu)
        assert sum(gpu_spec.profiles[gi.profile].compute_slices for gi in layout) <= gpu_spec.compute_slices
    else:
        assert violation.rule in RULES
        assert layout not in valid_standard


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_change_plan_is_minimal_and_reaches_the_target(data):
    layouts = enumerate_layouts("a100-40gb")
    old = data.draw(st.sampled_from(layouts))
    new = data.draw(st.sampled_from(layouts))
    plan = change_plan(old, new)
    after = (Counter(old.instances) - Counter(plan.destroyed)) + Counter(plan.created)
    assert Layout("a100-40gb", tuple(after.elements())) == new
    assert set(plan.kept) == set(old.instances) & set(new.instances)
    # Nothing that stays is touched, nothing is both destroyed and created.
    assert not set(plan.destroyed) & set(plan.created)
    assert plan.is_noop == (old == new)
    assert plan.estimated_s >= 0 and (plan.estimated_s > 0) == (not plan.is_noop)


def test_change_plan_keeps_untouched_instances_running():
    old = parse_layout("3g@0,2g@4,1g@6", "a100-40gb")
    new = parse_layout("3g@0,1g@4,1g@5,1g@6", "a100-40gb")
    plan = change_plan(old, new)
    assert [gi.spec() for gi in plan.kept] == ["3g.20gb@0", "1g.5gb@6"]
    assert [gi.spec() for gi in plan.destroyed] == ["2g.10gb@4"]
    assert [gi.spec() for gi in plan.created] == ["1g.5gb@4", "1g.5gb@5"]
    assert plan.estimated_s == pytest.approx(0.20 + 2 * 0.16)


def test_staged_change_plan_creates_on_free_slices_before_it_breaks_anything():
    from rlsched.hardware import staged_change_plan

    old, new = parse_layout("3g@0,2g@4", "a100-40gb"), parse_layout("3g@0,1g@4,1g@5,1g@6", "a100-40gb")
    two_g, one_g6, one_g5 = GpuInstance(4, "2g.10gb"), GpuInstance(6, "1g.5gb"), GpuInstance(5, "1g.5gb")
    # The 2g's tenant moves to 1g@6 (free slice): create it, switch, then destroy the 2g.
    plan = staged_change_plan(old, new, {two_g: {one_g6}})
    assert [(op.kind, op.instance.spec()) for op in plan.operations] == [
        ("create", "1g.5gb@6"), ("destroy", "2g.10gb@4"), ("create", "1g.5gb@4"), ("create", "1g.5gb@5")]
    assert plan.broken == () and plan.estimated_s == pytest.approx(change_plan(old, new).estimated_s)
    # Moving to 1g@5 (inside the 2g) cannot be staged: the 2g is broken first.
    assert staged_change_plan(old, new, {two_g: {one_g5}}).broken == (two_g,)
    # An empty GI goes first, and nothing is broken for it.
    assert staged_change_plan(old, new, {}).operations[0].kind == "destroy" and staged_change_plan(old, new, {}).broken == ()


_A100_LAYOUTS = enumerate_layouts("a100-40gb")


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(_A100_LAYOUTS), st.sampled_from(_A100_LAYOUTS), st.randoms(use_true_random=False))
def test_every_moment_of_a_staged_plan_is_a_valid_layout(old, new, rnd):
    from rlsched.hardware import staged_change_plan

    plan = change_plan(old, new)
    moves = {o: {rnd.choice(new.instances)} for o in plan.destroyed if rnd.random() < 0.7}
    staged = staged_change_plan(old, new, moves)
    assert sorted(staged.created) == sorted(plan.created) and sorted(staged.destroyed) == sorted(plan.destroyed)
    live = set(old.instances)
    for op in staged.operations:
        if op.kind == "create":
            live.add(op.instance)
            assert layout_violation(Layout(old.gpu, tuple(live))) is None, staged
        else:
            live.remove(op.instance)
            # Unbroken destroys come after every GI their tenants move into.
            if not op.breaks and op.instance in moves:
                assert moves[op.instance] <= live
    assert live == set(new.instances)
