"""Capacity planning: the fewest GPUs of one type that meet every inference service's SLO.

iGniter's question (Xu et al., TPDS 2023), asked before any online manager runs: given
services (model, latency SLO, request rate), how many GPUs, how is each cut (MIG layout,
exact placements), and where does each service run (GI, MPS share, batch)?

How (:func:`plan_capacity`):

- **Options.** For every service, GI profile (the whole device on a GPU without MIG), MPS
  share (2.5% steps) and batch level, the performance model gives the batch latency curve
  with MPS interference as a function of the co-runners' summed L2 pressure
  (:meth:`~rlsched.perfmodel.PerformanceModel.latency_curve_ms_under_pressure`, exactly
  linear in it). :func:`request_p99_ms` turns a curve into the p99 of a request's latency
  (queueing + batching + service) at the service's rate; an option keeps the largest
  pressure its co-runners may put on it with that p99 still within the SLO.
- **GI patterns, GPU layouts.** A pattern is a set of options sharing one GI of a profile
  (shares <= 100%, memory fits, each member's tolerated pressure >= its co-runners' sum).
  GIs of one profile are interchangeable (MIG isolates them), so the master MILP picks
  patterns that cover every service once and per-layout GPU counts
  (:func:`~rlsched.hardware.enumerate_layouts`, maximal layouts) that offer enough GIs of
  every profile; it minimises GPUs, then the total compute share.
- **Column generation.** The master's LP relaxation prices new patterns: one small HiGHS
  MILP per profile (a knapsack with big-M interference rows) finds the pattern of most
  negative reduced cost; when none is left the LP bound is proven. The integer master is
  then solved over the generated patterns (price and branch).

The plan is checked with the exact performance model (actual co-runners) and, on request,
in the request-level simulator (:mod:`rlsched.solver.capacity_verify`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from rlsched.decision import BATCH_LEVELS, Configuration, SharingMode, TenantPlacement
from rlsched.errors import ConfigError
from rlsched.hardware import GpuInstance, Layout, enumerate_layouts, load_gpu
from rlsched.perfmodel import CoRunner, PerformanceModel
from rlsched.solver.milp import Milp, SolverError
from rlsched.workloads.tenants import InferenceTenant

#: MPS share grid, percent: iGniter rounds shares up to 2.5% steps (the iGniter baseline
#: reads it from here).
SHARE_STEP_PCT = 2.5
#: Quantile of the Poisson arrivals during one batch window that the next batch must hold
#: (:func:`request_p99_ms`). With 0.99 every replayed plan of a 9-set bench_plan.py run
#: passed (8 of 9 without repair); 0.9 failed most replays; 0.999 predicted about twice
#: the replayed p99.
ARRIVAL_QUANTILE = 0.99
#: The batcher's timeout a planned service gets (the tenant default: one source).
BATCH_TIMEOUT_MS: float = InferenceTenant.__dataclass_fields__["batch_timeout_ms"].default
#: Column generation stops after this many seconds (the integer master still runs).
COLUMN_GENERATION_BUDGET_S = 2.0
#: HiGHS options of the integer master (the GPU count is integral; the time limit guards).
MASTER_OPTIONS: dict[str, object] = {"presolve": "on", "mip_rel_gap": 1e-4, "time_limit": 10.0}
#: HiGHS options of a pricing MILP.
PRICING_OPTIONS: dict[str, object] = {"presolve": "on", "mip_rel_gap": 1e-4, "time_limit": 2.0}


@dataclass(frozen=True)
class ServiceSpec:
    """An inference service to provision.

    :param name: unique service name
    :param model: an inference model of the performance model
    :param slo_ms: p99 latency objective per request (arrival to answer), ms
    :param rate_rps: mean request rate, requests/s
    """

    name: str
    model: str
    slo_ms: float
    rate_rps: float

    @property
    def max_batch(self) -> int:
        """The largest batch a plan may give it."""
        return BATCH_LEVELS[-1]


@dataclass(frozen=True)
class ServiceOption:
    """One way a service can run in a GI of a profile (a candidate member of a pattern).

    :param service: index of the service in the planned list
    :param profile: GI profile (None: the whole GPU without MIG)
    :param mps_pct: MPS share of the GI, percent
    :param batch: the batcher's maximum batch
    :param memory_gib: device memory at that batch, GiB
    :param max_pressure: summed co-runner L2 pressure it tolerates with its predicted p99
        within the SLO (>= 0)
    :param pressure: L2 pressure it puts on its co-runners
    :param compute_fraction: share of the whole GPU's SMs it is given
    """

    service: int
    profile: str | None
    mps_pct: float
    batch: int
    memory_gib: float
    max_pressure: float
    pressure: float
    compute_fraction: float


@dataclass(frozen=True)
class GiPattern:
    """Options sharing one GI of ``profile`` (a column of the master MILP)."""

    profile: str | None
    members: tuple[ServiceOption, ...]

    @property
    def compute_fraction(self) -> float:
        """Whole-GPU SM fraction its members are given in all."""
        return sum(o.compute_fraction for o in self.members)


@dataclass(frozen=True)
class PlannedService:
    """Where and how one service runs in a plan.

    :param predicted_latency_ms_p99: :func:`request_p99_ms` with the exact co-runners
    :param throughput_rps: the most requests/s it serves at its batch and share (batch over
        the mean batch latency with its co-runners)
    """

    name: str
    model: str
    gpu: int
    instance: GpuInstance | None
    mps_pct: float
    batch: int
    predicted_latency_ms_p99: float
    throughput_rps: float


@dataclass
class CapacityPlan:
    """A plan: GPU count and type, each GPU's layout, each service's placement.

    :param method: ``rlsched`` (this module) or ``igniter`` (the baseline's greedy)
    :param layouts: one MIG layout per GPU (empty layouts on a GPU without MIG)
    :param services: per service, in input order
    :param solve_s: wall time of planning, seconds
    :param lower_bound_gpus: proven lower bound on the GPUs (column generation converged),
        None when not proven
    :param notes: what the planner wants the user to know (repairs, limits reached)
    """

    gpu_type: str
    method: str
    layouts: list[Layout]
    services: list[PlannedService]
    solve_s: float
    lower_bound_gpus: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        """GPUs the plan uses."""
        return len(self.layouts)

    def configuration(self) -> Configuration:
        """The plan as a node :class:`~rlsched.decision.Configuration` (every GI in MPS mode)."""
        mig = load_gpu(self.gpu_type).mig_supported
        modes = tuple((SharingMode.MPS,) * (len(layout) if mig else 1) for layout in self.layouts)
        placements = {}
        for s in self.services:
            index = self.layouts[s.gpu].instances.index(s.instance) if s.instance is not None else 0
            placements[s.name] = TenantPlacement(s.gpu, index, s.mps_pct, s.batch)
        return Configuration(tuple(self.layouts), modes, placements)

    def to_json(self) -> dict:
        """The JSON contract of ``rlsched plan`` (without the verification)."""
        per_gpu: list[dict] = [{"gpu": g, "layout": layout.spec(), "tenants": []} for g, layout in enumerate(self.layouts)]
        for s in self.services:
            per_gpu[s.gpu]["tenants"].append({
                "name": s.name, "model": s.model, "instance": s.instance.spec() if s.instance else "whole-gpu",
                "mps_pct": s.mps_pct, "batch": s.batch, "predicted_latency_ms_p99": round(s.predicted_latency_ms_p99, 3),
                "throughput_rps": round(s.throughput_rps, 1),
            })
        return {"gpus": self.gpus, "gpu_type": self.gpu_type, "method": self.method, "gpu_plans": per_gpu,
                "solve_time_s": round(self.solve_s, 4), "lower_bound_gpus": self.lower_bound_gpus, "notes": list(self.notes)}


# ---------------------------------------------------------------------------- latency
@functools.cache
def _poisson_mean_limits() -> np.ndarray:
    """``limits[k - 1]``: the largest Poisson mean whose :data:`ARRIVAL_QUANTILE` quantile is
    at most k (k = 1..the largest batch level)."""
    limits = np.zeros(BATCH_LEVELS[-1])
    for k in range(1, BATCH_LEVELS[-1] + 1):
        lo, hi = 0.0, float(k)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if stats.poisson.cdf(k, mid) >= ARRIVAL_QUANTILE else (lo, mid)
        limits[k - 1] = lo
    return limits


def request_p99_ms(mean_ms: np.ndarray, p99_ms: np.ndarray, rate_rps: float, timeout_ms: float = BATCH_TIMEOUT_MS) -> float:
    """Predicted p99 of a request's latency (wait + batching + service) under a dynamic
    batcher of maximum batch ``len(mean_ms)`` at Poisson rate ``rate_rps``.

    A batch size k is self-consistent when the requests arriving during one batch window
    (the mean service of a batch of k, or the batcher's timeout when longer) fit in a batch
    of k with probability :data:`ARRIVAL_QUANTILE`: batches then stay at most k, and a
    request waits at most one window and is served in the p99 time of a batch of k. The
    prediction is the smallest such bound; inf when no batch up to the maximum holds the
    arrivals (the queue would grow).

    :param mean_ms: mean batch latency for batch 1..B, ms
    :param p99_ms: p99 batch latency for batch 1..B, ms
    """
    window_ms = np.maximum(np.asarray(mean_ms, dtype=float), timeout_ms)
    holds = rate_rps * window_ms / 1000.0 <= _poisson_mean_limits()[: len(window_ms)]
    if not holds.any():
        return math.inf
    return float(np.min(np.where(holds, window_ms + np.asarray(p99_ms, dtype=float), np.inf)))


def _tolerated_pressure(m0: np.ndarray, p0: np.ndarray, m1: np.ndarray, p1: np.ndarray, rate_rps: float, slo_ms: float) -> np.ndarray:
    """Per maximum batch B (index B - 1): the largest co-runner pressure P with
    :func:`request_p99_ms` <= ``slo_ms``, from the curves at P = 0 and P = 1 (latency is
    linear in P: chord values, exact or conservative); negative when even P = 0 fails."""
    sm, sp = np.maximum(m1 - m0, 1e-12), np.maximum(p1 - p0, 1e-12)
    cap_ms = _poisson_mean_limits()[: len(m0)] / rate_rps * 1000.0
    tau = BATCH_TIMEOUT_MS
    per_k = np.minimum.reduce([(slo_ms - m0 - p0) / (sm + sp), (slo_ms - tau - p0) / sp, (cap_ms - m0) / sm])
    per_k = np.where(tau <= cap_ms, per_k, -np.inf)
    return np.maximum.accumulate(per_k)


# ---------------------------------------------------------------------------- options
class OptionTable:
    """The options of a list of services on one GPU type (curves cached per model).

    :param gpu: catalog GPU name
    :param perf: the performance model
    """

    def __init__(self, gpu: str, perf: PerformanceModel) -> None:
        self.gpu = load_gpu(gpu)
        self.perf = perf
        if self.gpu.mig_supported:
            standard = [p for p in self.gpu.profiles.values() if p.variant == "standard"]
            self.profiles: list[str | None] = [p.name for p in sorted(standard, key=lambda p: (p.compute_slices, p.memory_slices))]
        else:
            self.profiles = [None]
        self.shares = tuple(SHARE_STEP_PCT * i for i in range(1, int(round(100.0 / SHARE_STEP_PCT)) + 1))
        self._curves: dict[tuple, tuple[np.ndarray, ...]] = {}

    def gi_memory_gib(self, profile: str | None) -> float:
        """Memory of a GI of ``profile`` (the whole GPU for None), GiB."""
        return self.gpu.profiles[profile].memory_gib if profile else self.gpu.memory_gib

    def compute_fraction(self, profile: str | None) -> float:
        """The whole GPU's SM fraction a GI of ``profile`` owns."""
        return self.gpu.profiles[profile].sm_count / self.gpu.sm_count if profile else 1.0

    def curves(self, model: str, profile: str | None, mps_pct: float) -> tuple[np.ndarray, ...]:
        """(mean, p99) batch latency at pressure 0 and at pressure 1, batch 1..64, ms."""
        key = (model, profile, mps_pct)
        if key not in self._curves:
            b = BATCH_LEVELS[-1]
            m0, p0 = self.perf.latency_curve_ms_under_pressure(self.gpu.name, model, b, profile, mps_pct, 0.0)
            m1, p1 = self.perf.latency_curve_ms_under_pressure(self.gpu.name, model, b, profile, mps_pct, 1.0)
            self._curves[key] = (np.asarray(m0), np.asarray(p0), np.asarray(m1), np.asarray(p1))
        return self._curves[key]

    def min_latency_ms(self, model: str) -> float:
        """A request's least possible p99 latency: :func:`request_p99_ms` on the largest
        instance, alone, at a vanishing rate (the batcher's timeout plus a batch of 1)."""
        m0, p0, _, _ = self.curves(model, self.profiles[-1], 100.0)
        return request_p99_ms(m0, p0, 1e-9)

    def options(self, index: int, spec: ServiceSpec) -> list[ServiceOption]:
        """The service's non-dominated options: per profile, the least share that meets the
        SLO alone, then only shares that tolerate clearly more co-runner pressure (each
        at the batch tolerating the most), and 100%."""
        found: list[ServiceOption] = []
        for profile in self.profiles:
            memory_cap = self.gi_memory_gib(profile)
            batches = [b for b in BATCH_LEVELS if self.perf.memory_gib(self.gpu.name, spec.model, b) <= memory_cap + 1e-9]
            if not batches:
                continue
            last_kept = -math.inf
            for share in self.shares:
                tolerated = _tolerated_pressure(*self.curves(spec.model, profile, share), spec.rate_rps, spec.slo_ms)
                scores = [(tolerated[b - 1], -b) for b in batches]
                best, neg_b = max(scores)
                if best < 0:
                    continue
                if share < 100.0 and best < 1.3 * last_kept + 0.01:
                    continue
                last_kept = best
                batch = -neg_b
                found.append(ServiceOption(
                    index, profile, share, batch, self.perf.memory_gib(self.gpu.name, spec.model, batch), float(best),
                    self.perf.l2_pressure(self.gpu.name, spec.model, batch, profile, share),
                    self.compute_fraction(profile) * share / 100.0,
                ))
        return found

    def predict(self, spec: ServiceSpec, profile: str | None, mps_pct: float, batch: int, colocated: Sequence[CoRunner]) -> tuple[float, float]:
        """(predicted request p99 ms, max throughput rps) with the exact co-runners."""
        mean, p99 = self.perf.latency_curve_ms(self.gpu.name, spec.model, batch, profile, mps_pct, SharingMode.MPS, tuple(colocated))
        return request_p99_ms(mean, p99, spec.rate_rps), batch * 1000.0 / float(mean[-1])


def check_services(services: Sequence[ServiceSpec], table: OptionTable, source: str = "--tenant") -> None:
    """Raise :class:`ConfigError` naming the service and value of anything unplannable:
    a duplicate name, an unknown model, a non-positive SLO or rate, an SLO below the model's
    least latency on this GPU."""
    known = table.perf.inference_models()
    seen: set[str] = set()
    for s in services:
        if s.name in seen:
            raise ConfigError(source, f"{s.name}.name", s.name, "service names must be unique")
        seen.add(s.name)
        if s.model not in known:
            raise ConfigError(source, f"{s.name}.model", s.model, f"unknown model (calibrated inference models: {', '.join(known)})")
        if not (math.isfinite(s.slo_ms) and s.slo_ms > 0):
            raise ConfigError(source, f"{s.name}.slo_ms", s.slo_ms, "the SLO must be a number > 0 (ms)")
        if not (math.isfinite(s.rate_rps) and s.rate_rps > 0):
            raise ConfigError(source, f"{s.name}.rate_rps", s.rate_rps, "the rate must be a number > 0 (requests/s)")
        least = table.min_latency_ms(s.model)
        if s.slo_ms < least:
            raise ConfigError(source, f"{s.name}.slo_ms", s.slo_ms,
                              f"below {s.model}'s least latency on {table.gpu.name} ({least:.2f} ms p99: batch 1 alone on the largest instance, after the batcher's {BATCH_TIMEOUT_MS:g} ms timeout)")


# ---------------------------------------------------------------------------- patterns
def pattern_feasible(members: Sequence[ServiceOption], memory_gib: float) -> bool:
    """Shares <= 100%, memory fits, every member tolerates its co-runners' pressure."""
    if sum(o.mps_pct for o in members) > 100.0 + 1e-9 or sum(o.memory_gib for o in members) > memory_gib + 1e-9:
        return False
    total = sum(o.pressure for o in members)
    return all(total - o.pressure <= o.max_pressure + 1e-12 for o in members)


def _first_fit_patterns(options: dict[int, list[ServiceOption]], profile: str | None, memory_gib: float) -> list[GiPattern]:
    """Seed patterns: singletons, and first fit of least-share options by decreasing share."""
    least = {s: min((o for o in opts if o.profile == profile), key=lambda o: o.mps_pct, default=None) for s, opts in options.items()}
    least = {s: o for s, o in least.items() if o is not None}
    patterns = [GiPattern(profile, (o,)) for o in least.values()]
    bins: list[list[ServiceOption]] = []
    for o in sorted(least.values(), key=lambda o: -o.mps_pct):
        for members in bins:
            if pattern_feasible(members + [o], memory_gib):
                members.append(o)
                break
        else:
            bins.append([o])
    patterns += [GiPattern(profile, tuple(b)) for b in bins if len(b) > 1]
    return patterns


def _price(options: list[ServiceOption], profile: str | None, memory_gib: float, duals: np.ndarray, profile_dual: float,
           epsilon: float) -> GiPattern | None:
    """The pattern of ``profile`` with the most negative reduced cost, or None."""
    cand = [o for o in options if o.profile == profile and duals[o.service] > epsilon * o.compute_fraction + 1e-9]
    if not cand:
        return None
    milp = Milp()
    x = [milp.add_binary(epsilon * o.compute_fraction - duals[o.service]) for o in cand]
    by_service: dict[int, list[int]] = {}
    for j, o in enumerate(cand):
        by_service.setdefault(o.service, []).append(j)
    for js in by_service.values():
        milp.add_row([x[j] for j in js], [1.0] * len(js), upper=1.0)
    milp.add_row(x, [o.mps_pct for o in cand], upper=100.0)
    milp.add_row(x, [o.memory_gib for o in cand], upper=memory_gib)
    most = {s: max(cand[j].pressure for j in js) for s, js in by_service.items()}
    for j, o in enumerate(cand):
        others = [k for k, c in enumerate(cand) if c.service != o.service]
        big_m = sum(v for s, v in most.items() if s != o.service) - o.max_pressure
        if big_m <= 0 or not others:
            continue
        milp.add_row([x[k] for k in others] + [x[j]], [cand[k].pressure for k in others] + [big_m], upper=o.max_pressure + big_m)
    try:
        solution = milp.solve(PRICING_OPTIONS)
    except SolverError:  # a pricing round without an answer only ends column generation early
        return None
    if not solution.feasible or solution.objective + profile_dual >= -1e-7:
        return None
    members = tuple(cand[j] for j in range(len(cand)) if solution.values[x[j]] > 0.5)
    return GiPattern(profile, members) if members and pattern_feasible(members, memory_gib) else None


def plan_capacity(services: Sequence[ServiceSpec], gpu: str, perf: PerformanceModel, table: OptionTable | None = None,
                  budget_s: float = COLUMN_GENERATION_BUDGET_S) -> CapacityPlan:
    """The fewest GPUs of type ``gpu`` (then the least compute share) for ``services``.

    Raises :class:`ConfigError` for an unplannable service (see :func:`check_services`, and
    a service no single instance of this GPU can serve at its rate within its SLO).
    """
    started = time.perf_counter()
    table = table or OptionTable(gpu, perf)
    check_services(services, table)
    options = {i: table.options(i, s) for i, s in enumerate(services)}
    for i, s in enumerate(services):
        if not options[i]:
            raise ConfigError("--tenant", f"{s.name}.rate_rps", s.rate_rps,
                              f"no instance of {table.gpu.name} serves {s.model} at this rate within its {s.slo_ms:g} ms SLO (split the service)")
    every = [o for opts in options.values() for o in opts]
    layouts = list(enumerate_layouts(table.gpu, maximal=True)) if table.gpu.mig_supported else [Layout(table.gpu.name, ())]
    counts = [[sum(1 for gi in layout if gi.profile == p) for p in table.profiles] if table.gpu.mig_supported else [1] for layout in layouts]
    epsilon = 1.0 / (len(services) + 2)  # the compute term (<= GPUs) never outweighs a GPU
    memory = {p: table.gi_memory_gib(p) for p in table.profiles}
    patterns: list[GiPattern] = []
    seen: set[tuple] = set()

    def add(pattern: GiPattern) -> bool:
        key = (pattern.profile, tuple(sorted((o.service, o.mps_pct, o.batch) for o in pattern.members)))
        if key in seen:
            return False
        seen.add(key)
        patterns.append(pattern)
        return True

    for p in table.profiles:
        for pattern in _first_fit_patterns(options, p, memory[p]):
            add(pattern)

    def build(integer: bool) -> tuple[Milp, list[int], list[int]]:
        milp = Milp()
        lam = [milp.add_column(epsilon * c.compute_fraction, 0.0, 1.0, integer) for c in patterns]
        w = [milp.add_column(1.0, 0.0, float(len(services)), integer) for _ in layouts]
        for i in range(len(services)):
            cols = [lam[j] for j, c in enumerate(patterns) if any(o.service == i for o in c.members)]
            milp.add_row(cols, [1.0] * len(cols), 1.0, 1.0)
        for k, p in enumerate(table.profiles):
            cols = [lam[j] for j, c in enumerate(patterns) if c.profile == p]
            milp.add_row([w[l] for l in range(len(layouts))] + cols, [float(counts[l][k]) for l in range(len(layouts))] + [-1.0] * len(cols), lower=0.0)
        return milp, lam, w

    converged, bound = False, None
    deadline = started + budget_s
    while time.perf_counter() < deadline:
        milp, _, _ = build(False)
        lp = milp.solve({"presolve": "off"})
        if lp.row_duals.size == 0:
            break
        duals = lp.row_duals[: len(services)]
        added = False
        for k, p in enumerate(table.profiles):
            pattern = _price(every, p, memory[p], duals, -float(lp.row_duals[len(services) + k]), epsilon)
            added = (pattern is not None and add(pattern)) or added
        if not added:
            converged, bound = True, lp.objective
            break
    milp, lam, w = build(True)
    solution = milp.solve(MASTER_OPTIONS)
    if not solution.feasible:
        raise SolverError(f"capacity master MILP infeasible ({solution.status})")
    notes = [] if converged else [f"column generation stopped at its {budget_s:g} s budget: the GPU count is not proven minimal"]
    if solution.status != "kOptimal":
        notes.append(f"integer master stopped with status {solution.status}")
    chosen = [patterns[j] for j in range(len(patterns)) if solution.values[lam[j]] > 0.5]
    gpu_layouts = [layouts[l] for l in range(len(layouts)) for _ in range(int(round(solution.values[w[l]])))]
    plan = _decode(services, table, chosen, gpu_layouts, "rlsched")
    plan.solve_s = time.perf_counter() - started
    # GPUs + epsilon * compute >= the LP bound, and the compute is at most the GPUs.
    plan.lower_bound_gpus = int(math.ceil(bound / (1.0 + epsilon) - 1e-6)) if bound is not None else None
    plan.notes = notes
    return plan


def _decode(services: Sequence[ServiceSpec], table: OptionTable, chosen: list[GiPattern], gpu_layouts: list[Layout], method: str) -> CapacityPlan:
    """Patterns onto concrete GIs of the chosen GPUs; unused GIs and GPUs are dropped."""
    free: dict[str | None, list[tuple[int, GpuInstance | None]]] = {}
    for g, layout in enumerate(gpu_layouts):
        if table.gpu.mig_supported:
            for gi in layout:
                free.setdefault(gi.profile, []).append((g, gi))
        else:
            free.setdefault(None, []).append((g, None))
    used: dict[int, list[GpuInstance]] = {}
    where: dict[int, tuple[int, GpuInstance | None, ServiceOption, GiPattern]] = {}
    for pattern in sorted(chosen, key=lambda c: -c.compute_fraction):
        g, gi = free[pattern.profile].pop(0)
        used.setdefault(g, [])
        if gi is not None:
            used[g].append(gi)
        for o in pattern.members:
            where[o.service] = (g, gi, o, pattern)
    renumber = {g: k for k, g in enumerate(sorted(used))}
    layouts = [Layout(table.gpu.name, tuple(used[g])) for g in sorted(used)]
    planned = []
    for i, s in enumerate(services):
        g, gi, o, pattern = where[i]
        co = [CoRunner(services[m.service].model, m.batch, m.mps_pct) for m in pattern.members if m.service != i]
        p99, throughput = table.predict(s, o.profile, o.mps_pct, o.batch, co)
        planned.append(PlannedService(s.name, s.model, renumber[g], gi, o.mps_pct, o.batch, p99, throughput))
    return CapacityPlan(table.gpu.name, method, layouts, planned, 0.0)


def repredict(plan: CapacityPlan, services: Sequence[ServiceSpec], table: OptionTable) -> CapacityPlan:
    """The plan with every service's prediction recomputed for its current co-runners."""
    by_name = {s.name: s for s in services}
    updated = []
    for s in plan.services:
        co = [CoRunner(o.model, o.batch, o.mps_pct) for o in plan.services if o is not s and (o.gpu, o.instance) == (s.gpu, s.instance)]
        p99, throughput = table.predict(by_name[s.name], s.instance.profile if s.instance else None, s.mps_pct, s.batch, co)
        updated.append(PlannedService(s.name, s.model, s.gpu, s.instance, s.mps_pct, s.batch, p99, throughput))
    plan.services = updated
    return plan


def max_rate_rps(table: OptionTable, model: str, slo_ms: float) -> float:
    """The highest rate one whole GPU (largest instance, alone) serves within ``slo_ms`` by
    :func:`request_p99_ms` (0 when even a lone request misses it), requests/s."""
    m0, p0, _, _ = table.curves(model, table.profiles[-1], 100.0)
    lo, hi = 0.0, 1e6
    if table.min_latency_ms(model) > slo_ms:
        return 0.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if request_p99_ms(m0, p0, mid) <= slo_ms else (lo, mid)
    return lo


def plan_igniter(services: Sequence[ServiceSpec], gpu: str, perf: PerformanceModel, table: OptionTable | None = None) -> CapacityPlan:
    """The iGniter-style greedy's plan (:class:`~rlsched.solver.igniter.IgniterGreedy`:
    least share per SLO, placement by interference, a new GPU when a service fits nowhere),
    each GPU one whole-device instance shared with MPS; same checks and output as
    :func:`plan_capacity`."""
    from rlsched.solver.igniter import IgniterGreedy  # it imports this module's share step

    started = time.perf_counter()
    table = table or OptionTable(gpu, perf)
    check_services(services, table)
    whole = table.profiles[-1]

    def latency_ms(model: str, batch: int, share: float, colocated: tuple[CoRunner, ...]) -> float:
        return perf.predict(table.gpu.name, model, batch, whole, share, SharingMode.MPS, colocated).latency_ms_mean

    by_name = {s.name: s for s in services}
    groups = IgniterGreedy(latency_ms).place(by_name, {s.name: s.rate_rps for s in services}, None)
    instance = GpuInstance(0, whole) if whole is not None else None
    layouts = [Layout(table.gpu.name, (instance,) if instance else ()) for _ in groups]
    where = {name: (g, batch, share) for g, group in enumerate(groups) for name, (batch, share) in group.items()}
    planned = []
    for s in services:
        g, batch, share = where[s.name]
        co = [CoRunner(by_name[o].model, b, sh) for o, (b, sh) in groups[g].items() if o != s.name]
        p99, throughput = table.predict(s, whole, min(share, 100.0), batch, co)
        planned.append(PlannedService(s.name, s.model, g, instance, min(share, 100.0), batch, p99, throughput))
    return CapacityPlan(table.gpu.name, "igniter", layouts, planned, time.perf_counter() - started)
