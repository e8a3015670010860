"""MIG layouts of one GPU: parsing, validation, enumeration and minimal change plans.

A GPU instance (GI) is a profile placed at a start slot (counted in memory slices); a layout
is the set of GIs on one GPU. Every part of rlsched that reasons about what the hardware
allows (simulator, ILP, baselines, daemon, NVML backend) uses this module.

Spec strings, used by the CLI and the configs: ``3g.20gb@0,2g.10gb@4,1g.5gb@6``
(``profile@start``, comma separated; the short form ``3g@0`` picks the standard profile of
that compute size; the empty string is the empty layout).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

from rlsched.hardware.catalog import GpuSpec, load_gpu

#: The rules a layout can break, in the order they are checked.
RULES = ("syntax", "unknown-profile", "mig-unsupported", "start-slot", "memory-overlap", "max-count", "compute-slices", "forbidden-combination")


class LayoutError(ValueError):
    """A layout breaks a hardware rule.

    :param rule: which rule failed, one of :data:`RULES`
    :param message: one line naming the instances involved and what is allowed
    """

    def __init__(self, rule: str, message: str) -> None:
        assert rule in RULES, rule
        self.rule = rule
        super().__init__(f"{rule}: {message}")


@dataclass(frozen=True, order=True)
class GpuInstance:
    """A GI: a profile (full catalog name) placed at a memory-slice start slot."""

    start: int
    profile: str

    def spec(self) -> str:
        """``profile@start``, the form used in layout specs."""
        return f"{self.profile}@{self.start}"


@dataclass(frozen=True)
class Layout:
    """The GIs of one GPU, kept sorted by start slot so that equal layouts compare equal.

    :param gpu: catalog name of the GPU type
    :param instances: the GIs
    """

    gpu: str
    instances: tuple[GpuInstance, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", tuple(sorted(self.instances)))

    def spec(self) -> str:
        """The layout as a spec string (full profile names, by start slot)."""
        return ",".join(gi.spec() for gi in self.instances)

    def __iter__(self):
        return iter(self.instances)

    def __len__(self) -> int:
        return len(self.instances)

    def profile_counts(self) -> Counter[str]:
        """Profile name -> number of GIs of it."""
        return Counter(gi.profile for gi in self.instances)


def _spec_of(gpu: GpuSpec | str) -> GpuSpec:
    return gpu if isinstance(gpu, GpuSpec) else load_gpu(gpu)


def parse_layout(spec: str, gpu: GpuSpec | str) -> Layout:
    """Parse a spec string into a :class:`Layout` (not yet validated).

    Raises :class:`LayoutError` (rule ``syntax`` or ``unknown-profile``).
    """
    gpu = _spec_of(gpu)
    instances = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            if spec.strip():
                raise LayoutError("syntax", f"empty element in '{spec}' (expected profile@start, comma separated)")
            continue
        name, at, start_text = item.partition("@")
        if not at or not start_text.strip().isdigit():
            raise LayoutError("syntax", f"'{item}' is not profile@start (e.g. 3g.20gb@0 or 3g@0)")
        try:
            profile = gpu.profile(name.strip())
        except KeyError as exc:
            raise LayoutError("unknown-profile", str(exc.args[0])) from None
        instances.append(GpuInstance(int(start_text), profile.name))
    return Layout(gpu.name, tuple(instances))


def layout_violation(layout: Layout, gpu: GpuSpec | str | None = None, driver_major: int | None = None) -> LayoutError | None:
    """The first rule ``layout`` breaks, or None if the hardware accepts it.

    :param driver_major: NVIDIA driver branch (e.g. 470); None means a current driver
    """
    gpu = _spec_of(gpu or layout.gpu)
    if not layout.instances:
        return None
    if not gpu.mig_supported:
        return LayoutError("mig-unsupported", f"{gpu.name} has no MIG: share it with MPS or time slicing, not GIs")
    used_mask = 0
    owner: dict[int, GpuInstance] = {}
    for gi in layout.instances:
        if gi.profile not in gpu.profiles:
            return LayoutError("unknown-profile", f"{gpu.name} has no GI profile '{gi.profile}'")
        profile = gpu.profiles[gi.profile]
        if gi.start not in profile.start_slots:
            allowed = ",".join(map(str, profile.start_slots))
            return LayoutError("start-slot", f"{gi.spec()}: start slot {gi.start} is not allowed for {profile.name} (allowed: {allowed})")
        mask = ((1 << profile.memory_slices) - 1) << gi.start
        if used_mask & mask:
            clash = next(owner[s] for s in range(gi.start, gi.start + profile.memory_slices) if used_mask >> s & 1)
            return LayoutError("memory-overlap", f"{gi.spec()} overlaps {clash.spec()} in memory slices")
        used_mask |= mask
        owner.update({s: gi for s in range(gi.start, gi.start + profile.memory_slices)})
    for name, count in layout.profile_counts().items():
        if count > gpu.profiles[name].max_count:
            return LayoutError("max-count", f"{count} x {name} exceed its max count of {gpu.profiles[name].max_count}")
    compute = sum(gpu.profiles[gi.profile].compute_slices for gi in layout.instances)
    if compute > gpu.compute_slices:
        return LayoutError("compute-slices", f"{compute} compute slices used, {gpu.name} has {gpu.compute_slices}")
    if driver_major is not None:
        present = set(layout.profile_counts())
        for names, before in gpu.forbidden_combinations:
            if driver_major < before and names <= present:
                return LayoutError("forbidden-combination", f"{' + '.join(sorted(names))} is rejected by drivers before R{before} (driver R{driver_major})")
    return None


def validate_layout(layout: Layout, gpu: GpuSpec | str | None = None, driver_major: int | None = None) -> None:
    """Raise :class:`LayoutError` naming the first rule ``layout`` breaks."""
    violation = layout_violation(layout, gpu, driver_major)
    if violation is not None:
        raise violation


def enumerate_layouts(
    gpu: GpuSpec | str,
    variants: tuple[str, ...] = ("standard",),
    maximal: bool = False,
    driver_major: int | None = None,
) -> list[Layout]:
    """Every valid non-empty layout built from the profiles of ``variants``.

    :param maximal: keep only layouts to which no further GI of those profiles can be added
    :param driver_major: apply the rules of that driver branch (None: current driver)
    :returns: layouts sorted by their spec string
    """
    return list(_enumerate_cached(_spec_of(gpu).name, tuple(sorted(variants)), maximal, driver_major))


def is_maximal(layout: Layout, variants: tuple[str, ...] = ("standard",), driver_major: int | None = None) -> bool:
    """True if ``layout`` is valid and no GI of ``variants`` can be added to it."""
    gpu = load_gpu(layout.gpu)
    if layout_violation(layout, gpu, driver_major) is not None:
        return False
    for candidate in _candidates(gpu, variants):
        grown = Layout(gpu.name, layout.instances + (candidate,))
        if candidate not in layout.instances and layout_violation(grown, gpu, driver_major) is None:
            return False
    return True


def _candidates(gpu: GpuSpec, variants: tuple[str, ...]) -> list[GpuInstance]:
    return [GpuInstance(start, p.name) for p in gpu.profiles_of(variants) for start in p.start_slots]


@functools.cache
def _enumerate_cached(gpu_name: str, variants: tuple[str, ...], maximal: bool, driver_major: int | None) -> tuple[Layout, ...]:
    gpu = load_gpu(gpu_name)
    candidates = _candidates(gpu, variants)
    found: list[Layout] = []

    # Depth-first over candidates in a fixed order: each subset is visited once. Pruning on
    # memory overlap, max count and compute slices keeps this to a few hundred nodes.
    def extend(first: int, chosen: list[GpuInstance], mask: int, compute: int, counts: Counter[str]) -> None:
        if chosen:
            layout = Layout(gpu.name, tuple(chosen))
            if layout_violation(layout, gpu, driver_major) is None:
                found.append(layout)
        for i in range(first, len(candidates)):
            gi = candidates[i]
            profile = gpu.profiles[gi.profile]
            gi_mask = ((1 << profile.memory_slices) - 1) << gi.start
            if mask & gi_mask or compute + profile.compute_slices > gpu.compute_slices or counts[gi.profile] >= profile.max_count:
                continue
            counts[gi.profile] += 1
            extend(i + 1, chosen + [gi], mask | gi_mask, compute + profile.compute_slices, counts)
            counts[gi.profile] -= 1

    if gpu.mig_supported:
        extend(0, [], 0, 0, Counter())
    if maximal:
        found = [layout for layout in found if is_maximal(layout, variants, driver_major)]
    return tuple(sorted(found, key=Layout.spec))


@dataclass(frozen=True)
class ChangePlan:
    """The fewest GI operations that turn one layout into another.

    GIs are identified by profile and placement, so an instance present in both layouts
    is kept and its tenants keep running; only the others are destroyed and created.

    :param kept: GIs in both layouts
    :param destroyed: GIs only in the old layout (destroy these first)
    :param created: GIs only in the new layout (create these after, with explicit placements)
    :param estimated_s: sum of the catalog's measured destroy and create times, seconds
    """

    kept: tuple[GpuInstance, ...]
    destroyed: tuple[GpuInstance, ...]
    created: tuple[GpuInstance, ...]
    estimated_s: float

    @property
    def is_noop(self) -> bool:
        """True when nothing changes."""
        return not self.destroyed and not self.created


def change_plan(old: Layout, new: Layout) -> ChangePlan:
    """The minimal plan from ``old`` to ``new`` (same GPU type)."""
    if old.gpu != new.gpu:
        raise ValueError(f"cannot plan a change from a {old.gpu} layout to a {new.gpu} layout")
    gpu = load_gpu(new.gpu)
    old_set, new_set = set(old.instances), set(new.instances)
    destroyed = tuple(sorted(old_set - new_set))
    created = tuple(sorted(new_set - old_set))
    seconds = sum(gpu.profiles[gi.profile].destroy_s for gi in destroyed) + sum(gpu.profiles[gi.profile].create_s for gi in created)
    return ChangePlan(tuple(sorted(old_set & new_set)), destroyed, created, seconds)


@dataclass(frozen=True)
class StagedOperation:
    """One GI operation of a :class:`StagedChangePlan`, in execution order.

    :param kind: ``create`` or ``destroy``
    :param instance: the GI
    :param breaks: (destroy only) the GI is destroyed before every GI its tenants move into
        exists: its tenants stop before their new instance is ready and pay a restart
    """

    kind: str
    instance: GpuInstance
    breaks: bool = False


@dataclass(frozen=True)
class StagedChangePlan:
    """The minimal change plan ordered for make-before-break (MIGRator's pre-initialisation).

    A GI is created as soon as it fits next to the GIs that still exist (the hardware's
    placement, count and compute-slice rules, :func:`layout_violation`), so that the
    tenants moving into it start there while their old instance keeps serving; an old GI is
    destroyed once every GI its tenants move into exists (they switch, then it goes). When
    no creation fits, the cheapest old GI whose destruction unblocks one is destroyed first
    (``breaks``): only its tenants pay a restart.

    :param operations: creates and destroys in execution order
    :param broken: old GIs destroyed before their tenants' new GIs existed
    :param estimated_s: catalog destroy + create seconds (the same operations as :func:`change_plan`)
    """

    operations: tuple[StagedOperation, ...]
    broken: tuple[GpuInstance, ...]
    estimated_s: float

    @property
    def created(self) -> tuple[GpuInstance, ...]:
        """The GIs created, in execution order."""
        return tuple(op.instance for op in self.operations if op.kind == "create")

    @property
    def destroyed(self) -> tuple[GpuInstance, ...]:
        """The GIs destroyed, in execution order."""
        return tuple(op.instance for op in self.operations if op.kind == "destroy")


def fits_alongside(live: tuple[GpuInstance, ...] | list[GpuInstance], gi: GpuInstance, gpu: GpuSpec | str) -> bool:
    """True when ``gi`` can be created while the GIs ``live`` exist (free memory slices at
    its start slot, count and compute slices left)."""
    spec = _spec_of(gpu)
    return layout_violation(Layout(spec.name, tuple(live) + (gi,)), spec) is None


def staged_change_plan(
    old: Layout,
    new: Layout,
    moves_to: dict[GpuInstance, set[GpuInstance] | frozenset[GpuInstance]] | None = None,
    break_cost: dict[GpuInstance, float] | None = None,
) -> StagedChangePlan:
    """Order :func:`change_plan`'s operations from ``old`` to ``new`` to keep tenants serving.

    :param moves_to: per old GI that holds tenants, the new GIs they move into (kept or
        created; a GI absent from the mapping holds no tenant and is destroyed first). None:
        the tenants are unknown; every destroyed GI is taken as occupied and destroyed only
        once nothing more can be created before it (create first, then destroy).
    :param break_cost: per old GI, the cost of stopping its tenants before their new
        instance is ready (default 1 each): the cheapest blocking GI is broken first
    """
    plan = change_plan(old, new)
    gpu = load_gpu(new.gpu)
    live = list(old.instances)
    pending_create = list(plan.created)
    pending_destroy = list(plan.destroyed)
    occupied = {o: (moves_to is None or o in moves_to) for o in pending_destroy}
    waits = {o: set((moves_to or {}).get(o, ())) & set(plan.created) for o in pending_destroy}
    operations: list[StagedOperation] = []
    broken: list[GpuInstance] = []

    def destroy(o: GpuInstance, breaks: bool) -> None:
        live.remove(o)
        pending_destroy.remove(o)
        operations.append(StagedOperation("destroy", o, breaks))
        if breaks:
            broken.append(o)

    for o in [o for o in pending_destroy if not occupied[o]]:  # empty GIs go first
        destroy(o, False)
    while pending_create or pending_destroy:
        progress = False
        for n in list(pending_create):
            if fits_alongside(live, n, gpu):
                live.append(n)
                pending_create.remove(n)
                operations.append(StagedOperation("create", n))
                progress = True
        created = {op.instance for op in operations if op.kind == "create"}
        for o in list(pending_destroy):
            if waits[o] <= created and (moves_to is not None or not pending_create):
                destroy(o, False)
                progress = True
        if progress:
            continue
        # Nothing fits: break the cheapest old GI whose destruction lets a creation through.
        def unblocks(o: GpuInstance) -> bool:
            rest = [gi for gi in live if gi != o]
            return any(fits_alongside(rest, n, gpu) for n in pending_create)

        choices = [o for o in pending_destroy if unblocks(o)] or list(pending_destroy)
        costs = break_cost or {}
        destroy(min(choices, key=lambda o: (costs.get(o, 1.0), o)), True)
    return StagedChangePlan(tuple(operations), tuple(broken), plan.estimated_s)
