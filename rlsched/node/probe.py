"""``rlsched probe``: a read-only report of what NVML sees on this machine.

GPUs (name, UUID, PCI device id matched to the catalog), MIG mode (current and pending),
the GI profiles NVML offers with their placements (also with MIG off), the GIs with profile names and
placements, their CIs and MIG device UUIDs, and where NVML and the catalog disagree.
Nothing is changed: only NVML get-calls are made.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rlsched.node.nvml_backend import (
    BackendError,
    InstanceReader,
    NamingNvml,
    catalog_gpu_for_pci_id,
    describe_nvml_error,
    match_catalog,
    read_gi_profiles,
    read_mig_uuids,
)
from rlsched.errors import RlschedError


class NoDriverError(RlschedError):
    """No NVIDIA driver or NVML library on this machine."""


@dataclass
class ProbeInstance:
    """One GI: NVML id, profile, placement (memory slices), CIs and MIG device UUID."""

    gi_id: int
    profile_id: int
    profile: str
    start: int
    size: int
    compute_instances: list[dict[str, int]]
    mig_uuid: str | None


@dataclass
class ProbeGpu:
    """One GPU as NVML reports it.

    :param pci_device_id: e.g. ``"0x20B010DE"``
    :param catalog: the matching catalog GPU type, or None
    :param mig_current: ``enabled``, ``disabled`` or ``unsupported``
    :param mig_pending: the mode after the next reset (same words)
    :param profiles: GI profiles NVML offers (also with MIG off: what enabling it would offer)
    :param mismatches: where NVML and the catalog disagree
    """

    index: int
    name: str
    uuid: str
    pci_device_id: str
    catalog: str | None
    mig_current: str
    mig_pending: str
    profiles: list[dict[str, Any]] = field(default_factory=list)
    instances: list[ProbeInstance] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)


@dataclass
class ProbeReport:
    """Everything NVML reported: driver version and GPUs."""

    driver_version: str
    gpus: list[ProbeGpu]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    def __str__(self) -> str:
        lines = [f"NVIDIA driver {self.driver_version}, {len(self.gpus)} GPU(s)"]
        for g in self.gpus:
            mig = g.mig_current if g.mig_current == g.mig_pending else f"{g.mig_current} (pending: {g.mig_pending})"
            lines.append(f"GPU {g.index}: {g.name} {g.uuid} pci {g.pci_device_id} catalog {g.catalog or '(unknown)'} MIG {mig}")
            for p in g.profiles:
                starts = ",".join(map(str, p["start_slots"]))
                lines.append(
                    f"  profile {p['name']:<12} id {p['profile_id']:>2} index {p['index']:>2} max {p['max_count']} "
                    f"SMs {p['sm_count']} memory {p['memory_mib']} MiB placements start {starts} size {p['memory_slices']}"
                )
            if g.mig_current == "enabled" and not g.instances:
                lines.append("  no GPU instances")
            for gi in g.instances:
                cis = ", ".join(f"CI {c['ci_id']} ({c['compute_slices']} slices)" for c in gi.compute_instances) or "no CI"
                lines.append(f"  GI {gi.gi_id}: {gi.profile}@{gi.start} (size {gi.size}, profile id {gi.profile_id}) {cis} {gi.mig_uuid or ''}".rstrip())
            lines += [f"  mismatch: {m}" for m in g.mismatches]
        return "\n".join(lines)


def _mode(nvml: Any, value: int) -> str:
    return "enabled" if value == nvml.NVML_DEVICE_MIG_ENABLE else "disabled"


def probe(nvml: Any) -> ProbeReport:
    """Read the node through an initialized NVML module (``pynvml`` or a fake); changes nothing."""
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        pci_id = nvml.nvmlDeviceGetPciInfo(handle).pciDeviceId
        spec = catalog_gpu_for_pci_id(pci_id)
        gpu = ProbeGpu(index, str(nvml.nvmlDeviceGetName(handle)), str(nvml.nvmlDeviceGetUUID(handle)), f"0x{pci_id:08X}", spec.name if spec else None, "unsupported", "unsupported")
        gpus.append(gpu)
        try:
            current, pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError as exc:
            if exc.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                raise
            continue
        gpu.mig_current, gpu.mig_pending = _mode(nvml, current), _mode(nvml, pending)
        # NVML answers the profile and placement queries with MIG off too (seen on an H100,
        # driver 580.159.04): the catalog can be checked before MIG is enabled.
        profiles = read_gi_profiles(nvml, handle)
        gpu.profiles = [asdict(p) | {"start_slots": list(p.start_slots)} for p in profiles.values()]
        if spec is not None:
            gpu.mismatches = list(match_catalog(spec, profiles).mismatches)
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            continue
        reader = InstanceReader(nvml, handle, {p.profile_id: (p.name, p.max_count) for p in profiles.values()})
        uuids = read_mig_uuids(nvml, handle)
        for gi in reader.read():
            cis = [{"ci_id": c.ci_id, "profile_id": c.profile_id, "compute_slices": c.compute_slices} for c in gi.compute_instances]
            gpu.instances.append(ProbeInstance(gi.gi_id, gi.profile_id, gi.instance.profile, gi.instance.start, gi.memory_slices, cis, uuids.get(gi.gi_id)))
    return ProbeReport(str(nvml.nvmlSystemGetDriverVersion()), gpus)


def probe_node(nvml: Any = None) -> ProbeReport:
    """Initialize NVML, probe, shut NVML down.

    :param nvml: None imports ``pynvml`` (raises :class:`NoDriverError` on a machine
        without an NVIDIA driver)
    """
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as exc:
            raise NoDriverError(f"the nvidia-ml-py package (module pynvml) is not installed: {exc}") from exc
    nvml = NamingNvml(nvml)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NoDriverError(
            f"no NVIDIA driver found: NVML could not start ({type(exc).__name__}, code {exc.value}); "
            "run this on a machine with an NVIDIA GPU and its driver (libnvidia-ml.so.1)"
        ) from exc
    try:
        return probe(nvml)
    except nvml.NVMLError as exc:
        raise BackendError(f"NVML failed while probing: {describe_nvml_error(exc)}") from exc
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # a failing shutdown (e.g. a lost GPU) must not hide the report or the first error
