"""The MIG catalog: one YAML file per GPU type under ``configs/hardware/``.

This is the single source of truth for GPU-instance (GI) profiles, their placements and
their sizes. The layout model, the performance model, the simulator, the ILP and the NVML
backend all read it through :func:`load_gpu`; none of them hard-codes a profile.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rlsched.errors import ConfigError

#: Profile variants. Layout enumeration uses the ``standard`` ones unless asked otherwise.
VARIANTS = ("standard", "media-extension", "double-memory")


@dataclass(frozen=True)
class ComputeInstanceProfile:
    """A compute-instance (CI) profile inside a GI: splits only the GI's SMs.

    :param name: e.g. ``"2c"``
    :param compute_slices: SM slices the CI owns
    :param max_count: how many such CIs fit in one GI of the owning size
    """

    name: str
    compute_slices: int
    max_count: int


@dataclass(frozen=True)
class GiProfile:
    """A GPU-instance profile of one GPU type.

    :param name: the NVIDIA name, e.g. ``"3g.20gb"``
    :param variant: ``standard``, ``media-extension`` (+me) or ``double-memory`` (the
        2-memory-slice 1g)
    :param nvml_profile_id: the id NVML reports (device specific: resolve through NVML on
        real hardware)
    :param nvml_profile_index: the ``NVML_GPU_INSTANCE_PROFILE_*`` index passed to
        ``nvmlDeviceGetGpuInstanceProfileInfo``
    :param compute_slices: SM slices owned
    :param memory_slices: memory slices owned (placements are counted in these)
    :param sm_count: streaming multiprocessors owned
    :param memory_gib: device memory, GiB
    :param start_slots: memory-slice indices at which the GI may start
    :param max_count: most GIs of this profile on one GPU
    :param create_s: measured GI creation time, seconds
    :param destroy_s: measured GI destruction time, seconds
    :param unconfirmed: field name -> why its value is not confirmed on hardware
    """

    name: str
    variant: str
    nvml_profile_id: int
    nvml_profile_index: int
    compute_slices: int
    memory_slices: int
    sm_count: int
    memory_gib: float
    start_slots: tuple[int, ...]
    max_count: int
    create_s: float
    destroy_s: float
    unconfirmed: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def short_name(self) -> str:
        """The compute-size prefix, e.g. ``"3g"``: the short form used in layout specs."""
        return self.name.split(".", 1)[0]


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type: its totals, its GI profiles and its rules.

    :param name: catalog key, e.g. ``"a100-40gb"``
    :param pci_device_id: e.g. ``"0x20B010DE"``; mig-parted's ``device-filter``
    :param mig_supported: False for GPUs shared only with MPS (e.g. V100)
    :param memory_gib: whole-GPU memory, GiB
    :param sm_count: whole-GPU SMs (without MIG)
    :param memory_slices: MIG memory slices (0 without MIG)
    :param compute_slices: MIG compute slices (0 without MIG)
    :param profiles: GI profile name -> profile, in file order
    :param compute_instance_profiles: GI compute slices -> CI profiles of such a GI
    :param forbidden_combinations: (profile names, driver major version before which the
        combination was rejected)
    :param unconfirmed: GPU-level field -> why its value is not confirmed
    :param source_file: the file it was loaded from
    """

    name: str
    display_name: str
    pci_device_id: str
    architecture: str
    mig_supported: bool
    memory_gib: float
    sm_count: int
    memory_slices: int
    compute_slices: int
    profiles: dict[str, GiProfile]
    compute_instance_profiles: dict[int, tuple[ComputeInstanceProfile, ...]]
    forbidden_combinations: tuple[tuple[frozenset[str], int], ...]
    unconfirmed: dict[str, str]
    source_file: str

    def profile(self, name: str) -> GiProfile:
        """The GI profile called ``name`` (full name or short form such as ``"3g"``).

        The short form picks the ``standard`` variant of that compute size.
        """
        if name in self.profiles:
            return self.profiles[name]
        for profile in self.profiles.values():
            if profile.variant == "standard" and profile.short_name == name:
                return profile
        allowed = ", ".join(self.profiles) or "none: this GPU has no MIG"
        raise KeyError(f"{self.name} has no GI profile '{name}' (allowed: {allowed})")

    def profiles_of(self, variants: tuple[str, ...] = ("standard",)) -> list[GiProfile]:
        """The profiles whose variant is in ``variants``, in catalog order."""
        return [p for p in self.profiles.values() if p.variant in variants]


