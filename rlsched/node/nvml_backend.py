"""MIG through NVML: read a node's layouts, plan the minimal change, apply it safely.

The backend talks to the ``pynvml`` module of ``nvidia-ml-py`` (or to anything with the same
functions, such as :class:`rlsched.node.fake_nvml.FakeNvml`: the module is injected).
Rules it follows (``../shared/docs/gpu-facts.md`` sections 1-3):

- profile names are resolved to NVML profile ids on the device at run time (ids are device
  specific); what NVML reports is compared with the catalog and every mismatch reported;
- GIs are created with explicit placements, each with one full-size compute instance (CI);
- only what the hardware model's minimal change plan names is touched: instances present in
  both layouts keep running; the operations run in make-before-break order
  (:func:`rlsched.hardware.staged_change_plan`): a GI is created as soon as it fits next to
  the GIs still serving, an old GI is destroyed once the GIs its tenants move into exist,
  and :class:`StageHooks` start the new clients after each create and stop the old ones
  before each destroy (rollbacks included);
- destroy order is CIs, then the GI; IN_USE (busy instance, leaked DCGM handle) is retried
  with bounded exponential back-off;
- after applying, the layout is read back and compared; on any failure the GPU is driven
  back to the last good layout (and, by default, so is every other GPU of the node);
- MIG mode is never changed: a GPU with MIG off is reported, not reconfigured.

Nothing changes unless ``apply(..., dry_run=False)`` is called.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

from rlsched.errors import RlschedError
from rlsched.hardware.catalog import GpuSpec, gpu_names, load_gpu
from rlsched.hardware.layout import ChangePlan, GpuInstance, Layout, change_plan, staged_change_plan, validate_layout


class BackendError(RlschedError):
    """The node cannot be read or the request cannot be carried out; nothing was changed."""


class VerifyError(RlschedError):
    """The layout read back after applying is not the one asked for."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential back-off for NVML calls that return IN_USE.

    :param attempts: calls in total, the first included (>= 1)
    :param first_delay_s: wait before the second call, seconds
    :param backoff_factor: each later wait is this many times the previous one
    """

    attempts: int = 5
    first_delay_s: float = 0.05
    backoff_factor: float = 2.0

    def delays_s(self) -> list[float]:
        """The waits between attempts, seconds (``attempts - 1`` of them)."""
        return [self.first_delay_s * self.backoff_factor**i for i in range(self.attempts - 1)]


# ---------------------------------------------------------------------------- NVML reading


@dataclass(frozen=True)
class NvmlGiProfile:
    """A GI profile as NVML reports it on one device.

    :param index: the ``NVML_GPU_INSTANCE_PROFILE_*`` index it was queried with
    :param profile_id: the device-specific id used by create/get calls
    :param name: e.g. ``"3g.20gb"`` (NVML's ``"MIG "`` prefix removed)
    :param compute_slices: NVML's ``sliceCount``
    :param max_count: NVML's ``instanceCount``
    :param sm_count: streaming multiprocessors
    :param memory_mib: device memory, MiB
    :param start_slots: possible placements' starts, in memory slices
    :param memory_slices: the placements' size, in memory slices
    """

    index: int
    profile_id: int
    name: str
    compute_slices: int
    max_count: int
    sm_count: int
    memory_mib: int
    start_slots: tuple[int, ...]
    memory_slices: int


@dataclass(frozen=True)
class ObservedCi:
    """A compute instance read from NVML (``handle`` is invalid after any reconfiguration)."""

    ci_id: int
    profile_id: int
    compute_slices: int
    handle: Any = field(compare=False, repr=False)


@dataclass(frozen=True)
class ObservedGi:
    """A GPU instance read from NVML, with its compute instances.

    :param instance: profile (catalog or NVML name) and start slot
    :param gi_id: NVML's GI id (what ``nvidia-smi`` and MIG device handles show)
    :param profile_id: NVML profile id
    :param memory_slices: placement size
    """

    instance: GpuInstance
    gi_id: int
    profile_id: int
    memory_slices: int
    compute_instances: tuple[ObservedCi, ...]
    handle: Any = field(compare=False, repr=False)


def _nvml_name(raw: Any) -> str:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return text.removeprefix("MIG ").strip()


def possible_placements(nvml: Any, device: Any, profile_id: int) -> list[tuple[int, int]]:
    """(start, size) of every placement NVML offers a GI of ``profile_id``, in memory slices
    (answered with MIG disabled too); NVML errors are raised."""
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, None, ctypes.byref(count))
    found = (nvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, found, ctypes.byref(count))
    return [(found[i].start, found[i].size) for i in range(count.value)]


def read_gi_profiles(nvml: Any, device: Any, indices: Sequence[int] | None = None) -> dict[int, NvmlGiProfile]:
    """Every GI profile the device supports, keyed by NVML profile index.

    :param indices: the profile indices to ask about, every error raised: the backend asks
        for what the catalog promises, and a profile misread as unsupported would hide its
        GIs from every later read. None asks about every index NVML defines and skips the
        unsupported ones (the probe, on GPUs the catalog may not know).
    """
    found: dict[int, NvmlGiProfile] = {}
    skip = (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT) if indices is None else ()
    for index in indices if indices is not None else range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(device, index)
        except nvml.NVMLError as exc:
            if exc.value in skip:  # this device has no such profile
                continue
            exc.function = f"nvmlDeviceGetGpuInstanceProfileInfo(profile index {index})"  # name the profile
            raise
        placements = possible_placements(nvml, device, info.id)
        starts = tuple(sorted(start for start, _ in placements))
        size = placements[0][1] if placements else 0
        found[index] = NvmlGiProfile(
            index, info.id, _nvml_name(info.name), info.sliceCount, info.instanceCount,
            info.multiprocessorCount, int(info.memorySizeMB), starts, size,
        )
    return found


@dataclass(frozen=True)
class CatalogMatch:
    """How a device's NVML profiles compare with the catalog.

    :param profile_ids: catalog profile name -> NVML id on this device (usable profiles only)
    :param mismatches: one line per disagreement, for the operator
    :param unusable: catalog profiles whose name or geometry NVML contradicts (or lacks):
        layouts using them are refused
    """

    profile_ids: dict[str, int]
    mismatches: tuple[str, ...]
    unusable: frozenset[str]


def match_catalog(spec: GpuSpec, profiles: dict[int, NvmlGiProfile]) -> CatalogMatch:
    """Compare the catalog's GI profiles of ``spec`` with what NVML reported."""
    ids: dict[str, int] = {}
    mismatches: list[str] = []
    unusable: set[str] = set()
    for p in spec.profiles.values():
        seen = profiles.get(p.nvml_profile_index)
        where = f"{spec.name} {p.name} (profile index {p.nvml_profile_index})"
        if seen is None:
            mismatches.append(f"{where}: not supported by the device")
            unusable.add(p.name)
            continue
        # Geometry decides whether a layout means the same thing on the device: refuse on mismatch.
        geometry = {
            "name": (p.name, seen.name),
            "start slots": (p.start_slots, seen.start_slots),
            "memory slices": (p.memory_slices, seen.memory_slices),
            "compute slices": (p.compute_slices, seen.compute_slices),
        }
        # Informational: ids are device specific (we use NVML's), counts and SMs are not placements.
        info = {
            "profile id": (p.nvml_profile_id, seen.profile_id),
            "max count": (p.max_count, seen.max_count),
            "SMs": (p.sm_count, seen.sm_count),
        }
        for label, (ours, theirs) in {**geometry, **info}.items():
            if ours != theirs:
                mismatches.append(f"{where}: catalog {label} {ours}, NVML {theirs}")
        # Every capacity check uses the catalog's memory: more than the device has would place
        # tenants that do not fit (less only wastes memory, so it is not reported).
        catalog_mib = round(p.memory_gib * 1024)
        if catalog_mib > seen.memory_mib:
            mismatches.append(f"{where}: catalog memory {catalog_mib} MiB, NVML {seen.memory_mib} MiB "
                              f"(more than the device has: set memory_gib to {seen.memory_mib / 1024:g})")
        if any(ours != theirs for ours, theirs in geometry.values()):
            unusable.add(p.name)
        else:
            ids[p.name] = seen.profile_id
    return CatalogMatch(ids, tuple(mismatches), frozenset(unusable))


def ci_profile_index(nvml: Any, compute_slices: int) -> int:
    """The ``NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE`` index of a CI of ``compute_slices``."""
    return getattr(nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{compute_slices}_SLICE")


def _ci_profiles(nvml: Any, gi_handle: Any, indices: Sequence[int] | None) -> list[tuple[int, int, int]]:
    """(CI profile id, compute slices, max count) of the CI profiles of a GI.

    :param indices: the CI profile indices to ask about, every error raised (the backend
        asks for what the catalog promises); None asks about every index NVML defines and
        skips the unsupported ones (the probe, on GPUs the catalog may not know)
    """
    found = []
    skip = (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT) if indices is None else ()
    for index in indices if indices is not None else range(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi_handle, index, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        except nvml.NVMLError as exc:
            if exc.value in skip:
                continue
            raise
        found.append((info.id, info.sliceCount, info.instanceCount))
    return found


class InstanceReader:
    """Reads GIs and their CIs; caches CI profiles per GI profile (they are device constants).

    :param nvml: the pynvml module (or a fake)
    :param device: NVML device handle
    :param profiles: NVML profile id -> (name to report, max count)
    :param ci_indices: NVML profile id -> the CI profile indices its GIs must offer (None:
        discover them, skipping unsupported ones)
    """

    def __init__(self, nvml: Any, device: Any, profiles: dict[int, tuple[str, int]], ci_indices: dict[int, list[int]] | None = None) -> None:
        self.nvml, self.device, self.profiles, self.ci_indices = nvml, device, profiles, ci_indices
        self._ci_cache: dict[int, list[tuple[int, int, int]]] = {}

    def ci_profiles(self, gi_profile_id: int, gi_handle: Any) -> list[tuple[int, int, int]]:
        """(CI profile id, compute slices, max count) for GIs of this profile."""
        if gi_profile_id not in self._ci_cache:
            indices = None if self.ci_indices is None else self.ci_indices[gi_profile_id]
            self._ci_cache[gi_profile_id] = _ci_profiles(self.nvml, gi_handle, indices)
        return self._ci_cache[gi_profile_id]

    def read(self) -> list[ObservedGi]:
        """Every GI of the known profiles, sorted by start slot."""
        nvml = self.nvml
        observed = []
        for profile_id, (name, max_count) in self.profiles.items():
            handles = (nvml.c_nvmlGpuInstance_t * max(max_count, 1))()
            count = ctypes.c_uint(0)
            nvml.nvmlDeviceGetGpuInstances(self.device, profile_id, handles, ctypes.byref(count))
            for i in range(count.value):
                info = nvml.nvmlGpuInstanceGetInfo(handles[i])
                cis = []
                for ci_profile_id, slices, ci_max in self.ci_profiles(profile_id, handles[i]):
                    ci_handles = (nvml.c_nvmlComputeInstance_t * max(ci_max, 1))()
                    ci_count = ctypes.c_uint(0)
                    nvml.nvmlGpuInstanceGetComputeInstances(handles[i], ci_profile_id, ci_handles, ctypes.byref(ci_count))
                    for j in range(ci_count.value):
                        ci_info = nvml.nvmlComputeInstanceGetInfo(ci_handles[j])
                        cis.append(ObservedCi(ci_info.id, ci_profile_id, slices, ci_handles[j]))
                observed.append(
                    ObservedGi(
                        GpuInstance(info.placement.start, name), info.id, profile_id, info.placement.size,
                        tuple(sorted(cis, key=lambda c: c.ci_id)), handles[i],
                    )
                )
        return sorted(observed, key=lambda o: o.instance)


def read_mig_uuids(nvml: Any, device: Any) -> dict[int, str]:
    """GI id -> ``MIG-...`` UUID of its first MIG device (compute instance), from NVML."""
    found: dict[int, str] = {}
    for mig_index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(device)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, mig_index)
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_NOT_FOUND:  # indices need not be dense
                continue
            raise
        found.setdefault(nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetUUID(mig))
    return found


def catalog_gpu_for_pci_id(pci_device_id: int) -> GpuSpec | None:
    """The catalog GPU type with this PCI device id (e.g. ``0x20B010DE``), or None."""
    for name in gpu_names():
        spec = load_gpu(name)
        if int(spec.pci_device_id, 16) == pci_device_id:
            return spec
    return None


# ---------------------------------------------------------------------------- plans and reports


@dataclass(frozen=True)
class GpuPlan:
    """What applying would do to one GPU.

    :param gpu_index: NVML device index
    :param gpu: catalog GPU type
    :param current: the layout read from the device
    :param target: the layout asked for
    :param change: the minimal change (kept, destroyed, created; catalog time estimate)
    :param profile_ids: catalog profile name -> NVML id on this device, for the profiles involved
    :param problems: reasons the change cannot be applied (empty when it can)
    :param notes: catalog mismatches and other facts worth printing
    """

    gpu_index: int
    gpu: str
    current: Layout
    target: Layout
    change: ChangePlan
    profile_ids: dict[str, int]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """The plan as text, one operation per line."""
        head = f"GPU {self.gpu_index} ({self.gpu}): {self.current.spec() or '(no GIs)'} -> {self.target.spec() or '(no GIs)'}"
        out = [head]
        if self.change.is_noop:
            out.append("  nothing to change")
        for gi in self.change.kept:
            out.append(f"  keep     {gi.spec():<16} (its tenants keep running)")
        for gi in self.change.destroyed:
            out.append(f"  destroy  {gi.spec():<16} (its CIs, then the GI; profile id {self.profile_ids.get(gi.profile, '?')})")
        for gi in self.change.created:
            out.append(f"  create   {gi.spec():<16} (GI at start {gi.start} with placement, then one full-size CI; profile id {self.profile_ids.get(gi.profile, '?')})")
        if not self.change.is_noop:
            out.append(f"  estimated {self.change.estimated_s:.2f} s of GI create/destroy (catalog times)")
        out += [f"  note: {n}" for n in self.notes]
        out += [f"  PROBLEM: {p}" for p in self.problems]
        return out


@dataclass(frozen=True)
class NodePlan:
    """The plans of every GPU of the node, printable with ``str()``."""

    gpus: tuple[GpuPlan, ...]

    @property
    def problems(self) -> list[str]:
        """Every problem of every GPU, prefixed with its GPU."""
        return [f"GPU {g.gpu_index}: {p}" for g in self.gpus for p in g.problems]

    @property
    def is_noop(self) -> bool:
        """True when no GPU changes."""
        return all(g.change.is_noop for g in self.gpus)

    def __str__(self) -> str:
        return "\n".join(line for g in self.gpus for line in g.lines())


@dataclass(frozen=True)
class Operation:
    """One NVML change carried out (or tried), with times from the backend's clock.

    :param kind: ``destroy-ci``, ``destroy-gi``, ``create-gi`` or ``create-ci``
    :param instance: the GI concerned
    :param started_s: clock reading before the first attempt, seconds
    :param finished_s: clock reading after the last attempt, seconds
    :param attempts: calls made (more than one after IN_USE retries)
    :param ok: whether it succeeded
    :param rollback: part of a rollback
    """

    kind: str
    instance: GpuInstance
    started_s: float
    finished_s: float
    attempts: int
    ok: bool
    rollback: bool


#: Outcomes of one GPU's apply.
OUTCOMES = ("planned", "unchanged", "applied", "skipped", "rolled-back", "broken")


@dataclass
class GpuApplyReport:
    """What happened to one GPU.

    :param outcome: ``planned`` (dry run), ``unchanged`` (already there), ``applied``
        (verified), ``skipped`` (not tried because another GPU failed first; untouched),
        ``rolled-back`` (failed; the old layout is in place, verified), or
        ``broken`` (failed and the old layout could not be restored: operator attention)
    :param old: the layout before
    :param target: the layout asked for
    :param final: the layout read at the end (None if it could not be read)
    :param operations: every change tried, in order
    :param error: what failed, one line (None on success)
    """

    gpu_index: int
    outcome: str
    old: Layout
    target: Layout
    final: Layout | None
    operations: list[Operation] = field(default_factory=list)
    error: str | None = None

    @property
    def unavailable_s(self) -> float:
        """Longest time any tenant of this GPU may have lacked an instance, seconds.

        From the start of the first successful destroy (its tenants lose their instance) to
        the end of the last successful operation: every tenant that lost its instance has its
        new one (or, after a rollback, its old one) by then. 0 when nothing was destroyed.
        """
        done = [op for op in self.operations if op.ok]
        destroys = [op.started_s for op in done if op.kind.startswith("destroy")]
        if not destroys:
            return 0.0
        return max(op.finished_s for op in done) - min(destroys)


@dataclass
class ApplyReport:
    """The result of :meth:`NvmlMigBackend.apply` for a node.

    :param dry_run: True when only the plan was computed
    :param plan: the plan that was (or would be) carried out
    :param gpus: one report per GPU
    """

    dry_run: bool
    plan: NodePlan
    gpus: list[GpuApplyReport]

    @property
    def ok(self) -> bool:
        """True when every GPU is in its target layout (or it was a dry run)."""
        return all(g.outcome in ("planned", "unchanged", "applied") for g in self.gpus)

    def __str__(self) -> str:
        lines = [str(self.plan)]
        if self.dry_run:
            lines.append("dry run: nothing changed (apply to carry out)")
        for g in self.gpus:
            if g.outcome != "planned":
                extra = f": {g.error}" if g.error else ""
                lines.append(f"GPU {g.gpu_index}: {g.outcome}, tenants without an instance for at most {g.unavailable_s:.2f} s{extra}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- the backend


class StageHooks(Protocol):
    """What the tenants' clients do around each GI operation of a staged change.

    ``rollback`` is True while the backend drives a GPU back to its last good layout (the
    goal is then the old configuration)."""

    def created(self, gpu_index: int, instance: GpuInstance, rollback: bool) -> None:
        """The GI and its compute instance exist: start the clients the goal puts there
        (next to their running clients), wait until they are ready, switch, stop the old ones."""

    def before_destroy(self, gpu_index: int, instance: GpuInstance, rollback: bool) -> None:
        """The GI is about to go: move or stop every client still running on it."""



class NamingNvml:
    """Wraps an NVML module so that every NVMLError it raises names the call (``exc.function``)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if not (name.startswith("nvml") and callable(value)):
            return value
        error_class = self._nvml.NVMLError

        @functools.wraps(value)
        def named(*args: Any) -> Any:
            try:
                return value(*args)
            except error_class as exc:
                if not getattr(exc, "function", None):
                    exc.function = name
                raise

        return named


@dataclass
class NvmlDevice:
    """One GPU of the node as the backend sees it.

    :param index: NVML device index
    :param handle: NVML device handle (valid until the driver resets)
    :param spec: its catalog GPU type
    :param mig_current: NVML's current MIG mode
    :param mig_pending: the mode after the next reset
    :param match: NVML profile ids and catalog mismatches
    :param reader: reads its GIs and CIs
    """

    index: int
    handle: Any
    spec: GpuSpec
    mig_current: int
    mig_pending: int
    match: CatalogMatch
    reader: InstanceReader


class NvmlMigBackend:
    """MIG layouts of a node's GPUs through NVML.

    Use as a context manager (``nvmlInit`` / ``nvmlShutdown``)::

        with NvmlMigBackend() as backend:
            print(backend.plan(targets))
            report = backend.apply(targets, dry_run=False)

    :param nvml: the ``pynvml`` module or a stand-in with the same functions (None: import
        ``pynvml``)
    :param gpu_types: catalog GPU type per device index; None detects it by PCI device id
    :param retry: back-off for IN_USE
    :param sleep: waits between retries (inject a fake to keep tests instant), seconds
    :param clock: monotonic clock for the report's timings, seconds
    :param node_atomic: on a failure on one GPU, also roll back the GPUs already changed so
        that the node is in the old configuration or the new one, never a mix
    """

    def __init__(
        self,
        nvml: Any = None,
        *,
        gpu_types: Sequence[str] | None = None,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        node_atomic: bool = True,
    ) -> None:
        if nvml is None:
            import pynvml as nvml
        self.nvml = NamingNvml(nvml)
        self.gpu_types = list(gpu_types) if gpu_types is not None else None
        self.retry, self.sleep, self.clock, self.node_atomic = retry, sleep, clock, node_atomic
        self._devices: list[NvmlDevice] | None = None
        self._moves_to: Sequence[dict[GpuInstance, set[GpuInstance]]] | None = None  # of the apply in progress
        self._hooks: StageHooks | None = None
        self.driver_major: int | None = None

    def __enter__(self) -> Self:
        self.nvml.nvmlInit()
        return self

    def __exit__(self, *exc: object) -> None:
        self.nvml.nvmlShutdown()

    # -------------------------------------------------------------- reading

    def devices(self, refresh: bool = True) -> list[NvmlDevice]:
        """The node's GPUs with their catalog type, MIG mode and profile ids.

        :param refresh: read them again (every public call does: MIG mode and handles can
            change under us, and a transient error must not stick)
        """
        if self._devices is None or refresh:
            nvml = self.nvml
            version = nvml.nvmlSystemGetDriverVersion()
            self.driver_major = int(str(version).split(".")[0])
            devices = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                pci_id = nvml.nvmlDeviceGetPciInfo(handle).pciDeviceId
                spec = self._spec_for(index, pci_id)
                if not spec.mig_supported:
                    match = CatalogMatch({}, (), frozenset())
                    current = pending = nvml.NVML_DEVICE_MIG_DISABLE
                else:
                    current, pending = nvml.nvmlDeviceGetMigMode(handle)
                    if current == nvml.NVML_DEVICE_MIG_ENABLE:
                        indices = [p.nvml_profile_index for p in spec.profiles.values()]
                        match = match_catalog(spec, read_gi_profiles(nvml, handle, indices))
                    else:  # profile queries need MIG on; nothing to read or create anyway
                        match = CatalogMatch({}, (), frozenset())
                profiles = {pid: (name, spec.profiles[name].max_count) for name, pid in match.profile_ids.items()}
                ci_indices = {
                    pid: [ci_profile_index(nvml, ci.compute_slices) for ci in spec.compute_instance_profiles[spec.profiles[name].compute_slices]]
                    for name, pid in match.profile_ids.items()
                }
                devices.append(NvmlDevice(index, handle, spec, current, pending, match, InstanceReader(nvml, handle, profiles, ci_indices)))
            self._devices = devices
        return self._devices

    def _spec_for(self, index: int, pci_id: int) -> GpuSpec:
        detected = catalog_gpu_for_pci_id(pci_id)
        if self.gpu_types is not None:
            if index >= len(self.gpu_types):
                raise BackendError(f"GPU {index} has no entry in gpu_types ({len(self.gpu_types)} given)")
            return load_gpu(self.gpu_types[index])
        if detected is None:
            raise BackendError(f"GPU {index}: PCI device id 0x{pci_id:08X} is in no catalog file (known: {', '.join(gpu_names())}); pass gpu_types")
        return detected

    def _observe(self, device: NvmlDevice) -> list[ObservedGi]:
        if device.mig_current != self.nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        return device.reader.read()

    @staticmethod
    def _layout_of(device: NvmlDevice, observed: list[ObservedGi]) -> Layout:
        return Layout(device.spec.name, tuple(o.instance for o in observed))

    def read_layouts(self) -> list[Layout]:
        """The current layout of every GPU, index 0..G-1 (empty on GPUs with MIG off)."""
        try:
            return [self._layout_of(d, self._observe(d)) for d in self.devices()]
        except self.nvml.NVMLError as exc:
            raise BackendError(f"NVML: {describe_nvml_error(exc)}") from exc

    def mig_device_uuids(self, gpu_index: int, raw: bool = False) -> dict[GpuInstance, str]:
        """GI -> the ``MIG-...`` UUID of its (first) compute instance: what ``CUDA_VISIBLE_DEVICES`` takes.

        Re-read after every reconfiguration: MIG device handles are reused with other properties.

        :param raw: let NVML errors through (from :class:`StageHooks`, inside an apply whose
            rollback handles them) instead of raising :class:`BackendError`
        """
        if raw:
            return self._mig_device_uuids(gpu_index)
        try:
            return self._mig_device_uuids(gpu_index)
        except self.nvml.NVMLError as exc:
            raise BackendError(f"NVML: {describe_nvml_error(exc)}") from exc

    def _mig_device_uuids(self, gpu_index: int) -> dict[GpuInstance, str]:
        device = self.devices()[gpu_index]
        if device.mig_current != self.nvml.NVML_DEVICE_MIG_ENABLE:
            return {}
        by_gi_id = {o.gi_id: o.instance for o in self._observe(device)}
        return {by_gi_id[gi_id]: uuid for gi_id, uuid in read_mig_uuids(self.nvml, device.handle).items() if gi_id in by_gi_id}

    # -------------------------------------------------------------- planning

    def plan(self, targets: Sequence[Layout]) -> NodePlan:
        """The minimal change from the current layouts to ``targets`` (one per GPU); changes nothing.

        Raises :class:`BackendError` when NVML cannot be read, LayoutError for an invalid target.
        """
        try:
            return self._plan(targets, {d.index: self._observe(d) for d in self.devices()})
        except self.nvml.NVMLError as exc:
            raise BackendError(f"NVML: {describe_nvml_error(exc)}") from exc

    def _plan(self, targets: Sequence[Layout], observed: dict[int, list[ObservedGi]]) -> NodePlan:
        devices = self.devices(refresh=False)
        if len(targets) != len(devices):
            raise BackendError(f"{len(targets)} target layouts for a node of {len(devices)} GPUs")
        plans = []
        for device, target in zip(devices, targets):
            spec = device.spec
            if target.gpu != spec.name:
                raise BackendError(f"GPU {device.index} is a {spec.name}, the target layout is for a {target.gpu}")
            validate_layout(target, spec, self.driver_major)
            current = self._layout_of(device, observed[device.index])
            problems = []
            if target.instances and device.mig_current != self.nvml.NVML_DEVICE_MIG_ENABLE:
                problems.append(
                    f"MIG mode is off (pending: {'on' if device.mig_pending else 'off'}); rlsched never changes it: "
                    f"run `nvidia-smi -i {device.index} -mig 1` yourself (A100/A30 reset the GPU)"
                )
            change = change_plan(current, target)
            used = {gi.profile for gi in change.destroyed + change.created}
            for name in sorted(used & device.match.unusable):
                problems.append(f"profile {name}: the catalog disagrees with NVML (see notes); fix {spec.source_file}")
            ids = {name: pid for name, pid in device.match.profile_ids.items() if name in used | {gi.profile for gi in change.kept}}
            plans.append(GpuPlan(device.index, spec.name, current, target, change, ids, tuple(problems), device.match.mismatches))
        return NodePlan(tuple(plans))

    # -------------------------------------------------------------- applying

    def apply(self, targets: Sequence[Layout], dry_run: bool = True, *,
              moves_to: Sequence[dict[GpuInstance, set[GpuInstance]]] | None = None, hooks: StageHooks | None = None) -> ApplyReport:
        """Plan, and unless ``dry_run``, carry out the change to ``targets`` (one layout per GPU).

        :param moves_to: per GPU, per old GI holding tenants, the GIs they move into (orders
            the operations make-before-break, :func:`~rlsched.hardware.staged_change_plan`);
            None: tenants unknown, create what fits first, then destroy
        :param hooks: start and stop the tenants' clients around the operations

        NVML failures do not raise: each GPU's report says whether it is in the target
        layout (``applied``/``unchanged``), back in the old one (``rolled-back``), or neither
        (``broken``). Raises :class:`BackendError` (nothing changed) when the node cannot be
        read or the plan has problems, LayoutError for an invalid target.
        """
        try:
            devices = self.devices()
            observed = {d.index: self._observe(d) for d in devices}
        except self.nvml.NVMLError as exc:
            raise BackendError(f"NVML, before any change: {describe_nvml_error(exc)}") from exc
        plan = self._plan(targets, observed)
        self._moves_to, self._hooks = moves_to, hooks
        reports = [GpuApplyReport(p.gpu_index, "planned", p.current, p.target, p.current) for p in plan.gpus]
        if dry_run:
            return ApplyReport(True, plan, reports)
        if plan.problems:
            raise BackendError("; ".join(plan.problems))
        for device, gpu_plan, report in zip(devices, plan.gpus, reports):
            if gpu_plan.change.is_noop and all(o.compute_instances for o in observed[device.index]):
                report.outcome = "unchanged"
                continue
            self._apply_one(device, report, observed[device.index])
            if report.outcome != "applied" and self.node_atomic:
                for earlier in reports[: device.index]:
                    if earlier.outcome == "applied":
                        self._roll_back(devices[earlier.gpu_index], earlier, f"GPU {device.index} failed")
                for later in reports[device.index + 1 :]:
                    later.outcome = "skipped"
                break
        return ApplyReport(False, plan, reports)

    def _apply_one(self, device: NvmlDevice, report: GpuApplyReport, observed: list[ObservedGi]) -> None:
        try:
            self._reconcile(device, report.target, report.operations, rollback=False, observed=observed)
            report.final = self._verify(device, report.target)
            report.outcome = "applied"
        except (self.nvml.NVMLError, VerifyError) as exc:
            self._roll_back(device, report, describe_nvml_error(exc))

    def _roll_back(self, device: NvmlDevice, report: GpuApplyReport, why: str) -> None:
        report.error = why
        try:
            self._reconcile(device, report.old, report.operations, rollback=True)
            report.final = self._verify(device, report.old)
            report.outcome = "rolled-back"
        except (self.nvml.NVMLError, VerifyError) as exc:
            report.outcome = "broken"
            report.error = f"{why}; rollback failed: {describe_nvml_error(exc)}"
            try:
                report.final = self._layout_of(device, self._observe(device))
            except self.nvml.NVMLError:
                report.final = None

    def _verify(self, device: NvmlDevice, expected: Layout) -> Layout:
        observed = self._observe(device)
        seen = self._layout_of(device, observed)
        if seen != expected:
            raise VerifyError(f"read back {seen.spec() or '(no GIs)'}, expected {expected.spec() or '(no GIs)'}")
        bare = [o.instance.spec() for o in observed if not o.compute_instances]
        if bare:
            raise VerifyError(f"GIs without a compute instance: {', '.join(bare)}")
        return seen

    def _reconcile(self, device: NvmlDevice, target: Layout, ops: list[Operation], rollback: bool, observed: list[ObservedGi] | None = None) -> None:
        """Drive the GPU from what it holds to ``target`` with the fewest changes.

        The same routine applies and rolls back. A rollback passes no ``observed`` and so
        re-reads the hardware: a half-finished apply (or a call whose reply was lost) is
        taken as it really is. The forward path reuses the read its plan was made from.
        """
        observed_map = {o.instance: o for o in (self._observe(device) if observed is None else observed)}
        current = Layout(device.spec.name, tuple(observed_map))
        change = change_plan(current, target)
        hooks = self._hooks
        moves_to = None if rollback or self._moves_to is None else {o: set(t) for o, t in self._moves_to[device.index].items() if o in observed_map}
        for gi in change.kept:
            # A CI destroyed by an interrupted apply leaves its GI unusable: give it one back
            # first, so that clients can move back to it before anything else is destroyed.
            if not observed_map[gi].compute_instances:
                self._create_full_ci(device, gi, observed_map[gi].profile_id, observed_map[gi].handle, ops, rollback)
                if hooks is not None:
                    hooks.created(device.index, gi, rollback)
        for op in staged_change_plan(current, target, moves_to).operations:
            gi = op.instance
            if op.kind == "destroy":
                if hooks is not None:
                    hooks.before_destroy(device.index, gi, rollback)
                for ci in observed_map[gi].compute_instances:
                    self._do(ops, "destroy-ci", gi, rollback, self.nvml.nvmlComputeInstanceDestroy, ci.handle)
                self._do(ops, "destroy-gi", gi, rollback, self.nvml.nvmlGpuInstanceDestroy, observed_map[gi].handle)
                continue
            profile_id = device.match.profile_ids[gi.profile]
            placement = self.nvml.c_nvmlGpuInstancePlacement_t(gi.start, device.spec.profiles[gi.profile].memory_slices)
            handle = self._do(
                ops, "create-gi", gi, rollback, self.nvml.nvmlDeviceCreateGpuInstanceWithPlacement,
                device.handle, profile_id, ctypes.byref(placement),
            )
            self._create_full_ci(device, gi, profile_id, handle, ops, rollback)
            if hooks is not None:
                hooks.created(device.index, gi, rollback)

    def _create_full_ci(self, device: NvmlDevice, gi: GpuInstance, profile_id: int, handle: Any, ops: list[Operation], rollback: bool) -> None:
        slices = device.spec.profiles[gi.profile].compute_slices
        full = [pid for pid, ci_slices, _ in device.reader.ci_profiles(profile_id, handle) if ci_slices == slices]
        if not full:
            raise VerifyError(f"{gi.spec()}: NVML offers no {slices}-slice compute instance profile (catalog: {device.spec.source_file})")
        self._do(ops, "create-ci", gi, rollback, self.nvml.nvmlGpuInstanceCreateComputeInstance, handle, full[0])

    def _do(self, ops: list[Operation], kind: str, gi: GpuInstance, rollback: bool, function: Callable[..., Any], *args: Any) -> Any:
        """Call one changing NVML function, retrying IN_USE with back-off; record it in ``ops``."""
        started = self.clock()
        delays = self.retry.delays_s()
        for attempt in range(1, self.retry.attempts + 1):
            try:
                result = function(*args)
            except self.nvml.NVMLError as exc:
                if exc.value != self.nvml.NVML_ERROR_IN_USE or attempt == self.retry.attempts:
                    ops.append(Operation(kind, gi, started, self.clock(), attempt, False, rollback))
                    raise
                self.sleep(delays[attempt - 1])
                continue
            ops.append(Operation(kind, gi, started, self.clock(), attempt, True, rollback))
            return result
        raise AssertionError("unreachable: the last attempt returns or raises")


def describe_nvml_error(exc: BaseException) -> str:
    """One line naming the NVML call, the error class and its code (e.g. ``NVMLError_InUse (code 19)``)."""
    function = getattr(exc, "function", None)
    code = getattr(exc, "value", None)
    # str() of an NVMLError may ask the driver for the text: the class name needs no driver.
    text = f"{type(exc).__name__} (code {code})" if isinstance(code, int) else str(exc)
    return f"{function}: {text}" if function else text
