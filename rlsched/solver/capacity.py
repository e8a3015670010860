"""Capacity planning: the fewest GPUs of one type that meet every inference service's SLO.

iGniter's question (Xu et al., TPDS 2023), asked before any online manager runs: given
services (model, latency SLO, request rate), how many GPUs, how is each cut (MIG layout,
exact placements), and where does each service run (GI, MPS share, batch)?

How (:func:`plan_capacity`):

- **Options.** For every service, GI profile (the whole device on a GPU without MIG), MPS
  share (2.5% steps) and batch level, the performance model gives the batch latency curve
  with MPS interference as a function of the co-runners' summed L2 pressure
  (:meth:`~rlsched.perfmodel.PerformanceModel.latency_curve_ms_under_pressure`, exactly
  linear in it). :func:`request_p99_many_ms` turns a curve into the p99 of a request's
  latency (batching window + queueing + service) at the service's rate, a queueing model of
  the simulator's batcher with constants fitted to replays of it
  (``configs/calibration/plan-latency.yaml``); an option keeps the largest pressure its
  co-runners may put on it with that p99 still within the SLO.
- **GI patterns, GPU layouts.** A pattern is a set of options sharing one GI of a profile
  (shares <= 100%, memory fits, each member's tolerated pressure >= its co-runners' sum).
  GIs of one profile are interchangeable (MIG isolates them), so the master MILP picks
  patterns that cover every service once and per-layout GPU counts
  (:func:`~rlsched.hardware.enumerate_layouts`, maximal layouts) that offer enough GIs of
  every profile; it minimises GPUs, then the total compute share.
- **Column generation.** Seed patterns come from first-fit packings (a member that no
  longer tolerates its co-runners is raised to its next share, as iGniter does). The
  master's LP relaxation prices new patterns: the same packing, ordered by the duals, first;
  when it finds none, one small HiGHS MILP per profile (a knapsack with big-M interference
  rows) looks for the pattern of most negative reduced cost, and when none is left the LP
  bound is proven. The integer master is then solved over the generated patterns (price
  and branch).

The plan is checked with the exact performance model (actual co-runners) and, on request,
in the request-level simulator (:mod:`rlsched.solver.capacity_verify`).
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import stats

from rlsched.decision import BATCH_LEVELS, Configuration, SharingMode, TenantPlacement
from rlsched.errors import ConfigError
from rlsched.hardware import GpuInstance, Layout, enumerate_layouts, load_gpu
from rlsched.perfmodel import CoRunner, PerformanceModel
from rlsched.perfmodel.calibration import load_support, packaged_calibration_dir
from rlsched.solver.milp import Milp, SolverError
from rlsched.workloads.tenants import InferenceTenant

#: MPS share grid, percent: iGniter rounds shares up to 2.5% steps (the iGniter baseline
#: reads it from here).
SHARE_STEP_PCT = 2.5
#: The request latency quantile of a service's SLO (p99): what a plan reports and a replay checks.
REQUEST_QUANTILE = 0.99
#: Co-runner pressure above which an option's tolerance is not told apart (a GI's members
#: put at most a few tenths each on one another).
MAX_TOLERATED_PRESSURE = 8.0
#: Bisection steps for an option's tolerated pressure (resolution 8 / 2^14 = 0.0005).
PRESSURE_BISECTIONS = 14
#: Newton steps for the queue tail's decay (converges to machine precision well within).
TAIL_DECAY_NEWTON_STEPS = 40
#: The largest Poisson count :func:`_poisson_quantile` tells apart: above any batch level (a
#: window's mean arrivals never exceed the batch they fit in, 64).
MAX_BATCH_ARRIVALS = 256
#: The batcher's timeout a planned service gets (the tenant default: one source).
BATCH_TIMEOUT_MS: float = InferenceTenant.__dataclass_fields__["batch_timeout_ms"].default
#: Column generation stops after this many seconds (the integer master still runs).
COLUMN_GENERATION_BUDGET_S = 2.0
#: HiGHS options of the integer master (the GPU count is integral; the time limit guards).
MASTER_OPTIONS: dict[str, object] = {"presolve": "on", "mip_rel_gap": 1e-4, "time_limit": 10.0}
#: HiGHS options of a pricing MILP (its time limit: what is left of the budget, at most
#: PRICING_TIME_LIMIT_S; none is started with less than MIN_PRICING_S left).
PRICING_OPTIONS: dict[str, object] = {"presolve": "on", "mip_rel_gap": 1e-4}
PRICING_TIME_LIMIT_S = 2.0
MIN_PRICING_S = 0.05
#: Random orders the packing heuristics try besides their fixed ones (seeds and pricing).
RANDOM_ORDERS = 8


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
@dataclass(frozen=True)
class QueueingCalibration:
    """The fitted constants of :func:`request_p99_ms` (``configs/calibration/plan-latency.yaml``,
    written by ``scripts/calibrate_plan_latency.py`` from replays of the simulator's queue).

    :param in_flight_quantile: quantile of the in-flight batch's size whose service an
        arriving request waits out
    :param own_batch_quantile: quantile of the size of the batch a request is served in
    :param tail_constant: C of the queue-wait tail P(wait > t) ~ C exp(-theta t)
    :param max_load: the highest full-batch load (rate x mean latency of a full batch / its
        size) a plan may put on one service
    :param source: how the numbers were obtained
    """

    in_flight_quantile: float
    own_batch_quantile: float
    tail_constant: float
    max_load: float
    source: str


#: The calibration file of :func:`request_p99_ms` (a support file of the calibration folder).
QUEUEING_CALIBRATION_FILE = "plan-latency.yaml"


@functools.cache
def load_queueing_calibration(path: Path | None = None) -> QueueingCalibration:
    """The :class:`QueueingCalibration` in ``path`` (the packaged file by default), validated
    (a bad field: ConfigError naming it)."""
    path = path or packaged_calibration_dir() / QUEUEING_CALIBRATION_FILE
    if not path.is_file():  # load_support would fall back to the packaged file
        raise ConfigError(path, "<file>", str(path), "no such calibration file")
    doc = load_support(path.parent, path.name)
    fields = doc.get("request_p99")
    if not isinstance(fields, dict):
        raise ConfigError(path, "request_p99", fields, "expected a mapping of the fitted constants")
    values = {}
    for name, low, high in (("in_flight_quantile", 0.0, 1.0), ("own_batch_quantile", 0.0, 1.0), ("tail_constant", 0.0, math.inf), ("max_load", 0.0, 1.0)):
        value = fields.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
            raise ConfigError(path, f"request_p99.{name}", value, f"expected a number in ({low:g}, {high:g})")
        values[name] = float(value)
    source = fields.get("source")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(path, "request_p99.source", source, "every fitted number needs its source")
    return QueueingCalibration(**values, source=source)


def _tail_decay(arrivals_per_batch: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """theta > 0 with a (e^theta - 1) = B theta, per element (a < B): the decay, per waiting
    request, of the queue-length tail of a server of full batches of B during which a
    Poisson mean of a requests arrive (the Cramer-Lundberg root of the bulk queue)."""
    a, b = np.maximum(arrivals_per_batch, 1e-300), batch.astype(float)
    # Newton from the right of the root of this convex function converges monotonically;
    # theta = 2 ln(2B/a) + 2 lies right of it (there a e^theta exceeds B theta + a).
    theta = np.minimum(2.0 * np.log(np.maximum(2.0 * b / a, 1.0)) + 2.0, 700.0)
    for _ in range(TAIL_DECAY_NEWTON_STEPS):
        grow = a * np.exp(theta)
        theta = theta - (grow - a - b * theta) / np.maximum(grow - b, 1e-300)
    return theta


@functools.cache
def _poisson_thresholds(quantile: float) -> np.ndarray:
    """``t[x]``: the Poisson mean at which P(N <= x) falls to ``quantile`` (x = 0..
    :data:`MAX_BATCH_ARRIVALS`), so that the quantile of Poisson(m) is the count of t below m."""
    x = np.arange(MAX_BATCH_ARRIVALS + 1)
    lo, hi = np.zeros(len(x)), x + 20.0 * np.sqrt(x + 1.0) + 20.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        above = stats.poisson.cdf(x, mid) >= quantile
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return lo


def _poisson_quantile(quantile: float, mean: np.ndarray) -> np.ndarray:
    """The ``quantile`` of Poisson(``mean``), elementwise (capped at :data:`MAX_BATCH_ARRIVALS`)."""
    return np.searchsorted(_poisson_thresholds(quantile), mean, side="left").astype(float)


def request_p99_many_ms(mean_ms: np.ndarray, p99_ms: np.ndarray, batch: np.ndarray, rate_rps: float | np.ndarray,
                        timeout_ms: float = BATCH_TIMEOUT_MS, calibration: QueueingCalibration | None = None) -> np.ndarray:
    """Predicted p99 of a request's latency (wait + batching + service) per row: a dynamic
    batcher of maximum batch ``batch[i]`` (the simulator's: a batch starts when the batch is
    full or the oldest request has waited ``timeout_ms``, never before the server is free)
    at Poisson rate ``rate_rps`` with the batch latency curve of row i; inf when the
    server's full-batch load exceeds :attr:`QueueingCalibration.max_load`.

    The prediction adds three terms:

    - **the window**: the batcher's timeout (batch > 1) or the in-flight batch's service,
      whichever is longer; that service counts only in the part of the time the server is
      busy beyond 1%. Busy batches settle at the least k whose window's arrivals fit in k,
      and fluctuate around it: the arrivals of a window are Poisson, amplified by
      1 / sqrt(1 - s^2) where s is the rate times the curve's slope per batch (a long batch
      makes the next one longer). The in-flight batch is the
      :attr:`~QueueingCalibration.in_flight_quantile` of that distribution;
    - **the queue**: when the queue outgrows full batches, the p99 of the wait for the full
      batches ahead from the Cramer-Lundberg tail of the bulk queue (:func:`_tail_decay`,
      constant :attr:`~QueueingCalibration.tail_constant`), less one batch's share already
      counted in the window (for a batch of 1 this is exactly M/D/1's tail);
    - **the service**: the p99 latency of the request's own batch, at the
      :attr:`~QueueingCalibration.own_batch_quantile` of the same distribution.

    :param mean_ms: mean batch latency for batch 1..L, ms, shape (N, L)
    :param p99_ms: p99 batch latency for batch 1..L, ms, shape (N, L)
    :param batch: the batcher's maximum batch per row (1..L), shape (N,)
    :param rate_rps: mean request rate, requests/s (one, or one per row)
    """
    cal = calibration or load_queueing_calibration()
    mean = np.atleast_2d(np.asarray(mean_ms, dtype=float))
    p99 = np.atleast_2d(np.asarray(p99_ms, dtype=float))
    cap = np.asarray(batch, dtype=int).reshape(-1)
    rows = np.arange(mean.shape[0])
    lam = np.broadcast_to(np.asarray(rate_rps, dtype=float) / 1000.0, cap.shape)  # requests per ms
    sizes = np.arange(1, mean.shape[1] + 1)
    full_ms = mean[rows, cap - 1]
    # Busy batch size: the least k whose window's arrivals fit in it on average.
    fits = (lam[:, None] * np.maximum(mean, timeout_ms) <= sizes) & (sizes <= cap[:, None])
    feasible = fits.any(axis=1) & (lam * full_ms / cap <= cal.max_load)
    k = np.argmax(fits, axis=1) + 1
    k_ms = mean[rows, k - 1]
    arrivals = lam * np.maximum(k_ms, timeout_ms)
    slope = np.where(cap > 1, lam * (full_ms - mean[:, 0]) / np.maximum(cap - 1, 1), 0.0)
    amplify = 1.0 / np.sqrt(1.0 - np.clip(slope, 0.0, 0.999) ** 2)

    def batch_at(quantile: float) -> np.ndarray:
        upper = _poisson_quantile(quantile, arrivals)
        return np.clip(np.ceil(arrivals + (upper - arrivals) * amplify), 1, cap).astype(int)

    busy = np.minimum(1.0, lam * k_ms / k)
    miss = 1.0 - REQUEST_QUANTILE
    in_flight_ms = mean[rows, batch_at(cal.in_flight_quantile) - 1] * np.maximum(0.0, 1.0 - miss / np.maximum(busy, 1e-12))
    window_ms = np.maximum(in_flight_ms, np.where(cap > 1, timeout_ms, 0.0))
    theta = _tail_decay(lam * full_ms, cap)
    queue_ms = np.maximum(0.0, math.log(cal.tail_constant / miss) * full_ms / (np.maximum(theta, 1e-300) * cap) - full_ms / cap)
    latency = window_ms + queue_ms + p99[rows, batch_at(cal.own_batch_quantile) - 1]
    return np.where(feasible, latency, math.inf)


def request_p99_ms(mean_ms: Sequence[float] | np.ndarray, p99_ms: Sequence[float] | np.ndarray, rate_rps: float,
                   timeout_ms: float = BATCH_TIMEOUT_MS, calibration: QueueingCalibration | None = None) -> float:
    """:func:`request_p99_many_ms` for one batcher whose maximum batch is ``len(mean_ms)``."""
    return float(request_p99_many_ms(np.asarray(mean_ms, dtype=float)[None, :], np.asarray(p99_ms, dtype=float)[None, :],
                                     np.array([len(mean_ms)]), rate_rps, timeout_ms, calibration)[0])


def _tolerated_pressure(m0: np.ndarray, p0: np.ndarray, m1: np.ndarray, p1: np.ndarray, batch: np.ndarray, rate_rps: float,
                        slo_ms: float) -> np.ndarray:
    """Per row: the largest co-runner pressure P (up to :data:`MAX_TOLERATED_PRESSURE`) with
    :func:`request_p99_many_ms` <= ``slo_ms``; the curves are linear in P (rows of ``m0``,
    ``p0`` at P = 0 and ``m1``, ``p1`` at P = 1); -1 when even P = 0 fails."""

    def meets(pressure: np.ndarray) -> np.ndarray:
        at = pressure[:, None]
        return request_p99_many_ms(m0 + at * (m1 - m0), p0 + at * (p1 - p0), batch, rate_rps) <= slo_ms

    lo, hi = np.zeros(len(batch)), np.full(len(batch), MAX_TOLERATED_PRESSURE)
    ok_lo, ok_hi = meets(lo), meets(hi)
    for _ in range(PRESSURE_BISECTIONS):  # the prediction grows with the pressure
        mid = (lo + hi) / 2.0
        ok = meets(mid)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return np.where(ok_hi, MAX_TOLERATED_PRESSURE, np.where(ok_lo, lo, -1.0))


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
        """A request's least possible p99 latency: :func:`request_p99_ms` of a batch of 1 on
        the largest instance, alone, at a vanishing rate (no batching wait)."""
        m0, p0, _, _ = self.curves(model, self.profiles[-1], 100.0)
        return request_p99_ms(m0[:1], p0[:1], 1e-9)

    def batches(self, model: str, profile: str | None) -> list[int]:
        """The batch levels whose memory fits a GI of ``profile``."""
        cap = self.gi_memory_gib(profile) + 1e-9
        return [b for b in BATCH_LEVELS if self.perf.memory_gib(self.gpu.name, model, b) <= cap]

    def options(self, index: int, spec: ServiceSpec) -> list[ServiceOption]:
        """The service's non-dominated options: per profile, the least share that meets the
        SLO alone, then only shares that tolerate clearly more co-runner pressure (each
        at the batch tolerating the most), and 100%."""
        found: list[ServiceOption] = []
        for profile in self.profiles:
            batches = self.batches(spec.model, profile)
            if not batches:
                continue
            # Every (share, batch) at once: rows share-major.
            curves = [self.curves(spec.model, profile, share) for share in self.shares]
            m0, p0, m1, p1 = (np.repeat(np.stack([c[j] for c in curves]), len(batches), axis=0) for j in range(4))
            cap = np.tile(np.array(batches), len(self.shares))
            tolerated = _tolerated_pressure(m0, p0, m1, p1, cap, spec.rate_rps, spec.slo_ms).reshape(len(self.shares), len(batches))
            last_kept = -math.inf
            for s_index, share in enumerate(self.shares):
                best, neg_b = max((tolerated[s_index, j], -b) for j, b in enumerate(batches))
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
                              f"below {s.model}'s least latency on {table.gpu.name} ({least:.2f} ms p99: batch 1 alone on the largest instance)")


# ---------------------------------------------------------------------------- patterns
def pattern_feasible(members: Sequence[ServiceOption], memory_gib: float) -> bool:
    """Shares <= 100%, memory fits, every member tolerates its co-runners' pressure."""
    if sum(o.mps_pct for o in members) > 100.0 + 1e-9 or sum(o.memory_gib for o in members) > memory_gib + 1e-9:
        return False
    total = sum(o.pressure for o in members)
    return all(total - o.pressure <= o.max_pressure + 1e-12 for o in members)


def _insert(members: list[ServiceOption], candidates: Sequence[ServiceOption], ladder: dict[int, list[ServiceOption]],
            memory_gib: float) -> list[ServiceOption] | None:
    """``members`` plus one of ``candidates`` (tried by increasing share), raising members
    that no longer tolerate their co-runners to their next option (more share, more
    tolerance: iGniter's step) until the pattern is feasible; None when it never is.

    :param ladder: per service, its options in this profile by increasing share
    """
    for option in candidates:
        trial = members + [option]
        while not pattern_feasible(trial, memory_gib):
            total = sum(o.pressure for o in trial)
            raised = False
            for k, o in enumerate(trial):
                if total - o.pressure > o.max_pressure + 1e-12:
                    steps = ladder[o.service]
                    higher = steps.index(o) + 1
                    if higher < len(steps):
                        trial[k], raised = steps[higher], True
            if not raised:
                break
        else:
            return trial
    return None


def _pack(order: Sequence[int], ladder: dict[int, list[ServiceOption]], profile: str | None, memory_gib: float) -> list[GiPattern]:
    """First fit of the services in ``order`` into GIs of ``profile`` (:func:`_insert`), a new
    GI at the service's least share when it fits in none."""
    bins: list[list[ServiceOption]] = []
    for service in order:
        for k, members in enumerate(bins):
            grown = _insert(members, ladder[service], ladder, memory_gib)
            if grown is not None:
                bins[k] = grown
                break
        else:
            bins.append([ladder[service][0]])
    return [GiPattern(profile, tuple(b)) for b in bins]


def _ladders(options: dict[int, list[ServiceOption]], profile: str | None) -> dict[int, list[ServiceOption]]:
    """Per service with options in ``profile``: those options by increasing share."""
    ladders = {s: sorted((o for o in opts if o.profile == profile), key=lambda o: o.mps_pct) for s, opts in options.items()}
    return {s: steps for s, steps in ladders.items() if steps}


def _seed_patterns(options: dict[int, list[ServiceOption]], profile: str | None, memory_gib: float, rng: random.Random) -> list[GiPattern]:
    """Seed columns: singletons, and first-fit packings of the services by decreasing least
    share, by decreasing pressure, by increasing tolerance and in :data:`RANDOM_ORDERS`
    random orders."""
    ladder = _ladders(options, profile)
    patterns = [GiPattern(profile, (steps[0],)) for steps in ladder.values()]
    orders = [sorted(ladder, key=lambda s: -ladder[s][0].mps_pct), sorted(ladder, key=lambda s: -ladder[s][0].pressure),
              sorted(ladder, key=lambda s: ladder[s][-1].max_pressure)]
    orders += [rng.sample(sorted(ladder), len(ladder)) for _ in range(RANDOM_ORDERS)]
    for order in orders:
        patterns += [p for p in _pack(order, ladder, profile, memory_gib) if len(p.members) > 1]
    return patterns


def _price_greedy(options: dict[int, list[ServiceOption]], profile: str | None, memory_gib: float, duals: np.ndarray,
                  profile_dual: float, epsilon: float, rng: random.Random) -> GiPattern | None:
    """A pattern of negative reduced cost found by packing one GI with the services of the
    highest duals first, of the highest dual per least compute first, and in
    :data:`RANDOM_ORDERS` orders drawn by dual; the most negative, or None."""
    ladder = {s: steps for s, steps in _ladders(options, profile).items() if duals[s] > 1e-9}
    if not ladder:
        return None
    services = sorted(ladder)
    orders = [sorted(services, key=lambda s: -duals[s]), sorted(services, key=lambda s: -duals[s] / max(ladder[s][0].compute_fraction, 1e-9))]
    # Random orders, a service's place drawn with its dual as the weight (exponential race).
    orders += [sorted(services, key=lambda s: rng.expovariate(1.0) / duals[s]) for _ in range(RANDOM_ORDERS)]
    best: tuple[float, GiPattern] | None = None
    for order in orders:
        members: list[ServiceOption] = []
        for service in order:
            members = _insert(members, ladder[service], ladder, memory_gib) or members
        cost = sum(epsilon * o.compute_fraction - duals[o.service] for o in members) + profile_dual
        if members and cost < -1e-7 and (best is None or cost < best[0]):
            best = (cost, GiPattern(profile, tuple(members)))
    return best[1] if best else None


def _price(options: list[ServiceOption], profile: str | None, memory_gib: float, duals: np.ndarray, profile_dual: float,
           epsilon: float, time_limit_s: float) -> tuple[GiPattern | None, bool]:
    """The pattern of ``profile`` with the most negative reduced cost, or None; and whether
    the answer is proven (False when the MILP stopped at ``time_limit_s``)."""
    cand = [o for o in options if o.profile == profile and duals[o.service] > epsilon * o.compute_fraction + 1e-9]
    if not cand:
        return None, True
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
        solution = milp.solve(PRICING_OPTIONS | {"time_limit": time_limit_s})
    except SolverError:  # a pricing round without an answer only ends column generation early
        return None, False
    proven = solution.status in ("kOptimal", "kInfeasible")
    if not solution.feasible or solution.objective + profile_dual >= -1e-7:
        return None, proven
    members = tuple(cand[j] for j in range(len(cand)) if solution.values[x[j]] > 0.5)
    return (GiPattern(profile, members) if members and pattern_feasible(members, memory_gib) else None), proven


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

    rng = random.Random(0)  # the heuristics' random orders: a plan is a function of its input
    for p in table.profiles:
        for pattern in _seed_patterns(options, p, memory[p], rng):
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
    deadline = time.perf_counter() + budget_s  # the options above are not column generation
    while time.perf_counter() < deadline:
        milp, _, _ = build(False)
        lp = milp.solve({"presolve": "off"})
        if lp.row_duals.size == 0:
            break
        duals = lp.row_duals[: len(services)]
        profile_duals = [-float(lp.row_duals[len(services) + k]) for k in range(len(table.profiles))]
        added = False
        for k, p in enumerate(table.profiles):  # the packing heuristic first: a pricing MILP takes seconds
            pattern = _price_greedy(options, p, memory[p], duals, profile_duals[k], epsilon, rng)
            added = (pattern is not None and add(pattern)) or added
        if added:
            continue
        exact = True
        for k, p in enumerate(table.profiles):
            left_s = deadline - time.perf_counter()
            if left_s < MIN_PRICING_S:
                exact = False
                break
            pattern, proven = _price(every, p, memory[p], duals, profile_duals[k], epsilon, min(left_s, PRICING_TIME_LIMIT_S))
            exact = exact and proven
            added = (pattern is not None and add(pattern)) or added
        if not added and not exact:
            break
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
    """The highest rate one whole GPU (largest instance, alone, the best batch) serves within
    ``slo_ms`` by :func:`request_p99_ms` (0 when even a lone request misses it), requests/s."""
    if table.min_latency_ms(model) > slo_ms:
        return 0.0
    m0, p0, _, _ = table.curves(model, table.profiles[-1], 100.0)
    cap = np.array(table.batches(model, table.profiles[-1]))
    mean, p99 = np.repeat(m0[None, :], len(cap), axis=0), np.repeat(p0[None, :], len(cap), axis=0)
    lo, hi = np.zeros(len(cap)), np.full(len(cap), 1e6)
    for _ in range(50):
        mid = (lo + hi) / 2.0
        ok = request_p99_many_ms(mean, p99, cap, mid) <= slo_ms
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return float(lo.max())


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