def _hardware_dir() -> Path:
    return Path(str(resources.files("rlsched.configs") / "hardware"))


def gpu_names() -> list[str]:
    """Names of every GPU type in the packaged catalog, sorted."""
    return sorted(p.stem for p in _hardware_dir().glob("*.yaml"))


@functools.cache
def load_gpu(name_or_path: str | Path) -> GpuSpec:
    """Load a GPU type by catalog name (``"a100-40gb"``) or from a YAML file path.

    Raises :class:`ConfigError` naming the file, field and value of anything malformed.
    """
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = _hardware_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ConfigError("configs/hardware", "name", str(name_or_path), f"unknown GPU type (known: {', '.join(gpu_names())})")
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(path, "<file>", None, f"cannot read YAML: {exc}") from exc
    return _parse_gpu(raw, path)


class _Reader:
    """Typed field access on a YAML mapping that names file and field in every error."""

    def __init__(self, source: Path, raw: Any, prefix: str = "") -> None:
        self.source, self.prefix = source, prefix
        if not isinstance(raw, dict):
            raise ConfigError(source, prefix or "<root>", raw, "expected a mapping")
        self.raw = raw

    def path(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.raw:
            if default is not ...:
                return default
            raise ConfigError(self.source, self.path(key), None, "missing")
        value = self.raw[key]
        # bool is an int in Python: never accept it where a number is meant.
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
            raise ConfigError(self.source, self.path(key), value, f"expected {_kind_name(kind)}")
        return value

    def number(self, key: str, minimum: float = 0.0, integer: bool = False) -> Any:
        value = self.get(key, int if integer else (int, float))
        if value < minimum:
            raise ConfigError(self.source, self.path(key), value, f"must be >= {minimum}")
        return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in _as_tuple(kind))


