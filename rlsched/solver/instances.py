"""What the ILPs know about one GPU type: its candidate GIs, its layouts, its placement rules.

A *candidate* is a GI profile at one of its catalog start slots; every GI any layout can hold
is one of them. The ILPs choose a layout in one of two ways, both built here from the
hardware model:

- ``layouts``: one binary per layout of :func:`rlsched.hardware.enumerate_layouts` (297 on
  A100-40GB plus the empty one) and a candidate exists iff the chosen layout holds it. The
  compact formulation that solver-notes.md recommends.
- ``placements``: one binary per candidate and the catalog rules written as linear rows
  (memory-slice non-overlap, max count, compute slices, driver-forbidden combinations).
  The naive formulation, kept as the benchmark baseline and as an independent statement of
  the rules that the tests check against the enumeration.

A GPU without MIG has one implicit candidate, the whole device, that always exists.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from rlsched.hardware import GpuInstance, GpuSpec, Layout, enumerate_layouts, load_gpu
from rlsched.solver.milp import Milp

#: Compute slices a GPU without MIG counts as, so that requests keep one unit on a mixed
#: node: 7 slices is a whole A100 / H100 / H200, i.e. a request of 3.5 is half the device.
NON_MIG_COMPUTE_SLICES = 7.0

#: The implicit whole-device GI of a GPU without MIG, used to name the tenant's "instance".
WHOLE_DEVICE = GpuInstance(0, "whole-device")

FORMULATIONS = ("layouts", "placements")


@dataclass(frozen=True, eq=False)
class GpuTable:
    """Arrays over the candidate GIs of one GPU type (index k) and its layouts (index l).

    :param gpu: the GPU type
    :param candidates: candidate GIs, sorted (start slot, then profile name)
    :param compute_slices: compute slices of each candidate
    :param memory_gib: memory of each candidate, GiB
    :param create_s: measured creation time of each candidate, seconds
    :param destroy_s: measured destruction time of each candidate, seconds
    :param layouts: the empty layout followed by every valid layout (enumeration order)
    :param layout_members: per layout, the candidate indices it holds
    :param driver_major: driver branch whose rules apply (None: current driver)
    """

    gpu: GpuSpec
    candidates: tuple[GpuInstance, ...]
    compute_slices: np.ndarray
    memory_gib: np.ndarray
    create_s: np.ndarray
    destroy_s: np.ndarray
    layouts: tuple[Layout, ...]
    layout_members: tuple[tuple[int, ...], ...]
    driver_major: int | None

    @property
    def mig(self) -> bool:
        """True when tenants need GIs; False for the implicit whole-device instance."""
        return self.gpu.mig_supported

    def index_of(self, gi: GpuInstance) -> int | None:
        """Candidate index of ``gi``, or None when it is no candidate of this table."""
        return self._index.get(gi)

    @functools.cached_property
    def _index(self) -> dict[GpuInstance, int]:
        return {gi: k for k, gi in enumerate(self.candidates)}

    @functools.cached_property
    def total_memory_gib(self) -> float:
        """Most memory all GIs of one layout can hold together, GiB."""
        return max(float(self.memory_gib[list(m)].sum()) for m in self.layout_members)

    def layout_of(self, chosen: list[int]) -> Layout:
        """The layout holding the candidates ``chosen`` (empty on a GPU without MIG)."""
        if not self.mig:
            return Layout(self.gpu.name, ())
        return Layout(self.gpu.name, tuple(self.candidates[k] for k in chosen))

    def add_layout_choice(self, milp: Milp, formulation: str, cost_per_s: float, anchor: Layout) -> list[int]:
        """Add the layout decision to ``milp``; returns per candidate the column of its existence.

        The existence columns are 0/1 in every feasible solution. The cost of the choice is
        ``cost_per_s`` times the seconds of the GI destructions and creations that turn
        ``anchor`` into the chosen layout (:func:`rlsched.hardware.change_plan`).
        """
        if not self.mig:
            return [milp.add_column(0.0, 1.0, 1.0)]
        if formulation == "layouts":
            return self._add_layout_selection(milp, cost_per_s, anchor)
        if formulation == "placements":
            return self._add_free_placement(milp, cost_per_s, anchor)
        raise ValueError(f"formulation {formulation!r} is not one of {FORMULATIONS}")

    def _anchor_mask(self, anchor: Layout) -> tuple[np.ndarray, float]:
        """Which candidates ``anchor`` holds, and the seconds to destroy its other GIs."""
        held = np.zeros(len(self.candidates), dtype=bool)
        other_s = 0.0
        for gi in anchor.instances:
            k = self.index_of(gi)
            if k is None:
                # A GI of a profile outside this table (e.g. another variant) must go.
                other_s += self.gpu.profiles[gi.profile].destroy_s
            else:
                held[k] = True
        return held, other_s

    @functools.cached_property
    def _incidence(self) -> np.ndarray:
        """Layout x candidate 0/1 matrix: which candidates each layout holds."""
        matrix = np.zeros((len(self.layouts), len(self.candidates)))
        for l, members in enumerate(self.layout_members):
            matrix[l, list(members)] = 1.0
        return matrix

    @functools.cached_property
    def _holders(self) -> tuple[tuple[int, ...], ...]:
        """Per candidate, the indices of the layouts that hold it."""
        return tuple(tuple(int(l) for l in np.flatnonzero(column)) for column in self._incidence.T)

    def _add_layout_selection(self, milp: Milp, cost_per_s: float, anchor: Layout) -> list[int]:
        held, other_s = self._anchor_mask(anchor)
        # Seconds of change_plan(anchor, layout) for every layout at once: destroy what the
        # anchor holds and the layout lacks, create what the layout holds and the anchor lacks.
        destroy_all = float(self.destroy_s[held].sum()) + other_s
        seconds = destroy_all - self._incidence @ np.where(held, self.destroy_s, 0.0) + self._incidence @ np.where(held, 0.0, self.create_s)
        first = milp.num_columns
        layout_cols = [milp.add_binary(float(c)) for c in cost_per_s * seconds]
        milp.add_row(layout_cols, [1.0] * len(layout_cols), 1.0, 1.0)
        exists = [milp.add_column(0.0) for _ in self.candidates]
        for k, holders in enumerate(self._holders):
            milp.add_row([exists[k], *(first + l for l in holders)], [1.0] + [-1.0] * len(holders), 0.0, 0.0)
        return exists

    def _add_free_placement(self, milp: Milp, cost_per_s: float, anchor: Layout) -> list[int]:
        held, other_s = self._anchor_mask(anchor)
        cost = np.where(held, -self.destroy_s, self.create_s) * cost_per_s
        milp.offset += cost_per_s * (float(self.destroy_s[held].sum()) + other_s)
        exists = [milp.add_binary(float(c)) for c in cost]
        add_placement_rules(milp, self, exists)
        return exists


def add_placement_rules(milp: Milp, table: GpuTable, exists: list[int]) -> None:
    """Rows that hold exactly when the candidates with ``exists`` = 1 form a valid layout.

    The catalog's rules, one by one: start slots (only catalog starts are candidates),
    memory slices used at most once, each profile's max count, the GPU's compute slices, and
    the combinations that drivers before ``table.driver_major`` rejected.
    """
    gpu = table.gpu
    profiles = [gpu.profiles[gi.profile] for gi in table.candidates]
    for slot in range(gpu.memory_slices):
        covering = [exists[k] for k, (gi, p) in enumerate(zip(table.candidates, profiles)) if gi.start <= slot < gi.start + p.memory_slices]
        if len(covering) > 1:
            milp.add_row(covering, [1.0] * len(covering), upper=1.0)
    for name, profile in gpu.profiles.items():
        same = [exists[k] for k, gi in enumerate(table.candidates) if gi.profile == name]
        if len(same) > profile.max_count:
            milp.add_row(same, [1.0] * len(same), upper=float(profile.max_count))
    milp.add_row(exists, [float(c) for c in table.compute_slices], upper=float(gpu.compute_slices))
    if table.driver_major is None:
        return
    for names, before in gpu.forbidden_combinations:
        if table.driver_major >= before:
            continue
        # One presence indicator per profile of the combination; not all may be present.
        present = []
        for name in sorted(names):
            flag = milp.add_binary(0.0)
            present.append(flag)
            for k, gi in enumerate(table.candidates):
                if gi.profile == name:
                    milp.add_row([exists[k], flag], [1.0, -1.0], upper=0.0)
        milp.add_row(present, [1.0] * len(present), upper=float(len(present) - 1))


@functools.cache
def gpu_table(gpu_name: str, variants: tuple[str, ...] = ("standard",), driver_major: int | None = None) -> GpuTable:
    """The (cached) table of one GPU type, for GIs of the profile ``variants``."""
    gpu = load_gpu(gpu_name)
    if not gpu.mig_supported:
        return GpuTable(
            gpu, (WHOLE_DEVICE,), np.array([NON_MIG_COMPUTE_SLICES]), np.array([gpu.memory_gib]),
            np.zeros(1), np.zeros(1), (Layout(gpu.name, ()),), ((0,),), driver_major,
        )
    candidates = tuple(sorted(GpuInstance(start, p.name) for p in gpu.profiles_of(variants) for start in p.start_slots))
    profiles = [gpu.profiles[gi.profile] for gi in candidates]
    index = {gi: k for k, gi in enumerate(candidates)}
    layouts = (Layout(gpu.name, ()), *enumerate_layouts(gpu, variants, driver_major=driver_major))
    return GpuTable(
        gpu=gpu,
        candidates=candidates,
        compute_slices=np.array([p.compute_slices for p in profiles], dtype=np.float64),
        memory_gib=np.array([p.memory_gib for p in profiles], dtype=np.float64),
        create_s=np.array([p.create_s for p in profiles], dtype=np.float64),
        destroy_s=np.array([p.destroy_s for p in profiles], dtype=np.float64),
        layouts=layouts,
        layout_members=tuple(tuple(index[gi] for gi in layout.instances) for layout in layouts),
        driver_major=driver_major,
    )
