"""The planner: per-window Goodput maximisation over layouts, placements, shares and batches.

MIGRator's idea (arXiv 2407.13126): given the arrival rates expected over the next
window(s), choose the MIG layout of every GPU and where and how every tenant runs so that
the predicted Goodput (:mod:`rlsched.goodput`) minus what reconfiguring costs is largest.
It is one HiGHS MILP (:class:`~rlsched.solver.milp.Milp`: arrays, status checked, one
thread, fixed seed), built from a *value table*:

- Per tenant and option (GI profile, MPS share level, batch size), the predicted Goodput
  over the lookahead, from the performance model the simulator uses
  (``latency_curve_ms`` / ``predict`` / ``train_step_s``):

  * inference: capacity = batch / mean batch latency; a fluid approximation of the
    dynamic batcher (:meth:`Planner.steady_on_time_fractions`: the batch settles where its
    throughput carries the rate, a request waits for the batch in flight, none is on time
    beyond the largest batch's capacity) gives the fraction f answered within the SLO at a
    steady rate; under bursts (:meth:`Planner.on_time_fraction`) f is averaged over
    quantiles of the rate, spread as far as the recent forecasts erred, and the backlog a
    burst above capacity leaves is drained at the spare capacity;
    on-time requests x accuracy x priority weight minus the SLO penalty for the rest
    (``goodput_terms``). The batch (the batcher's maximum) is the one of the tenant's
    levels (up to ``max_batch``, fitting the GI's memory) with the largest value (then the
    largest capacity).
  * best effort: weighted progress (full-GPU seconds, SLICE-TUNE's share penalty), as the
    simulator counts it.
  * continual learning: the accuracy its retraining adds (Ekya's curve, inverted at the
    served model's current accuracy) x the served tenant's requests x their weight.

  A share below 100% is valued with the worst co-runner the scenario could put next to it
  (each other tenant's model at the complementary share, iGniter's L2 interference in the
  performance model): the MILP does not know the actual co-runners (that would make the
  values depend on pairs of decisions), so co-location is priced pessimistically.
- Reconfiguration: an option that is not the tenant's running placement (same GPU, same
  GI kept by the layout, same share, MPS) restarts it. With make-before-break (the
  scenario's ``reconfiguration.make_before_break``, :meth:`Planner.can_stage`) the new
  server starts while the old one serves: no downtime, only the gain of the new option
  forgone until it is ready (GI create + ``restart_s``). Otherwise its downtime
  (``restart_s``, plus, in a GI the layout creates, the catalog's create time and the
  destroy times of the running GIs it overlaps) loses the value it would have earned
  meanwhile, the requests arriving then are charged the SLO penalty, and so are those
  arriving after the restart while the backlog it left drains (:meth:`Planner.late_after_restart`);
  ``weights.reconfiguration_per_s`` is added per second of downtime.
- Payback (no flapping): a change is made only if its predicted gain over the lookahead
  exceeds its cost plus a hurdle, the value model's measured error times what is at stake
  (:meth:`Planner.payback_hurdle`).
- Priority fill: whole configurations with priority-fill GIs (FIKIT) can be weighed against
  the MILP's answer (``candidates`` of :meth:`Planner.plan`), valued as the simulator
  serves them (:meth:`Planner.priority_fill_values`); with ``priority_fill_columns`` the
  MILP itself may run a GI in priority fill (:meth:`Planner._priority_fill_columns`).

Variables: per GPU one layout among the maximal ones (:func:`~rlsched.hardware.enumerate_layouts`,
the one hardware model; plus the running layout), per tenant one option (GPU, GI placement,
share, batch). Constraints: each GI's shares sum to at most 100% and its tenants' memory
fits it, and a GI can hold tenants only if the GPU's chosen layout contains it.

On a multi-GPU node the tenants stay on the GPU they run on and each GPU is one MILP (the
joint MILP over symmetric GPUs takes seconds); the joint MILP is used only when nothing
runs yet.

Departs from MIGRator: one configuration is held over the lookahead windows (a receding
horizon re-planned every interval) rather than a per-window sequence; the MILP's GIs run in
MPS mode (priority fill only as whole candidate configurations or, with
``priority_fill_columns``, as first-tenant and filler columns; time slicing not at all);
co-location interference is priced with the worst co-runner; and the GI wait of a created
instance is estimated from that GI alone (the simulator charges the GPU's whole change plan).
"""

from __future__ import annotations

import copy
import math
import threading
import time
from statistics import NormalDist
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from rlsched.decision import BATCH_LEVELS, SHARE_LEVELS_PCT, Configuration, SharingMode, TenantPlacement, equal_shares
from rlsched.goodput import goodput_terms
from rlsched.hardware import GpuInstance, Layout, enumerate_layouts, fits_alongside, load_gpu
from rlsched.perfmodel import CoRunner
from rlsched.simulator.node import filler_shares, min_idle_fraction
from rlsched.simulator.queueing import replay_busy_fraction, replay_on_time_fractions
from rlsched.solver.milp import Milp, SolverError
from rlsched.workloads.scenario import Scenario
from rlsched.workloads.tenants import BestEffortJob, ContinualLearningJob, InferenceTenant, Tenant

#: Batch a co-runner is assumed to run when valuing a shared GI (the baselines' default).
CO_RUNNER_BATCH = 8
#: Value per percent of share, request-equivalents: breaks ties towards larger shares (a
#: tenant alone in a GI takes all of it) without changing any real trade-off.
SHARE_TIE_BREAK = 1e-6
#: Relative difference below which two batch sizes' values are a tie, broken by throughput
#: (:meth:`Planner._inference_values`). Where every batch answers all on time their values are
#: equal but for floating-point rounding, and the rounding picked b8 one interval and b32 the
#: next: zero-gain batch flips counted as reconfigurations (docs/planner-bursts.md, stop 75).
BATCH_VALUE_TIE = 1e-9
#: HiGHS options of the planner: one thread, fixed seed (deterministic); presolve on
#: (symmetric GPUs and GIs); the gap is relative to a Goodput of thousands per window, so
#: 1e-4 is far below the model's own error; the time limit only guards a runaway solve.
#: An "infeasible" verdict is checked again with presolve off (see ``Planner._solve``).
#: RENS is off: on a cross-GPU move MILP of heldout-retrain, HiGHS 1.16.0's RENS heuristic
#: presolved its sub-MIP for more than 13 minutes (``HPresolve::strengthenInequalities``),
#: past the time limit, which that loop does not check; without RENS the same model is
#: optimal in 0.7 s (docs/results/highs-rens-hang.mps.gz, tests/test_planner_highs.py).
PLANNER_SOLVER_OPTIONS: dict[str, object] = {"presolve": "on", "mip_rel_gap": 1e-4, "time_limit": 5.0,
                                             "mip_heuristic_run_rens": False}


class PlannerSolveCounter:
    """How many planner MILPs this process has solved, and how many of them HiGHS stopped at
    :data:`PLANNER_SOLVER_OPTIONS`' time limit before it proved an answer optimal.

    Why count them: the limit is wall-clock time, so wherever it binds, a planner's answers
    depend on the machine's speed and load. On heldout-retrain (two GPUs) `migrator-queue-slo`'s
    cross-GPU MILPs take 2-6 s on one core; a few a run stop at the 5-s limit even with a core
    to themselves, with answers worth far less than the optimum (-15,934 against -20,695), and
    the same episode earned 2.63M in one run and 2.90M in another (docs/planner-bursts.md,
    stop 95). ``rlsched eval`` reads the counter around every episode and reports the count.
    Library solves run on a worker thread in the daemon, hence the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.solved = 0
        self.time_limited = 0

    def record(self, time_limited: bool) -> None:
        """Count one solve, and whether it stopped at the time limit."""
        with self._lock:
            self.solved += 1
            self.time_limited += bool(time_limited)

    def snapshot(self) -> tuple[int, int]:
        """(solves, solves stopped at the time limit) so far."""
        with self._lock:
            return self.solved, self.time_limited


#: This process's planner MILP solves (:class:`PlannerSolveCounter`).
PLANNER_SOLVES = PlannerSolveCounter()

#: Fraction of the largest batch's throughput below it at which predicted on-time service
#: starts to fall (linearly to 0 at full load): Poisson bursts within an interval. Measured
#: against the request-level simulator it is far too pessimistic (below), but it also leaves
#: the headroom that ``migrator-ilp`` keeps against its forecast's errors (docs/planner-bursts.md).
OVERLOAD_MARGIN = 0.3
#: The queueing tail's slack before a queued request is late, in latencies of the settled
#: batch b: SLO - QUEUE_SLACK_LATENCIES x L(b) (:meth:`Planner.steady_on_time_fractions` with
#: ``queueing_tail``). The tail's one fitted number, fitted to the request-level simulator: 45
#: points, resnet, vgg, bert and alexnet alone in 1g-4g GIs of an A100-40GB, Poisson arrivals at
#: 0.6-0.98 of the largest batch's throughput. On-time fraction error: 0.020 mean, 0.16 worst;
#: the linear :data:`OVERLOAD_MARGIN` on the same points: 0.40 mean, 0.80 worst.
QUEUE_SLACK_LATENCIES = 1.25
#: Quantile points of the per-interval arrival rate the on-time fraction is averaged over
#: when the recent rates vary (:meth:`Planner.on_time_fraction`); the midpoints of 9 equal
#: probability bins reach the 94th percentile, where a burst of the recent window sits.
RATE_QUANTILE_POINTS = 9
#: How far past its start the planner follows a queue's drain (:meth:`Planner._inference_values`
#: with ``backlog_drain``), seconds. Arrivals the queue leaves late past the lookahead, up to
#: this, are charged as SLO violations at the lookahead's share of it: what the drain costs the
#: lookahead, averaged over a hold this long. Without it, a queue that no option drains within
#: the lookahead made every option of the tenant worth nothing, and heldout-retrain's bert was
#: given to a retraining job for the episode (0.62x; docs/planner-bursts.md, stop 72).
#: Charged in full it made bursty tenants' moves look worth more than they earned (train-
#: bursty-high 0.87x, 4x the reconfigurations). Chosen, not fitted: stop 71's guess, untuned.
#: It belongs to the ``backlog_drain`` switch, off by default (its docstring says why).
BACKLOG_HORIZON_S = 300.0
#: The payback rule's margin (:meth:`Planner.payback_hurdle`), a relative error of the value
#: model. ``scripts/bench_value_model.py`` (seed 0, one hour each) measures the burst-aware
#: model's per-interval Goodput error at 0.029 on the steady scenario and 0.52-0.66 on the
#: default and bursty ones; 0.1 is chosen between: it stops the alternating-rate flapping
#: of tests/test_planner.py while a tenant that outgrows its GI still moves.
VALUE_MODEL_ERROR = 0.1
#: Fewest logged arrivals the planner replays to find a priority-fill instance's idle time or
#: a guarded tenant's on-time fraction (:attr:`Planner.arrival_log`); with fewer the fluid
#: batcher and the on-time table stand in.
MIN_ARRIVALS_FOR_REPLAY = 20
#: What a guarded tenant's predicted late request below its SLO target costs the planner, in
#: multiples of the request's priority weight (:class:`SloGuard`). Ten times, chosen, not
#: fitted: a request served is worth at most about its priority weight, so a late guarded
#: request outweighs what the GPU share it would free earns the other tenants, and the
#: planner misses the target only where no configuration meets it (docs/planner-bursts.md,
#: stop 53).
SLO_GUARD_PENALTY = 10.0
_QUANTILE_Z = np.array([NormalDist().inv_cdf((k + 0.5) / RATE_QUANTILE_POINTS) for k in range(RATE_QUANTILE_POINTS)])

Rates = Mapping[str, float]
#: A configuration's (or one tenant's) (value, reconfiguration cost, payback hurdle) under the planner's model (:meth:`Planner.assess_many`).
Terms = tuple[float, float, float]
#: Values computed once per rates and shared by the candidates of one choice
#: (:meth:`Planner.configuration_values`): an MPS option's value, or a priority-fill GI's per member.
OptionValues = dict[tuple, float | dict[str, float]]
#: How a restarted inference option drains the backlog its downtime left (:meth:`Planner.drain`):
#: (capacity, requests/s; SLO slack left by its batch, s; the tenant's queue timeout, s).
Drain = tuple[float, float, float]


class Move(NamedTuple):
    """How a tenant gets from its running placement to an option (:meth:`Planner._move`),
    whatever the option's value and the rates."""

    kind: str
    """"keep" (no restart), "start" (not running yet), "stage" (make-before-break) or "restart" """
    delay_s: float
    """until the new server serves: its restart (a start), restart plus GI create (staged), or
    restart plus the GI's wait (a restart); 0 to keep"""


_KEEP = Move("keep", 0.0)


class PlacementTerms(NamedTuple):
    """What a tenant's terms in :meth:`Planner.assess_many` depend on besides its value and the
    rates: found once per placement and shared by every forecast's valuation."""

    guard: float
    """its SLO guard's charge (:meth:`Planner.slo_guard_cost`)"""
    move: Move
    drain: Drain | None
    """its backlog model (:meth:`Planner.drain`); None to keep"""


#: No rate quantiles: :func:`_on_time_kernel` at the steady rates themselves.
_STEADY = np.empty(0)
#: Priority fill's mode as :attr:`Configuration.placement_keys` holds it (a plain value; reading
#: the enum's member is a Python-level descriptor call in the planner's loops over candidates).
_PRIORITY_FILL = SharingMode.PRIORITY_FILL.value


@njit(cache=True)
def _pairwise_sum(values: np.ndarray) -> float:
    """The sum of up to 128 numbers in numpy's order (eight running sums, folded in pairs): the
    compiled on-time table then answers to the bit what the vectorised one did."""
    n = values.shape[0]
    if n < 8:
        total = 0.0
        for i in range(n):
            total += values[i]
        return total
    partial = values[:8].copy()
    i = 8
    while i < n - n % 8:
        for j in range(8):
            partial[j] += values[i + j]
        i += 8
    total = ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5]) + (partial[6] + partial[7]))
    while i < n:
        total += values[i]
        i += 1
    return total


@njit(cache=True)
def _steady_on_time_column(rate_rps: float, latency_ms: np.ndarray, levels: np.ndarray, slo_ms: float, queueing_tail: bool,
                           dispersion: float, out: np.ndarray) -> None:
    """:meth:`Planner.steady_on_time_table`'s column at one rate, into ``out`` (one per level)."""
    if rate_rps <= 0.0:
        out[:] = 1.0 if latency_ms[0] < slo_ms else 0.0
        return
    settled = -1  # the smallest batch (index) whose throughput carries the rate
    for size in range(1, levels.max() + 1):
        if size * 1000.0 / latency_ms[size - 1] >= rate_rps:
            settled = size - 1
            break
    if settled < 0:
        out[:] = 0.0
        return
    latency = latency_ms[settled]
    fraction = min(max((slo_ms - latency) / latency, 0.0), 1.0)
    for j in range(levels.shape[0]):
        largest = levels[j]
        if settled >= largest:
            out[j] = 0.0
            continue
        rho = rate_rps / (largest * 1000.0 / latency_ms[largest - 1])
        if queueing_tail:
            rho = min(max(rho, 0.0), 1.0 - 1e-9)
            per_request_ms = latency_ms[largest - 1] / largest
            mean_wait_ms = rho / (1.0 - rho) * 0.5 * max(dispersion, 0.0) * per_request_ms
            slack_ms = max(slo_ms - QUEUE_SLACK_LATENCIES * latency, 0.0)
            out[j] = fraction * (1.0 - rho * math.exp(-slack_ms / max(mean_wait_ms, 1e-12)))
        else:
            out[j] = fraction * min(1.0, (1.0 - rho) / OVERLOAD_MARGIN)


