"""Repair: the feasible configuration nearest to what the policy asked for.

The PPO policy (or a baseline) asks, per tenant, for an amount of GPU and how to get it
(:class:`TenantRequest`); :func:`repair` turns that into an exact
:class:`~rlsched.decision.Configuration` that the hardware can carry out: a valid MIG layout
per GPU (chosen among :func:`rlsched.hardware.enumerate_layouts`), every tenant in one GI,
co-located tenants' memory within the GI's memory, and their shares summing to at most 100%.

"Nearest" is a weighted sum (:class:`RepairWeights`) of how far the configuration is from
the request (compute slices given vs asked, GI size vs the size implied by the requested
share, preferred GPU and sharing mode missed) plus what it costs to get there from the
running configuration (GI destroy/create seconds from the catalog, tenants moved).

Each GPU's layout and packing is found by an exact search over the enumerated layouts
(:mod:`rlsched.solver.search`, formulation ``search``, the default) or, as the reference,
by the layout ILP (``layouts``); both reach the same optimum.

Multi-GPU nodes are decomposed: stage one puts tenants on GPUs (memory must fit, compute
beyond a GPU's slices is penalised like unmet requests), then each GPU is laid out on its
own. With ``search`` stage one is a local search on that objective
(:mod:`rlsched.solver.assignment`; proving its optimum took HiGHS seconds); with the ILP
formulations, and after a failed local-search assignment, it is the assignment ILP. A GPU
whose tenant set cannot be packed gets a no-good cut and the assignment ILP is solved again. The result is optimal per GPU for the assignment found, not
necessarily optimal for the node as a whole.

A request the running configuration already meets exactly comes back as that configuration
without any solve (the fast path), and so does a requested exact configuration that is
feasible (:func:`repair_configuration`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.errors import ConfigError, RlschedError
from rlsched.hardware import GpuInstance, Layout, change_plan, fits_alongside, layout_violation, load_gpu
from rlsched.solver.instances import FORMULATIONS, NON_MIG_COMPUTE_SLICES, WHOLE_DEVICE, GpuTable, gpu_table
from rlsched.solver.assignment import assign_by_local_search
from rlsched.solver.milp import INF, Milp
from rlsched.solver.search import MAX_SEARCH_TENANTS, search_packing

#: Smallest share a placed tenant gets, percent: MPS needs a positive active-thread
#: percentage, and a tenant with almost nothing would not run.
MIN_SHARE_PCT = 1.0

#: Most tenants one GI can hold, each at its minimum share.
MAX_TENANTS_PER_INSTANCE = int(100 // MIN_SHARE_PCT)

#: Shares are reported rounded to this many decimals of a percent.
SHARE_DECIMALS = 4

#: Slack when comparing compute slices and GiB (solver tolerances are ~1e-7).
TOLERANCE = 1e-6

#: Assignment rounds (each adds a no-good cut) before a multi-GPU repair gives up.
MAX_ASSIGNMENT_ROUNDS = 50

SOURCE = "repair request"


class InfeasibleRequest(RlschedError):
    """No configuration can hold every tenant (e.g. memory needs exceed the node)."""


@dataclass(frozen=True)
class TenantRequest:
    """What one tenant asks for.

    :param compute_slices: GPU compute wanted, in compute slices (fractions via sharing:
        0.5 is half a 1g slice, 3 a whole 3g; a GPU without MIG counts as
        :data:`~rlsched.solver.instances.NON_MIG_COMPUTE_SLICES`), > 0
    :param memory_gib: device memory the tenant needs at ``batch_size``, GiB, >= 0
    :param preferred_gpu: GPU index it would like, or None for any
    :param mode: sharing mode it would like for its GI, or None for any
    :param mps_pct: share of its GI it would like, percent in (0, 100]; with
        ``compute_slices`` this implies the GI size it wants (``compute_slices / (mps_pct /
        100)``); None for no size preference
    :param batch_size: batch size, passed through unchanged, >= 1
    """

    compute_slices: float
    memory_gib: float
    preferred_gpu: int | None = None
    mode: SharingMode | None = None
    mps_pct: float | None = None
    batch_size: int = 1

    @property
    def wanted_instance_slices(self) -> float | None:
        """Compute slices of the GI the requested share implies, or None."""
        return None if self.mps_pct is None else self.compute_slices * 100.0 / self.mps_pct


@dataclass(frozen=True)
class RepairWeights:
    """Prices of the terms of the repair objective, in units of one compute slice missed."""

    compute_per_slice: float = 1.0
    """per compute slice given more or less than requested"""
    instance_size_per_slice: float = 0.25
    """per compute slice between the GI's size and the size the requested share implies"""
    preferred_gpu_miss: float = 1.0
    """per tenant placed off its preferred GPU"""
    mode_miss: float = 0.5
    """per tenant whose GI runs another sharing mode than it asked for"""
    moved_tenant: float = 0.2
    """per tenant moved to another GI than the one it runs in now (stopped for its restart)"""
    staged_move: float = 0.05
    """per tenant moved make-before-break: into a GI it can start in while its running
    instance keeps serving (:attr:`RepairProblem.make_before_break`; no downtime)"""
    reconfiguration_per_s: float = 1.0
    """per second of GI destruction and creation (catalog times)"""


