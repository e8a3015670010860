"""What rlsched decides every interval: the configuration of a node of G GPUs.

A :class:`Configuration` holds one MIG layout per GPU, the sharing mode of each GPU
instance, and for each tenant where it runs (GPU, instance), its MPS share and its batch
size. The simulator executes it, the ILP produces it, the baselines and the PPO policy ask
for it, and the daemon applies it; all of them use these types.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from rlsched.hardware.catalog import load_gpu
from rlsched.hardware.layout import GpuInstance, Layout, layout_violation


#: MPS share levels a decision may give a tenant, percent of its GI (12.5% steps: fine enough
#: to co-locate up to 8 tenants in one GI, coarse enough to learn). The action space, the
#: planner and the capacity planner all choose among these.
SHARE_LEVELS_PCT: tuple[float, ...] = (12.5, 25.0, 37.5, 50.0, 62.5, 75.0, 87.5, 100.0)
#: Batch sizes a decision may give a tenant (powers of two, as servers configure them).
BATCH_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


def equal_shares(count: int) -> float:
    """Each of ``count`` tenants' equal MPS share of one GI, percent (floored to 0.01%)."""
    return math.floor(10000.0 / count) / 100.0


class SharingMode(str, enum.Enum):
    """How the tenants placed in one GPU instance share it.

    ``mps``: spatial sharing, each tenant capped at its MPS active-thread percentage.
    ``time-slice``: temporal sharing, tenants take turns on the whole instance.
    ``priority-fill``: FIKIT-style; the highest-priority tenant runs as if alone (plus a small
    overhead) and the others use its idle gaps.
    """

    MPS = "mps"
    TIME_SLICE = "time-slice"
    PRIORITY_FILL = "priority-fill"


@dataclass(frozen=True)
class TenantPlacement:
    """Where and how one tenant runs.

    :param gpu_index: GPU of the node, 0..G-1
    :param instance_index: index into that GPU's layout instances (sorted by start slot);
        0 on a GPU without MIG, whose whole device is one implicit instance
    :param mps_pct: MPS active-thread percentage within the instance, (0, 100]
    :param batch_size: maximum batch the tenant's server forms (inference), or its training
        batch (retraining jobs), >= 1
    """

    gpu_index: int
    instance_index: int
    mps_pct: float = 100.0
    batch_size: int = 1


class PlacementKey(NamedTuple):
    """A tenant's placement as plain values (:attr:`Configuration.placement_keys`)."""

    gpu_index: int
    gi_start: int | None
    """the GI's first memory slice (None on a GPU without MIG)"""
    gi_profile: str | None
    """the GI's profile name (None on a GPU without MIG)"""
    mps_pct: float
    batch_size: int
    mode: str
    """the GI's sharing mode (:class:`SharingMode`'s value)"""