@njit(cache=True)
def _on_time_kernel(rates_rps: np.ndarray, quantile_multipliers: np.ndarray, ceiling_rps: float, latency_ms: np.ndarray,
                    levels: np.ndarray, slo_ms: float, queueing_tail: bool, dispersions: np.ndarray, backlog_late: bool) -> np.ndarray:
    """The on-time table (levels x rates) of :meth:`Planner.on_time_table` (rates varying by
    ``quantile_multipliers`` of their mean, capped at ``ceiling_rps``; empty: steady rates,
    :meth:`Planner.steady_on_time_table`), compiled: the daemon planner's objective asks for
    about forty small tables a decision, where numpy's per-call overhead was 42% of its time."""
    n_levels, n_rates, n_quantiles = levels.shape[0], rates_rps.shape[0], quantile_multipliers.shape[0]
    table = np.empty((n_levels, n_rates))
    column = np.empty(n_levels)
    if n_quantiles == 0:
        for k in range(n_rates):
            _steady_on_time_column(rates_rps[k], latency_ms, levels, slo_ms, queueing_tail, dispersions[k], table[:, k])
        return table
    on_time = np.empty((n_levels, n_quantiles))
    quantiles = np.empty(n_quantiles)
    weighted = np.empty(n_quantiles)
    excess = np.empty(n_quantiles)
    for k in range(n_rates):
        rate_rps = rates_rps[k]
        if rate_rps <= 0.0:  # no arrivals: the steady answer
            _steady_on_time_column(rate_rps, latency_ms, levels, slo_ms, queueing_tail, dispersions[k], table[:, k])
            continue
        cap_rps = max(ceiling_rps, rate_rps)
        for q in range(n_quantiles):
            quantiles[q] = min(rate_rps * quantile_multipliers[q], cap_rps)
            _steady_on_time_column(quantiles[q], latency_ms, levels, slo_ms, queueing_tail, dispersions[k], column)
            on_time[:, q] = column
        total_rps = _pairwise_sum(quantiles)
        for j in range(n_levels):
            capacity_rps = levels[j] * 1000.0 / latency_ms[levels[j] - 1]
            if rate_rps >= capacity_rps:
                table[j, k] = 0.0
                continue
            for q in range(n_quantiles):
                weighted[q] = quantiles[q] * on_time[j, q]
                excess[q] = max(quantiles[q] - capacity_rps, 0.0)
            # A quantile past the capacity leaves a backlog drained at the spare capacity; the
            # arrivals meanwhile are late, unless the server rejects what outwaits its timeout.
            late = _pairwise_sum(excess) / n_quantiles / (capacity_rps - rate_rps) if backlog_late else 0.0
            table[j, k] = max(_pairwise_sum(weighted) / total_rps - late, 0.0)
    return table


_kernels_loaded = False


def _load_kernels() -> None:
    """Load the compiled on-time table and request-log replay once per process, with the
    argument types the planner passes them: a first call loads each from numba's cache (15-25
    ms), and no decision should pay for that (the daemon's second decision did: 60 ms on
    ``default``, against 12 for the next; stop 80)."""
    global _kernels_loaded
    if not _kernels_loaded:
        _on_time_kernel(np.ones(1), _STEADY, math.inf, np.ones(1), np.ones(1, dtype=np.int64), 1.0, True, np.ones(1), True)
        replay_on_time_fractions(np.array([0.0, 1.0]), np.ones(1), np.ones(1), 1, 1.0, 1.0)
        _kernels_loaded = True


def _batch_beats(value: float, throughput_rps: float, best_value: float, best_throughput_rps: float) -> bool:
    """Whether a batch worth ``value`` at ``throughput_rps`` ranks above the best so far: by
    value, and by throughput where the values tie within :data:`BATCH_VALUE_TIE`."""
    tolerance = BATCH_VALUE_TIE * max(1.0, abs(value), abs(best_value))
    if abs(value - best_value) <= tolerance:
        return throughput_rps > best_throughput_rps
    return value > best_value


@dataclass(frozen=True)
class SloGuard:
    """An inference tenant's SLO target, and the rates it may reach over the lookahead.

    The planner charges each of the tenant's placements :data:`SLO_GUARD_PENALTY` x its
    priority weight for every request it predicts late beyond the target, its on-time
    fraction taken over these rates (request-weighted). The Goodput objective alone trades
    a high-priority tenant's SLO for the others' Goodput; the guard makes the target a
    constraint the planner breaks only where no configuration meets it.

    :param target: fraction of the tenant's requests to answer on time, e.g. 0.99
    :param rates_rps: rates the tenant may reach, requests/s
    :param probabilities: how likely each rate is (sums to 1)
    :param error_budget: requests the tenant may still answer late over its SLO window
        before it misses the target; a restart of the running tenant is charged the guard's
        penalty for the late answers it leaves beyond this (inf: not charged)
    :param reacts: the planner may wait for a burst in the running placement and react to
        it once measured, paying the late answers from the error budget
        (:meth:`Planner.slo_guard_cost`'s ``staying``): the tenant has been measured, its
        budget is not spent, and it met its target over its last interval (or missed it only
        by restarting)
    """

    target: float
    rates_rps: np.ndarray
    probabilities: np.ndarray
    error_budget: float = math.inf
    reacts: bool = False


@dataclass(frozen=True)
class PlanOption:
    """One way a tenant can run (a column of the MILP).

    :param tenant: tenant name
    :param gpu: GPU index
    :param instance: the GI (None: a GPU without MIG, its whole device)
    :param mps_pct: MPS share of the GI, percent
    :param batch: batch size
    :param memory_gib: memory the tenant needs at ``batch``, GiB
    :param value: predicted Goodput over the lookahead (value table), request-equivalents
    :param reconfiguration: predicted cost of the restart this option needs (0 when it
        keeps the running placement), request-equivalents
    :param hurdle: what the option must gain beyond ``reconfiguration`` to be chosen over
        keeping the running placement (:meth:`Planner.payback_hurdle`; 0 when it keeps it),
        request-equivalents
    :param co_runners: the most other tenants the option's GI may hold (the planner's
        ``co_runner_count``; None: valued against one worst co-runner)
    """

    tenant: str
    gpu: int
    instance: GpuInstance | None
    mps_pct: float
    batch: int
    memory_gib: float
    value: float
    reconfiguration: float
    hurdle: float = 0.0
    co_runners: int | None = None


@dataclass(frozen=True)
class Plan:
    """The planner's answer.

    :param configuration: the configuration to apply for the next interval
    :param objective: predicted Goodput over the lookahead minus reconfiguration cost
        (the MILP's optimum), request-equivalents
    :param value: the value-table part of ``objective``
    :param reconfiguration_cost: the reconfiguration part (``objective = value - cost``)
    :param solve_ms: wall time of building and solving the MILP, ms
    :param status: HiGHS model status
    :param columns: MILP columns (size)
    :param rows: MILP rows
    :param hurdle: the payback hurdles of its changes (:meth:`Planner.payback_hurdle`),
        request-equivalents: it was chosen for ``objective - hurdle``
    """

    configuration: Configuration
    objective: float
    value: float
    reconfiguration_cost: float
    solve_ms: float
    status: str
    columns: int
    rows: int
    hurdle: float = 0.0