@dataclass(frozen=True)
class RepairProblem:
    """A node and what each of its tenants asks for.

    :param gpus: catalog GPU type per GPU index
    :param tenants: tenant name -> request
    :param variants: GI profile variants the layouts may use
    :param driver_major: NVIDIA driver branch whose layout rules apply (None: current)
    :param make_before_break: moves the hardware can stage (the target GI runs now, or can
        be created next to the GIs that hold tenants) cost :attr:`RepairWeights.staged_move`
    """

    gpus: tuple[str, ...]
    tenants: Mapping[str, TenantRequest]
    variants: tuple[str, ...] = ("standard",)
    driver_major: int | None = None
    make_before_break: bool = False

    def __post_init__(self) -> None:
        if not self.gpus:
            raise ConfigError(SOURCE, "gpus", self.gpus, "at least one GPU is needed")
        for g, name in enumerate(self.gpus):
            if not isinstance(name, str):
                raise ConfigError(SOURCE, f"gpus[{g}]", name, "expected a catalog GPU name")
            load_gpu(name)  # unknown names fail here, listing the known ones
        for name, request in self.tenants.items():
            _check_request(name, request, len(self.gpus))

    @classmethod
    def from_arrays(
        cls,
        gpus: Sequence[str],
        names: Sequence[str],
        compute_slices: Sequence[float] | np.ndarray,
        memory_gib: Sequence[float] | np.ndarray,
        preferred_gpu: Sequence[int] | np.ndarray | None = None,
        mps_pct: Sequence[float] | np.ndarray | None = None,
        batch_size: Sequence[int] | np.ndarray | None = None,
        modes: Sequence[SharingMode | str | None] | None = None,
        **options: object,
    ) -> RepairProblem:
        """Build a problem from per-tenant arrays (the form a policy emits).

        ``preferred_gpu`` entries < 0 and ``mps_pct`` entries that are NaN mean "no
        preference". Every array must have one entry per name; ``options`` go to the
        constructor (``variants``, ``driver_major``).
        """
        n = len(names)
        if len(set(names)) != n:
            raise ConfigError(SOURCE, "names", list(names), "tenant names must be unique")

        def column(field_name: str, values: object, default: object) -> list:
            if values is None:
                return [default] * n
            array = np.asarray(values, dtype=object)
            if array.shape != (n,):
                raise ConfigError(SOURCE, field_name, array.shape, f"expected shape ({n},): one entry per tenant")
            return list(array)

        compute = column("compute_slices", compute_slices, None)
        memory = column("memory_gib", memory_gib, None)
        gpu = column("preferred_gpu", preferred_gpu, -1)
        pct = column("mps_pct", mps_pct, math.nan)
        batch = column("batch_size", batch_size, 1)
        mode = column("modes", modes, None)
        tenants = {}
        for i, name in enumerate(names):
            where = f"[{i}] (tenant {name!r})"
            pct_value = _number(pct[i], f"mps_pct{where}", allow_nan=True)
            gpu_value = _integer(gpu[i], f"preferred_gpu{where}")
            tenants[name] = TenantRequest(
                compute_slices=_number(compute[i], f"compute_slices{where}"),
                memory_gib=_number(memory[i], f"memory_gib{where}"),
                preferred_gpu=None if gpu_value < 0 else gpu_value,
                mode=_mode(mode[i], f"modes{where}"),
                mps_pct=None if math.isnan(pct_value) else pct_value,
                batch_size=_integer(batch[i], f"batch_size{where}"),
            )
        return cls(tuple(gpus), tenants, **options)  # type: ignore[arg-type]


