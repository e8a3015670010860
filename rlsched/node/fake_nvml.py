"""An in-memory stand-in for the ``pynvml`` module (package ``nvidia-ml-py``), for tests and demos.

:class:`FakeNvml` exposes the NVML functions rlsched uses under their real names and
signatures (ctypes handles, ``byref`` structs and arrays), raises the real
``pynvml.NVMLError`` subclasses with the real codes, and follows the hardware catalog
(``rlsched.hardware``): placements, max counts, memory overlap and compute slices are
checked by the layout model itself, so the fake cannot drift from the rules the rest of
rlsched uses. Code handed a :class:`FakeNvml` instead of ``pynvml`` cannot tell them apart
(the contract is ``../shared/docs/gpu-facts.md`` sections 2 and 3).

Test controls (not part of NVML): :meth:`FakeNvml.inject_fault` (any error code at any
later call, once or for good, before or after the call's effect), :meth:`start_process`
(a busy instance: IN_USE on destroy), :meth:`leak_handle` (transient IN_USE, as leaked
DCGM handles cause), ``permission_denied`` (NO_PERMISSION on every change), :meth:`lose_gpu`
(GPU_IS_LOST), and a virtual clock that advances by the catalog's measured GI
create/destroy times and by :meth:`sleep`.
"""

from __future__ import annotations

import ctypes
import itertools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from rlsched.hardware.catalog import GiProfile, GpuSpec, load_gpu
from rlsched.hardware.layout import GpuInstance, Layout, layout_violation, parse_layout

#: Layout-model rule -> the NVML error the driver returns for a create that breaks it.
_RULE_ERRORS = {
    "start-slot": pynvml.NVML_ERROR_INVALID_ARGUMENT,
    "unknown-profile": pynvml.NVML_ERROR_INVALID_ARGUMENT,
    "memory-overlap": pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES,
    "max-count": pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES,
    "compute-slices": pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES,
    "forbidden-combination": pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES,
    "mig-unsupported": pynvml.NVML_ERROR_NOT_SUPPORTED,
}

#: Functions that change the GPU: these raise NO_PERMISSION when ``permission_denied``.
_MUTATING = frozenset(
    {
        "nvmlDeviceSetMigMode",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlDeviceCreateGpuInstance",
        "nvmlGpuInstanceDestroy",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlComputeInstanceDestroy",
    }
)


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _raiser(code: int) -> Callable[[], None]:
    """A check that reports ``code`` once the call's effect has happened (a lost reply)."""

    def check() -> None:
        raise _error(code)

    return check


@dataclass
class _FakeCi:
    ci_id: int
    compute_slices: int
    profile_id: int
    token: int
    mig_token: int
    processes: set[int] = field(default_factory=set)


@dataclass
class _FakeGi:
    gi_id: int
    profile: GiProfile
    profile_id: int
    start: int
    token: int
    cis: dict[int, _FakeCi] = field(default_factory=dict)
    leaked_in_use: int = 0
    memory_used_bytes: int = 0


@dataclass
class _FakeGpu:
    index: int
    spec: GpuSpec
    token: int
    uuid: str
    mig_current: int
    mig_pending: int
    profile_ids: dict[str, int]
    gis: dict[int, _FakeGi] = field(default_factory=dict)
    lost: bool = False


@dataclass
class _Fault:
    at_call: int
    code: int
    persistent: bool
    after_effect: bool