class Planner:
    """MIGRator-style Goodput-maximising planner for one scenario's node.

    :param scenario: tenants, GPU type and count, decision interval, Goodput weights
    :param perf_model: the performance model (the simulator's)
    :param memory_gib: ``(tenant name, batch) -> GiB`` (the backend's memory model)
    :param restart_backlog: charge a restart the late answers while the backlog it left
        drains (:meth:`late_after_restart`); ``migrator-ilp`` does not (see below), ``migrator-burst`` does
    :param payback_margin: make a change only if it gains more than its cost plus the
        payback hurdle (:meth:`payback_hurdle`); ``migrator-ilp`` does not, ``migrator-burst`` does
    :param queueing_tail: value the on-time fraction near capacity by the queueing tail of
        :meth:`steady_on_time_fractions` instead of the linear :data:`OVERLOAD_MARGIN`
        (``migrator-queue``)
    :param co_runner_count: value an MPS share against as many co-runners as its GI holds
        (:meth:`_co_runners`), not one: each MILP column carries a co-runner count and a row per
        GI and tenant holds the GI to it (``migrator-queue``). The simulator sums the co-runners'
        L2 pressure, about 0.15-0.17 each at batch 32 whatever their share, so one co-runner
        valued vit's 25% of an H100 7g at 370 req/s where it serves 325 beside two.
    :param priority_fill_columns: the MILP may also run a GI in priority fill (FIKIT): a
        column per tenant as a GI's first tenant and per (filler, first tenant) pair
        (:meth:`_priority_fill_columns`); the answer is kept only if the exact valuation
        (:meth:`assess`) prefers it to the MPS-only MILP's. Off on a node without a
        priority-fill scheduler (``Scenario.priority_fill_scheduler``)
    :param payback_scope: ``"all"`` (default): the payback margin holds every change;
        ``"priority-fill"``: only a tenant that runs in a priority-fill GI must pay back with
        the margin to leave it (``migrator-pf``)
    :param cross_gpu_moves: on a node of several GPUs with tenants running, plan the two GPUs
        whose tenants lose most and least against their best columns again as one MILP in
        which their tenants may move between them (:meth:`_cross_gpu_move`); otherwise each
        running tenant stays on its GPU (``migrator-queue``)
    :param backlog_drain: value the requests an inference tenant has queued
        (:attr:`queued_requests`) by how long each option takes to drain them
        (:meth:`backlog_late_requests`), not spread over the first window as extra arrivals
        (:meth:`forecast`); past the lookahead, out to :attr:`backlog_horizon_s`, at the
        lookahead's share of it. Off everywhere: on ``migrator-queue-slo`` (stops 71-72,
        docs/planner-bursts.md) it predicts per-interval Goodput better and wins on the training
        suite, but flaps on ``default`` and the held-out traces: a starved tenant's rescue is
        valued over a hold the planner does not keep, and another tenant's burst moves it
        back before its queue has drained
    :param restart_added_backlog: with ``restart_backlog``, a restart's drain counts only the
        requests the restart adds to the queue the tenant already holds,
        min(queue + rate x downtime, ``queue_capacity``) - queue (:meth:`restart_added_downtime_s`):
        the simulator queues through a restart, so a starved tenant with a full queue adds nothing
        by restarting. Charged the whole downtime's arrivals, rescues came late
        (docs/planner-bursts.md, stop 75). ``migrator-queue-slo-12``
    :param guard_windows: the lookahead, in windows, the SLO guard's restart charge was
        calibrated against (:meth:`guarded_restart_cost`); over a longer one the charge grows in
        proportion, as the value it is weighed against does (None: never scaled). Unscaled over
        12 windows, train-out-of-phase's high-priority SLO fell to 0.9567, scaled to 0.9856
        (docs/planner-bursts.md, stop 77). ``migrator-queue-slo-12``

    ``restart_backlog`` and ``payback_margin`` are off by default: on ``default`` (seeds 0-2)
    they made the planner hold its first layout and lose 5.2% (docs/planner-bursts.md), while on
    bursty and day/night traces they are most of what ``migrator-burst`` gains.
    """

    def __init__(self, scenario: Scenario, perf_model: object, memory_gib: Callable[[str, int], float],
                 restart_backlog: bool = False, payback_margin: bool = False, queueing_tail: bool = False,
                 co_runner_count: bool = False, priority_fill_columns: bool = False, payback_scope: str = "all",
                 cross_gpu_moves: bool = False, backlog_drain: bool = False, restart_added_backlog: bool = False,
                 guard_windows: int | None = None) -> None:
        if payback_scope not in ("all", "priority-fill"):
            raise ValueError(f"payback_scope must be 'all' or 'priority-fill', not {payback_scope!r}")
        self.payback_scope = payback_scope
        self.restart_backlog, self.payback_margin, self.queueing_tail = restart_backlog, payback_margin, queueing_tail
        self.co_runner_count = co_runner_count
        self.cross_gpu_moves = cross_gpu_moves
        self.backlog_drain = backlog_drain
        self.restart_added_backlog = restart_added_backlog
        self.guard_windows = guard_windows
        self.priority_fill_columns = priority_fill_columns and scenario.priority_fill_scheduler
        self.scenario = scenario
        self.perf = perf_model
        self.memory_gib = memory_gib
        self.gpu = load_gpu(scenario.gpu)
        self.interval_s = float(scenario.decision_interval_s)
        self.share_levels = tuple(float(s) for s in SHARE_LEVELS_PCT)
        self.batch_levels = tuple(int(b) for b in BATCH_LEVELS)
        self.weights = scenario.weights
        self.min_idle_fraction = min_idle_fraction(perf_model)
        if self.gpu.mig_supported:
            self.layouts = list(enumerate_layouts(self.gpu, maximal=True))
        else:
            self.layouts = [Layout(self.gpu.name, ())]
        self._curves: dict[tuple, np.ndarray] = {}
        self._work: dict[tuple, float] = {}
        #: Per inference tenant, the variability of its arrivals as its request log measures
        #: it (the index of dispersion of counts; 1 for Poisson), for the queueing tail (set
        #: by the policy; a tenant not in it is valued as Poisson).
        self.arrival_dispersion: dict[str, float] = {}
        #: Per inference tenant, the highest rate its forecast spread reaches in Goodput valuation
        #: (set by the policy, e.g. the highest rate measured over the spread's window while the
        #: rate is not rising; a tenant not in it is unbounded, and an SLO guard never is).
        self.rate_ceiling_rps: dict[str, float] = {}
        #: Per inference tenant, the arrival times of its last interval's requests (a request
        #: log, seconds), replayed to find the idle time a priority-fill instance's first
        #: tenant leaves and a guarded tenant's on-time fraction (set by the policy; a tenant
        #: not in it is valued by the fluid batcher and the on-time table alone).
        self.arrival_log: dict[str, np.ndarray] = {}
        # Per guarded tenant: the log its replays were of, and their on-time fractions by
        # (GI profile, share, co-runners, batch, rate): one decision asks for the same ones often.
        self._replayed: dict[str, tuple[np.ndarray, dict[tuple, float]]] = {}
        #: Per inference tenant, the requests waiting or in service at the decision (set by
        #: :meth:`forecast` from its ``backlog``; :meth:`backlog_late_requests`, with
        #: ``backlog_drain``, and :meth:`arrival_rate_rps`).
        self.queued_requests: dict[str, float] = {}
        #: How far past its start the drain of a queue is followed (:data:`BACKLOG_HORIZON_S`;
        #: at or below the lookahead: within the lookahead only, e.g. to measure one interval's
        #: value).
        self.backlog_horizon_s = BACKLOG_HORIZON_S
        #: The value model's relative error as the policy measured it on this node, for the
        #: payback margin (:meth:`payback_hurdle`; None: :data:`VALUE_MODEL_ERROR`).
        self.value_model_error: float | None = None
        #: Per inference tenant held to an SLO target, its guard (:class:`SloGuard`; set by
        #: the policy each interval; a tenant not in it is valued by Goodput alone).
        self.slo_guards: dict[str, SloGuard] = {}
        reference = scenario.reference
        self._background_batch = {
            t.name: (reference.placements[t.name].batch_size if reference and t.name in reference.placements else CO_RUNNER_BATCH)
            for t in scenario.tenants if not isinstance(t, InferenceTenant)
        }
        #: Per tenant, the co-runners ``co_runner_count`` values its shares against, hardest first.
        self._pressing = self._pressing_order() if co_runner_count else {}
        _load_kernels()

    def snapshot(self) -> Planner:
        """This planner as it stands, for a solve on another thread (a candidate library's
        worker): the state the policy sets each interval (rates' spread ceilings, dispersion,
        request logs, queues, guards, the value model's error) is copied, so the decision
        loop's next interval does not reach a solve in flight. The caches (latency curves, work
        rates, request-log replays) stay shared: each entry is a function of its key alone
        (a replay's, of its log too), whichever thread fills it, and either thread may use
        what the other computed."""
        planner = copy.copy(self)
        for name in ("arrival_dispersion", "rate_ceiling_rps", "arrival_log", "queued_requests", "slo_guards"):
            setattr(planner, name, dict(getattr(self, name)))
        return planner

    # ------------------------------------------------------------------ value table
    def _slices(self, profile: str | None) -> int | None:
        return self.gpu.profiles[profile].compute_slices if profile else None

    def _gi_memory(self, profile: str | None) -> float:
        return self.gpu.profiles[profile].memory_gib if profile else self.gpu.memory_gib

    def _co_runners(self, tenant: Tenant, mps_pct: float, count: int | None = None) -> list[tuple[CoRunner, ...]]:
        """The co-runner sets a share below 100% is valued against: with ``count`` None, one
        per other model (a single co-runner at :data:`CO_RUNNER_BATCH` holding the rest of
        the GI); else the one set of the ``count`` other tenants that press hardest (jobs,
        always busy, first; then services by their L2 pressure), each at its largest batch
        with an equal part of the rest."""
        if mps_pct >= 100.0 or count == 0:
            return [()]
        if count is None:
            models = sorted({t.model for t in self.scenario.tenants if t.name != tenant.name})
            return [(CoRunner(m, CO_RUNNER_BATCH, 100.0 - mps_pct),) for m in models] or [()]
        worst = self._pressing[tenant.name][:count]
        return [tuple(CoRunner(t.model, self._full_batch(t), (100.0 - mps_pct) / len(worst)) for t in worst)]

    def _full_batch(self, tenant: Tenant) -> int:
        """The batch a tenant runs at full load: a service's largest, a job's own."""
        return tenant.max_batch if isinstance(tenant, InferenceTenant) else self._background_batch[tenant.name]

    def _pressing_order(self) -> dict[str, list[Tenant]]:
        """Per tenant, the other tenants from the hardest-pressing co-runner to the lightest
        (:meth:`_co_runners`): jobs (always busy) first, then services by L2 pressure."""
        def pressure(t: Tenant) -> float:
            if not isinstance(t, InferenceTenant):
                return math.inf
            return self.perf.l2_pressure(self.gpu.name, t.model, t.max_batch, None, self.share_levels[0])
        ranked = sorted(self.scenario.tenants, key=pressure, reverse=True)
        return {t.name: [o for o in ranked if o.name != t.name] for t in self.scenario.tenants}

    def co_runner_counts(self, mps_pct: float, others: int) -> list[int | None]:
        """The co-runner counts an option at ``mps_pct`` is valued at, with ``others`` other
        tenants that could join its GI: [None] without ``co_runner_count``; [0] for a whole GI;
        else 1 up to as many as the rest of the GI holds at the smallest share."""
        if not self.co_runner_count:
            return [None]
        if mps_pct >= 100.0 or others == 0:
            return [0]
        return list(range(1, max(1, min(others, math.floor((100.0 - mps_pct) / self.share_levels[0] + 1e-9))) + 1))

    def latency_ms(self, tenant: InferenceTenant, profile: str | None, mps_pct: float, co_runners: int | None = None) -> np.ndarray:
        """Mean batch latency for batch 1..max_batch (index 0 = batch 1), ms: the worst over
        the co-runners of :meth:`_co_runners` (``co_runners``: their count), with the
        tenant's tuning penalty."""
        key = (tenant.name, profile, mps_pct, co_runners)
        if key not in self._curves:
            curves = [np.asarray(self.perf.latency_curve_ms(self.gpu.name, tenant.model, tenant.max_batch, profile, mps_pct,
                                                            SharingMode.MPS, co, self._slices(profile))[0], dtype=float)
                      for co in self._co_runners(tenant, mps_pct, co_runners)]
            self._curves[key] = np.max(curves, axis=0) * tenant.tuning_latency_factor(mps_pct)
        return self._curves[key]

    def on_time_fraction(self, tenant: InferenceTenant, rate_rps: float, latency_ms: np.ndarray, max_batch: int,
                         rate_cv: float = 0.0) -> float:
        """Predicted fraction of requests answered within the SLO at mean rate ``rate_rps``
        by a dynamic batcher forming batches of up to ``max_batch`` (``latency_ms[b - 1]``:
        mean latency of a batch of b, ms), when the per-interval rate varies around its mean
        with coefficient of variation ``rate_cv`` (0: a steady rate): :meth:`on_time_fractions`
        at one rate."""
        return float(self.on_time_table(tenant, np.array([rate_rps], dtype=float), latency_ms, [max_batch], rate_cv)[0, 0])

    def on_time_table(self, tenant: InferenceTenant, rates_rps: np.ndarray, latency_ms: np.ndarray, max_batches: Sequence[int],
                      rate_cv: float = 0.0, capped: bool = True) -> np.ndarray:
        """:meth:`on_time_fraction` for each largest batch of ``max_batches`` (rows) at each mean
        rate of ``rates_rps`` (columns), in one vectorised call: the planner's hot loop values
        every batch level and lookahead window of an option at once.

        A varying rate is a lognormal with that mean and CV, read at
        :data:`RATE_QUANTILE_POINTS` quantiles and, where ``capped``, capped at the tenant's
        :attr:`rate_ceiling_rps` (never below the mean): each quantile's requests are on time as the
        steady-rate model (:meth:`steady_on_time_fractions`) says at its rate, weighted by
        the requests it brings. A quantile above the largest batch's throughput also leaves
        a backlog that is drained at the spare capacity (throughput minus the mean rate);
        the requests arriving meanwhile are late (fluid: excess / spare of them), unless the
        tenant's server rejects what outwaits its queue timeout: then only the excess itself
        is lost (its quantiles' requests are already counted late). With ``rate_cv`` 0 this is
        the steady-rate model.
        """
        dispersion = self.arrival_dispersion.get(tenant.name, 1.0)
        rates_rps = np.asarray(rates_rps, dtype=float)
        if rate_cv <= 0.0:
            return self.steady_on_time_table(tenant, rates_rps, latency_ms, max_batches, self.queueing_tail, dispersion)
        sigma = math.sqrt(math.log1p(rate_cv * rate_cv))
        # The lognormal's tail is a shape, not a measurement: a tenant whose rate jumps
        # between levels (MMPP, bursty: bert 40 / 160 / 320) errs by 1.0 of its forecast,
        # whose 94th percentile then lies at 2.6x it, past any rate it has reached.
        ceiling = self.rate_ceiling_rps.get(tenant.name) if capped else None
        return _on_time_kernel(rates_rps, np.exp(sigma * _QUANTILE_Z - 0.5 * sigma * sigma), math.inf if ceiling is None else ceiling,
                               np.asarray(latency_ms, dtype=float), np.asarray(max_batches, dtype=np.int64), float(tenant.slo_ms),
                               self.queueing_tail, np.full(rates_rps.shape, float(dispersion)), math.isinf(tenant.queue_timeout_s))

    @staticmethod
    def steady_on_time_fractions(tenant: InferenceTenant, rates_rps: np.ndarray, latency_ms: np.ndarray, max_batch: int,
                                 queueing_tail: bool = False, arrival_dispersion: float = 1.0) -> np.ndarray:
        """:meth:`on_time_fraction` at steady rates (arrivals at each of ``rates_rps``; their
        variability ``arrival_dispersion``, the index of dispersion of counts, 1 for Poisson,
        matters to the queueing tail only).

        Fluid approximation of dynamic batching: the batch settles at the smallest size b
        whose throughput b / L(b) carries the rate; a request waits for the batch in flight
        (uniform over [0, L(b)]) and is then served in L(b), so a fraction
        (SLO - L(b)) / L(b) (clipped to [0, 1]) is on time. Above the largest batch's
        throughput the FIFO backlog grows and every request ends up late (0). Below it:

        - by default the last :data:`OVERLOAD_MARGIN` lose linearly (bursts within the interval);
        - with ``queueing_tail``, requests queue as the heavy-traffic (Kingman) approximation
          says for a server taking L(B) / B per request (B the largest batch) at utilization
          rho: a queueing delay above w with probability rho exp(-w / W), W = rho / (1 - rho)
          x arrival_dispersion / 2 x L(B) / B (the dispersion stands in for Kingman's squared
          coefficient of variation of inter-arrival times, which it equals for renewal
          arrivals and exceeds for clustered ones); a request is late once it waits more than the slack
          SLO - :data:`QUEUE_SLACK_LATENCIES` x L(b).
        """
        return Planner.steady_on_time_table(tenant, rates_rps, latency_ms, [max_batch], queueing_tail, arrival_dispersion)[0]

    @staticmethod
    def steady_on_time_table(tenant: InferenceTenant, rates_rps: np.ndarray, latency_ms: np.ndarray, max_batches: Sequence[int],
                             queueing_tail: bool = False, arrival_dispersion: float | np.ndarray = 1.0) -> np.ndarray:
        """:meth:`steady_on_time_fractions` for each largest batch of ``max_batches`` (rows) at
        each rate (columns; ``arrival_dispersion`` one for all, or one per rate). The settled
        batch is the smallest that carries the rate under any largest batch B, so it is found
        once; B sets whether it is allowed and the tail."""
        rates_rps = np.asarray(rates_rps, dtype=float)
        dispersions = np.empty(rates_rps.shape)  # one array type for every call: each is a compiled specialization to load
        dispersions[:] = arrival_dispersion
        return _on_time_kernel(rates_rps, _STEADY, math.inf, np.asarray(latency_ms, dtype=float), np.asarray(max_batches, dtype=np.int64),
                               float(tenant.slo_ms), queueing_tail, dispersions, math.isinf(tenant.queue_timeout_s))

    def _batch_levels(self, tenant: InferenceTenant, profile: str | None, batch: int | None) -> list[int]:
        """The batches an option is valued at: ``batch``, or (None) every level that fits the GI."""
        if batch is not None:
            return [min(batch, tenant.max_batch)]
        memory = self._gi_memory(profile)
        levels = [b for b in self.batch_levels if b <= tenant.max_batch and self.memory_gib(tenant.name, b) <= memory + 1e-9]
        return levels or [1]

    def _inference_value(self, tenant: InferenceTenant, latency: np.ndarray, levels: Sequence[int], rates: Sequence[Rates],
                         accuracy: float, rate_cv: float) -> tuple[float, int]:
        """(value over the lookahead, batch) of serving ``tenant`` with batch latencies
        ``latency`` (ms, index 0 = batch 1) at the best of ``levels``."""
        return self._inference_values(tenant, latency, levels, [rates], accuracy, rate_cv)[0]

    def _inference_values(self, tenant: InferenceTenant, latency: np.ndarray, levels: Sequence[int], forecasts: Sequence[Sequence[Rates]],
                          accuracy: float, rate_cv: float) -> list[tuple[float, int]]:
        """:meth:`_inference_value` at each forecast (windows of rates), from one on-time table
        over all their windows (its columns are independent: the same numbers as one call each)."""
        window_rates = [np.array([r[tenant.name] for r in rates], dtype=float) for rates in forecasts]
        table = self.on_time_table(tenant, np.concatenate(window_rates), latency, levels, rate_cv)
        queued = self.queued_requests.get(tenant.name, 0.0) if self.backlog_drain else 0.0
        results, start = [], 0
        for rates_rps in window_rates:
            requests = rates_rps * self.interval_s
            total_requests = float(requests.sum())
            # The terms are linear in the request counts: one product per level values every window.
            on_time = np.ascontiguousarray(table[:, start:start + len(rates_rps)]) @ requests
            start += len(rates_rps)
            late_past = np.zeros(len(levels))
            if queued > 0.0 and len(rates_rps):
                rate, lookahead_s = float(rates_rps[0]), self.interval_s * len(rates_rps)
                horizon_s = max(self.backlog_horizon_s, lookahead_s)
                late = self.backlog_late_requests(tenant, queued, rate, latency, levels, horizon_s)
                late_within = np.minimum(late, rate * lookahead_s)
                on_time = np.maximum(on_time - late_within, 0.0)
                # Past the lookahead, at its share of the horizon: options that drain the queue
                # after the lookahead still rank by how soon (BACKLOG_HORIZON_S says why).
                late_past = (late - late_within) * (lookahead_s / horizon_s)
            best: tuple[float, float, int] | None = None
            for b, on, past in zip(levels, on_time.tolist(), late_past.tolist(), strict=True):
                value = goodput_terms(self.weights, tenant.priority.value, on, accuracy, violated=total_requests - on + past).total
                throughput_rps = b * 1000.0 / float(latency[b - 1])
                if best is None or _batch_beats(value, throughput_rps, best[0], best[1]):
                    best = (value, throughput_rps, b)
            assert best is not None
            results.append((best[0], best[2]))
        return results

    @staticmethod
    def backlog_late_requests(tenant: InferenceTenant, queued: float, rate_rps: float, latency_ms: np.ndarray, levels: Sequence[int],
                              horizon_s: float) -> np.ndarray:
        """Per largest batch of ``levels`` (``latency_ms[b - 1]``: a batch of b, ms), the
        arrivals at ``rate_rps`` answered late within ``horizon_s`` because ``queued``
        requests drain ahead of them, FIFO, at that batch's capacity.

        Fluid, as :meth:`late_after_restart`: the head of the queue is taken to be fresh, so
        a batch in service and the next capacity x slack requests are on time; an arrival is
        late until the queue ahead of it falls to that. Where the capacity does not exceed
        the rate, the queue never drains and every arrival is late (the on-time table, which
        sees no queue, may count an overloaded batcher's throughput on time). A server with a
        queue timeout rejects what waits longer: no more than the last timeout's worth of
        arrivals drains. The queued requests themselves are not counted: they are late, or
        rejected, wherever the tenant runs, so their penalty is no option's doing.

        Why: a tenant starved for a while holds a full queue (4,096 requests). Spread over the
        first window as extra arrivals, that queue was valued as served partly on time there
        and wholly on time after, where the node answers nothing on time until it has drained:
        heldout-deploy's bert was moved into a larger GI, valued +2,400 an interval, and
        earned -2,600 to -3,300 in each of the next five (docs/planner-bursts.md, stop 71).
        """
        levels_arr = np.asarray(levels)
        lat = latency_ms[levels_arr - 1]
        capacity = levels_arr * 1000.0 / lat
        slack = np.maximum(tenant.slo_ms - lat, 0.0) / 1000.0
        backlog = min(queued, rate_rps * tenant.queue_timeout_s) if math.isfinite(tenant.queue_timeout_s) else queued
        # The queue measured holds the batch in service: no backlog, but the batcher at work.
        excess = np.maximum(backlog - levels_arr - capacity * slack, 0.0)
        spare = capacity - rate_rps
        with np.errstate(divide="ignore", invalid="ignore"):
            drain_s = np.where(spare > 0.0, excess / spare, np.where(excess > 0.0, np.inf, 0.0))
        return rate_rps * np.minimum(drain_s, horizon_s)

    def _work_rate(self, tenant: Tenant, profile: str | None, mps_pct: float, batch: int, co_runners: int | None = None,
                   colocated: tuple[CoRunner, ...] | None = None) -> float:
        """Best effort: full-GPU seconds of progress per second; CL: samples per second
        (the simulator's formulas; worst co-runner below 100%, or ``co_runners`` of them, or
        exactly the ``colocated`` ones)."""
        key = (tenant.name, profile, mps_pct, batch, co_runners, colocated)
        if key not in self._work:
            rates = []
            for co in [colocated] if colocated is not None else self._co_runners(tenant, mps_pct, co_runners):
                if isinstance(tenant, ContinualLearningJob):
                    step_s = self.perf.train_step_s(self.gpu.name, tenant.model, batch, profile, mps_pct, co)
                    rates.append(batch / step_s if step_s > 0 else 0.0)
                else:
                    pred = self.perf.predict(self.gpu.name, tenant.model, batch, profile, mps_pct, SharingMode.MPS, co, self._slices(profile))
                    solo = self.perf.predict(self.gpu.name, tenant.model, batch)
                    factor = tenant.tuning_throughput_factor(mps_pct) if isinstance(tenant, BestEffortJob) else 1.0
                    rates.append(pred.throughput_per_s / solo.throughput_per_s * factor if solo.throughput_per_s > 0 else 0.0)
            self._work[key] = float(min(rates))
        return self._work[key]

    def _background_value(self, tenant: Tenant, profile: str | None, mps_pct: float, batch: int,
                          rates: Sequence[Rates], accuracy: Mapping[str, float], speed: float = 1.0,
                          co_runners: int | None = None, colocated: tuple[CoRunner, ...] | None = None) -> float:
        """Value of a best-effort or retraining job over the lookahead; ``speed`` scales its
        work rate (a priority-fill filler runs at the idle fraction the first tenant leaves,
        beside the ``colocated`` other fillers)."""
        rate = self._work_rate(tenant, profile, mps_pct, batch, co_runners, colocated) * speed
        horizon_s = self.interval_s * len(rates)
        if isinstance(tenant, BestEffortJob):
            value = goodput_terms(self.weights, tenant.priority.value, best_effort_progress_s=tenant.work_weight * rate * horizon_s).total
        else:
            assert isinstance(tenant, ContinualLearningJob)
            served = self.scenario.tenant(tenant.serves)
            c = tenant.curve
            acc0 = accuracy.get(tenant.serves, c.accuracy(tenant.units_after_drift))
            # Ekya's curve inverted at the served model's accuracy: the units retrained so far.
            units0 = c.units_for(acc0)
            per_window = rate * self.interval_s / tenant.samples_per_unit
            value = 0.0
            if math.isfinite(units0):
                for k, r in enumerate(rates):  # the gain persists; mid-window accuracy
                    gain = c.accuracy(units0 + per_window * (k + 0.5)) - c.accuracy(units0)
                    value += goodput_terms(self.weights, served.priority.value, r.get(tenant.serves, 0.0) * self.interval_s, gain).goodput
        return value + SHARE_TIE_BREAK * mps_pct

    def option_value(self, tenant: Tenant, profile: str | None, mps_pct: float, rates: Sequence[Rates],
                     accuracy: Mapping[str, float], batch: int | None = None, rate_cv: Rates | None = None,
                     co_runners: int | None = None) -> tuple[float, int]:
        """(predicted Goodput over the lookahead, batch) of running ``tenant`` alone-equivalent
        in a GI of ``profile`` at ``mps_pct``; ``batch`` None picks the best batch level.

        :param rate_cv: per inference tenant, the coefficient of variation of its recent
            per-interval arrival rates (:meth:`on_time_fraction`; missing: steady)
        :param co_runners: how many other tenants share the GI (:meth:`_co_runners`; None:
            one worst co-runner)
        """
        if isinstance(tenant, InferenceTenant):
            value, b = self._inference_value(tenant, self.latency_ms(tenant, profile, mps_pct, co_runners), self._batch_levels(tenant, profile, batch),
                                             rates, accuracy.get(tenant.name, tenant.accuracy), (rate_cv or {}).get(tenant.name, 0.0))
            return value + SHARE_TIE_BREAK * mps_pct, b
        b = self._background_batch[tenant.name] if batch is None else batch
        return self._background_value(tenant, profile, mps_pct, b, rates, accuracy, co_runners=co_runners), b

    def option_values(self, tenant: Tenant, profile: str | None, mps_pct: float, forecasts: Sequence[Sequence[Rates]],
                      accuracy: Mapping[str, float], batch: int, rate_cv: Rates | None = None, co_runners: int | None = None) -> list[float]:
        """:meth:`option_value` of one option at ``batch``, at each forecast (windows of rates)."""
        if isinstance(tenant, InferenceTenant):
            values = self._inference_values(tenant, self.latency_ms(tenant, profile, mps_pct, co_runners), self._batch_levels(tenant, profile, batch),
                                            forecasts, accuracy.get(tenant.name, tenant.accuracy), (rate_cv or {}).get(tenant.name, 0.0))
            return [v + SHARE_TIE_BREAK * mps_pct for v, _ in values]
        return [self._background_value(tenant, profile, mps_pct, batch, rates, accuracy, co_runners=co_runners) for rates in forecasts]

    def slo_guard_cost(self, tenant: Tenant, profile: str | None, mps_pct: float, batch: int, horizon_s: float,
                       co_runners: int | None = None, rate_cv: Rates | None = None, staying: bool = False) -> float:
        """What its :class:`SloGuard` charges ``tenant`` for a placement in a GI of ``profile``
        at ``mps_pct`` and ``batch`` over ``horizon_s``: :data:`SLO_GUARD_PENALTY` x its
        priority weight x the requests predicted late beyond the target (0 for a tenant
        without a guard).

        ``staying``: the placement is the tenant's running one. Where the guard
        :attr:`~SloGuard.reacts`, staying is charged at most for the late answers that waiting
        for a burst and then reacting to it would leave beyond the error budget
        (:meth:`reaction_late_requests`): a burst the node can afford to meet when it comes
        is not worth restarting every tenant for before it is measured. On the guard's prior
        alone, DeepSeek-R1 chunk 66 had all four tenants restarted at the second interval for
        bursts that never came: 0.955x the fixed configuration, and 1.22x waiting
        (docs/planner-bursts.md, stop 61).
        """
        guarded = self.guarded_on_time(tenant, profile, mps_pct, batch, co_runners, rate_cv)
        if guarded is None:
            return 0.0
        guard, on_time = guarded
        charge = self._guard_charge(tenant, guard, on_time, horizon_s)
        if staying and guard.reacts and charge > 0.0:
            late = self.reaction_late_requests(tenant, profile, mps_pct, batch, co_runners, guard, on_time, horizon_s)
            charge = min(charge, self._late_charge(tenant, late - guard.error_budget))
        return charge

    def _guard_charge(self, tenant: Tenant, guard: SloGuard, on_time: np.ndarray, horizon_s: float) -> float:
        """:data:`SLO_GUARD_PENALTY` x ``tenant``'s priority weight x the requests predicted late
        beyond ``guard``'s target over ``horizon_s``, at the on-time fraction ``on_time`` of each
        of the guard's rates (request-weighted by their probabilities)."""
        requests = guard.rates_rps * guard.probabilities * horizon_s
        return self._late_charge(tenant, guard.target * float(requests.sum()) - float(on_time @ requests))

    def _late_charge(self, tenant: Tenant, late_requests: float) -> float:
        """What an :class:`SloGuard` charges for ``late_requests`` of ``tenant`` (none below 0):
        :data:`SLO_GUARD_PENALTY` x its priority weight each."""
        return SLO_GUARD_PENALTY * self.weights.priority[tenant.priority.value] * max(late_requests, 0.0)

    def reaction_late_requests(self, tenant: InferenceTenant, profile: str | None, mps_pct: float, batch: int, co_runners: int | None,
                               guard: SloGuard, on_time: np.ndarray, horizon_s: float) -> float:
        """Requests ``tenant`` answers late over ``horizon_s`` if it stays in its placement
        (on-time fraction ``on_time`` at each of ``guard``'s rates) until a burst is measured
        and then restarts: at each rate, the late answers of one decision interval there plus
        a restart's (the requests arriving while it is down and those late while the backlog
        drains at the placement's capacity, at most the interval's), or staying's over the
        whole horizon where that is fewer; weighted by the rates' probabilities."""
        late_share = 1.0 - on_time
        staying = late_share * guard.rates_rps * horizon_s
        drain = self.drain(tenant, profile, mps_pct, batch, co_runners)
        restart = np.array([min(self.restart_late_requests(rate, tenant.restart_s, drain, self.interval_s), rate * self.interval_s)
                            for rate in guard.rates_rps])
        reacting = late_share * guard.rates_rps * min(self.interval_s, horizon_s) + restart
        return float(guard.probabilities @ np.minimum(staying, reacting))

    def guarded_requests(self, tenant: Tenant, profile: str | None, mps_pct: float, batch: int, horizon_s: float,
                         co_runners: int | None = None, rate_cv: Rates | None = None) -> tuple[float, float] | None:
        """(requests predicted on time, requests) of ``tenant`` over ``horizon_s`` in a placement
        in a GI of ``profile`` at ``mps_pct`` and ``batch``, at the rates its :class:`SloGuard`
        holds it to, weighted by their probabilities (None: no guard). What
        :meth:`slo_guard_cost` charges for, and what ``scripts/bench_slo_guard.py`` compares
        with the late answers the simulator measures.

        At each rate the on-time fraction is the lower of the on-time table's and, where the
        tenant's request log (:attr:`arrival_log`) holds :data:`MIN_ARRIVALS_FOR_REPLAY`
        arrivals, that log's replayed at that rate through the placement's batch server
        (:func:`~rlsched.simulator.queueing.replay_on_time_fraction`). The table sees a rate
        and an index of dispersion, not requests that come in clusters within milliseconds
        and wait behind each other's batches (docs/planner-bursts.md, stop 58)."""
        guarded = self.guarded_on_time(tenant, profile, mps_pct, batch, co_runners, rate_cv)
        if guarded is None:
            return None
        guard, on_time = guarded
        requests = guard.rates_rps * guard.probabilities * horizon_s
        return float(on_time @ requests), float(requests.sum())

    def guarded_on_time(self, tenant: Tenant, profile: str | None, mps_pct: float, batch: int, co_runners: int | None = None,
                        rate_cv: Rates | None = None) -> tuple[SloGuard, np.ndarray] | None:
        """(``tenant``'s :class:`SloGuard`, the fraction of its requests on time at each of the
        guard's rates) in a placement in a GI of ``profile`` at ``mps_pct`` and ``batch``
        (:meth:`guarded_requests` says how); None for a tenant without a guard."""
        guard = self.slo_guards.get(tenant.name)
        if guard is None or not isinstance(tenant, InferenceTenant):
            return None
        return guard, self._guarded_fractions(tenant, guard, self.latency_ms(tenant, profile, mps_pct, co_runners), batch, rate_cv,
                                              (profile, float(mps_pct), co_runners))

    def _replays(self, name: str, log: np.ndarray) -> dict[tuple, float]:
        """The replays of tenant ``name``'s request log ``log`` computed so far, by placement and
        rate; a new log starts an empty cache."""
        replayed_log, replayed = self._replayed.get(name, (None, {}))
        if replayed_log is not log:
            replayed = {}
            self._replayed[name] = (log, replayed)
        return replayed

    def _guarded_fractions(self, tenant: InferenceTenant, guard: SloGuard, latency: np.ndarray, batch: int, rate_cv: Rates | None,
                           placement_key: tuple) -> np.ndarray:
        """The fraction of ``tenant``'s requests on time at each of ``guard``'s rates, served
        with batch latencies ``latency`` (ms, index 0 = batch 1) at ``batch``
        (:meth:`guarded_requests` says how); ``placement_key`` names the placement in the cache
        of replayed logs."""
        b = min(batch, tenant.max_batch)
        # Uncapped: the guard's rates are the peaks the tenant may reach, at or above its ceiling,
        # and the spread around them is what it may meet beyond them (stop 66: capped, mm-image
        # c10's resnet met 0.981 of its SLO where the fixed configuration met 0.997).
        on_time = self.on_time_table(tenant, guard.rates_rps, latency, [b], (rate_cv or {}).get(tenant.name, 0.0), capped=False)[0]
        log = self.arrival_log.get(tenant.name)
        if log is not None and len(log) >= MIN_ARRIVALS_FOR_REPLAY:
            replayed = self._replays(tenant.name, log)
            keys = [(*placement_key, b, float(rate)) for rate in guard.rates_rps]
            missing = [k for k, key in enumerate(keys) if key not in replayed]
            if missing:  # one compiled call for every rate not replayed yet
                fractions = replay_on_time_fractions(log, np.asarray(guard.rates_rps)[missing], latency, b, tenant.batch_timeout_ms,
                                                     tenant.slo_ms, tenant.queue_timeout_ms)
                replayed.update((keys[k], float(f)) for k, f in zip(missing, fractions, strict=True))
            for k, key in enumerate(keys):
                on_time[k] = min(on_time[k], replayed[key])
        return on_time

    def priority_fill_guard_cost(self, configuration: Configuration, name: str, horizon_s: float, rate_cv: Rates | None = None) -> float:
        """What its :class:`SloGuard` charges tenant ``name``, run in a priority-fill GI of
        ``configuration``, over ``horizon_s`` (0 for a tenant without a guard), as
        :meth:`slo_guard_cost` charges an MPS placement: as the GI's first tenant, for the
        requests its FIKIT latency (:meth:`priority_fill_first_latency_ms`) leaves late at the
        guard's rates; as a filler, for all of them up to the target, since a filler runs in
        whatever idle time the first tenant leaves and no latency holds it to an SLO.

        Why: with the guard charging MPS placements only, a priority-fill layout isolating a
        guarded service cost nothing beside MPS placements charged for its bursts, and the
        planner weighed none (heldout-retrain held two priority-fill 7g GIs all episode,
        docs/planner-bursts.md, stop 65), while the fixed reference held to the SLO runs
        priority fill on four of five held-out scenarios (stop 73)."""
        guard = self.slo_guards.get(name)
        tenant = self.scenario.tenant(name)
        if guard is None or not isinstance(tenant, InferenceTenant):
            return 0.0
        p = configuration.placements[name]
        layout = configuration.layouts[p.gpu_index]
        profile = layout.instances[p.instance_index].profile if len(layout) else None
        names = configuration.tenants_in(p.gpu_index, p.instance_index)
        members = self._priority_fill_members(names)
        if members[0] is not tenant:
            return self._guard_charge(tenant, guard, np.zeros(len(guard.rates_rps)), horizon_s)
        batch = {n: configuration.placements[n].batch_size for n in names}
        mps_pct = {n: configuration.placements[n].mps_pct for n in names}
        others = self._filler_co_runners(members[1:], batch, mps_pct)
        latency = self.priority_fill_first_latency_ms(tenant, profile, others)
        on_time = self._guarded_fractions(tenant, guard, latency, p.batch_size, rate_cv, (profile, SharingMode.PRIORITY_FILL.value, others))
        return self._guard_charge(tenant, guard, on_time, horizon_s)

    def restart_loss(self, tenant: Tenant, downtime_s: float, value: float, rates: Sequence[Rates],
                     drain: Drain | None = None) -> float:
        """What ``downtime_s`` of restart costs an option worth ``value`` over the lookahead:
        the value it would have earned meanwhile, plus the SLO penalty of the requests that
        arrive then, plus ``reconfiguration_per_s`` per second; and, for an inference option
        whose ``drain`` (capacity, requests/s; SLO slack at the largest batch, s) is given,
        the requests arriving after the restart that are still late while the backlog it
        left drains (:meth:`late_after_restart`), each losing its value and paying the penalty
        (with ``restart_backlog`` on)."""
        loss = goodput_terms(self.weights, tenant.priority.value, downtime_s=downtime_s).reconfiguration_cost
        per_window = value / len(rates)
        for k, r in enumerate(rates):
            overlap = min(max(downtime_s - k * self.interval_s, 0.0), self.interval_s) / self.interval_s
            if overlap <= 0:
                break
            down = 0.0
            if isinstance(tenant, InferenceTenant):  # every request arriving while down is dropped
                down = goodput_terms(self.weights, tenant.priority.value, dropped=r[tenant.name] * self.interval_s).total
            loss += overlap * max(per_window - down, 0.0)
        rate = self.arrival_rate_rps(tenant, rates) if drain is not None and self.restart_backlog else 0.0
        if rate > 0:
            horizon_s = self.interval_s * len(rates)
            queued_s = self.restart_added_downtime_s(tenant, downtime_s, rate) if self.restart_added_backlog else downtime_s
            late = self.late_after_restart(rate, queued_s, drain[0], drain[1], horizon_s, drain[2])
            penalty = -goodput_terms(self.weights, tenant.priority.value, violated=1.0).total
            loss += late * max(per_window / (rate * self.interval_s) + penalty, 0.0)
        return loss

    def restart_added_downtime_s(self, tenant: Tenant, downtime_s: float, rate_rps: float) -> float:
        """The part of ``downtime_s`` whose arrivals at ``rate_rps`` a restart adds to the queue
        ``tenant`` holds (:attr:`queued_requests`): min(queue + rate x downtime, its
        ``queue_capacity``) - queue, over the rate (``restart_added_backlog``)."""
        if rate_rps <= 0.0 or not isinstance(tenant, InferenceTenant):
            return downtime_s
        queued = self.queued_requests.get(tenant.name, 0.0)
        added = min(queued + rate_rps * downtime_s, float(tenant.queue_capacity)) - queued
        return max(added, 0.0) / rate_rps

    def arrival_rate_rps(self, tenant: Tenant, rates: Sequence[Rates]) -> float:
        """``tenant``'s arrival rate in the first of ``rates``' windows, requests/s (0 for a job):
        without the queued requests :meth:`forecast` spreads over that window.

        Why: a restart's backlog drains at the arrival rate. Read with the queue in it, a
        tenant holding a queue arrives faster than any placement serves, and
        :meth:`late_after_restart` counts the whole lookahead late: with ``restart_backlog``
        on, train-two-gpus froze in its first layout at 0.46x the planner's Goodput, and
        0.86x at the arrival rate (docs/planner-bursts.md, stop 74)."""
        if not isinstance(tenant, InferenceTenant) or not rates:
            return 0.0
        rate = rates[0][tenant.name]
        if not self.backlog_drain:
            rate -= self.queued_requests.get(tenant.name, 0.0) / self.interval_s
        return max(rate, 0.0)

    def restart_late_requests(self, rate_rps: float, downtime_s: float, drain: Drain | None, horizon_s: float) -> float:
        """Requests a restart of ``downtime_s`` leaves late within ``horizon_s`` at ``rate_rps``:
        those arriving while it is down, plus those late while the backlog drains at ``drain``
        (:meth:`late_after_restart`; None: not counted)."""
        late = rate_rps * downtime_s
        if drain is not None:
            late += self.late_after_restart(rate_rps, downtime_s, drain[0], drain[1], horizon_s, drain[2])
        return late

    @staticmethod
    def late_after_restart(rate_rps: float, downtime_s: float, capacity_rps: float, slack_s: float, horizon_s: float,
                           queue_timeout_s: float = math.inf) -> float:
        """Requests arriving after a restart of ``downtime_s`` that are answered late while
        the backlog it left drains (fluid FIFO: ``rate_rps`` x downtime queued, served at
        ``capacity_rps``; a request is late when it waits more than ``slack_s``), counted
        up to ``horizon_s`` from the start of the downtime.

        A request arriving at t after the restart waits (rate x downtime - (capacity - rate)
        x t) / capacity; the late ones are those before that wait falls to the slack. A
        server with a queue timeout (``queue_timeout_s``: the tenant's ``queue_timeout_ms``)
        rejects, when it comes back, what arrived more than that before: only the last
        ``queue_timeout_s`` of the downtime's arrivals are left to drain.
        """
        if downtime_s <= 0.0 or rate_rps <= 0.0:
            return 0.0
        if rate_rps >= capacity_rps:
            return rate_rps * max(horizon_s - downtime_s, 0.0)
        backlog = rate_rps * min(downtime_s, queue_timeout_s)
        late_s = max(backlog - capacity_rps * slack_s, 0.0) / (capacity_rps - rate_rps)
        return rate_rps * min(late_s, max(horizon_s - downtime_s, 0.0))

    def drain(self, tenant: Tenant, profile: str | None, mps_pct: float, batch: int,
              co_runners: int | None = None) -> Drain | None:
        """(capacity at ``batch``, requests/s; SLO slack left by a batch of ``batch``, s; the
        tenant's queue timeout, s, inf without one) of an inference option, the backlog model
        of :meth:`restart_loss` and
        :meth:`guarded_restart_cost`; None for a job, or when the planner prices no backlog:
        ``restart_backlog`` off and the tenant without an :class:`SloGuard`."""
        if not isinstance(tenant, InferenceTenant) or not (self.restart_backlog or tenant.name in self.slo_guards):
            return None
        b = min(batch, tenant.max_batch)
        latency_ms = float(self.latency_ms(tenant, profile, mps_pct, co_runners)[b - 1])
        return b * 1000.0 / latency_ms, max(tenant.slo_ms - latency_ms, 0.0) / 1000.0, tenant.queue_timeout_s

    # ------------------------------------------------------------------ options
    def _running(self, current: Configuration | None, name: str) -> tuple[int, GpuInstance | None, float] | None:
        """(GPU, GI, share) of a tenant's running MPS placement, or None (restarts anyway)."""
        if current is None or name not in current.placements:
            return None
        p = current.placements[name]
        if current.modes[p.gpu_index][p.instance_index] != SharingMode.MPS:
            return None
        layout = current.layouts[p.gpu_index]
        gi = layout.instances[p.instance_index] if len(layout) else None
        return p.gpu_index, gi, float(p.mps_pct)

    def _gi_wait_s(self, current: Configuration | None, g: int, gi: GpuInstance | None) -> float:
        """Seconds a tenant waits for ``gi`` on GPU g before restarting in it: 0 if the running
        layout has it, else its create time plus the destroy times of running GIs it overlaps."""
        if gi is None or current is None:
            return 0.0
        running = current.layouts[g].instances
        if gi in running:
            return 0.0
        spec = self.gpu.profiles[gi.profile]
        lo, hi = gi.start, gi.start + spec.memory_slices
        wait = spec.create_s
        for other in running:
            o = self.gpu.profiles[other.profile]
            if other.start < hi and lo < other.start + o.memory_slices:
                wait += o.destroy_s
        return wait

    def _placement_terms(self, t: Tenant, current: Configuration | None, g: int, gi: GpuInstance | None, mps_pct: float, batch: int,
                         mode: SharingMode, sharing: int | None, horizon_s: float, rate_cv: Rates | None) -> PlacementTerms:
        """:class:`PlacementTerms` of tenant ``t`` placed in ``gi`` on GPU g at ``mps_pct``,
        ``batch``, in ``mode``, beside ``sharing`` other tenants, over ``horizon_s``."""
        share = mps_pct if mode == SharingMode.MPS else 100.0
        profile = gi.profile if gi else None
        staying = self.unchanged(t.name, current, g, gi, mps_pct, mode)
        guard = self.slo_guard_cost(t, profile, share, batch, horizon_s, sharing, rate_cv, staying) if mode == SharingMode.MPS else 0.0
        if staying:
            return PlacementTerms(guard, _KEEP, None)
        move = self._move(t, current, g, gi, mps_pct, self.memory_gib(t.name, batch), mode)
        return PlacementTerms(guard, move, self.drain(t, profile, share, batch, sharing))

    def _tenant_terms(self, t: Tenant, placement: PlacementTerms, value: float, held: float | None, windows: Sequence[Rates],
                      current: Configuration | None) -> tuple[float, float, float]:
        """(value less its SLO guard's charge, reconfiguration cost, payback hurdle) of tenant
        ``t`` in a placement with these :class:`PlacementTerms`, worth ``value`` there over
        ``windows`` (:meth:`assess_many`'s terms)."""
        if placement.move.kind == "keep":  # no move: no cost, no hurdle
            return value - placement.guard, 0.0, 0.0
        cost = self._move_cost(t, placement.move, value, windows, held if self.scenario.make_before_break else None, placement.drain)
        return value - placement.guard, cost, self.payback_hurdle(cost, held, t.name, current)

    def _reconfiguration(self, tenant: Tenant, current: Configuration | None, g: int, gi: GpuInstance | None,
                         mps_pct: float, value: float, rates: Sequence[Rates], memory_gib: float = 0.0, held_value: float | None = None,
                         drain: Drain | None = None, mode: SharingMode = SharingMode.MPS) -> float:
        """Predicted cost of moving ``tenant`` to this option from the running configuration.

        Make-before-break (the scenario's switch, :meth:`can_stage`): no downtime, but the
        option earns its value only once the new server is ready (GI create + ``restart_s``);
        until then the old instance earns ``held_value`` (the running option's value), so the
        cost is the gain forgone over that delay. Otherwise the full restart
        (:meth:`restart_loss` of ``restart_s`` plus the GI wait, with the backlog it leaves
        drained at the option's ``drain``), and for a guarded tenant the guard's charge for
        the late answers beyond its error budget (:meth:`guarded_restart_cost`; a tenant's
        first start is not charged: every option pays it).
        """
        return self._move_cost(tenant, self._move(tenant, current, g, gi, mps_pct, memory_gib, mode), value, rates, held_value, drain)

    def _move(self, tenant: Tenant, current: Configuration | None, g: int, gi: GpuInstance | None, mps_pct: float,
              memory_gib: float, mode: SharingMode) -> Move:
        """How ``tenant`` gets to ``gi`` on GPU g at ``mps_pct`` in ``mode`` (its server needing
        ``memory_gib``) from the running configuration (:meth:`_reconfiguration` says what each costs)."""
        if self.unchanged(tenant.name, current, g, gi, mps_pct, mode):
            return _KEEP
        if current is not None and tenant.name not in current.placements:
            return Move("start", tenant.restart_s)
        if current is not None and self.scenario.make_before_break and self.can_stage(tenant.name, current, g, gi, memory_gib):
            return Move("stage", tenant.restart_s + (self.gpu.profiles[gi.profile].create_s if gi is not None and gi not in current.layouts[g].instances else 0.0))
        return Move("restart", tenant.restart_s + self._gi_wait_s(current, g, gi))

    def _move_cost(self, tenant: Tenant, move: Move, value: float, rates: Sequence[Rates], held_value: float | None,
                   drain: Drain | None) -> float:
        """:meth:`_reconfiguration` of ``move`` to an option worth ``value`` over ``rates``' windows."""
        if move.kind == "keep":
            return 0.0
        if move.kind == "start":
            return self.restart_loss(tenant, move.delay_s, value, rates, drain)
        if move.kind == "stage":
            gain = max(value - held_value, 0.0) / len(rates) if held_value is not None else 0.0
            return sum(min(max(move.delay_s - k * self.interval_s, 0.0), self.interval_s) / self.interval_s * gain for k in range(len(rates)))
        return self.restart_loss(tenant, move.delay_s, value, rates, drain) + self.guarded_restart_cost(tenant, move.delay_s, rates, drain)

    def guarded_restart_cost(self, tenant: Tenant, downtime_s: float, rates: Sequence[Rates], drain: Drain | None) -> float:
        """What its :class:`SloGuard` charges a running ``tenant`` for a restart of
        ``downtime_s``: :data:`SLO_GUARD_PENALTY` x its priority weight x the requests it
        leaves late (arriving while down, plus late while the backlog drains at ``drain``)
        beyond the guard's error budget, scaled to the lookahead (``guard_windows``); 0 for a
        tenant without a guard."""
        guard = self.slo_guards.get(tenant.name)
        if guard is None or not isinstance(tenant, InferenceTenant) or downtime_s <= 0.0 or not rates:
            return 0.0
        late = self.restart_late_requests(self.arrival_rate_rps(tenant, rates), downtime_s, drain, self.interval_s * len(rates))
        scale = len(rates) / self.guard_windows if self.guard_windows else 1.0
        return scale * self._late_charge(tenant, late - guard.error_budget)

    def unchanged(self, name: str, current: Configuration | None, g: int, gi: GpuInstance | None, mps_pct: float,
                  mode: SharingMode = SharingMode.MPS) -> bool:
        """True when running tenant ``name`` in ``gi`` on GPU g at ``mps_pct`` in ``mode``
        keeps its running placement (no restart): same GI, kept by the layout, same mode,
        and under MPS the same share (a running MPS client's share cannot change)."""
        if current is None or name not in current.placements:
            return False
        p = current.placements[name]
        layout = current.layouts[p.gpu_index]
        running_gi = layout.instances[p.instance_index] if len(layout) else None
        if (p.gpu_index, running_gi) != (g, gi) or current.modes[p.gpu_index][p.instance_index] != mode:
            return False
        if gi is not None and gi not in current.layouts[g].instances:
            return False
        return mode != SharingMode.MPS or float(p.mps_pct) == mps_pct

    def restarted(self, configuration: Configuration, current: Configuration | None) -> list[str]:
        """The tenants that ``configuration`` restarts when ``current`` runs (all, from nothing)."""
        restarted = []
        for name, p in configuration.placements.items():
            layout = configuration.layouts[p.gpu_index]
            gi = layout.instances[p.instance_index] if len(layout) else None
            if not self.unchanged(name, current, p.gpu_index, gi, float(p.mps_pct), configuration.modes[p.gpu_index][p.instance_index]):
                restarted.append(name)
        return restarted

    def can_stage(self, name: str, current: Configuration, g: int, gi: GpuInstance | None, memory_gib: float) -> bool:
        """True when tenant ``name`` can start in ``gi`` on GPU g while its running instance
        keeps serving: ``gi`` runs now and its memory holds its clients plus the new one
        (``memory_gib``), or it can be created on slices that no GI holding tenants uses
        (:func:`~rlsched.hardware.fits_alongside`; empty GIs are destroyed first). Judged per
        tenant: two new GIs that each fit may not fit together (the simulator orders them)."""
        layout = current.layouts[g]
        if gi is None or gi in layout.instances:
            index = layout.instances.index(gi) if gi is not None else 0
            held = sum(self.memory_gib(n, p.batch_size) for n, p in current.placements.items() if (p.gpu_index, p.instance_index) == (g, index))
            return held + memory_gib <= self._gi_memory(gi.profile if gi else None) + 1e-9
        occupied = {layout.instances[p.instance_index] for p in current.placements.values() if p.gpu_index == g and len(layout)}
        return fits_alongside(sorted(occupied), gi, self.gpu)

    def held_value(self, tenant: Tenant, current: Configuration | None, rates: Sequence[Rates], accuracy: Mapping[str, float],
                   rate_cv: Rates | None = None) -> float | None:
        """Predicted value of the tenant's running option over the lookahead (None: not placed)."""
        if current is None or tenant.name not in current.placements:
            return None
        return self.configuration_values(current, rates, accuracy, rate_cv)[tenant.name]

    def predicted_goodput(self, configuration: Configuration, rates: Sequence[Rates], accuracy: Mapping[str, float],
                          rate_cv: Rates | None = None) -> float:
        """The Goodput ``configuration`` is predicted to earn over ``rates``' windows: its
        :meth:`configuration_values` without what a queue's drain costs past them (a planning
        charge, not Goodput of these windows), as a policy measures the value model's error."""
        horizon_s, self.backlog_horizon_s = self.backlog_horizon_s, 0.0
        try:
            return sum(self.configuration_values(configuration, rates, accuracy, rate_cv).values())
        finally:
            self.backlog_horizon_s = horizon_s

    def configuration_values(self, configuration: Configuration, rates: Sequence[Rates], accuracy: Mapping[str, float],
                             rate_cv: Rates | None = None, options: OptionValues | None = None) -> dict[str, float]:
        """Per placed tenant, its predicted value over the lookahead in ``configuration``: an
        MPS placement as its option in the value table, a priority-fill GI as
        :meth:`priority_fill_values` says.

        :param options: MPS option values already computed at these rates (tenant, GI
            profile, share, batch -> value), and priority-fill GIs' values (("priority-fill",
            GI profile, (tenant, batch, share) per member) -> value per member), filled in as
            they are computed
        """
        options = {} if options is None else options
        values: dict[str, float] = {}
        for name, placement in configuration.placement_keys.items():
            if placement.mode == _PRIORITY_FILL:
                continue
            key = self.option_key(configuration, name)
            if key not in options:
                options[key] = self.option_value(self.scenario.tenant(name), key[1], key[2], rates, accuracy, key[3], rate_cv, key[4])[0]
            values[name] = options[key]
        for g, i in self._priority_fill_gis(configuration):
            # Candidates share priority-fill GIs as they share MPS options: valued once per call's rates.
            key = self._priority_fill_key(configuration, g, i)
            if key not in options:
                options[key] = self.priority_fill_values(configuration, g, i, rates, accuracy, rate_cv)
            values.update(options[key])
        return values

    def option_key(self, configuration: Configuration, name: str) -> tuple[str, str | None, float, int, int | None]:
        """(tenant, GI profile, share, batch, co-runner count) of tenant ``name``'s MPS placement:
        what its option value depends on, at given rates."""
        placement = configuration.placement_keys[name]
        return name, placement.gi_profile, placement.mps_pct, placement.batch_size, self.sharing(configuration, name)

    @staticmethod
    def _priority_fill_key(configuration: Configuration, g: int, i: int) -> tuple:
        """("priority-fill", GI profile, (tenant, batch, share) per member) of GI i on GPU g of
        ``configuration``, run in priority fill: what its members' values depend on, at given rates."""
        layout = configuration.layouts[g]
        return ("priority-fill", layout.instances[i].profile if len(layout) else None,
                *((n, configuration.placements[n].batch_size, float(configuration.placements[n].mps_pct)) for n in configuration.tenants_in(g, i)))

    @staticmethod
    def _priority_fill_gis(configuration: Configuration) -> list[tuple[int, int]]:
        """(GPU, GI) of each GI of ``configuration`` run in priority fill, in order."""
        return sorted({(p.gpu_index, p.instance_index) for name, p in configuration.placements.items()
                       if configuration.placement_keys[name].mode == _PRIORITY_FILL})

    def measured_values(self, configuration: Configuration, rates: Sequence[Rates], accuracy: Mapping[str, float],
                        measured: Mapping[str, tuple[float, float]], rate_cv: Rates | None = None) -> dict[str, float]:
        """:meth:`configuration_values` of the running ``configuration``, each inference
        tenant valued at no less than the node measured it serve. ``measured`` gives its last
        interval's (arrival rate, requests/s; on-time fraction). Where no window of the
        lookahead forecasts more than the measured rate plus the value model's error
        (:data:`VALUE_MODEL_ERROR`), the tenant is valued at that fraction of the requests up
        to the measured rate on time, and every request beyond it late.

        Why: the fluid model is pessimistic near capacity (its linear
        :data:`OVERLOAD_MARGIN`). On train-retrain it valued resnet at 1,143 req/s in a 4g
        at about 0.65 on time, where the node served 0.999, and so left that layout for a
        priority-fill 7g that starved bert for the rest of the episode. Why the tolerance:
        a forecast a few percent above the measured rate (a rising trend, the backlog spread
        over the first window) otherwise switched the floor off, and the planner left that
        layout all the same (stop 45, docs/planner-bursts.md).
        """
        values = self.configuration_values(configuration, rates, accuracy, rate_cv)
        for name, (rate_rps, fraction) in measured.items():
            tenant = self.scenario.tenant(name)
            if name not in values or not isinstance(tenant, InferenceTenant):
                continue
            window_rps = [r.get(name, 0.0) for r in rates]
            if max(window_rps) > (1.0 + VALUE_MODEL_ERROR) * rate_rps:
                continue
            requests = sum(window_rps) * self.interval_s
            on_time = fraction * sum(min(rate_rps, w) for w in window_rps) * self.interval_s
            served = goodput_terms(self.weights, tenant.priority.value, on_time, accuracy.get(name, tenant.accuracy), violated=requests - on_time).total
            values[name] = max(values[name], served)
        return values

    def sharing(self, configuration: Configuration, name: str) -> int | None:
        """How many other tenants share tenant ``name``'s MPS GI in ``configuration`` (the
        co-runner count it is valued at; None without ``co_runner_count``)."""
        if not self.co_runner_count:
            return None
        return configuration.placed_in[name][3] - 1

    def priority_fill_values(self, configuration: Configuration, g: int, i: int, rates: Sequence[Rates],
                             accuracy: Mapping[str, float], rate_cv: Rates | None = None) -> dict[str, float]:
        """Per tenant of GI i on GPU g run in priority fill (FIKIT), its predicted value over
        the lookahead, as the simulator serves it: the highest-priority tenant (scenario
        order breaks ties) runs at its solo speed plus FIKIT's overhead; the others fill the
        idle time it leaves: a lone filler at its solo speed times that idle fraction (never
        below the performance model's minimum), several as MPS clients of the GI at their
        nominal shares scaled to 100% (:func:`~rlsched.simulator.node.filler_shares`)
        times it. The idle fraction is 1 minus its busy fraction at its mean rate: its request
        log (:attr:`arrival_log`) replayed at that rate
        (:func:`~rlsched.simulator.queueing.replay_busy_fraction`), else the fluid batcher's
        settled batch, which is busy nearly all the time; the minimum for a job (always busy)."""
        return self.priority_fill_forecast_values(configuration, g, i, [rates], accuracy, rate_cv)[0]

    def priority_fill_forecast_values(self, configuration: Configuration, g: int, i: int, forecasts: Sequence[Sequence[Rates]],
                                      accuracy: Mapping[str, float], rate_cv: Rates | None = None) -> list[dict[str, float]]:
        """:meth:`priority_fill_values` at each forecast (windows of rates)."""
        layout = configuration.layouts[g]
        gi = layout.instances[i] if len(layout) else None
        names = configuration.tenants_in(g, i)
        return self.priority_fill_member_forecast_values(gi.profile if gi else None, names, {n: configuration.placements[n].batch_size for n in names},
                                                         {n: configuration.placements[n].mps_pct for n in names}, forecasts, accuracy, rate_cv)

    def priority_fill_member_values(self, profile: str | None, names: Sequence[str], batch: Mapping[str, int], mps_pct: Mapping[str, float],
                                    rates: Sequence[Rates], accuracy: Mapping[str, float], rate_cv: Rates | None = None) -> dict[str, float]:
        """:meth:`priority_fill_values` of the tenants ``names`` sharing one GI of ``profile`` in
        priority fill, at these batches and nominal shares (the MILP's priority-fill columns
        value a GI's first tenant alone and each filler beside its first tenant this way)."""
        return self.priority_fill_member_forecast_values(profile, names, batch, mps_pct, [rates], accuracy, rate_cv)[0]

    def priority_fill_member_forecast_values(self, profile: str | None, names: Sequence[str], batch: Mapping[str, int],
                                             mps_pct: Mapping[str, float], forecasts: Sequence[Sequence[Rates]], accuracy: Mapping[str, float],
                                             rate_cv: Rates | None = None) -> list[dict[str, float]]:
        """:meth:`priority_fill_member_values` at each forecast (windows of rates): the GI's
        members, curves and co-runners are found once, and a tenant's value at every forecast
        where it runs at the same speed comes from one on-time table (its columns are
        independent: the same numbers as one call each)."""
        slices = self._slices(profile)
        members = self._priority_fill_members(names)
        first, fillers = members[0], members[1:]
        others = self._filler_co_runners(fillers, batch, mps_pct)
        values: list[dict[str, float]] = [{} for _ in forecasts]
        idles = [self.min_idle_fraction] * len(forecasts)
        if isinstance(first, InferenceTenant):
            b = min(batch[first.name], first.max_batch)
            curve = self.priority_fill_first_latency_ms(first, profile, others)
            first_values = self._inference_values(first, curve, [b], forecasts, accuracy.get(first.name, first.accuracy),
                                                  (rate_cv or {}).get(first.name, 0.0))
            log = self.arrival_log.get(first.name)
            for k, rates in enumerate(forecasts):
                values[k][first.name] = first_values[k][0]
                rate = float(np.mean([r[first.name] for r in rates]))
                if log is not None and len(log) >= MIN_ARRIVALS_FOR_REPLAY:
                    replayed = self._replays(first.name, log)
                    key = ("busy", curve.tobytes(), b, rate)
                    if key not in replayed:
                        replayed[key] = replay_busy_fraction(log, rate, curve, b, first.batch_timeout_ms)
                    busy = replayed[key]
                else:
                    throughput = np.arange(1, b + 1) * 1000.0 / curve[:b]
                    carries = np.nonzero(throughput >= rate)[0]
                    busy = rate / float(throughput[carries[0]]) if carries.size else 1.0
                idles[k] = max(idles[k], 1.0 - busy)
        else:
            for k, rates in enumerate(forecasts):
                values[k][first.name] = self._background_value(first, profile, 100.0, batch[first.name], rates, accuracy)
        # The forecasts that leave the fillers the same idle fraction, each filler valued at them at once.
        at_idle: dict[float, list[int]] = {}
        for k, idle in enumerate(idles):
            at_idle.setdefault(idle, []).append(k)
        # A lone filler runs at its solo speed in the idle time; several split it as the simulator runs them.
        split = filler_shares([(t.name, c) for t, c in zip(fillers, others, strict=True)]) if len(fillers) > 1 else {}
        for t in fillers:
            share, colocated = split.get(t.name, (100.0, None))
            if isinstance(t, InferenceTenant):
                b = min(batch[t.name], t.max_batch)
                if colocated is None:
                    curve = self.perf.latency_curve_ms(self.gpu.name, t.model, t.max_batch, profile, 100.0, SharingMode.PRIORITY_FILL,
                                                       (), slices, high_priority=False)[0]
                else:
                    curve = self.perf.latency_curve_ms(self.gpu.name, t.model, t.max_batch, profile, share, SharingMode.MPS, colocated, slices)[0]
                latency = np.asarray(curve, dtype=float) * t.tuning_latency_factor(share)
                for idle, ks in at_idle.items():
                    filler_values = self._inference_values(t, latency / idle, [b], [forecasts[k] for k in ks], accuracy.get(t.name, t.accuracy),
                                                           (rate_cv or {}).get(t.name, 0.0))
                    for k, (value, _) in zip(ks, filler_values, strict=True):
                        values[k][t.name] = value
            else:
                for k, rates in enumerate(forecasts):
                    values[k][t.name] = self._background_value(t, profile, share, batch[t.name], rates, accuracy, speed=idles[k], colocated=colocated)
        return values

    def _priority_fill_members(self, names: Sequence[str]) -> list[Tenant]:
        """The tenants ``names`` of one priority-fill GI in the order the scheduler ranks them:
        the first runs as the high-priority tenant (scenario order breaks ties)."""
        return sorted((self.scenario.tenant(n) for n in names), key=lambda t: t.priority.rank)

    @staticmethod
    def _filler_co_runners(fillers: Sequence[Tenant], batch: Mapping[str, int], mps_pct: Mapping[str, float]) -> tuple[CoRunner, ...]:
        """The co-runners a priority-fill GI's first tenant runs beside: its fillers at their batches and nominal shares."""
        return tuple(CoRunner(t.model, min(batch[t.name], t.max_batch) if isinstance(t, InferenceTenant) else batch[t.name],
                              mps_pct[t.name]) for t in fillers)

    def priority_fill_first_latency_ms(self, first: InferenceTenant, profile: str | None, fillers: tuple[CoRunner, ...]) -> np.ndarray:
        """Batch latencies (ms, index 0 = batch 1) of a priority-fill GI's first tenant beside
        ``fillers``: its solo speed plus FIKIT's overhead where it has fillers."""
        curve = self.perf.latency_curve_ms(self.gpu.name, first.model, first.max_batch, profile, 100.0, SharingMode.PRIORITY_FILL,
                                           fillers, self._slices(profile), high_priority=bool(fillers))[0]
        return np.asarray(curve, dtype=float) * first.tuning_latency_factor(100.0)

    def payback_hurdle(self, cost: float, held_value: float | None, name: str | None = None, current: Configuration | None = None) -> float:
        """What a change must be predicted to gain beyond its ``cost`` over the lookahead
        (the payback rule, against flapping): the value model's relative error times what
        is at stake, the value the tenant holds now (``held_value``) plus the cost, both
        predicted by a model that errs by that much: :attr:`value_model_error` where the
        policy measures it, else :data:`VALUE_MODEL_ERROR`. A tenant not placed yet (None)
        must start: no hurdle. 0 with ``payback_margin`` off, and, with ``payback_scope``
        ``"priority-fill"``, for a tenant ``name`` that does not run in priority fill in ``current``."""
        if held_value is None or not self.payback_margin:
            return 0.0
        if self.payback_scope == "priority-fill" and not self._in_priority_fill(name, current):
            return 0.0
        error = VALUE_MODEL_ERROR if self.value_model_error is None else self.value_model_error
        return error * (abs(held_value) + cost)

    @staticmethod
    def _in_priority_fill(name: str | None, current: Configuration | None) -> bool:
        """Whether tenant ``name`` runs in a priority-fill GI of ``current``."""
        if name is None or current is None or name not in current.placements:
            return False
        p = current.placements[name]
        return current.modes[p.gpu_index][p.instance_index] == SharingMode.PRIORITY_FILL

    def _layouts_for(self, current: Configuration | None, g: int) -> list[Layout]:
        layouts = list(self.layouts)
        if current is not None and self.gpu.mig_supported and current.layouts[g] not in layouts and len(current.layouts[g]):
            layouts.append(current.layouts[g])
        return layouts

    def options(self, rates: Sequence[Rates], current: Configuration | None, accuracy: Mapping[str, float],
                gpus_of: Mapping[str, Sequence[int]] | None = None, rate_cv: Rates | None = None,
                held_values: Mapping[str, float] | None = None, smaller_batches: bool = False) -> list[PlanOption]:
        """Every column of the MILP: per tenant, GPU and GI placement, the share levels that
        add value over the smaller ones (plus 100% and the running share), each at its best batch.
        A guarded tenant's column is worth its value less its SLO guard's charge
        (:meth:`slo_guard_cost`). The MILP's priority-fill columns are not charged; the exact
        valuation in :meth:`plan` charges them (:meth:`priority_fill_guard_cost`).

        :param held_values: :meth:`configuration_values` of ``current`` at these rates, when
            the caller has them already
        :param smaller_batches: also a column at every smaller batch level that needs less
            memory (after the best batch's): for a node whose tenants fit only at smaller
            batches (:meth:`_milp_configuration` retries with them)
        """
        placements = sorted({gi for layout in self.layouts for gi in layout.instances}) if self.gpu.mig_supported else [None]
        if current is not None and self.gpu.mig_supported:
            placements = sorted(set(placements) | {gi for layout in current.layouts for gi in layout.instances})
        options: list[PlanOption] = []
        if held_values is None:
            held_values = self.configuration_values(current, rates, accuracy, rate_cv) if current is not None else {}
        others = len(gpus_of) - 1 if gpus_of is not None else len(self.scenario.tenants) - 1
        horizon_s = self.interval_s * len(rates)
        for t in self.scenario.tenants:
            if gpus_of is not None and t.name not in gpus_of:
                continue
            allowed = range(self.scenario.gpu_count) if gpus_of is None else gpus_of[t.name]
            running = self._running(current, t.name)
            held = held_values.get(t.name)
            for profile in sorted({gi.profile if gi else None for gi in placements}, key=lambda p: (p is None, p or "")):
                table = []
                guard_costs: dict[tuple, float] = {}  # (share, co-runners, batch, staying) -> SLO guard cost
                shares = set(self.share_levels) | ({running[2]} if running else set())
                best: dict[int | None, float] = {}
                for share in sorted(shares):
                    for count in self.co_runner_counts(share, others):
                        value, batch = self.option_value(t, profile, share, rates, accuracy, rate_cv=rate_cv, co_runners=count)
                        memory = self.memory_gib(t.name, batch)
                        fits = memory <= self._gi_memory(profile) + 1e-9
                        useful = value > best.get(count, -math.inf) + 2 * SHARE_TIE_BREAK * 100.0 or share == 100.0 or share == self.share_levels[0]
                        if fits:
                            best[count] = max(best.get(count, -math.inf), value)
                            table.append((share, count, value, batch, memory, useful))
                        if smaller_batches and useful:
                            table += self._smaller_batch_columns(t, profile, share, count, batch, memory, rates, accuracy, rate_cv)
                for g in allowed:
                    for gi in placements:
                        if (gi.profile if gi else None) != profile:
                            continue
                        for share, count, value, batch, memory, useful in table:
                            keeps = running is not None and running == (g, gi, share)
                            if not (useful or keeps):
                                continue
                            cost = self._reconfiguration(t, current, g, gi, share, value, rates, memory, held,
                                                         self.drain(t, profile, share, batch, count))
                            staying = self.unchanged(t.name, current, g, gi, share)
                            hurdle = 0.0 if staying else self.payback_hurdle(cost, held, t.name, current)
                            if (share, count, batch, staying) not in guard_costs:
                                guard_costs[share, count, batch, staying] = self.slo_guard_cost(t, profile, share, batch, horizon_s, count, rate_cv, staying)
                            guard = guard_costs[share, count, batch, staying]
                            options.append(PlanOption(t.name, g, gi, share, batch, memory, value - guard, cost, hurdle, count))
        return options

    def _smaller_batch_columns(self, tenant: Tenant, profile: str | None, share: float, count: int | None, batch: int, memory: float,
                               rates: Sequence[Rates], accuracy: Mapping[str, float], rate_cv: Rates | None) -> list[tuple]:
        """:meth:`options`' table rows for ``tenant`` at each batch level below ``batch`` that
        needs less memory than the next larger one and fits the GI: (share, co-runners, value,
        batch, memory, useful)."""
        rows = []
        for b in reversed(self.batch_levels):
            smaller = self.memory_gib(tenant.name, b)
            if b < batch and smaller < memory:
                if smaller <= self._gi_memory(profile) + 1e-9:
                    value, _ = self.option_value(tenant, profile, share, rates, accuracy, b, rate_cv, count)
                    rows.append((share, count, value, b, smaller, True))
                memory = smaller
        return rows

    # ------------------------------------------------------------------ the MILP
    def forecast(self, rates: Rates | Sequence[Rates], backlog: Mapping[str, float] | None = None) -> list[dict[str, float]]:
        """Per lookahead window, the rate each inference tenant must be served at: the
        arrival rate, plus, in the first window, its queued requests spread over it (with
        ``backlog_drain``, the arrival rate only: the queue is valued by its drain). A given
        ``backlog`` becomes :attr:`queued_requests`, so that what is valued later (a drain, a
        restart's backlog at :meth:`arrival_rate_rps`) knows the queue behind these windows."""
        if backlog is not None:
            self.queued_requests = dict(backlog)
        windows = [dict(rates)] if isinstance(rates, Mapping) else [dict(r) for r in rates]
        for name, queued in ({} if self.backlog_drain else backlog or {}).items():
            if name in windows[0]:
                windows[0][name] += queued / self.interval_s
        return windows

    def plan(self, rates: Rates | Sequence[Rates], current: Configuration | None = None,
             accuracy: Mapping[str, float] | None = None, rate_cv: Rates | None = None,
             candidates: Sequence[Configuration] = ()) -> Plan:
        """The configuration maximising predicted Goodput over the lookahead minus the cost
        of getting there from ``current`` and the payback hurdle of each change
        (:meth:`payback_hurdle`: a change is made only if it pays back with a margin).

        :param rates: per inference tenant, the rate to serve over the next interval,
            requests/s; or a sequence of such maps, one per lookahead window (see
            :meth:`forecast` to add queued requests)
        :param current: the running configuration (None: nothing deployed, no restart is
            charged beyond each tenant's start)
        :param accuracy: per inference tenant, its serving model's current accuracy
            (default: the tenant's ``accuracy``)
        :param rate_cv: per inference tenant, the coefficient of variation of its recent
            per-interval arrival rates (:meth:`on_time_fraction`; missing: steady)
        :param candidates: whole configurations compared with the MILP's answer under the
            same objective (e.g. priority-fill layouts, which the MILP does not express);
            the best is returned
        """
        started = time.perf_counter()
        windows = [rates] if isinstance(rates, Mapping) else list(rates)
        accuracy = dict(accuracy or {})
        # What the running tenants hold now, and each MILP's MPS columns: computed once, shared
        # by the priority-fill MILP and the MPS-only one.
        held = self.configuration_values(current, windows, accuracy, rate_cv) if current is not None else {}
        columns_of: dict[tuple, list[PlanOption]] = {}
        config, value, cost, hurdle, columns, rows, status = self._milp_configuration(windows, current, accuracy, rate_cv, held, columns_of,
                                                                                       self.priority_fill_columns)
        if any(mode == SharingMode.PRIORITY_FILL for modes in config.modes for mode in modes):
            # The priority-fill columns value a first tenant alone and each filler beside its
            # first tenant only: the exact valuation decides against the MPS-only answer.
            mps = self._milp_configuration(windows, current, accuracy, rate_cv, held, columns_of, False)
            exact = self.assess_many([config, mps[0]], windows, current, accuracy, rate_cv)
            best = int(np.argmax([v - c - h for v, c, h in exact]))
            config = (config, mps[0])[best]
            value, cost, hurdle = exact[best]
            columns, rows = columns + mps[4], rows + mps[5]
        for candidate in candidates:
            v, c, h = self.assess(candidate, windows, current, accuracy, rate_cv)
            if v - c - h > value - cost - hurdle:
                config, value, cost, hurdle = candidate, v, c, h
        return Plan(config, value - cost, value, cost, (time.perf_counter() - started) * 1e3, status, columns, rows, hurdle)

    def _milp_configuration(self, windows: list[dict[str, float]], current: Configuration | None, accuracy: Mapping[str, float],
                            rate_cv: Rates | None, held: Mapping[str, float], columns_of: dict[tuple, list[PlanOption]],
                            priority_fill: bool) -> tuple[Configuration, float, float, float, int, int, str]:
        """The MILP's configuration (one MILP per GPU once tenants run): (configuration, value,
        cost, hurdle, columns, rows, HiGHS status).

        :param held: :meth:`configuration_values` of ``current``
        :param columns_of: each MILP's MPS columns (:meth:`options`) by its tenants, filled in
            as they are computed
        """
        G = self.scenario.gpu_count
        if G == 1 or current is None:
            groups = [({t.name: tuple(range(G)) for t in self.scenario.tenants}, tuple(range(G)))]
        else:
            # Tenants stay on their running GPU: the node decomposes into one small MILP per
            # GPU (the joint MILP over 8 symmetric GPUs does not solve within seconds).
            groups = [({n: (g,) for n, p in current.placements.items() if p.gpu_index == g}, (g,)) for g in range(G)]
            unplaced = [t.name for t in self.scenario.tenants if t.name not in current.placements]
            for k, name in enumerate(unplaced):
                groups[k % G][0][name] = (k % G,)
        layouts: list[Layout | None] = [None] * G
        placements: dict[str, TenantPlacement] = {}
        filled: set[tuple[int, int]] = set()
        solved_groups = []
        for gpus_of, gpus in groups:
            key = tuple(sorted((name, tuple(allowed)) for name, allowed in gpus_of.items()))
            if key not in columns_of:
                columns_of[key] = self.options(windows, current, accuracy, gpus_of, rate_cv, held)
            # What a solve stopped at its time limit falls back to: the running configuration,
            # or, on a node of several GPUs with nothing running, one MILP per GPU over a
            # balanced split of the tenants. The joint MILP over 4 A100s and 14 tenants stopped
            # at its limit with a configuration worth -1.33M request-equivalents where a fixed
            # one is worth +79k (docs/planner-bursts.md, stop 68).
            start = current
            if current is None and len(gpus) > 1:
                start = self._balanced_start(columns_of[key], windows, accuracy, held, rate_cv)
            try:
                solved = self._solve(columns_of[key], windows, current, accuracy, held, gpus_of, gpus, rate_cv, priority_fill, start)
            except SolverError:
                # The tenants fit only at smaller batches than their best ones (two retraining
                # jobs of bert need 15.75 GB each at batch 8 and a 24 GB A30 holds one): again,
                # with a column at every smaller batch.
                key = (*key, "smaller batches")
                if key not in columns_of:
                    columns_of[key] = self.options(windows, current, accuracy, gpus_of, rate_cv, held, smaller_batches=True)
                solved = self._solve(columns_of[key], windows, current, accuracy, held, gpus_of, gpus, rate_cv, priority_fill, start)
            solved_groups.append((gpus_of, gpus, columns_of[key], solved))
        if self.cross_gpu_moves and current is not None and len(groups) > 1:
            solved_groups = self._cross_gpu_move(solved_groups, windows, current, accuracy, held, rate_cv, priority_fill, columns_of)
        value = cost = hurdle = 0.0
        columns = rows = 0
        statuses = []
        for _, _, _, solved in solved_groups:
            chosen, placed, pf, v, c, h, milp, status = solved
            for g, layout in chosen.items():
                layouts[g] = layout
            placements.update(placed)
            filled |= pf
            value, cost, hurdle = value + v, cost + c, hurdle + h
            columns, rows = columns + milp.num_columns, rows + milp.num_rows
            statuses.append(status)
        assert all(layout is not None for layout in layouts)
        config = self._configuration(layouts, placements, filled)
        status = next((s_ for s_ in statuses if s_ != "kOptimal"), "kOptimal")
        return config, value, cost, hurdle, columns, rows, status

    def _priority_fill_columns(self, options: Sequence[PlanOption], windows: list[dict[str, float]], current: Configuration | None,
                               accuracy: Mapping[str, float], held_values: Mapping[str, float],
                               rate_cv: Rates | None) -> list[tuple[str | None, PlanOption]]:
        """The MILP's priority-fill columns: (first tenant, option) pairs. ``None`` as first: the
        option's tenant is its GI's first (highest-priority) tenant, valued alone; else it fills
        the idle time of that first tenant, valued beside it as its lone filler
        (:meth:`priority_fill_member_values`: several fillers split that time, so the MILP
        values them high, and the exact valuation of :meth:`plan` decides). Each at the batch
        of the tenant's 100% MPS column in that GI (one that does not fit has none)."""
        full: dict[tuple[str, int, GpuInstance], PlanOption] = {}
        for o in options:  # the first: its best batch (options' smaller batches follow it)
            if o.mps_pct == 100.0 and o.instance is not None:
                full.setdefault((o.tenant, o.gpu, o.instance), o)
        order = {t.name: k for k, t in enumerate(self.scenario.tenants)}

        def rank(name: str) -> tuple[int, int]:  # who runs first in a shared GI (scenario order breaks ties)
            return self.scenario.tenant(name).priority.rank, order[name]

        values: dict[tuple, dict[str, float]] = {}
        columns: list[tuple[str | None, PlanOption]] = []
        for (name, g, gi), o in full.items():
            tenant = self.scenario.tenant(name)
            firsts = [None] + [f for (f, g2, gi2) in full if (g2, gi2) == (g, gi) and rank(f) < rank(name)]
            for first in firsts:
                names = (name,) if first is None else (first, name)
                batches = {n: full[(n, g, gi)].batch for n in names}
                key = (gi.profile, names, tuple(batches.values()))
                if key not in values:
                    values[key] = self.priority_fill_member_values(gi.profile, names, batches, {n: 100.0 / len(names) for n in names},
                                                                   windows, accuracy, rate_cv)
                value = values[key][name]
                held = held_values.get(name)
                mode = SharingMode.PRIORITY_FILL
                cost = self._reconfiguration(tenant, current, g, gi, 100.0, value, windows, o.memory_gib,
                                             held if self.scenario.make_before_break else None,
                                             self.drain(tenant, gi.profile, 100.0, o.batch), mode)
                hurdle = 0.0 if self.unchanged(name, current, g, gi, 100.0, mode) else self.payback_hurdle(cost, held, name, current)
                columns.append((first, PlanOption(name, g, gi, 100.0, o.batch, o.memory_gib, value, cost, hurdle)))
        return columns

    def _configuration(self, layouts: Sequence[Layout], placements: Mapping[str, TenantPlacement], filled: set[tuple[int, int]]) -> Configuration:
        """The configuration of per-GPU ``layouts`` (by GPU index), the MILPs' ``placements`` and
        the (GPU, instance index) they ``filled`` in priority fill (the other GIs run MPS)."""
        modes = tuple(tuple(SharingMode.PRIORITY_FILL if (g, i) in filled else SharingMode.MPS for i in range(len(layout) if self.gpu.mig_supported else 1))
                      for g, layout in enumerate(layouts))
        return Configuration(tuple(layouts), modes, {t.name: placements[t.name] for t in self.scenario.tenants})

    def _cross_gpu_move(self, solved_groups: list[tuple], windows: list[dict[str, float]], current: Configuration,
                        accuracy: Mapping[str, float], held: Mapping[str, float], rate_cv: Rates | None,
                        priority_fill: bool, columns_of: dict[tuple, list[PlanOption]]) -> list[tuple]:
        """The per-GPU MILPs' answers (``(gpus_of, gpus, columns, solved)`` per GPU), with the two
        GPUs whose tenants lose most and least against their best columns planned again as one
        MILP, in which their tenants may move between them, where that plan is worth more
        (objective less hurdles). Why: once tenants run, the node decomposes into one MILP per
        GPU and a tenant never leaves its GPU; on heldout-eight-tenants, one MILP over both GPUs
        valued the node 20% higher than the two per GPU at 4 of 8 decisions (docs/planner-bursts.md, stop 68)."""
        def worth(solved: tuple) -> float:
            return solved[3] - solved[4] - solved[5]

        def lost(group: tuple) -> float:  # what the GPU's tenants give up against their best columns
            gpus_of, _, columns, solved = group
            best = {name: max((o.value for o in columns if o.tenant == name), default=0.0) for name in gpus_of}
            return sum(best.values()) - solved[3]

        losses = [lost(group) for group in solved_groups]
        a, b = int(np.argmax(losses)), int(np.argmin(losses))
        if a == b:
            return solved_groups
        gpus = tuple(sorted(solved_groups[a][1] + solved_groups[b][1]))
        gpus_of = {name: gpus for k in (a, b) for name in solved_groups[k][0]}
        key = tuple(sorted((name, allowed) for name, allowed in gpus_of.items()))
        if key not in columns_of:
            columns_of[key] = self.options(windows, current, accuracy, gpus_of, rate_cv, held)
        columns = columns_of[key]
        try:
            joint = self._solve(columns, windows, current, accuracy, held, gpus_of, gpus, rate_cv, priority_fill, current)
        except SolverError:
            return solved_groups
        if worth(joint) <= worth(solved_groups[a][3]) + worth(solved_groups[b][3]) + 1e-6:
            return solved_groups
        return [group for k, group in enumerate(solved_groups) if k not in (a, b)] + [(gpus_of, gpus, columns, joint)]

    def _balanced_start(self, options: Sequence[PlanOption], windows: list[dict[str, float]], accuracy: Mapping[str, float],
                        held: Mapping[str, float], rate_cv: Rates | None) -> Configuration | None:
        """A configuration for a node of several GPUs with nothing running: each tenant on one
        GPU, the busiest first on the least loaded (longest processing time first), then one
        MILP per GPU. A tenant's load is the largest part of a GPU (its compute slices times
        the MPS share, or its memory) that its cheapest column worth nearly its best one needs.
        None where a GPU's tenants cannot be placed (the joint MILP then starts unaided)."""
        G = self.scenario.gpu_count
        total_slices = max(self.gpu.compute_slices, 1)

        def load(o: PlanOption) -> float:
            compute = self.gpu.profiles[o.instance.profile].compute_slices / total_slices if o.instance is not None else 1.0
            return max(compute * o.mps_pct / 100.0, o.memory_gib / self.gpu.memory_gib)

        demand: dict[str, float] = {}
        for t in self.scenario.tenants:
            columns = [o for o in options if o.tenant == t.name and o.gpu == 0]
            if not columns:
                return None
            best = max(o.value - o.reconfiguration for o in columns)
            demand[t.name] = min(load(o) for o in columns if o.value - o.reconfiguration >= best - 0.01 * abs(best))
        loads = [0.0] * G
        gpus_of: dict[str, tuple[int]] = {}
        for name in sorted(demand, key=lambda n: -demand[n]):
            g = int(np.argmin(loads))
            gpus_of[name] = (g,)
            loads[g] += demand[name]
        layouts: dict[int, Layout] = {}
        placements: dict[str, TenantPlacement] = {}
        filled: set[tuple[int, int]] = set()
        for g in range(G):
            mine = {name: gpus for name, gpus in gpus_of.items() if gpus == (g,)}
            columns = [o for o in options if o.gpu == g and o.tenant in mine]
            try:
                chosen, placed, pf, *_ = self._solve(columns, windows, None, accuracy, held, mine, (g,), rate_cv)
            except SolverError:
                return None
            layouts.update(chosen)
            placements.update(placed)
            filled |= pf
        return self._configuration([layouts[g] for g in range(G)], placements, filled)

    def _start_columns(self, start: Configuration, options: Sequence[PlanOption]) -> dict[str, PlanOption] | None:
        """The columns that run ``start``'s tenants among ``options``' tenants: per tenant the
        column of its GPU, GI and share that is worth most and admits its co-runners (any
        batch: a batch change restarts nothing). None where ``start`` runs one of them in
        priority fill or in a placement no column has, or where those columns' batches do not
        fit a GI's memory together."""
        tenants = {o.tenant for o in options}
        if not tenants <= set(start.placements):
            return None
        if any(start.modes[p.gpu_index][p.instance_index] != SharingMode.MPS for name, p in start.placements.items() if name in tenants):
            return None
        members: dict[tuple[int, int], int] = {}
        for p in start.placements.values():
            members[(p.gpu_index, p.instance_index)] = members.get((p.gpu_index, p.instance_index), 0) + 1
        best: dict[str, PlanOption] = {}
        for o in options:
            p = start.placements[o.tenant]
            layout = start.layouts[p.gpu_index]
            gi = layout.instances[p.instance_index] if len(layout) else None
            if (o.gpu, o.instance, o.mps_pct) != (p.gpu_index, gi, float(p.mps_pct)):
                continue
            if o.co_runners is not None and o.co_runners < members[(p.gpu_index, p.instance_index)] - 1:
                continue
            if o.tenant not in best or o.value - o.reconfiguration - o.hurdle > best[o.tenant].value - best[o.tenant].reconfiguration - best[o.tenant].hurdle:
                best[o.tenant] = o
        if set(best) != tenants:
            return None
        # The best column may be at a larger batch than the running one: the GI must hold them.
        need: dict[tuple[int, GpuInstance | None], float] = {}
        for o in best.values():
            need[(o.gpu, o.instance)] = need.get((o.gpu, o.instance), 0.0) + o.memory_gib
        if any(memory > self._gi_memory(gi.profile if gi else None) + 1e-9 for (_, gi), memory in need.items()):
            return None
        return best

    def _solve(self, options: Sequence[PlanOption], windows: list[dict[str, float]], current: Configuration | None,
               accuracy: Mapping[str, float], held: Mapping[str, float], gpus_of: Mapping[str, Sequence[int]], gpus: Sequence[int],
               rate_cv: Rates | None = None, priority_fill: bool = False, start: Configuration | None = None
               ) -> tuple[dict[int, Layout], dict[str, TenantPlacement], set[tuple[int, int]], float, float, float, Milp, str]:
        """One MILP over ``gpus`` and the tenants of ``gpus_of`` (allowed GPUs per tenant), with
        their MPS columns ``options`` (:meth:`options`); with ``priority_fill``, also the priority-fill columns (:meth:`_priority_fill_columns`;
        ``held``: :meth:`configuration_values` of ``current``). Returns the layouts, placements,
        the (GPU, instance index) run in priority fill, value, cost, hurdle, the MILP and its status.

        Where the solve stops at its time limit, ``start`` (its GPUs' part) is returned instead
        if it is worth more (:meth:`_start_columns`). Not as a MIP start: with presolve on,
        HiGHS 1.16 handed back the start itself as the solution of a solve it reported optimal
        at a better objective (train-out-of-phase, docs/planner-bursts.md, stop 68)."""
        milp = Milp()
        x = [milp.add_binary(-(o.value - o.reconfiguration - o.hurdle)) for o in options]
        pf = self._priority_fill_columns(options, windows, current, accuracy, held, rate_cv) if priority_fill and self.gpu.mig_supported else []
        xp = [milp.add_binary(-(o.value - o.reconfiguration - o.hurdle)) for _, o in pf]
        # m: the GI runs in priority fill (then no MPS column may use it).
        m = {key: milp.add_binary(0.0) for key in dict.fromkeys((o.gpu, o.instance) for _, o in pf)}
        layouts = {g: self._layouts_for(current, g) for g in gpus}
        y = {g: [milp.add_binary(0.0) for _ in layouts[g]] for g in gpus}
        for g in gpus:
            milp.add_row(y[g], [1.0] * len(y[g]), 1.0, 1.0)
        by_tenant: dict[str, list[int]] = {name: [] for name in gpus_of}
        by_gi: dict[tuple[int, GpuInstance | None], list[int]] = {}
        for j, o in enumerate(options):
            by_tenant[o.tenant].append(x[j])
            by_gi.setdefault((o.gpu, o.instance), []).append(j)
        pf_by_gi: dict[tuple[int, GpuInstance | None], list[int]] = {}
        for k, (first, o) in enumerate(pf):
            by_tenant[o.tenant].append(xp[k])
            pf_by_gi.setdefault((o.gpu, o.instance), []).append(k)
        for name, cols in by_tenant.items():
            milp.add_row(cols, [1.0] * len(cols), 1.0, 1.0)
        for (g, gi), js in by_gi.items():
            holders = [y[g][k] for k, layout in enumerate(layouts[g]) if gi is None or gi in layout.instances]
            ks = pf_by_gi.get((g, gi), [])
            filled = [m[(g, gi)]] if (g, gi) in m else []
            # Shares <= 100% of the GI, and only if the chosen layout has it (u = sum y); a GI
            # in priority fill takes it whole.
            milp.add_row([x[j] for j in js] + filled + holders, [options[j].mps_pct / 100.0 for j in js] + [1.0] * len(filled) + [-1.0] * len(holders),
                         upper=1e-9)
            memory = self._gi_memory(gi.profile if gi else None)
            milp.add_row([x[j] for j in js] + [xp[k] for k in ks] + holders,
                         [options[j].memory_gib for j in js] + [pf[k][1].memory_gib for k in ks] + [-memory] * len(holders), upper=1e-9)
            if filled:
                # One first tenant in a GI in priority fill, none otherwise; a filler only beside its first.
                firsts = {pf[k][1].tenant: xp[k] for k in ks if pf[k][0] is None}
                milp.add_row(list(firsts.values()) + filled, [1.0] * len(firsts) + [-1.0], 0.0, 0.0)
                for k in ks:
                    if pf[k][0] is not None:
                        milp.add_row([xp[k], firsts[pf[k][0]]], [1.0, -1.0], upper=0.0)
            if self.co_runner_count:
                # A tenant's option with count k holds its GI to k co-runners: with n tenants
                # in the GI, n - 1 <= k when the tenant is there (N: tenants that could be).
                # Row per tenant: sum_GI x + sum_tenant (N - 1 - k) x <= N.
                tenants = sorted({options[j].tenant for j in js})
                n = len(tenants)
                for name in tenants:
                    milp.add_row([x[j] for j in js], [float(n - (options[j].co_runners or 0)) if options[j].tenant == name else 1.0 for j in js],
                                 upper=float(n))
        kept = self._start_columns(start, options) if start is not None else None
        if kept is not None and any(start.layouts[g] not in layouts[g] for g in gpus):
            kept = None
        try:
            solution = milp.solve(PLANNER_SOLVER_OPTIONS)
        except SolverError:
            PLANNER_SOLVES.record(time_limited=True)
            if kept is None:
                raise
            solution = None  # the time limit, before any solution
        else:
            PLANNER_SOLVES.record(time_limited=solution.status == "kTimeLimit")
        kept_worth = sum(o.value - o.reconfiguration - o.hurdle for o in kept.values()) if kept is not None else -math.inf
        if solution is None or (not solution.optimal and kept_worth > -solution.objective):  # objective: minus the worth
            placements = {name: TenantPlacement(o.gpu, start.placements[name].instance_index, o.mps_pct, o.batch) for name, o in kept.items()}
            return ({g: start.layouts[g] for g in gpus}, placements, set(), sum(o.value for o in kept.values()),
                    sum(o.reconfiguration for o in kept.values()), sum(o.hurdle for o in kept.values()), milp, "kTimeLimit")
        if not solution.feasible:
            # HiGHS presolve has declared feasible planner MILPs infeasible (a running
            # configuration with repaired shares, 88.8888% + 11.1111% of a GI: every tenant
            # still fits at 12.5% of a 7g): the verdict is confirmed without presolve.
            solution = milp.solve({**PLANNER_SOLVER_OPTIONS, "presolve": "off"})
        if not solution.feasible:
            raise SolverError(f"planner MILP infeasible ({solution.status}): the tenants' memory cannot be placed")
        chosen = {g: layouts[g][int(np.argmax([solution.values[c] for c in y[g]]))] for g in gpus}
        placements: dict[str, TenantPlacement] = {}
        value = cost = hurdle = 0.0
        picked = [o for j, o in enumerate(options) if solution.values[x[j]] > 0.5]
        picked_pf = [o for k, (_, o) in enumerate(pf) if solution.values[xp[k]] > 0.5]
        members: dict[tuple[int, int], int] = {}
        for o in picked_pf:
            key = (o.gpu, chosen[o.gpu].instances.index(o.instance))
            members[key] = members.get(key, 0) + 1
        for o in picked + picked_pf:
            index = chosen[o.gpu].instances.index(o.instance) if o.instance is not None else 0
            # The members of a priority-fill GI hold equal nominal shares (as the portfolio's do).
            share = equal_shares(members[(o.gpu, index)]) if (o.gpu, index) in members else o.mps_pct
            placements[o.tenant] = TenantPlacement(o.gpu, index, share, o.batch)
            value += o.value
            cost += o.reconfiguration
            hurdle += o.hurdle
        return chosen, placements, set(members), value, cost, hurdle, milp, solution.status

    def evaluate(self, configuration: Configuration, rates: Rates | Sequence[Rates], current: Configuration | None = None,
                 accuracy: Mapping[str, float] | None = None, rate_cv: Rates | None = None) -> tuple[float, float]:
        """(value-table sum, reconfiguration cost) of a configuration under the planner's
        model: the planner's objective of that configuration is their difference."""
        value, cost, _ = self.assess(configuration, rates, current, accuracy, rate_cv)
        return value, cost

    def assess(self, configuration: Configuration, rates: Rates | Sequence[Rates], current: Configuration | None = None,
               accuracy: Mapping[str, float] | None = None, rate_cv: Rates | None = None) -> tuple[float, float, float]:
        """(value, reconfiguration cost, payback hurdle) of a configuration, each summed over
        tenants (:meth:`evaluate`, :meth:`payback_hurdle`); any sharing mode. The value is
        less the SLO guards' charges (:meth:`slo_guard_cost`, :meth:`priority_fill_guard_cost`)."""
        return self.assess_many([configuration], rates, current, accuracy, rate_cv)[0]

    def assess_forecasts(self, configurations: Sequence[Configuration], forecasts: Sequence[Sequence[Rates]], current: Configuration | None = None,
                         accuracy: Mapping[str, float] | None = None, rate_cv: Rates | None = None) -> list[list[tuple[float, float, float]]]:
        """:meth:`assess_many` at each of several forecasts (windows of rates): every MPS option
        the configurations place is valued at all the forecasts in one vectorised call."""
        configurations = list(configurations)
        options = self.forecast_options([*configurations, *([current] if current is not None else [])], forecasts, accuracy, rate_cv)
        placed: dict[tuple, PlacementTerms] = {}
        return [self.assess_many(configurations, windows, current, accuracy, rate_cv, options[k], placed) for k, windows in enumerate(forecasts)]

    def forecast_options(self, configurations: Sequence[Configuration], forecasts: Sequence[Sequence[Rates]],
                         accuracy: Mapping[str, float] | None = None, rate_cv: Rates | None = None) -> list[OptionValues]:
        """Per forecast, the value of every MPS option and priority-fill GI the configurations
        place (the ``options`` :meth:`assess_many` takes), all forecasts in one vectorised call
        per option or GI."""
        accuracy = dict(accuracy or {})
        options: list[OptionValues] = [{} for _ in forecasts]
        keys = {self.option_key(c, name) for c in configurations for name, placement in c.placement_keys.items() if placement.mode != _PRIORITY_FILL}
        for key in keys:
            name, profile, mps_pct, batch, sharing = key
            for k, value in enumerate(self.option_values(self.scenario.tenant(name), profile, mps_pct, forecasts, accuracy, batch, rate_cv, sharing)):
                options[k][key] = value
        filled: set[tuple] = set()
        for c in configurations:
            for g, i in self._priority_fill_gis(c):
                key = self._priority_fill_key(c, g, i)
                if key not in filled:
                    filled.add(key)
                    for k, values in enumerate(self.priority_fill_forecast_values(c, g, i, forecasts, accuracy, rate_cv)):
                        options[k][key] = values
        return options

    def assess_many(self, configurations: Sequence[Configuration], rates: Rates | Sequence[Rates], current: Configuration | None = None,
                    accuracy: Mapping[str, float] | None = None, rate_cv: Rates | None = None,
                    options: OptionValues | None = None, placed: dict[tuple, PlacementTerms] | None = None,
                    by_tenant: list[dict[str, Terms]] | None = None) -> list[Terms]:
        """:meth:`assess` of each configuration from the same running one at the same rates
        (a choice among candidates): the running configuration's values are computed once,
        and an MPS option the candidates share is valued once.

        :param options: MPS option values already computed at these rates (:meth:`configuration_values`)
        :param placed: the tenants' :class:`PlacementTerms` found so far from the same running
            configuration, by (tenant, placement, co-runner count, windows), filled in as they
            are found (:meth:`assess_forecasts` shares them between its forecasts)
        :param by_tenant: given, each configuration's (value, cost, hurdle) terms per tenant are
            appended to it, one dict per configuration (they sum to the returned totals)
        """
        windows = [rates] if isinstance(rates, Mapping) else list(rates)
        accuracy = dict(accuracy or {})
        options = {} if options is None else options
        # What the tenants hold now matters only to make-before-break and the payback hurdle.
        needs_held = current is not None and (self.scenario.make_before_break or self.payback_margin)
        held_values = self.configuration_values(current, windows, accuracy, rate_cv, options) if needs_held else {}
        # A tenant's terms depend on the running configuration (fixed here) and on its own
        # placement, co-runner count and value only; library candidates share most tenants'
        # placements (a multi-GPU node's solutions differ on a few GPUs), so each is computed once.
        terms: dict[tuple, tuple[float, float, float]] = {}
        placed = {} if placed is None else placed
        horizon_s = self.interval_s * len(windows)
        results = []
        for configuration in configurations:
            values = self.configuration_values(configuration, windows, accuracy, rate_cv, options)
            placements = configuration.placement_keys
            value = cost = hurdle = 0.0
            tenants: dict[str, Terms] = {}
            for t in self.scenario.tenants:
                name = t.name
                placement = placements[name]
                sharing = self.sharing(configuration, name)
                key = (name, placement, sharing, values[name])
                found = terms.get(key)
                if found is None:
                    # Its value aside, a tenant's terms depend on its placement alone: found once for every forecast.
                    placement_key = (name, placement, sharing, len(windows))
                    placement_terms = placed.get(placement_key)
                    if placement_terms is None:
                        g, gi, mode, _ = configuration.placed_in[name]
                        placement_terms = placed[placement_key] = self._placement_terms(t, current, g, gi, placement.mps_pct, placement.batch_size,
                                                                                        mode, sharing, horizon_s, rate_cv)
                    found = terms[key] = self._tenant_terms(t, placement_terms, values[name], held_values.get(name), windows, current)
                v, c, h = found
                if placement.mode == _PRIORITY_FILL and name in self.slo_guards:
                    v -= self.priority_fill_guard_cost(configuration, name, self.interval_s * len(windows), rate_cv)
                value += v
                cost += c
                hurdle += h
                tenants[name] = (v, c, h)
            results.append((value, cost, hurdle))
            if by_tenant is not None:
                by_tenant.append(tenants)
        return results
