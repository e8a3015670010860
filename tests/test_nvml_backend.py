"""The NVML MIG backend against the fake NVML: plans, retries, verification, rollback, faults."""

import dataclasses
import itertools
from pathlib import Path

import pynvml
import pytest

from rlsched.node.fake_nvml import FakeNvml
from rlsched.node.nvml_backend import BackendError, NvmlMigBackend, RetryPolicy
from rlsched.hardware import LayoutError, load_gpu, parse_layout

#: The daemon decides every few seconds; a tenant must get an instance back within one interval.
DECISION_INTERVAL_S = 5.0

MUTATING = {"nvmlGpuInstanceDestroy", "nvmlComputeInstanceDestroy", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance", "nvmlDeviceSetMigMode"}


def backend_for(fake: FakeNvml, **kwargs) -> NvmlMigBackend:
    backend = NvmlMigBackend(fake, sleep=fake.sleep, clock=fake.clock, **kwargs)
    backend.__enter__()
    return backend


def layouts(*pairs: tuple[str, str]):
    return [parse_layout(spec, gpu) for gpu, spec in pairs]


def test_read_plan_and_dry_run_change_nothing():
    fake = FakeNvml(["a100-40gb", "h100-80gb"], layouts=["3g@0,3g@4", "7g@0"])
    backend = backend_for(fake)
    assert [lay.spec() for lay in backend.read_layouts()] == ["3g.20gb@0,3g.20gb@4", "7g.80gb@0"]
    targets = layouts(("a100-40gb", "3g@0,2g@4,1g@6"), ("h100-80gb", "7g@0"))
    text = str(backend.plan(targets))
    assert "keep     3g.20gb@0" in text and "destroy  3g.20gb@4" in text
    assert "create   2g.10gb@4" in text and "create   1g.5gb@6" in text and "nothing to change" in text
    report = backend.apply(targets)  # dry run by default
    assert report.dry_run and "dry run" in str(report)
    assert not MUTATING & set(fake.calls)
    assert fake.layout(0).spec() == "3g.20gb@0,3g.20gb@4"


def test_apply_keeps_unchanged_instances_running_and_creates_with_placements():
    fake = FakeNvml(["a100-40gb"], layouts=["3g@0,3g@4"])
    pid = fake.start_process(0, 0)  # a tenant on the 3g that stays
    gi_before = fake._gi_at(0, 0)
    backend = backend_for(fake)
    report = backend.apply(layouts(("a100-40gb", "3g@0,2g@4,1g@6")), dry_run=False)
    assert report.ok and report.gpus[0].outcome == "applied"
    assert fake.layout(0).spec() == "3g.20gb@0,2g.10gb@4,1g.5gb@6" and not fake.gis_without_ci(0)
    assert fake._gi_at(0, 0) is gi_before and pid in next(iter(gi_before.cis.values())).processes
    kinds = [(op.kind, op.instance.spec()) for op in report.gpus[0].operations]
    assert kinds == [
        ("destroy-ci", "3g.20gb@4"), ("destroy-gi", "3g.20gb@4"),
        ("create-gi", "2g.10gb@4"), ("create-ci", "2g.10gb@4"),
        ("create-gi", "1g.5gb@6"), ("create-ci", "1g.5gb@6"),
    ]
    assert "nvmlDeviceCreateGpuInstance" not in fake.calls  # never the driver's own placement
    # Applying again changes nothing.
    again = backend.apply(layouts(("a100-40gb", "3g@0,2g@4,1g@6")), dry_run=False)
    assert again.gpus[0].outcome == "unchanged" and again.gpus[0].operations == []


def test_profile_ids_are_resolved_through_nvml_and_mismatches_reported():
    fake = FakeNvml(["a100-40gb"], profile_id_overrides={"2g.10gb": 33})
    backend = backend_for(fake)
    plan = backend.plan(layouts(("a100-40gb", "2g@0")))
    assert "a100-40gb 2g.10gb (profile index 1): catalog profile id 14, NVML 33" in plan.gpus[0].notes
    assert plan.gpus[0].profile_ids == {"2g.10gb": 33} and not plan.problems
    assert backend.apply(layouts(("a100-40gb", "2g@0")), dry_run=False).ok
    assert fake.layout(0).spec() == "2g.10gb@0"


def test_a_catalog_that_contradicts_nvml_geometry_is_refused():
    spec = load_gpu("a100-40gb")
    odd = dataclasses.replace(spec.profiles["2g.10gb"], start_slots=(0, 2))
    device_spec = dataclasses.replace(spec, profiles={**spec.profiles, "2g.10gb": odd})
    fake = FakeNvml([device_spec])
    backend = backend_for(fake)
    plan = backend.plan(layouts(("a100-40gb", "2g@0")))
    assert any("start slots (0, 2, 4), NVML (0, 2)" in n for n in plan.gpus[0].notes)
    with pytest.raises(BackendError, match="2g.10gb: the catalog disagrees with NVML"):
        backend.apply(layouts(("a100-40gb", "2g@0")), dry_run=False)
    assert len(fake.layout(0)) == 0


def test_in_use_is_retried_with_bounded_backoff():
    fake = FakeNvml(["a100-40gb"], layouts=["7g@0"])
    fake.leak_handle(0, 0, times=2)  # leaked DCGM handles: IN_USE twice, then free
    sleeps = []
    backend = NvmlMigBackend(fake, sleep=lambda s: (sleeps.append(s), fake.sleep(s)), clock=fake.clock, retry=RetryPolicy(4, 0.1, 3.0))
    report = backend.apply(layouts(("a100-40gb", "4g@0,3g@4")), dry_run=False)
    assert report.ok and sleeps == pytest.approx([0.1, 0.3])
    destroy = next(op for op in report.gpus[0].operations if op.kind == "destroy-gi")
    assert destroy.attempts == 3
    assert report.gpus[0].unavailable_s == pytest.approx(0.22 + 0.4 + 0.21 + 0.20)  # destroy, waits, 2 creates


def test_a_busy_instance_makes_the_apply_roll_back_to_the_old_layout():
    fake = FakeNvml(["a100-40gb"], layouts=["3g@0,1g@4,1g@5,1g@6"])
    pid = fake.start_process(0, 5)  # the second of the GIs to destroy never becomes free
    backend = backend_for(fake)
    report = backend.apply(layouts(("a100-40gb", "3g@0,2g@4,1g@6")), dry_run=False)
    gpu = report.gpus[0]
    assert gpu.outcome == "rolled-back" and not report.ok
    assert "nvmlComputeInstanceDestroy" in gpu.error and "InUse" in gpu.error
    assert fake.layout(0).spec() == "3g.20gb@0,1g.5gb@4,1g.5gb@5,1g.5gb@6" == gpu.final.spec()
    assert not fake.gis_without_ci(0) and pid in next(iter(fake._gi_at(0, 5).cis.values())).processes
    failed = [op for op in gpu.operations if not op.ok]
    assert len(failed) == 1 and failed[0].attempts == RetryPolicy().attempts
    assert [op.kind for op in gpu.operations if op.rollback] == ["create-gi", "create-ci"]  # 1g@4 recreated


def test_no_permission_changes_nothing():
    fake = FakeNvml(["a100-40gb"], layouts=["7g@0"])
    fake.permission_denied = True
    report = backend_for(fake).apply(layouts(("a100-40gb", "4g@0,3g@4")), dry_run=False)
    assert report.gpus[0].outcome == "rolled-back" and "NoPermission" in report.gpus[0].error
    assert fake.layout(0).spec() == "7g.40gb@0" and report.gpus[0].unavailable_s == 0.0


def test_a_lost_gpu_is_reported_broken_without_raising():
    fake = FakeNvml(["a100-40gb"], layouts=["7g@0"])
    backend = backend_for(fake)
    targets = layouts(("a100-40gb", "4g@0,3g@4"))
    start = len(fake.calls)
    backend.apply(targets)  # a dry run makes the reads a real apply starts with
    reads = len(fake.calls) - start
    fake.inject_fault(reads + 2, pynvml.NVML_ERROR_GPU_IS_LOST, persistent=True)  # after the 7g is destroyed
    report = backend.apply(targets, dry_run=False)
    assert [op.kind for op in report.gpus[0].operations if op.ok] == ["destroy-ci", "destroy-gi"]
    assert report.gpus[0].outcome == "broken" and report.gpus[0].final is None
    assert "rollback failed" in report.gpus[0].error and "GpuIsLost" in report.gpus[0].error


def test_mig_off_is_reported_and_never_switched():
    fake = FakeNvml(["a100-40gb"], mig_enabled=False)
    backend = backend_for(fake)
    assert backend.read_layouts()[0].spec() == ""
    with pytest.raises(BackendError, match=r"MIG mode is off .*nvidia-smi -i 0 -mig 1"):
        backend.apply(layouts(("a100-40gb", "7g@0")), dry_run=False)
    assert backend.apply(layouts(("a100-40gb", "")), dry_run=False).gpus[0].outcome == "unchanged"
    assert "nvmlDeviceSetMigMode" not in fake.calls


def test_no_code_outside_the_fake_can_change_mig_mode():
    daemon = Path(__file__).resolve().parents[1] / "rlsched" / "daemon"
    for source in daemon.glob("*.py"):
        if source.name != "fake_nvml.py":
            assert "SetMigMode" not in source.read_text(), source


def test_invalid_targets_are_rejected_before_any_change():
    fake = FakeNvml(["a100-40gb", "h100-80gb"], layouts=["7g@0", "7g@0"])
    backend = backend_for(fake)
    with pytest.raises(LayoutError, match="overlap"):
        backend.apply(layouts(("a100-40gb", "3g@0,4g@0"), ("h100-80gb", "7g@0")), dry_run=False)
    with pytest.raises(BackendError, match="1 target layouts for a node of 2 GPUs"):
        backend.apply(layouts(("a100-40gb", "7g@0")), dry_run=False)
    with pytest.raises(BackendError, match="GPU 1 is a h100-80gb"):
        backend.apply(layouts(("a100-40gb", "7g@0"), ("a100-40gb", "7g@0")), dry_run=False)
    assert not MUTATING & set(fake.calls)
    # Drivers before R510 reject 4g+3g: the driver version read through NVML decides.
    old = FakeNvml(["a100-40gb"], driver_version="470.82.01", driver_major=470)
    with pytest.raises(LayoutError, match="forbidden-combination"):
        backend_for(old).apply(layouts(("a100-40gb", "4g@0,3g@4")), dry_run=False)


def test_a_failure_on_one_gpu_rolls_the_whole_node_back():
    fake = FakeNvml(["a100-40gb", "a100-40gb", "a100-40gb"], layouts=["7g@0", "7g@0", "7g@0"])
    fake.start_process(1, 0)
    report = backend_for(fake).apply(layouts(*[("a100-40gb", "4g@0,3g@4")] * 3), dry_run=False)
    assert [g.outcome for g in report.gpus] == ["rolled-back", "rolled-back", "skipped"]
    assert "GPU 1 failed" in report.gpus[0].error
    assert [fake.layout(i).spec() for i in range(3)] == ["7g.40gb@0"] * 3


def test_mig_device_uuids_map_each_instance():
    fake = FakeNvml(["h100-80gb"], layouts=["4g@0,2g@4,1g@6"])
    uuids = backend_for(fake).mig_device_uuids(0)
    assert sorted(gi.spec() for gi in uuids) == ["1g.10gb@6", "2g.20gb@4", "4g.40gb@0"]
    assert len(set(uuids.values())) == 3 and all(u.startswith("MIG-") for u in uuids.values())


# ---------------------------------------------------------------------------- fault injection

SCENARIOS = {
    "a100-split": ("a100-40gb", "3g@0,3g@4", "3g@0,2g@4,1g@6"),
    "h100-7g-to-four": ("h100-80gb", "7g@0", "1g@0,1g@1,2g@2,3g@4"),
}
CODES = [
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_NOT_FOUND,
    pynvml.NVML_ERROR_GPU_IS_LOST,
    pynvml.NVML_ERROR_IN_USE,
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES,
]


def run_scenario(name: str, fault=None):
    gpu, old, new = SCENARIOS[name]
    fake = FakeNvml([gpu], layouts=[old])
    backend = backend_for(fake)
    if fault is not None:
        fake.inject_fault(*fault[:2], after_effect=fault[2])
    start = len(fake.calls)
    try:
        report = backend.apply(layouts((gpu, new)), dry_run=False)
    except BackendError:
        report = None
    return fake, report, len(fake.calls) - start


CALLS = {name: run_scenario(name)[2] for name in SCENARIOS}
CASES = [(name, k) for name in SCENARIOS for k in range(CALLS[name])]


def test_the_clean_runs_apply_and_the_fault_matrix_covers_every_call():
    for name, (gpu, _, new) in SCENARIOS.items():
        fake, report, calls = run_scenario(name)
        assert report.ok and fake.layout(0) == parse_layout(new, gpu)
        assert calls > 30  # the matrix below injects at each of these


@pytest.mark.parametrize("after_effect", [False, True], ids=["before-effect", "lost-reply"])
@pytest.mark.parametrize("code", CODES)
@pytest.mark.parametrize("scenario, call_index", CASES)
def test_after_any_fault_the_gpu_is_in_the_old_or_the_new_layout(scenario, call_index, code, after_effect):
    gpu, old, new = SCENARIOS[scenario]
    fake, report, _ = run_scenario(scenario, (call_index, code, after_effect))
    state = fake.layout(0)
    assert not fake.gis_without_ci(0), "a GI without a compute instance serves no tenant"
    if report is None:  # NVML failed while reading, before any change
        assert state == parse_layout(old, gpu)
        return
    gpu_report = report.gpus[0]
    if gpu_report.outcome == "applied":
        assert state == parse_layout(new, gpu)
    else:
        assert gpu_report.outcome == "rolled-back", gpu_report.error
        assert state == parse_layout(old, gpu) and gpu_report.error
    assert gpu_report.final == state
    assert gpu_report.unavailable_s <= DECISION_INTERVAL_S


def test_the_fault_matrix_reaches_rollbacks_that_restore_destroyed_instances():
    outcomes = {"applied": 0, "restored": 0, "rolled-back": 0, "refused": 0}
    # IN_USE on a change is retried (applied); any other fault during the change rolls back.
    for (scenario, k), code in itertools.product(CASES, [pynvml.NVML_ERROR_IN_USE, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES]):
        _, report, _ = run_scenario(scenario, (k, code, False))
        if report is None:
            outcomes["refused"] += 1
        elif report.gpus[0].outcome == "applied":
            outcomes["applied"] += 1
        elif any(op.rollback and op.ok for op in report.gpus[0].operations):
            outcomes["restored"] += 1
        else:
            outcomes["rolled-back"] += 1
    assert all(count > 0 for count in outcomes.values()), outcomes


NODE = [("a100-40gb", "3g@0,3g@4", "3g@0,2g@4,1g@6"), ("a100-40gb", "7g@0", "4g@0,3g@4")]


def run_node(fault=None):
    fake = FakeNvml([gpu for gpu, _, _ in NODE], layouts=[old for _, old, _ in NODE])
    backend = backend_for(fake)
    if fault is not None:
        fake.inject_fault(*fault[:2], after_effect=fault[2])
    start = len(fake.calls)
    try:
        report = backend.apply(layouts(*[(gpu, new) for gpu, _, new in NODE]), dry_run=False)
    except BackendError:
        report = None
    return fake, report, len(fake.calls) - start


NODE_CALLS = run_node()[2]


@pytest.mark.parametrize("after_effect", [False, True], ids=["before-effect", "lost-reply"])
@pytest.mark.parametrize("call_index", range(NODE_CALLS))
def test_after_any_fault_the_whole_node_is_in_the_old_or_the_new_configuration(call_index, after_effect):
    fake, report, _ = run_node((call_index, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, after_effect))
    state = [fake.layout(i) for i in range(len(NODE))]
    old = [parse_layout(spec, gpu) for gpu, spec, _ in NODE]
    new = [parse_layout(spec, gpu) for gpu, _, spec in NODE]
    assert state in (old, new)
    assert report is None or report.ok == (state == new)
    assert not any(fake.gis_without_ci(i) for i in range(len(NODE)))
    if report is not None:
        assert all(g.unavailable_s <= DECISION_INTERVAL_S for g in report.gpus)
