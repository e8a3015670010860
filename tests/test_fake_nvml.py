"""The fake NVML follows the contract of gpu-facts.md sections 2-3 and looks like pynvml."""

import ctypes
import inspect

import pynvml
import pytest

from rlsched.node.fake_nvml import FakeNvml
from rlsched.hardware import load_gpu

IN_USE, INSUFFICIENT, INVALID = pynvml.NVML_ERROR_IN_USE, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, pynvml.NVML_ERROR_INVALID_ARGUMENT


def error_code(call, *args) -> int:
    with pytest.raises(pynvml.NVMLError) as info:
        call(*args)
    return info.value.value


def create(nvml, device, profile_id: int, start: int, size: int):
    placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
    return nvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, profile_id, ctypes.byref(placement))


@pytest.fixture
def a100():
    nvml = FakeNvml(["a100-40gb"])
    nvml.nvmlInit()
    return nvml, nvml.nvmlDeviceGetHandleByIndex(0)


def test_every_fake_function_has_the_signature_of_pynvml():
    names = [n for n in dir(FakeNvml) if n.startswith("nvml")]
    assert len(names) >= 25
    for name in names:
        ours = list(inspect.signature(getattr(FakeNvml, name)).parameters)[1:]  # without self
        theirs = list(inspect.signature(getattr(pynvml, name)).parameters)
        assert ours == theirs, name


def test_errors_are_the_real_pynvml_classes_and_unknown_functions_fail_loudly(a100):
    nvml, device = a100
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(nvml, device, 0, 0, 8)
        create(nvml, device, 0, 0, 8)
    assert nvml.NVML_ERROR_IN_USE == 19 and nvml.c_nvmlGpuInstance_t is pynvml.c_nvmlGpuInstance_t
    with pytest.raises(AttributeError, match="does not implement"):
        nvml.nvmlDeviceGetPowerUsage(device)


def test_profile_info_takes_an_index_and_reports_the_catalog(a100):
    nvml, device = a100
    spec = load_gpu("a100-40gb")
    for profile in spec.profiles.values():
        info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(device, profile.nvml_profile_index)
        assert (info.id, info.name, info.instanceCount) == (profile.nvml_profile_id, f"MIG {profile.name}", profile.max_count)
    assert error_code(nvml.nvmlDeviceGetGpuInstanceProfileInfo, device, pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert error_code(nvml.nvmlDeviceGetGpuInstanceProfileInfo, device, 99) == INVALID


def test_possible_placements_follow_the_catalog_even_with_mig_off():
    nvml = FakeNvml(["a100-40gb"], mig_enabled=False)
    device = nvml.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, 14, None, ctypes.byref(count))
    assert count.value == 3
    small = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
    count2 = ctypes.c_uint(2)
    assert error_code(nvml.nvmlDeviceGetGpuInstancePossiblePlacements, device, 14, small, ctypes.byref(count2)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * 3)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, 14, placements, ctypes.byref(count))
    assert [(p.start, p.size) for p in placements] == [(0, 2), (2, 2), (4, 2)]
    # MIG off: nothing can be created or listed, and the mode is left alone.
    assert error_code(create, nvml, device, 14, 0, 2) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml.nvmlDeviceGetMigMode(device) == [0, 0]


@pytest.mark.parametrize(
    "existing, profile_id, start, size, code",
    [
        ([], 19, 7, 1, INVALID),  # a 1g never starts at slot 7
        ([], 14, 6, 2, INVALID),  # a 2g never at 6
        ([], 14, 0, 1, INVALID),  # wrong placement size
        ([(9, 0, 4)], 14, 2, 2, INSUFFICIENT),  # overlaps the 3g
        ([(20, 0, 1)], 20, 1, 1, INSUFFICIENT),  # 1g+me: max count 1
        ([(9, 0, 4), (14, 4, 2), (19, 6, 1)], 19, 7, 1, INVALID),
        ([(5, 0, 4), (14, 4, 2), (19, 6, 1)], 19, 7, 1, INVALID),
        ([(9, 0, 4), (19, 4, 1), (19, 5, 1), (19, 6, 1)], 15, 6, 2, INSUFFICIENT),  # memory slice 6 taken
        ([], 77, 0, 1, INVALID),  # no such profile id
    ],
)
def test_creates_that_break_a_hardware_rule_fail_with_the_real_code(a100, existing, profile_id, start, size, code):
    nvml, device = a100
    for pid, s, n in existing:
        create(nvml, device, pid, s, n)
    before = nvml.layout(0)
    assert error_code(create, nvml, device, profile_id, start, size) == code
    assert nvml.layout(0) == before