def _parse_gpu(raw: Any, source: Path) -> GpuSpec:
    top = _Reader(source, raw)
    memory_slices = top.number("memory_slices", integer=True)
    compute_slices = top.number("compute_slices", integer=True)
    mig_supported = top.get("mig_supported", bool)
    if mig_supported and (memory_slices < 1 or compute_slices < 1):
        raise ConfigError(source, "memory_slices", memory_slices, "a MIG GPU needs at least one memory and one compute slice")

    profiles: dict[str, GiProfile] = {}
    for i, raw_profile in enumerate(top.get("gi_profiles", list)):
        p = _Reader(source, raw_profile, f"gi_profiles[{i}]")
        name = p.get("name", str)
        if name in profiles:
            raise ConfigError(source, p.path("name"), name, "duplicate profile name")
        variant = p.get("variant", str)
        if variant not in VARIANTS:
            raise ConfigError(source, p.path("variant"), variant, f"allowed: {', '.join(VARIANTS)}")
        gi_memory_slices = p.number("memory_slices", minimum=1, integer=True)
        gi_compute_slices = p.number("compute_slices", minimum=1, integer=True)
        if gi_compute_slices > compute_slices:
            raise ConfigError(source, p.path("compute_slices"), gi_compute_slices, f"exceeds the GPU's {compute_slices} compute slices")
        start_slots = p.get("start_slots", list)
        for slot in start_slots:
            if not isinstance(slot, int) or isinstance(slot, bool) or slot < 0 or slot + gi_memory_slices > memory_slices:
                raise ConfigError(
                    source, p.path("start_slots"), start_slots,
                    f"each start slot must be an integer with start + memory_slices ({gi_memory_slices}) <= {memory_slices}",
                )
        if not start_slots:
            raise ConfigError(source, p.path("start_slots"), start_slots, "at least one start slot is needed")
        profiles[name] = GiProfile(
            name=name,
            variant=variant,
            nvml_profile_id=p.number("nvml_profile_id", integer=True),
            nvml_profile_index=p.number("nvml_profile_index", integer=True),
            compute_slices=gi_compute_slices,
            memory_slices=gi_memory_slices,
            sm_count=p.number("sm_count", minimum=1, integer=True),
            memory_gib=float(p.number("memory_gib", minimum=0.001)),
            start_slots=tuple(sorted(start_slots)),
            max_count=p.number("max_count", minimum=1, integer=True),
            create_s=float(p.number("create_s")),
            destroy_s=float(p.number("destroy_s")),
        )

    ci_profiles: dict[int, tuple[ComputeInstanceProfile, ...]] = {}
    for size, entries in top.get("compute_instance_profiles", dict).items():
        where = f"compute_instance_profiles.{size}"
        if not isinstance(size, int) or not isinstance(entries, list):
            raise ConfigError(source, where, entries, "expected GI compute slices (int) -> list of CI profiles")
        parsed = []
        for j, entry in enumerate(entries):
            c = _Reader(source, entry, f"{where}[{j}]")
            ci_slices = c.number("compute_slices", minimum=1, integer=True)
            if ci_slices > size:
                raise ConfigError(source, c.path("compute_slices"), ci_slices, f"a CI cannot exceed its GI's {size} compute slices")
            parsed.append(ComputeInstanceProfile(c.get("name", str), ci_slices, c.number("max_count", minimum=1, integer=True)))
        ci_profiles[size] = tuple(parsed)
    for profile in profiles.values():
        if profile.compute_slices not in ci_profiles:
            raise ConfigError(source, "compute_instance_profiles", sorted(ci_profiles), f"no CI profiles for {profile.name}'s {profile.compute_slices} compute slices")

    forbidden = []
    for i, combo in enumerate(top.get("forbidden_combinations", list, [])):
        c = _Reader(source, combo, f"forbidden_combinations[{i}]")
        names = c.get("profiles", list)
        for n in names:
            if n not in profiles:
                raise ConfigError(source, c.path("profiles"), n, f"unknown profile (known: {', '.join(profiles)})")
        forbidden.append((frozenset(names), c.number("before_driver", integer=True)))

    gpu_unconfirmed, per_profile = _split_unconfirmed(top.get("unconfirmed", dict, {}), profiles, top, source)
    profiles = {n: _with_unconfirmed(p, per_profile.get(n, {})) for n, p in profiles.items()}

    return GpuSpec(
        name=top.get("name", str),
        display_name=top.get("display_name", str),
        pci_device_id=top.get("pci_device_id", str),
        architecture=top.get("architecture", str),
        mig_supported=mig_supported,
        memory_gib=float(top.number("memory_gib", minimum=0.001)),
        sm_count=top.number("sm_count", minimum=1, integer=True),
        memory_slices=memory_slices,
        compute_slices=compute_slices,
        profiles=profiles,
        compute_instance_profiles=ci_profiles,
        forbidden_combinations=tuple(forbidden),
        unconfirmed=gpu_unconfirmed,
        source_file=str(source),
    )


_PROFILE_FIELDS = set(GiProfile.__dataclass_fields__) - {"unconfirmed"}


def _split_unconfirmed(
    raw: dict[str, Any], profiles: dict[str, GiProfile], top: _Reader, source: Path
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Resolve ``field`` / ``PROFILE.field`` / ``*.field`` keys into per-GPU and per-profile flags."""
    gpu_level: dict[str, str] = {}
    per_profile: dict[str, dict[str, str]] = {}
    for key, why in raw.items():
        where = f"unconfirmed.{key}"
        if not isinstance(why, str):
            raise ConfigError(source, where, why, "expected the reason as a string")
        owner, _, field_name = str(key).rpartition(".")
        if not owner:
            if field_name not in top.raw:
                raise ConfigError(source, where, key, "names no GPU field")
            gpu_level[field_name] = why
            continue
        if field_name not in _PROFILE_FIELDS:
            raise ConfigError(source, where, key, f"'{field_name}' is no profile field (fields: {', '.join(sorted(_PROFILE_FIELDS))})")
        targets = list(profiles) if owner == "*" else [owner]
        for target in targets:
            if target not in profiles:
                raise ConfigError(source, where, key, f"unknown profile '{target}'")
            per_profile.setdefault(target, {})[field_name] = why
    return gpu_level, per_profile


def _with_unconfirmed(profile: GiProfile, flags: dict[str, str]) -> GiProfile:
    if not flags:
        return profile
    return GiProfile(**{**profile.__dict__, "unconfirmed": dict(flags)})