def _number(value: object, field_name: str, allow_nan: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(SOURCE, field_name, value, "expected a number")
    number = float(value)
    if math.isinf(number) or (math.isnan(number) and not allow_nan):
        raise ConfigError(SOURCE, field_name, value, "expected a finite number")
    return number


def _integer(value: object, field_name: str) -> int:
    number = _number(value, field_name)
    if number != int(number):
        raise ConfigError(SOURCE, field_name, value, "expected an integer")
    return int(number)


def _mode(value: object, field_name: str) -> SharingMode | None:
    if value is None or isinstance(value, SharingMode):
        return value
    try:
        return SharingMode(value)
    except ValueError:
        allowed = ", ".join(m.value for m in SharingMode)
        raise ConfigError(SOURCE, field_name, value, f"unknown sharing mode (allowed: {allowed}, or None)") from None


def _check_request(name: str, request: TenantRequest, gpu_count: int) -> None:
    """Raise :class:`ConfigError` naming the first bad field of one tenant's request."""
    where = f"tenants[{name!r}]"
    if not isinstance(name, str) or not name:
        raise ConfigError(SOURCE, "tenants", name, "tenant names must be non-empty strings")
    if not isinstance(request, TenantRequest):
        raise ConfigError(SOURCE, where, request, "expected a TenantRequest")
    if not _number(request.compute_slices, f"{where}.compute_slices") > 0:
        raise ConfigError(SOURCE, f"{where}.compute_slices", request.compute_slices, "must be > 0")
    if _number(request.memory_gib, f"{where}.memory_gib") < 0:
        raise ConfigError(SOURCE, f"{where}.memory_gib", request.memory_gib, "must be >= 0")
    if request.preferred_gpu is not None:
        gpu = _integer(request.preferred_gpu, f"{where}.preferred_gpu")
        if not 0 <= gpu < gpu_count:
            raise ConfigError(SOURCE, f"{where}.preferred_gpu", gpu, f"allowed: 0..{gpu_count - 1} or None")
    if request.mode is not None and not isinstance(request.mode, SharingMode):
        raise ConfigError(SOURCE, f"{where}.mode", request.mode, "expected a SharingMode or None")
    if request.mps_pct is not None and not 0 < _number(request.mps_pct, f"{where}.mps_pct") <= 100:
        raise ConfigError(SOURCE, f"{where}.mps_pct", request.mps_pct, "must be in (0, 100] or None")
    if _integer(request.batch_size, f"{where}.batch_size") < 1:
        raise ConfigError(SOURCE, f"{where}.batch_size", request.batch_size, "must be >= 1")


@dataclass(frozen=True)
class RepairTerms:
    """The unweighted parts of a configuration's repair objective.

    :param compute_slices_off: sum over tenants of |compute slices given - requested|
    :param instance_size_off: sum over tenants of |GI slices - slices the share implies|
    :param preferred_gpu_misses: tenants off their preferred GPU
    :param mode_misses: tenants whose GI runs another mode than requested
    :param moved_tenants: tenants in another GI than in the running configuration, stopped for a restart
    :param reconfiguration_s: GI destroy + create seconds from the running configuration
    :param staged_moves: tenants moved make-before-break (no downtime)
    """

    compute_slices_off: float = 0.0
    instance_size_off: float = 0.0
    preferred_gpu_misses: int = 0
    mode_misses: int = 0
    moved_tenants: int = 0
    reconfiguration_s: float = 0.0
    staged_moves: int = 0

    def distance(self, weights: RepairWeights) -> float:
        """Weighted distance from the request (without the cost of getting there)."""
        return (
            weights.compute_per_slice * self.compute_slices_off
            + weights.instance_size_per_slice * self.instance_size_off
            + weights.preferred_gpu_miss * self.preferred_gpu_misses
            + weights.mode_miss * self.mode_misses
        )

    def reconfiguration_cost(self, weights: RepairWeights) -> float:
        """Weighted cost of getting there from the running configuration."""
        return weights.moved_tenant * self.moved_tenants + weights.staged_move * self.staged_moves + weights.reconfiguration_per_s * self.reconfiguration_s

    def is_zero(self) -> bool:
        """True when the configuration is exactly the request and nothing changes."""
        return (
            self.compute_slices_off <= TOLERANCE * 10
            and self.instance_size_off <= TOLERANCE * 10
            and self.preferred_gpu_misses == self.mode_misses == self.moved_tenants == self.staged_moves == 0
            and self.reconfiguration_s == 0.0
        )


@dataclass(frozen=True)
class RepairResult:
    """A repaired configuration and how it was obtained.

    :param configuration: the feasible configuration
    :param distance: weighted distance from the request (:meth:`RepairTerms.distance`)
    :param reconfiguration_cost: weighted cost of reaching it from the running configuration
    :param terms: the unweighted terms
    :param changed: True when it differs from the running configuration (always True when
        there was none)
    :param solve_ms: wall time of the whole repair, milliseconds
    :param fast_path: True when no ILP was solved
    :param optimal: True when every ILP solved was proved optimal
    :param solver_objective: sum of the ILP objectives (None on the fast path); equals
        ``distance + reconfiguration_cost`` up to share rounding for a single GPU
    """

    configuration: Configuration
    distance: float
    reconfiguration_cost: float
    terms: RepairTerms
    changed: bool
    solve_ms: float
    fast_path: bool
    optimal: bool = True
    solver_objective: float | None = None


@dataclass(frozen=True)
class _Anchor:
    """The running configuration as the ILPs see it (tolerant of stale entries)."""

    layouts: tuple[Layout, ...]
    modes: Mapping[tuple[int, GpuInstance], SharingMode]
    positions: Mapping[str, tuple[int, GpuInstance]]

    @classmethod
    def of(cls, config: Configuration | None, gpus: tuple[str, ...]) -> _Anchor:
        if config is None:
            return cls(tuple(Layout(g, ()) for g in gpus), {}, {})
        layouts, modes, positions = [], {}, {}
        for g, gpu_name in enumerate(gpus):
            layout = config.layouts[g]
            if layout.gpu != gpu_name or layout_violation(layout) is not None:
                layout = Layout(gpu_name, ())  # nothing sound to keep on this GPU
            layouts.append(layout)
            for i, gi in enumerate(_instances(layout)):
                if g < len(config.modes) and i < len(config.modes[g]):
                    modes[(g, gi)] = config.modes[g][i]
        for name, p in config.placements.items():
            if 0 <= p.gpu_index < len(layouts):
                instances = _instances(layouts[p.gpu_index])
                if 0 <= p.instance_index < len(instances):
                    positions[name] = (p.gpu_index, instances[p.instance_index])
        return cls(tuple(layouts), modes, positions)

    def move_cost(self, name: str, g: int, gi: GpuInstance, weights: RepairWeights, staged: bool) -> float:
        """What moving tenant ``name`` to ``gi`` on GPU g costs: 0 if it runs there,
        ``staged_move`` if ``staged`` and the move can be made before the break (``gi`` runs
        now, or fits next to the GIs holding tenants), ``moved_tenant`` otherwise."""
        before = self.positions.get(name)
        if before is None or before == (g, gi):
            return 0.0
        return weights.staged_move if staged and self.can_stage(g, gi) else weights.moved_tenant

    def can_stage(self, g: int, gi: GpuInstance) -> bool:
        """True when a tenant can start in ``gi`` on GPU g while the running GIs that hold
        tenants keep serving."""
        layout = self.layouts[g]
        if gi in _instances(layout):
            return True
        occupied = sorted({p for h, p in self.positions.values() if h == g})
        return fits_alongside(occupied, gi, layout.gpu)


def _instances(layout: Layout) -> tuple[GpuInstance, ...]:
    """The GIs tenants can be placed in, in instance-index order."""
    return layout.instances if load_gpu(layout.gpu).mig_supported else (WHOLE_DEVICE,)


def _instance_size(gpu_name: str, gi: GpuInstance) -> tuple[float, float]:
    """(compute slices, memory GiB) of a GI, the whole device on a GPU without MIG."""
    gpu = load_gpu(gpu_name)
    if not gpu.mig_supported:
        return NON_MIG_COMPUTE_SLICES, gpu.memory_gib
    profile = gpu.profiles[gi.profile]
    return float(profile.compute_slices), profile.memory_gib


def feasibility_problems(config: Configuration, problem: RepairProblem) -> list[str]:
    """Everything that keeps ``config`` from serving ``problem``'s tenants (empty if none).

    Beyond :meth:`Configuration.problems`: GPU types and count, the driver's layout rules,
    tenants not in the request, memory of co-located tenants, and share sums.
    """
    found = config.problems(list(problem.tenants))
    if len(config.layouts) != len(problem.gpus):
        return found + [f"{len(config.layouts)} layouts for {len(problem.gpus)} GPUs"]
    for g, (layout, gpu_name) in enumerate(zip(config.layouts, problem.gpus)):
        if layout.gpu != gpu_name:
            found.append(f"GPU {g}: layout for {layout.gpu}, the GPU is a {gpu_name}")
        elif problem.driver_major is not None and (v := layout_violation(layout, driver_major=problem.driver_major)):
            found.append(f"GPU {g}: {v}")
    if found:
        return found
    memory: dict[tuple[int, int], float] = {}
    share: dict[tuple[int, int], float] = {}
    for name, p in config.placements.items():
        if name not in problem.tenants:
            found.append(f"tenant {name} is placed but not in the request")
            continue
        key = (p.gpu_index, p.instance_index)
        memory[key] = memory.get(key, 0.0) + problem.tenants[name].memory_gib
        share[key] = share.get(key, 0.0) + p.mps_pct
    for (g, i), used in sorted(memory.items()):
        gi = _instances(config.layouts[g])[i]
        _, capacity = _instance_size(problem.gpus[g], gi)
        if used > capacity + TOLERANCE:
            found.append(f"GPU {g} instance {i} ({gi.profile}): tenants need {used:g} GiB, it has {capacity:g}")
        if share[(g, i)] > 100.0 + TOLERANCE:
            found.append(f"GPU {g} instance {i} ({gi.profile}): shares sum to {share[(g, i)]:g}% > 100%")
    return found


def repair_terms(config: Configuration, problem: RepairProblem, current: Configuration | None = None) -> RepairTerms:
    """The unweighted objective terms of a feasible ``config`` for ``problem``.

    :param current: the running configuration (None: nothing runs yet, every GI is created)
    """
    anchor = _Anchor.of(current, problem.gpus)
    compute_off = size_off = 0.0
    gpu_misses = mode_misses = moved = staged = 0
    for name, request in problem.tenants.items():
        p = config.placements[name]
        gi = _instances(config.layouts[p.gpu_index])[p.instance_index]
        slices, _ = _instance_size(problem.gpus[p.gpu_index], gi)
        compute_off += abs(slices * p.mps_pct / 100.0 - request.compute_slices)
        wanted = request.wanted_instance_slices
        size_off += 0.0 if wanted is None else abs(slices - wanted)
        gpu_misses += request.preferred_gpu is not None and request.preferred_gpu != p.gpu_index
        mode_misses += request.mode is not None and config.modes[p.gpu_index][p.instance_index] != request.mode
        before = anchor.positions.get(name)
        if before is not None and before != (p.gpu_index, gi):
            if problem.make_before_break and anchor.can_stage(p.gpu_index, gi):
                staged += 1
            else:
                moved += 1
    seconds = sum(change_plan(old, new).estimated_s for old, new in zip(anchor.layouts, config.layouts))
    return RepairTerms(compute_off, size_off, gpu_misses, mode_misses, moved, seconds, staged)


def _meets_exactly(config: Configuration, problem: RepairProblem) -> bool:
    """True when ``config`` is feasible and gives every tenant exactly what it asked for."""
    if feasibility_problems(config, problem):
        return False
    if any(config.placements[n].batch_size != r.batch_size for n, r in problem.tenants.items()):
        return False
    return repair_terms(config, problem, config).is_zero()


@dataclass
class _GpuPlan:
    """The solution of one GPU's layout ILP."""

    layout: Layout
    modes: tuple[SharingMode, ...]
    placements: dict[str, TenantPlacement]
    objective: float
    optimal: bool


@dataclass
class _Solver:
    """One repair: the problem, the running configuration and the prices."""

    problem: RepairProblem
    anchor: _Anchor
    weights: RepairWeights
    formulation: str
    tables: list[GpuTable] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tables = [gpu_table(g, tuple(self.problem.variants), self.problem.driver_major) for g in self.problem.gpus]

    def solve(self) -> tuple[Configuration, float, bool]:
        """The repaired configuration, the sum of ILP objectives, and whether all were optimal."""
        names = list(self.problem.tenants)
        for name in names:
            need = self.problem.tenants[name].memory_gib
            if not any(need <= float(t.memory_gib.max()) + TOLERANCE for t in self.tables):
                raise InfeasibleRequest(f"tenant {name} needs {need:g} GiB; no GI on this node has that much")
        if len(self.tables) == 1:
            plan = self._solve_gpu(0, names)
            if plan is None:
                raise InfeasibleRequest(f"the tenants' memory needs ({self._memory(names):g} GiB) cannot be packed on GPU 0 ({self.problem.gpus[0]})")
            plans = [plan]
        else:
            plans = self._solve_node(names)
        placed = {name: placement for p in plans for name, placement in p.placements.items()}
        # Placements in request order, so that equal requests give equal mappings.
        config = Configuration(tuple(p.layout for p in plans), tuple(p.modes for p in plans), {n: placed[n] for n in names})
        return config, sum(p.objective for p in plans), all(p.optimal for p in plans)

    def _memory(self, names: list[str]) -> float:
        return sum(self.problem.tenants[n].memory_gib for n in names)

    def _solve_node(self, names: list[str]) -> list[_GpuPlan]:
        """Assign tenants to GPUs, then lay out each GPU; cut assignments that cannot be packed."""
        cuts: list[tuple[int, tuple[str, ...]]] = []
        cache: dict[tuple[int, tuple[str, ...]], _GpuPlan | None] = {}
        for round_ in range(MAX_ASSIGNMENT_ROUNDS):
            # The search starts from the local-search assignment; once a GPU of it cannot be
            # packed (rare), the assignment ILP with no-good cuts takes over.
            quick = self._assign_quickly(names) if round_ == 0 and self.formulation == "search" else None
            groups = quick if quick is not None else self._assign(names, cuts)
            plans: list[_GpuPlan] = []
            failed = []
            for g, group in enumerate(groups):
                key = (g, tuple(group))
                if key not in cache:
                    cache[key] = self._solve_gpu(g, group)
                if cache[key] is None:
                    failed.append(key)
                else:
                    plans.append(cache[key])  # type: ignore[arg-type]
            if not failed:
                return plans
            cuts.extend(failed)
        raise InfeasibleRequest(f"no packing found after {MAX_ASSIGNMENT_ROUNDS} GPU assignments (memory needs {self._memory(names):g} GiB)")

    def _assignment_costs(self, names: list[str]) -> np.ndarray:
        """Shape (tenants, GPUs): preferred-GPU miss and move cost of each tenant on each GPU;
        ``inf`` where its memory exceeds every GI of the GPU."""
        w = self.weights
        costs = np.full((len(names), len(self.tables)), np.inf)
        for i, name in enumerate(names):
            request = self.problem.tenants[name]
            before = self.anchor.positions.get(name)
            for g, table in enumerate(self.tables):
                if request.memory_gib > float(table.memory_gib.max()) + TOLERANCE:
                    continue
                costs[i, g] = w.preferred_gpu_miss * (request.preferred_gpu is not None and request.preferred_gpu != g)
                costs[i, g] += w.moved_tenant * (before is not None and before[0] != g)
        return costs

    def _capacity_slices(self) -> np.ndarray:
        """Per GPU, the compute slices beyond which the assignment prices overload."""
        return np.array([float(t.gpu.compute_slices) if t.mig else NON_MIG_COMPUTE_SLICES for t in self.tables])

    def _assign_quickly(self, names: list[str]) -> list[list[str]] | None:
        """Stage one by local search (:func:`rlsched.solver.assignment.assign_by_local_search`):
        the assignment ILP's objective, locally optimal; None when it finds no start."""
        requests = [self.problem.tenants[n] for n in names]
        where = assign_by_local_search(
            cost=self._assignment_costs(names),
            compute_slices=np.array([r.compute_slices for r in requests], dtype=np.float64),
            memory_gib=np.array([r.memory_gib for r in requests], dtype=np.float64),
            capacity_slices=self._capacity_slices(),
            memory_capacity_gib=np.array([t.total_memory_gib + TOLERANCE for t in self.tables]),
            compute_weight=self.weights.compute_per_slice,
        )
        if where is None:
            return None
        groups: list[list[str]] = [[] for _ in self.tables]
        for name, g in zip(names, where):
            groups[int(g)].append(name)
        return groups

    def _assign(self, names: list[str], cuts: list[tuple[int, tuple[str, ...]]]) -> list[list[str]]:
        """The assignment ILP: tenant -> GPU (stage one of the decomposition)."""
        w, milp = self.weights, Milp()
        columns: dict[tuple[str, int], int] = {}
        costs, capacities = self._assignment_costs(names), self._capacity_slices()
        for i, name in enumerate(names):
            row = []
            for g in range(len(self.tables)):
                if np.isfinite(costs[i, g]):
                    columns[(name, g)] = milp.add_binary(float(costs[i, g]))
                    row.append(columns[(name, g)])
            milp.add_row(row, [1.0] * len(row), 1.0, 1.0)
        for g, table in enumerate(self.tables):
            on_g = [(n, columns[(n, g)]) for n in names if (n, g) in columns]
            if not on_g:
                continue
            cols = [c for _, c in on_g]
            milp.add_row(cols, [self.problem.tenants[n].memory_gib for n, _ in on_g], upper=table.total_memory_gib + TOLERANCE)
            overload = milp.add_column(w.compute_per_slice, 0.0, INF)
            milp.add_row([*cols, overload], [self.problem.tenants[n].compute_slices for n, _ in on_g] + [-1.0], upper=float(capacities[g]))
        for g, group in cuts:
            milp.add_row([columns[(n, g)] for n in group], [1.0] * len(group), upper=len(group) - 1.0)
        solution = milp.solve()
        if not solution.feasible:
            raise InfeasibleRequest(f"the tenants' memory needs ({self._memory(names):g} GiB) fit no assignment to the node's GPUs")
        groups: list[list[str]] = [[] for _ in self.tables]
        for (name, g), col in columns.items():
            if solution.values[col] > 0.5:
                groups[g].append(name)
        return groups

    def _solve_gpu(self, g: int, names: list[str]) -> _GpuPlan | None:
        """The best layout and packing of GPU ``g`` for the tenants ``names``; None when they cannot fit.

        The exact search when asked for and the tenants are few enough, else the ILP.
        """
        if self.formulation == "search" and len(names) <= MAX_SEARCH_TENANTS:
            return self._search_gpu(g, names)
        return self._ilp_gpu(g, names)

    def _constant(self, g: int, names: list[str]) -> float:
        """The objective terms of GPU ``g`` that no choice changes: all compute requested
        (the GIs' compute is subtracted from it) and the preferred-GPU misses."""
        w, tenants = self.weights, self.problem.tenants
        return sum(
            w.compute_per_slice * tenants[n].compute_slices
            + w.preferred_gpu_miss * (tenants[n].preferred_gpu is not None and tenants[n].preferred_gpu != g)
            for n in names
        )

    def _assign_costs(self, g: int, names: list[str]) -> np.ndarray:
        """Shape (tenants, candidates): the GI-size and moved-tenant cost of each tenant in each
        candidate GI of GPU ``g`` (the mode miss depends on the GI's mode and is added apart)."""
        table, w = self.tables[g], self.weights
        costs = np.zeros((len(names), len(table.candidates)))
        for i, name in enumerate(names):
            wanted = self.problem.tenants[name].wanted_instance_slices
            if wanted is not None:
                costs[i] = w.instance_size_per_slice * np.abs(table.compute_slices - wanted)
            costs[i] += [self.anchor.move_cost(name, g, gi, w, self.problem.make_before_break) for gi in table.candidates]
        return costs

    def _search_gpu(self, g: int, names: list[str]) -> _GpuPlan | None:
        """GPU ``g`` by the exact search (:func:`rlsched.solver.search.search_packing`).

        Needs no tenant cap per GI: the search takes at most MAX_SEARCH_TENANTS (10) tenants,
        far below MAX_TENANTS_PER_INSTANCE.
        """
        table, w = self.tables[g], self.weights
        requests = [self.problem.tenants[n] for n in names]
        modes = list(SharingMode)
        found = search_packing(
            layout_members=table.layout_members,
            layout_cost=w.reconfiguration_per_s * table.change_seconds(self.anchor.layouts[g]),
            compute_slices=table.compute_slices,
            memory_gib=table.memory_gib,
            requested_slices=np.array([r.compute_slices for r in requests], dtype=np.float64),
            tenant_memory_gib=np.array([r.memory_gib for r in requests], dtype=np.float64),
            assign_cost=self._assign_costs(g, names),
            mode_index=np.array([-1 if r.mode is None else modes.index(r.mode) for r in requests], dtype=np.intp),
            compute_weight=w.compute_per_slice,
            mode_weight=w.mode_miss,
            memory_slack_gib=TOLERANCE,
        )
        if found is None:
            return None
        layout = table.layout_of(list(table.layout_members[found.layout]))
        return self._plan(g, table, layout, dict(zip(names, found.candidate_of)), self._constant(g, names) + found.value, True)

    def _ilp_gpu(self, g: int, names: list[str]) -> _GpuPlan | None:
        """The layout ILP of GPU ``g`` for the tenants ``names``; None when they cannot fit.

        Shares are not variables: within one GI the tenants get what they ask for (at most
        the GI each) while the sum fits, and the GI's shortfall is what does not fit. So the
        compute a GI gives is ``min(its slices, sum of min(request, its slices))``, one
        continuous column per GI instead of one per (tenant, GI), which keeps the model small.
        """
        table, w, milp = self.tables[g], self.weights, Milp()
        formulation = "layouts" if self.formulation == "search" else self.formulation
        exists = table.add_layout_choice(milp, formulation, w.reconfiguration_per_s, self.anchor.layouts[g])
        caps, mems = table.compute_slices, table.memory_gib
        # With two or more requested modes each GI runs in one of them: a "slot" per (GI,
        # mode), exactly one slot of an existing GI open. A tenant in a slot of another mode
        # pays the miss in its own assignment cost, which keeps the relaxation tight.
        requested_modes = {self.problem.tenants[n].mode for n in names} - {None}
        slot_modes: list[SharingMode | None] = [m for m in SharingMode if m in requested_modes] if len(requested_modes) > 1 else [None]
        slots: list[tuple[int, SharingMode | None, int]] = []  # (k, mode, open column)
        for k, col in enumerate(exists):
            if len(slot_modes) == 1:
                slots.append((k, None, col))
                continue
            opened = [milp.add_binary(0.0) for _ in slot_modes]
            milp.add_row([*opened, col], [1.0] * len(opened) + [-1.0], 0.0, 0.0)
            slots.extend((k, m, o) for m, o in zip(slot_modes, opened))
        usable: list[list[tuple[int, float]]] = [[] for _ in slots]
        memory_terms: list[list[tuple[int, float]]] = [[] for _ in slots]
        choices: dict[str, list[tuple[int, int]]] = {}  # name -> (slot, x column)
        milp.offset += self._constant(g, names)
        assign_costs = self._assign_costs(g, names)
        for i, name in enumerate(names):
            request = self.problem.tenants[name]
            options = []
            for j, (k, mode, opened) in enumerate(slots):
                if request.memory_gib > mems[k] + TOLERANCE:
                    continue
                cost = float(assign_costs[i, k]) + w.mode_miss * (mode is not None and request.mode is not None and mode != request.mode)
                x = milp.add_binary(cost)
                milp.add_row([x, opened], [1.0, -1.0], upper=0.0)
                usable[j].append((x, min(request.compute_slices, float(caps[k]))))
                if request.memory_gib > 0:
                    memory_terms[j].append((x, request.memory_gib))
                options.append((j, x))
            if not options:
                return None
            choices[name] = options
            milp.add_row([x for _, x in options], [1.0] * len(options), 1.0, 1.0)
        for j, (k, _, opened) in enumerate(slots):
            if usable[j]:
                given = milp.add_column(-w.compute_per_slice, 0.0, float(caps[k]))
                milp.add_row([given, opened], [1.0, -float(caps[k])], upper=0.0)
                cols, vals = zip(*usable[j])
                milp.add_row([given, *cols], [1.0, *(-v for v in vals)], upper=0.0)
            if memory_terms[j]:
                cols, vals = zip(*memory_terms[j])
                milp.add_row([*cols, opened], [*vals, -float(mems[k])], upper=TOLERANCE)
            if len(usable[j]) > MAX_TENANTS_PER_INSTANCE:  # every tenant keeps its minimum share
                cols = [x for x, _ in usable[j]]
                milp.add_row([*cols, opened], [1.0] * len(cols) + [-float(MAX_TENANTS_PER_INSTANCE)], upper=0.0)
        solution = milp.solve()
        if not solution.feasible:
            return None
        chosen = {name: slots[max(options, key=lambda o: solution.values[o[1]])[0]] for name, options in choices.items()}
        layout = table.layout_of([k for k, col in enumerate(exists) if solution.values[col] > 0.5])
        return self._plan(g, table, layout, {n: k for n, (k, _, _) in chosen.items()}, solution.objective, solution.optimal)

    def _plan(self, g: int, table: GpuTable, layout: Layout, chosen: dict[str, int], objective: float, optimal: bool) -> _GpuPlan:
        """Turn one GPU's chosen layout and tenant -> candidate map into placements."""
        instances = _instances(layout)
        position = {gi: i for i, gi in enumerate(instances)}
        members: list[list[str]] = [[] for _ in instances]
        for name, k in chosen.items():
            members[position[table.candidates[k]]].append(name)
        shares: dict[str, float] = {}
        modes = []
        for i, gi in enumerate(instances):
            slices = _instance_size(table.gpu.name, gi)[0]
            shares.update(fill_shares(slices, {n: self.problem.tenants[n].compute_slices for n in members[i]}))
            modes.append(self._mode_of(g, gi, members[i]))
        placements = {
            n: TenantPlacement(g, position[table.candidates[k]], shares[n], self.problem.tenants[n].batch_size)
            for n, k in chosen.items()
        }
        return _GpuPlan(layout, tuple(modes), placements, objective, optimal)

    def _mode_of(self, g: int, gi: GpuInstance, group: list[str]) -> SharingMode:
        """The mode most of the GI's tenants asked for; else the running one; else MPS."""
        votes: dict[SharingMode, int] = {}
        for name in group:
            mode = self.problem.tenants[name].mode
            if mode is not None:
                votes[mode] = votes.get(mode, 0) + 1
        running = self.anchor.modes.get((g, gi))
        if votes:
            order = list(SharingMode)
            return max(votes, key=lambda m: (votes[m], m == running, -order.index(m)))
        return running if running is not None else SharingMode.MPS


def fill_shares(instance_slices: float, requests: Mapping[str, float]) -> dict[str, float]:
    """Shares (percent) of one GI's tenants: each gets what it asks for, capped by the GI.

    When the requests do not fit, every tenant loses the same fraction (proportional
    scaling), which gives the same total as any other split. Shares are at least
    :data:`MIN_SHARE_PCT`, rounded to :data:`SHARE_DECIMALS` decimals, and sum to <= 100.

    :param instance_slices: compute slices of the GI
    :param requests: tenant -> requested compute slices
    """
    if not requests:
        return {}
    wanted = {n: min(100.0, 100.0 * r / instance_slices) for n, r in requests.items()}
    total = sum(wanted.values())
    scale = min(1.0, 100.0 / total)
    step = 10.0 ** -SHARE_DECIMALS
    # Floor to the rounding step so that the rounded shares never sum above 100 through
    # rounding; the floor of 1% can still push a crowded GI over, so rescale the others.
    shares = {n: max(MIN_SHARE_PCT, math.floor(v * scale / step + 1e-9) * step) for n, v in wanted.items()}
    excess = sum(shares.values()) - 100.0
    if excess > 0:
        spare = {n: v - MIN_SHARE_PCT for n, v in shares.items()}
        room = sum(spare.values())
        shares = {n: MIN_SHARE_PCT + max(0, math.floor(spare[n] * (1 - excess / room) / step + 1e-9)) * step for n in shares}
    return {n: round(v, SHARE_DECIMALS) for n, v in shares.items()}


def _check_current(current: Configuration | None, problem: RepairProblem) -> None:
    if current is None:
        return
    if len(current.layouts) != len(problem.gpus):
        raise ConfigError(SOURCE, "current.layouts", len(current.layouts), f"the node has {len(problem.gpus)} GPUs")
    for g, (layout, gpu_name) in enumerate(zip(current.layouts, problem.gpus)):
        if layout.gpu != gpu_name:
            raise ConfigError(SOURCE, f"current.layouts[{g}].gpu", layout.gpu, f"GPU {g} is a {gpu_name}")


def repair(
    problem: RepairProblem,
    current: Configuration | None = None,
    weights: RepairWeights = RepairWeights(),
    formulation: str = "search",
    fast_path: bool = True,
) -> RepairResult:
    """The feasible configuration nearest to ``problem``'s requests.

    :param current: the running configuration; the reconfiguration-cost terms are measured
        from it (None: nothing runs, every GI must be created)
    :param weights: prices of the objective terms
    :param formulation: how each GPU's layout is chosen: ``"search"`` (exact search over the
        enumerated layouts, the default; GPUs with more than
        :data:`~rlsched.solver.search.MAX_SEARCH_TENANTS` tenants use the layout ILP),
        ``"layouts"`` (the layout ILP, the reference) or ``"placements"`` (free GI binaries
        under the catalog rules; the slow naive baseline). All three reach the same optimum.
    :param fast_path: return ``current`` without solving when it meets the request exactly
    :raises ConfigError: bad ``current`` (GPU count or types)
    :raises InfeasibleRequest: no configuration can hold every tenant
    """
    started = time.perf_counter()
    if formulation not in FORMULATIONS:
        raise ConfigError(SOURCE, "formulation", formulation, f"allowed: {', '.join(FORMULATIONS)}")
    _check_current(current, problem)
    if fast_path and current is not None and _meets_exactly(current, problem):
        return RepairResult(current, 0.0, 0.0, RepairTerms(), False, (time.perf_counter() - started) * 1e3, True)
    solver = _Solver(problem, _Anchor.of(current, problem.gpus), weights, formulation)
    config, objective, optimal = solver.solve()
    terms = repair_terms(config, problem, current)
    return RepairResult(
        configuration=config,
        distance=terms.distance(weights),
        reconfiguration_cost=terms.reconfiguration_cost(weights),
        terms=terms,
        changed=config != current,
        solve_ms=(time.perf_counter() - started) * 1e3,
        fast_path=False,
        optimal=optimal,
        solver_objective=objective,
    )


def _placed_instance(config: Configuration, p: TenantPlacement) -> GpuInstance | None:
    """The GI a placement points at, or None when there is none of a known profile."""
    layout = config.layouts[p.gpu_index]
    instances = _instances(layout)
    if not 0 <= p.instance_index < len(instances):
        return None
    gi = instances[p.instance_index]
    return gi if gi == WHOLE_DEVICE or gi.profile in load_gpu(layout.gpu).profiles else None


def requests_from_configuration(config: Configuration, memory_gib: Mapping[str, float]) -> RepairProblem:
    """The per-tenant requests that ``config`` meets exactly (GPU, mode, share, size, batch).

    A placement that points at no GI asks for one compute slice on its GPU (or anywhere).

    :param memory_gib: tenant -> memory need, GiB; exactly the placed tenants
    """
    unknown = sorted(set(memory_gib) - set(config.placements))
    if unknown:
        raise ConfigError(SOURCE, "memory_gib", unknown[0], "unknown tenant: it has no placement in the requested configuration")
    gpus = tuple(layout.gpu for layout in config.layouts)
    tenants = {}
    for name, p in config.placements.items():
        if name not in memory_gib:
            raise ConfigError(SOURCE, f"memory_gib[{name!r}]", None, "missing: every placed tenant needs its memory need")
        on_gpu = 0 <= p.gpu_index < len(gpus)
        gi = _placed_instance(config, p) if on_gpu else None
        slices = 1.0 if gi is None else _instance_size(gpus[p.gpu_index], gi)[0]
        mode = None
        if gi is not None and p.gpu_index < len(config.modes) and p.instance_index < len(config.modes[p.gpu_index]):
            mode = config.modes[p.gpu_index][p.instance_index]
        pct = p.mps_pct if 0 < p.mps_pct <= 100 else 100.0
        tenants[name] = TenantRequest(
            compute_slices=slices * pct / 100.0,
            memory_gib=memory_gib[name],
            preferred_gpu=p.gpu_index if on_gpu else None,
            mode=mode,
            mps_pct=pct,
            batch_size=max(1, p.batch_size),
        )
    return RepairProblem(gpus, tenants)


def repair_configuration(
    requested: Configuration,
    memory_gib: Mapping[str, float],
    current: Configuration | None = None,
    weights: RepairWeights = RepairWeights(),
    formulation: str = "search",
) -> RepairResult:
    """Repair an exact requested configuration (e.g. from a baseline policy).

    A feasible ``requested`` comes back unchanged, without a solve. Otherwise its
    per-tenant requests (:func:`requests_from_configuration`) are repaired, measuring moves
    and GI changes from ``current``, or from ``requested`` itself when nothing runs yet.
    """
    started = time.perf_counter()
    problem = requests_from_configuration(requested, memory_gib)
    if not feasibility_problems(requested, problem):
        terms = repair_terms(requested, problem, current) if current is not None else RepairTerms()
        return RepairResult(
            requested, terms.distance(weights), terms.reconfiguration_cost(weights), terms,
            requested != current, (time.perf_counter() - started) * 1e3, True,
        )
    anchor = current if current is not None else requested
    result = repair(problem, anchor, weights, formulation, fast_path=False)
    if current is None:
        terms = repair_terms(result.configuration, problem, None)
        result = RepairResult(
            result.configuration, terms.distance(weights), terms.reconfiguration_cost(weights), terms, True,
            result.solve_ms, False, result.optimal, result.solver_objective,
        )
    return result