def test_a_7th_compute_slice_rule_rejects_3g_3g_1g():
    nvml = FakeNvml(["a100-40gb"], layouts=["3g@0,2g@4"])
    device = nvml.nvmlDeviceGetHandleByIndex(0)
    create(nvml, device, 19, 6, 1)  # 3 + 2 + 1 = 6 compute slices: fine
    nvml2 = FakeNvml(["a100-40gb"], layouts=["4g@0,2g@4"])
    # 4 + 2 + 1 = 7: fine as well; an 8th compute slice would not be.
    create(nvml2, nvml2.nvmlDeviceGetHandleByIndex(0), 19, 6, 1)
    assert nvml2.layout(0).spec() == "4g.20gb@0,2g.10gb@4,1g.5gb@6"


def test_destroy_order_in_use_and_stale_handles(a100):
    nvml, device = a100
    gi = create(nvml, device, 14, 0, 2)
    ci_profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, 0)
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
    assert error_code(nvml.nvmlGpuInstanceDestroy, gi) == IN_USE  # CIs first
    pid = nvml.start_process(0, 0)
    assert error_code(nvml.nvmlComputeInstanceDestroy, ci) == IN_USE  # a process runs on it
    nvml.stop_process(pid)
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.leak_handle(0, 0, times=2)
    assert error_code(nvml.nvmlGpuInstanceDestroy, gi) == IN_USE
    assert error_code(nvml.nvmlGpuInstanceDestroy, gi) == IN_USE
    nvml.nvmlGpuInstanceDestroy(gi)
    assert len(nvml.layout(0)) == 0
    # Handles are invalid after a destroy, even once the slot is reused.
    create(nvml, device, 14, 0, 2)
    assert error_code(nvml.nvmlGpuInstanceGetInfo, gi) == INVALID
    assert error_code(nvml.nvmlComputeInstanceDestroy, ci) == INVALID


def test_listing_fills_ctypes_arrays_with_usable_handles():
    nvml = FakeNvml(["a100-40gb"], layouts=["1g@0,1g@3,1g@6"])
    device = nvml.nvmlDeviceGetHandleByIndex(0)
    handles = (pynvml.c_nvmlGpuInstance_t * 7)()
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstances(device, 19, handles, ctypes.byref(count))
    starts = [nvml.nvmlGpuInstanceGetInfo(handles[i]).placement.start for i in range(count.value)]
    assert sorted(starts) == [0, 3, 6]
    too_small = (pynvml.c_nvmlGpuInstance_t * 2)()
    assert error_code(nvml.nvmlDeviceGetGpuInstances, device, 19, too_small, ctypes.byref(count)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE


def test_permission_lost_gpu_and_injected_faults(a100):
    nvml, device = a100
    nvml.permission_denied = True
    assert error_code(create, nvml, device, 0, 0, 8) == pynvml.NVML_ERROR_NO_PERMISSION
    assert len(nvml.layout(0)) == 0
    nvml.permission_denied = False
    nvml.inject_fault(0, IN_USE)
    assert error_code(create, nvml, device, 0, 0, 8) == IN_USE
    assert len(nvml.layout(0)) == 0  # a fault before the effect changes nothing
    nvml.inject_fault(0, pynvml.NVML_ERROR_UNKNOWN, after_effect=True)
    assert error_code(create, nvml, device, 0, 0, 8) == pynvml.NVML_ERROR_UNKNOWN
    assert nvml.layout(0).spec() == "7g.40gb@0"  # the reply was lost, the GI exists
    nvml.lose_gpu(0)
    assert error_code(nvml.nvmlDeviceGetMigMode, device) == pynvml.NVML_ERROR_GPU_IS_LOST
    assert error_code(nvml.nvmlDeviceGetHandleByIndex, 0) == pynvml.NVML_ERROR_GPU_IS_LOST


def test_clock_advances_by_the_catalog_times(a100):
    nvml, device = a100
    gi = create(nvml, device, 9, 0, 4)
    assert nvml.clock() == pytest.approx(load_gpu("a100-40gb").profile("3g").create_s)
    nvml.nvmlGpuInstanceDestroy(gi)
    nvml.sleep(1.0)
    assert nvml.clock() == pytest.approx(0.20 + 0.21 + 1.0)


def test_mig_device_handles_give_mig_uuids():
    nvml = FakeNvml(["h100-80gb"], layouts=["4g@0,3g@4"])
    device = nvml.nvmlDeviceGetHandleByIndex(0)
    uuids = set()
    for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(device)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, index)
        except pynvml.NVMLError_NotFound:
            continue
        uuids.add(nvml.nvmlDeviceGetUUID(mig))
    assert len(uuids) == 2 and all(u.startswith("MIG-") for u in uuids)
    assert nvml.nvmlDeviceGetUUID(device).startswith("GPU-")