@dataclass(frozen=True)
class Configuration:
    """A complete decision for a node.

    :param layouts: one layout per GPU (an empty layout on a GPU without MIG)
    :param modes: per GPU, the sharing mode of each instance (same order as the layout)
    :param placements: tenant name -> placement
    """

    layouts: tuple[Layout, ...]
    modes: tuple[tuple[SharingMode, ...], ...]
    placements: Mapping[str, TenantPlacement]

    def to_dict(self) -> dict:
        """The scenario file's ``reference`` form (layout specs, modes, placements): what
        evaluation results record, read back by ``rlsched.workloads.scenario.parse_configuration``."""
        return {
            "layouts": [layout.spec() for layout in self.layouts],
            "modes": [[m.value for m in per_gpu] for per_gpu in self.modes],
            "placements": {name: {"gpu": p.gpu_index, "instance": p.instance_index, "mps_pct": p.mps_pct, "batch_size": p.batch_size}
                           for name, p in self.placements.items()},
        }

    def uses_priority_fill(self) -> bool:
        """Whether any instance runs in priority fill."""
        return any(mode == SharingMode.PRIORITY_FILL for modes in self.modes for mode in modes)

    def priority_fill_time_sliced(self) -> Configuration:
        """This configuration as a node without a priority-fill scheduler runs it: the tenants
        of every priority-fill instance time-slice it (``docs/hardware-probes/README.md``:
        the servers are ordinary processes, so the GPU time-slices them)."""
        if not self.uses_priority_fill():
            return self
        modes = tuple(tuple(SharingMode.TIME_SLICE if m == SharingMode.PRIORITY_FILL else m for m in gpu) for gpu in self.modes)
        return dataclasses.replace(self, modes=modes)

    def instance_count(self, gpu_index: int) -> int:
        """Instances tenants can be placed in on that GPU (1 for a GPU without MIG)."""
        layout = self.layouts[gpu_index]
        return len(layout) if load_gpu(layout.gpu).mig_supported else 1

    def tenants_in(self, gpu_index: int, instance_index: int) -> list[str]:
        """Names of the tenants placed in one instance, in placement order."""
        return list(self._tenants_by_instance.get((gpu_index, instance_index), ()))

    @functools.cached_property
    def placed_in(self) -> dict[str, tuple[int, GpuInstance | None, SharingMode, int]]:
        """Per tenant: its GPU, its GI (None on a GPU without MIG), the GI's sharing mode and
        how many tenants the GI holds (itself included). Found once per configuration: the
        planner asks for them per tenant of every candidate it values."""
        placed = {}
        for name, p in self.placements.items():
            layout = self.layouts[p.gpu_index]
            gi = layout.instances[p.instance_index] if len(layout) else None
            placed[name] = (p.gpu_index, gi, self.modes[p.gpu_index][p.instance_index], len(self._tenants_by_instance[(p.gpu_index, p.instance_index)]))
        return placed

    @functools.cached_property
    def placement_keys(self) -> dict[str, PlacementKey]:
        """Per tenant, its placement as plain values (:class:`PlacementKey`); equal keys, equal
        placements. Found once per configuration: the planner keys its per-tenant terms by them
        for every candidate it values, and plain values hash in C where a GI's dataclass hash
        and a mode's enum hash run Python code."""
        keys = {}
        for name, (g, gi, mode, _) in self.placed_in.items():
            p = self.placements[name]
            keys[name] = PlacementKey(g, gi.start if gi is not None else None, gi.profile if gi is not None else None, float(p.mps_pct),
                                      p.batch_size, mode.value)
        return keys

    @functools.cached_property
    def _tenants_by_instance(self) -> dict[tuple[int, int], list[str]]:
        # Found once per configuration: the planner asks per tenant of every candidate (32
        # tenants on 8 GPUs: a scan of all placements each time was a tenth of a decision).
        tenants: dict[tuple[int, int], list[str]] = {}
        for name, p in self.placements.items():
            tenants.setdefault((p.gpu_index, p.instance_index), []).append(name)
        return tenants

    def problems(self, tenants: list[str] | None = None) -> list[str]:
        """Everything that makes this configuration impossible to apply (empty if none).

        :param tenants: if given, every one of them must be placed
        """
        found: list[str] = []
        if len(self.modes) != len(self.layouts):
            found.append(f"{len(self.modes)} mode lists for {len(self.layouts)} GPUs")
        for g, layout in enumerate(self.layouts):
            violation = layout_violation(layout)
            if violation is not None:
                found.append(f"GPU {g}: {violation}")
            if g < len(self.modes) and len(self.modes[g]) != self.instance_count(g):
                found.append(f"GPU {g}: {len(self.modes[g])} sharing modes for {self.instance_count(g)} instances")
        for name, p in self.placements.items():
            if not 0 <= p.gpu_index < len(self.layouts):
                found.append(f"tenant {name}: GPU {p.gpu_index} does not exist (node has {len(self.layouts)})")
            elif not 0 <= p.instance_index < self.instance_count(p.gpu_index):
                found.append(f"tenant {name}: instance {p.instance_index} does not exist on GPU {p.gpu_index}")
            if not 0 < p.mps_pct <= 100:
                found.append(f"tenant {name}: mps_pct {p.mps_pct} outside (0, 100]")
            if p.batch_size < 1:
                found.append(f"tenant {name}: batch_size {p.batch_size} < 1")
        for name in tenants or []:
            if name not in self.placements:
                found.append(f"tenant {name} has no instance")
        return found