class FakeNvml:
    """A fake ``pynvml`` module holding the MIG state of a node in memory.

    :param gpus: catalog names (or specs) of the node's GPUs, index 0..G-1
    :param layouts: optional initial layout per GPU (spec strings or layouts); each GI gets
        one full-size CI, as rlsched creates them
    :param mig_enabled: initial MIG mode of every MIG-capable GPU
    :param profile_id_overrides: profile name -> the id this fake device reports instead of
        the catalog's (NVML ids are device specific: the backend must resolve them)
    :param driver_major: driver branch whose forbidden combinations apply (None: current)
    :param driver_version: what ``nvmlSystemGetDriverVersion`` returns
    """

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        gpus: Sequence[str | GpuSpec],
        layouts: Sequence[str | Layout] | None = None,
        mig_enabled: bool = True,
        profile_id_overrides: dict[str, int] | None = None,
        driver_major: int | None = None,
        driver_version: str = "550.90.07",
    ) -> None:
        self._tokens = itertools.count(0x1000, 0x10)
        self._pids = itertools.count(1000)
        self.driver_major = driver_major
        self.driver_version = driver_version
        self.permission_denied = False
        self.now_s = 0.0
        self.calls: list[str] = []
        self.initialized = 0
        self._faults: list[_Fault] = []
        self._objects: dict[int, Any] = {}
        self.gpus: list[_FakeGpu] = []
        for index, gpu in enumerate(gpus):
            spec = gpu if isinstance(gpu, GpuSpec) else load_gpu(gpu)
            mode = int(mig_enabled and spec.mig_supported)
            ids = {name: (profile_id_overrides or {}).get(name, p.nvml_profile_id) for name, p in spec.profiles.items()}
            fake = _FakeGpu(index, spec, self._new_token(None), f"GPU-{uuid.uuid5(uuid.NAMESPACE_OID, f'fake-{index}')}", mode, mode, ids)
            self._objects[fake.token] = fake
            self.gpus.append(fake)
        for fake, layout in zip(self.gpus, layouts or []):
            if layout and not fake.mig_current:
                raise ValueError(f"GPU {fake.index} ({fake.spec.name}) has MIG off: it cannot start with GIs")
            if isinstance(layout, str):
                layout = parse_layout(layout, fake.spec)
            for gi in layout:
                created = self._create_gi(fake, fake.spec.profiles[gi.profile], gi.start)
                self._create_ci(created, created.profile.compute_slices)

    # ------------------------------------------------------------------ test controls

    def inject_fault(self, after_calls: int, code: int, *, persistent: bool = False, after_effect: bool = False) -> None:
        """Make the NVML call ``after_calls`` calls from now raise ``NVMLError(code)``.

        :param persistent: keep failing every call from then on (else only that one)
        :param after_effect: the call takes effect and then reports the error (a lost reply)
        """
        self._faults.append(_Fault(len(self.calls) + after_calls, code, persistent, after_effect))

    def clear_faults(self) -> None:
        """Remove every injected fault."""
        self._faults.clear()

    def start_process(self, gpu_index: int, start: int) -> int:
        """Run a process on the GI starting at memory slot ``start`` (on its first CI); returns its pid."""
        gi = self._gi_at(gpu_index, start)
        if not gi.cis:
            raise ValueError(f"GI {gi.profile.name}@{start} has no CI to run a process on")
        pid = next(self._pids)
        gi.cis[min(gi.cis)].processes.add(pid)
        return pid

    def stop_process(self, pid: int) -> None:
        """End a process started with :meth:`start_process`."""
        for gpu in self.gpus:
            for gi in gpu.gis.values():
                for ci in gi.cis.values():
                    ci.processes.discard(pid)

    def set_memory_used(self, gpu_index: int, start: int, used_bytes: int) -> None:
        """Set the device memory in use on the GI starting at memory slot ``start``, bytes."""
        self._gi_at(gpu_index, start).memory_used_bytes = used_bytes

    def leak_handle(self, gpu_index: int, start: int, times: int) -> None:
        """Make the next ``times`` destroys of the GI at ``start`` fail with IN_USE (leaked DCGM handles)."""
        self._gi_at(gpu_index, start).leaked_in_use += times

    def instance_of_uuid(self, mig_uuid: str) -> tuple[int, int] | None:
        """(GPU index, GI start slot) of the MIG device with this UUID, or None (no NVML call logged)."""
        for index, gpu in enumerate(self.gpus):
            for gi, ci in self._mig_devices(gpu):
                if f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, f'fake-mig-{ci.mig_token}')}" == mig_uuid:
                    return index, gi.start
        return None

    def lose_gpu(self, gpu_index: int) -> None:
        """Every later call on this GPU raises GPU_IS_LOST."""
        self.gpus[gpu_index].lost = True

    def sleep(self, seconds: float) -> None:
        """Advance the virtual clock (inject as the backend's sleep)."""
        self.now_s += seconds

    def clock(self) -> float:
        """The virtual clock, seconds (inject as the backend's clock)."""
        return self.now_s

    def layout(self, gpu_index: int) -> Layout:
        """The GIs that exist on a GPU, read from the fake's state (not through NVML)."""
        gpu = self.gpus[gpu_index]
        return Layout(gpu.spec.name, tuple(GpuInstance(gi.start, gi.profile.name) for gi in gpu.gis.values()))

    def gis_without_ci(self, gpu_index: int) -> list[GpuInstance]:
        """GIs on which no tenant can run: they have no compute instance."""
        return sorted(GpuInstance(gi.start, gi.profile.name) for gi in self.gpus[gpu_index].gis.values() if not gi.cis)

    # ------------------------------------------------------------------ internals

    def _new_token(self, obj: Any) -> int:
        token = next(self._tokens)
        self._objects[token] = obj
        return token

    def _gi_at(self, gpu_index: int, start: int) -> _FakeGi:
        for gi in self.gpus[gpu_index].gis.values():
            if gi.start == start:
                return gi
        raise ValueError(f"no GI starts at slot {start} on GPU {gpu_index}")

    def _call(self, name: str) -> Callable[[], None]:
        """Log a call and raise an injected fault; returns the check to run after the effect."""
        index = len(self.calls)
        self.calls.append(name)
        for fault in self._faults:
            if fault.at_call == index or (fault.persistent and index > fault.at_call):
                if fault.after_effect and not fault.persistent:
                    return _raiser(fault.code)
                raise _error(fault.code)
        if self.permission_denied and name in _MUTATING:
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
        return lambda: None

    @staticmethod
    def _address(handle: Any, kind: Any) -> int:
        if not isinstance(handle, kind):
            raise TypeError(f"expected a {kind.__name__} handle, got {type(handle).__name__}")
        value = ctypes.cast(handle, ctypes.c_void_p).value
        if not value:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return value

    def _lookup(self, handle: Any, kind: Any, cls: type) -> Any:
        obj = self._objects.get(self._address(handle, kind))
        # A destroyed GI or CI leaves a dangling handle: NVML rejects it.
        if not isinstance(obj, cls):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = obj if isinstance(obj, _FakeGpu) else self._gpu_of(obj)
        if gpu.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return obj

    def _gpu_of(self, obj: _FakeGi | _FakeCi) -> _FakeGpu:
        for gpu in self.gpus:
            for gi in gpu.gis.values():
                if obj is gi or any(obj is ci for ci in gi.cis.values()):
                    return gpu
        raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _device(self, handle: Any, need_mig: bool = True) -> _FakeGpu:
        gpu = self._lookup(handle, pynvml.c_nvmlDevice_t, _FakeGpu)
        if need_mig and (not gpu.spec.mig_supported or gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _gi(self, handle: Any) -> _FakeGi:
        return self._lookup(handle, pynvml.c_nvmlGpuInstance_t, _FakeGi)

    def _ci(self, handle: Any) -> _FakeCi:
        return self._lookup(handle, pynvml.c_nvmlComputeInstance_t, _FakeCi)

    def _profile_by_id(self, gpu: _FakeGpu, profile_id: int) -> GiProfile:
        for name, pid in gpu.profile_ids.items():
            if pid == profile_id:
                return gpu.spec.profiles[name]
        raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _create_gi(self, gpu: _FakeGpu, profile: GiProfile, start: int) -> _FakeGi:
        current = self.layout(gpu.index)
        grown = Layout(gpu.spec.name, current.instances + (GpuInstance(start, profile.name),))
        violation = layout_violation(grown, gpu.spec, self.driver_major)
        if violation is not None:
            raise _error(_RULE_ERRORS[violation.rule])
        gi_id = next(i for i in itertools.count(1) if i not in gpu.gis)
        gi = _FakeGi(gi_id, profile, gpu.profile_ids[profile.name], start, token=0)
        gi.token = self._new_token(gi)
        gpu.gis[gi_id] = gi
        self.now_s += profile.create_s
        return gi

    def _ci_profiles(self, gi: _FakeGi) -> dict[int, int]:
        """CI profile index -> compute slices, for the CI profiles this GI size supports."""
        gpu = self._gpu_of(gi)
        return {
            _CI_PROFILE_INDEX[p.compute_slices]: p.compute_slices
            for p in gpu.spec.compute_instance_profiles[gi.profile.compute_slices]
            if p.compute_slices in _CI_PROFILE_INDEX
        }

    def _create_ci(self, gi: _FakeGi, compute_slices: int) -> _FakeCi:
        gpu = self._gpu_of(gi)
        limits = {p.compute_slices: p.max_count for p in gpu.spec.compute_instance_profiles[gi.profile.compute_slices]}
        used = sum(ci.compute_slices for ci in gi.cis.values())
        same = sum(ci.compute_slices == compute_slices for ci in gi.cis.values())
        if used + compute_slices > gi.profile.compute_slices or same >= limits[compute_slices]:
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in itertools.count(0) if i not in gi.cis)
        ci = _FakeCi(ci_id, compute_slices, _CI_PROFILE_INDEX[compute_slices], token=0, mig_token=0)
        ci.token = self._new_token(ci)
        ci.mig_token = self._new_token(("mig", ci))
        gi.cis[ci_id] = ci
        return ci

    def _mig_devices(self, gpu: _FakeGpu) -> list[tuple[_FakeGi, _FakeCi]]:
        return [(gi, gi.cis[c]) for g, gi in sorted(gpu.gis.items()) for c in sorted(gi.cis)]

    # ------------------------------------------------------------------ NVML: library and devices

    def nvmlInit(self) -> None:
        self._call("nvmlInit")()
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")()
        self.initialized = max(0, self.initialized - 1)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")()
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._call("nvmlDeviceGetHandleByIndex")()
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return ctypes.cast(ctypes.c_void_p(self.gpus[index].token), pynvml.c_nvmlDevice_t)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._call("nvmlDeviceGetName")()
        return self._device(handle, need_mig=False).spec.display_name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._call("nvmlDeviceGetUUID")()
        obj = self._objects.get(self._address(handle, pynvml.c_nvmlDevice_t))
        if isinstance(obj, tuple):  # a MIG device handle
            ci = obj[1]
            if self._objects.get(ci.token) is not ci:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, f'fake-mig-{ci.mig_token}')}"
        return self._device(handle, need_mig=False).uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        self._call("nvmlDeviceGetPciInfo")()
        gpu = self._device(handle, need_mig=False)
        info = pynvml.nvmlPciInfo_t()
        info.pciDeviceId = int(gpu.spec.pci_device_id, 16)
        info.busId = f"00000000:{0x10 + gpu.index:02X}:00.0".encode()
        return info

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        self._call("nvmlDeviceGetMigMode")()
        gpu = self._device(device, need_mig=False)
        if not gpu.spec.mig_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_current, gpu.mig_pending]

    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        check = self._call("nvmlDeviceSetMigMode")
        gpu = self._device(device, need_mig=False)
        if not gpu.spec.mig_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.gis:
            raise _error(pynvml.NVML_ERROR_IN_USE)
        gpu.mig_pending = mode
        # Hopper and later switch without a reset; Ampere waits for one (gpu-facts.md 2).
        if gpu.spec.architecture != "ampere":
            gpu.mig_current = mode
        check()
        return pynvml.NVML_SUCCESS

    # ------------------------------------------------------------------ NVML: GPU instances

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        self._call("nvmlDeviceGetGpuInstanceProfileInfo")()
        # Answers with MIG disabled, as a real H100 did (driver 580.159.04, probed read-only
        # 2026-11-26: docs/hardware-probes/), not on a GPU without MIG.
        gpu = self._device(device, need_mig=False)
        if not gpu.spec.mig_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        match = [p for p in gpu.spec.profiles.values() if p.nvml_profile_index == profile]
        if not match:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        p = match[0]
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t() if version == 2 else pynvml.c_nvmlGpuInstanceProfileInfo_t()
        info.id = gpu.profile_ids[p.name]
        info.sliceCount = p.compute_slices
        info.instanceCount = p.max_count
        info.multiprocessorCount = p.sm_count
        info.memorySizeMB = int(p.memory_gib * 1024)
        if version == 2:
            info.name = f"MIG {p.name}".encode()
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, device: Any, profileId: int, placementsRef: Any, countRef: Any) -> int:
        self._call("nvmlDeviceGetGpuInstancePossiblePlacements")()
        # Works with MIG disabled (gpu-facts.md 3), not on a GPU without MIG.
        gpu = self._device(device, need_mig=False)
        if not gpu.spec.mig_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile_by_id(gpu, profileId)
        count = _deref(countRef)
        if placementsRef is None:
            count.value = len(profile.start_slots)
            return pynvml.NVML_SUCCESS
        if count.value < len(profile.start_slots) or len(placementsRef) < len(profile.start_slots):
            count.value = len(profile.start_slots)
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(profile.start_slots):
            placementsRef[i].start, placementsRef[i].size = start, profile.memory_slices
        count.value = len(profile.start_slots)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: Any, profileId: int, placement: Any) -> Any:
        check = self._call("nvmlDeviceCreateGpuInstanceWithPlacement")
        gpu = self._device(device)
        profile = self._profile_by_id(gpu, profileId)
        where = _deref(placement)
        if not isinstance(where, pynvml.c_nvmlGpuInstancePlacement_t) or where.size != profile.memory_slices:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gi = self._create_gi(gpu, profile, where.start)
        check()
        return ctypes.cast(ctypes.c_void_p(gi.token), pynvml.c_nvmlGpuInstance_t)

    def nvmlDeviceGetGpuInstances(self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any) -> int:
        self._call("nvmlDeviceGetGpuInstances")()
        gpu = self._device(device)
        profile = self._profile_by_id(gpu, profileId)
        found = [gi.token for _, gi in sorted(gpu.gis.items()) if gi.profile.name == profile.name]
        return _fill(gpuInstancesRef, countRef, found, pynvml.c_nvmlGpuInstance_t)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        self._call("nvmlGpuInstanceGetInfo")()
        gi = self._gi(gpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = ctypes.cast(ctypes.c_void_p(self._gpu_of(gi).token), pynvml.c_nvmlDevice_t)
        info.id, info.profileId = gi.gi_id, gi.profile_id
        info.placement.start, info.placement.size = gi.start, gi.profile.memory_slices
        return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        check = self._call("nvmlGpuInstanceDestroy")
        gi = self._gi(gpuInstance)
        if gi.cis:
            raise _error(pynvml.NVML_ERROR_IN_USE)
        if gi.leaked_in_use > 0:
            gi.leaked_in_use -= 1
            raise _error(pynvml.NVML_ERROR_IN_USE)
        gpu = self._gpu_of(gi)
        del gpu.gis[gi.gi_id]
        del self._objects[gi.token]
        self.now_s += gi.profile.destroy_s
        check()
        return pynvml.NVML_SUCCESS

    # ------------------------------------------------------------------ NVML: compute instances

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, device: Any, profile: int, engProfile: int, version: int = 2) -> Any:
        self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo")()
        gi = self._gi(device)  # NVML names the GI handle "device" here
        supported = self._ci_profiles(gi)
        if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED or not 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if profile not in supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gpu = self._gpu_of(gi)
        limits = {p.compute_slices: p.max_count for p in gpu.spec.compute_instance_profiles[gi.profile.compute_slices]}
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t() if version == 2 else pynvml.c_nvmlComputeInstanceProfileInfo_t()
        info.id = profile
        info.sliceCount = supported[profile]
        info.instanceCount = limits[supported[profile]]
        info.multiprocessorCount = gi.profile.sm_count * supported[profile] // gi.profile.compute_slices
        if version == 2:
            info.name = f"MIG {supported[profile]}c.{gi.profile.name}".encode()
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        check = self._call("nvmlGpuInstanceCreateComputeInstance")
        gi = self._gi(gpuInstance)
        supported = self._ci_profiles(gi)
        if profileId not in supported:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        ci = self._create_ci(gi, supported[profileId])
        check()
        return ctypes.cast(ctypes.c_void_p(ci.token), pynvml.c_nvmlComputeInstance_t)

    def nvmlGpuInstanceGetComputeInstances(self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any) -> int:
        self._call("nvmlGpuInstanceGetComputeInstances")()
        gi = self._gi(gpuInstance)
        if profileId not in self._ci_profiles(gi):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = [ci.token for _, ci in sorted(gi.cis.items()) if ci.profile_id == profileId]
        return _fill(computeInstancesRef, countRef, found, pynvml.c_nvmlComputeInstance_t)

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        self._call("nvmlComputeInstanceGetInfo")()
        ci = self._ci(computeInstance)
        gi = next(g for gpu in self.gpus for g in gpu.gis.values() if ci in g.cis.values())
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.gpuInstance = ctypes.cast(ctypes.c_void_p(gi.token), pynvml.c_nvmlGpuInstance_t)
        info.id, info.profileId = ci.ci_id, ci.profile_id
        slices_before = sum(c.compute_slices for i, c in gi.cis.items() if i < ci.ci_id)
        info.placement.start, info.placement.size = slices_before, ci.compute_slices
        return info

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        check = self._call("nvmlComputeInstanceDestroy")
        ci = self._ci(computeInstance)
        if ci.processes:
            raise _error(pynvml.NVML_ERROR_IN_USE)
        for gpu in self.gpus:
            for gi in gpu.gis.values():
                if gi.cis.get(ci.ci_id) is ci:
                    del gi.cis[ci.ci_id]
        del self._objects[ci.token]
        self._objects.pop(ci.mig_token, None)
        check()
        return pynvml.NVML_SUCCESS

    # ------------------------------------------------------------------ NVML: MIG devices

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        self._call("nvmlDeviceGetMaxMigDeviceCount")()
        gpu = self._device(device, need_mig=False)
        return gpu.spec.compute_slices if gpu.spec.mig_supported else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        self._call("nvmlDeviceGetMigDeviceHandleByIndex")()
        gpu = self._device(device)
        devices = self._mig_devices(gpu)
        if not 0 <= index < len(devices):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return ctypes.cast(ctypes.c_void_p(devices[index][1].mig_token), pynvml.c_nvmlDevice_t)

    def _mig_entry(self, handle: Any) -> _FakeCi:
        obj = self._objects.get(self._address(handle, pynvml.c_nvmlDevice_t))
        if not (isinstance(obj, tuple) and self._objects.get(obj[1].token) is obj[1]):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj[1]

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        self._call("nvmlDeviceGetGpuInstanceId")()
        ci = self._mig_entry(device)
        return next(gi.gi_id for gpu in self.gpus for gi in gpu.gis.values() if ci in gi.cis.values())

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        # Per-instance memory info is supported in MIG mode (gpu-facts.md 3): a MIG device
        # handle reports its GI's memory, a whole-GPU handle the GPU's.
        self._call("nvmlDeviceGetMemoryInfo")()
        info = pynvml.c_nvmlMemory_t()  # version=None: the v1 struct (total, free, used)
        obj = self._objects.get(self._address(handle, pynvml.c_nvmlDevice_t))
        if isinstance(obj, tuple):
            ci = self._mig_entry(handle)
            gi = next(gi for gpu in self.gpus for gi in gpu.gis.values() if ci in gi.cis.values())
            total, used = int(gi.profile.memory_gib * 2**30), gi.memory_used_bytes
        else:
            gpu = self._device(handle, need_mig=False)
            total, used = int(gpu.spec.memory_gib * 2**30), sum(gi.memory_used_bytes for gi in gpu.gis.values())
        info.total, info.used, info.free = total, used, total - used
        return info

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        self._call("nvmlDeviceGetComputeInstanceId")()
        return self._mig_entry(device).ci_id

    # ------------------------------------------------------------------ everything else

    def __getattr__(self, name: str) -> Any:
        # Constants, structs and error classes come from the real module; an NVML function
        # this fake does not implement must fail loudly instead of reaching a real driver.
        if name.startswith("nvml"):
            raise AttributeError(f"FakeNvml does not implement {name}")
        return getattr(pynvml, name)


#: CI compute slices -> ``NVML_COMPUTE_INSTANCE_PROFILE_*_SLICE`` index.
_CI_PROFILE_INDEX = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}


def _fill(handles_ref: Any, count_ref: Any, tokens: list[int], handle_type: Any) -> int:
    """NVML's array-out contract: the caller's array gets one handle per token and the count
    its length, or INSUFFICIENT_SIZE when the array is too short."""
    if len(handles_ref) < len(tokens):
        raise _error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, token in enumerate(tokens):
        handles_ref[i] = ctypes.cast(ctypes.c_void_p(token), handle_type)
    _deref(count_ref).value = len(tokens)
    return pynvml.NVML_SUCCESS


def _deref(ref: Any) -> Any:
    """The object behind ``ctypes.byref(x)`` or ``ctypes.pointer(x)``."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    raise TypeError(f"expected ctypes.byref(...) or a pointer, got {type(ref).__name__}")
