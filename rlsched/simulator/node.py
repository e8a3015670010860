"""The node simulator: G GPUs, their tenants, one decision interval per :meth:`NodeSimulator.step`.

``sim = NodeSimulator(scenario, perf_model, seed)``; ``sim.reset(seed)``; then
``sim.step(configuration)`` applies a :class:`~rlsched.decision.Configuration` (charging
reconfiguration downtime), advances one decision interval at request level, and returns a
:class:`StepResult` with per-tenant statistics and the Goodput terms of the interval.

What happens to requests (see :mod:`rlsched.simulator.queueing`): each inference tenant
is one server with a bounded FIFO queue and a dynamic batcher; a batch's service time
comes from the performance model for the tenant's current instance, MPS share, sharing
mode and co-runners (cached per configuration), optionally with lognormal jitter fitted to
the model's mean and p99.

Reconfiguration: a GPU's layout change costs the catalog's GI destroy + create times
(:func:`~rlsched.hardware.change_plan`); a tenant whose instance is destroyed or created,
who moves, whose MPS share changes (a running MPS client's share cannot change), or whose
instance changes sharing mode restarts, paying its ``restart_s`` (CUDA context + model
load) after its batch in flight drains. Requests keep queueing (and dropping when the queue
is full) during the downtime. With the scenario's make-before-break switch, a tenant whose
new instance can start beside its old one pays no downtime: the old instance serves, at its
own speed, until the new server is ready (at most until the end of the interval), and the
new one from then on.

Activity windows (``Tenant.active_windows_s``): arrivals are drawn every interval as for an
always-active tenant, then those outside the windows are discarded (they never existed);
a job works only during the active part of an interval. A tenant that becomes active while
placed pays its ``restart_s`` from that moment (a cold start); one that is inactive at a
decision boundary pays no reconfiguration downtime, and its server, gone with its window,
drops what it still held. An inactive tenant holds no memory and is no co-runner: the
memory fit and interference are those of the tenants active during the interval.

Sharing modes: ``mps`` and ``time-slice`` latencies come from the performance model with
the co-runners. ``priority-fill`` (FIKIT): the highest-priority tenant of the instance gets
the performance model's high-priority latency (solo plus FIKIT's overhead); the others run
in the idle fraction the high-priority tenant actually left in the same interval (measured
here, request by request, rather than assumed from a busy fraction), never below the
performance model's minimum idle fraction. A lone filler runs at its solo speed scaled by
that fraction; several split it, running among themselves as MPS clients at their nominal
shares scaled to 100% (:func:`filler_shares`), so that together they never do more
than the idle time holds.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.goodput import GoodputTerms, goodput_terms
from rlsched.hardware import GpuInstance, change_plan, load_gpu, staged_change_plan
from rlsched.simulator import queueing as q
from rlsched.simulator.perf import CoRunner, PerformanceModelLike
from rlsched.workloads.arrivals import ArrivalProcess
from rlsched.workloads.scenario import Scenario
from rlsched.workloads.tenants import BestEffortJob, ContinualLearningJob, InferenceTenant, Tenant

#: Under priority fill, low-priority work never gets less than this fraction of the
#: instance; used only when the performance model does not state its own
#: (``sharing-modes.yaml: priority_fill.min_idle_frac``).
MIN_IDLE_FRACTION = 0.02


def filler_shares(fillers: Sequence[tuple[str, CoRunner]]) -> dict[str, tuple[float, tuple[CoRunner, ...]]]:
    """How two or more fillers of one priority-fill GI split the idle time its first tenant
    leaves: per filler (name, itself as a :class:`CoRunner` at its nominal share), its MPS
    share among them, its nominal share scaled so that the fillers' shares sum to 100%, and
    its co-runners, the other fillers at their scaled shares. The simulator runs them so
    and the planner values them so."""
    total_pct = sum(c.mps_pct for _, c in fillers)
    scaled = {name: replace(c, mps_pct=100.0 * c.mps_pct / total_pct if total_pct > 0 else 100.0)
              for name, c in fillers}
    return {name: (c.mps_pct, tuple(o for other, o in scaled.items() if other != name)) for name, c in scaled.items()}


def min_idle_fraction(perf_model: object) -> float:
    """The least fraction of a priority-fill instance its low-priority tenants get: the
    performance model's (``sharing-modes.yaml: priority_fill.min_idle_frac``), or
    :data:`MIN_IDLE_FRACTION` when it states none."""
    sharing = getattr(perf_model, "_sharing", None)  # the calibrated model's sharing-modes.yaml
    return float(sharing["priority_fill"]["min_idle_frac"]) if isinstance(sharing, dict) and "priority_fill" in sharing else MIN_IDLE_FRACTION

#: Weight of the newest interval in the smoothed arrival rate of the observation.
RATE_EWMA_WEIGHT = 0.3


@dataclass
class TenantStepStats:
    """One tenant over one decision interval (request counts are integers).

    Conservation: ``queued_at_end`` (waiting or in service at the end) equals the previous
    interval's ``queued_at_end + arrived - completed - dropped``.
    """

    name: str
    kind: str
    arrived: int = 0
    completed: int = 0
    dropped: int = 0
    queued_at_end: int = 0
    on_time: int = 0
    violated: int = 0
    slo_ms: float = math.nan
    slo_attainment: float = math.nan  # on_time / (completed + dropped); NaN if neither
    latency_ms_mean: float = math.nan
    latency_ms_p50: float = math.nan
    latency_ms_p99: float = math.nan
    mean_batch: float = math.nan
    utilization: float = 0.0  # busy fraction of the interval
    arrival_rate_rps: float = 0.0
    arrival_rate_ewma_rps: float = 0.0
    downtime_s: float = 0.0  # restart/reconfiguration downtime begun this interval
    restarted: bool = False
    out_of_memory: bool = False
    accuracy: float = 1.0  # serving model's accuracy (inference), or of the model it retrains (CL)
    best_effort_progress_s: float = 0.0  # full-GPU seconds of best-effort work
    training_samples: float = 0.0
    terms: GoodputTerms = field(default_factory=GoodputTerms)


@dataclass(frozen=True)
class ChangeRecord:
    """One tenant's reconfiguration and the downtime it actually paid.

    :param t_s: simulated time of the decision that changed it, seconds
    :param tenant: tenant name
    :param kind: ``move`` (another or a new GI), ``share`` (MPS share), ``mode`` (sharing
        mode) or ``start`` (newly placed)
    :param mechanism: ``make-before-break`` (new server ready before the old one stopped),
        ``ordered-restart`` (staged plan, but this tenant had to stop first),
        ``full-restart`` (make-before-break off) or ``start``
    :param downtime_s: seconds without a serving instance
    :param old_served_s: seconds the old instance kept serving after the change began
    """

    t_s: float
    tenant: str
    kind: str
    mechanism: str
    downtime_s: float
    old_served_s: float


@dataclass
class StepResult:
    """What one :meth:`NodeSimulator.step` did.

    :param t_start_s: simulated time at the start of the interval, seconds
    :param t_end_s: at its end
    :param tenants: per-tenant statistics of the interval
    :param terms: Goodput terms summed over tenants (``terms.total`` is the reward)
    :param gpu_reconfiguration_s: per GPU, GI destroy + create time spent, seconds
    :param done: the episode's duration is reached
    :param changes: one record per tenant changed at the start of the interval
    """

    t_start_s: float
    t_end_s: float
    tenants: dict[str, TenantStepStats]
    terms: GoodputTerms
    gpu_reconfiguration_s: tuple[float, ...]
    done: bool
    changes: tuple[ChangeRecord, ...] = ()

    @property
    def reward(self) -> float:
        """The Goodput objective of the interval."""
        return self.terms.total


@dataclass
class _Slot:
    """Where a tenant runs under the current configuration, with its cached speeds."""

    tenant: Tenant
    placement: TenantPlacement
    instance_key: tuple[int, GpuInstance | None]
    mode: SharingMode
    batch: int
    rank_in_instance: int  # 0: runs first (priority fill's high-priority tenant)
    fill_low: bool  # scaled by the idle fraction of the instance's high-priority tenant
    out_of_memory: bool
    service_mean_s: np.ndarray | None = None  # inference: index = batch size
    service_sigma: np.ndarray | None = None
    work_rate: float = 0.0  # CL: training samples/s; BE: full-GPU seconds per second


class _Server:
    """The queue state of one inference tenant, carried across steps."""

    def __init__(self, tenant: InferenceTenant) -> None:
        self.wait_buf = np.zeros(tenant.queue_capacity)
        self.flight_buf = np.zeros(tenant.max_batch)
        self.state = q.new_state()
        self.hist_step = np.zeros(q.HIST_BINS, dtype=np.int64)
        self.hist_total = np.zeros(q.HIST_BINS, dtype=np.int64)
        self.out = np.zeros(q.OUT_SIZE)
        self.totals = np.zeros(q.OUT_SIZE)
        self.percentiles_ms = np.zeros(2)  # p50, p99 of the last interval

    def in_system(self) -> int:
        return int(self.state[q.S_WAITING] + self.state[q.S_FLIGHT_N])


class NodeSimulator:
    """Request-level simulator of one node of ``scenario.gpu_count`` GPUs.

    :param scenario: tenants, arrivals, GPU type and count, intervals, weights
    :param perf_model: the performance model (latency curves, memory, training speed)
    :param seed: seed of the numpy Generator all randomness is drawn from
    """

    def __init__(self, scenario: Scenario, perf_model: PerformanceModelLike, seed: int | None = 0) -> None:
        self.scenario = scenario
        self.perf = perf_model
        self.gpu_spec = load_gpu(scenario.gpu)
        self.interval_s = float(scenario.decision_interval_s)
        known = set(perf_model.models())
        for t in scenario.tenants:
            if t.model.partition("@")[0] not in known:  # MODEL@SOURCE: see rlsched.perfmodel.model
                raise ValueError(f"scenario {scenario.name}: tenant {t.name} uses model {t.model!r}, unknown to the performance model ({', '.join(sorted(known))})")
        self._curve_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        # Own copies: MMPP and ServeGen processes carry state, and several simulators (e.g.
        # vectorised environments) may share one Scenario object.
        self._arrivals = {t.name: copy.deepcopy(t.arrivals) for t in scenario.inference_tenants()}
        # Tenants that come and go; the others are in every interval's active set.
        self._windowed = [t for t in scenario.tenants if t.active_windows_s]
        self._always_active = frozenset(t.name for t in scenario.tenants if not t.active_windows_s)
        # The retraining job that keeps each service's model (the first, in scenario order), found once:
        # a policy reads every tenant's accuracy each interval.
        self._retrained_by: dict[str, ContinualLearningJob] = {}
        for t in scenario.tenants:
            if isinstance(t, ContinualLearningJob):
                self._retrained_by.setdefault(t.serves, t)
        self.min_idle_fraction = min_idle_fraction(perf_model)
        self._seed = seed
        self._run_as: tuple[Configuration, Configuration] | None = None
        self.reset(seed)

    # ------------------------------------------------------------------ state
    def reset(self, seed: int | None = None, configuration: Configuration | None = None) -> dict[str, dict[str, float]]:
        """Start a new episode at time 0 with empty queues; returns the observation.

        :param seed: reseeds the Generator (None: keep the current stream)
        :param configuration: the configuration the node starts in (default: the
            scenario's reference); the first :meth:`step` pays only the changes from it.
            With neither, the first step's configuration is taken as already deployed.
        """
        if seed is not None:
            self._seed = seed
            self._seed_streams(seed)
        elif not hasattr(self, "_arrival_rng"):
            self._seed_streams(self._seed)
        self.time_s = 0.0
        self.step_index = 0
        self._config = self._as_run(configuration if configuration is not None else self.scenario.reference)
        self._slots: dict[str, _Slot] = {}
        self._slots_for: Configuration | None = None
        self._slots_active: frozenset[str] | None = None  # the active set the slots were built for
        self._servers = {t.name: _Server(t) for t in self.scenario.inference_tenants()}
        self._down_until = {t.name: 0.0 for t in self.scenario.tenants}
        #: Per priority-fill instance, the idle fraction its first tenant left last interval
        #: (what an old filler instance still serving during a handover runs at).
        self._idle_fraction: dict[tuple, float] = {}
        self._units = {t.name: t.units_after_drift for t in self.scenario.tenants if isinstance(t, ContinualLearningJob)}
        self._next_drift_s = {t.name: t.drift_window_s for t in self.scenario.tenants if isinstance(t, ContinualLearningJob)}
        self._rate_ewma = {t.name: t.arrivals.mean_rate_rps() for t in self.scenario.inference_tenants()}
        self._last: dict[str, TenantStepStats] = {}
        #: per inference tenant, the arrival times of the last interval, seconds (what a
        #: request log of the node would show; shadows of the node replay them)
        self.last_arrivals_s: dict[str, np.ndarray] = {}
        self._last_units_gain: dict[str, float] = {}
        self._tenant_terms = {t.name: GoodputTerms() for t in self.scenario.tenants}
        self._work_done = {t.name: 0.0 for t in self.scenario.tenants}
        self._downtime_total_s = {t.name: 0.0 for t in self.scenario.tenants}
        self.changes: list[ChangeRecord] = []  # every tenant change since reset, in order
        self._step_changes: list[ChangeRecord] = []
        self.totals = GoodputTerms()
        for name, process in self._arrivals.items():
            process.reset(self._arrival_rng[name])
        return self.observation()

    def _seed_streams(self, seed: int | None) -> None:
        """One Generator per tenant for its arrivals and one for its service jitter.

        Separate streams keep the arrivals a function of the seed alone: a policy's
        decisions (which change how many batches draw jitter) never change which requests
        arrive. Every policy scored on a seed meets the same requests (common random
        numbers), and a hindsight search can replay them.
        """
        root = np.random.SeedSequence(seed)
        arrival_seeds, service_seeds = root.spawn(2)
        names = [t.name for t in self.scenario.tenants]
        self._arrival_rng = {n: np.random.default_rng(s) for n, s in zip(names, arrival_seeds.spawn(len(names)), strict=True)}
        self._service_rng = {n: np.random.default_rng(s) for n, s in zip(names, service_seeds.spawn(len(names)), strict=True)}

    def reset_to_observed(self, seed: int, time_s: float, configuration: Configuration, arrivals: Mapping[str, ArrivalProcess],
                          backlog: Mapping[str, float], accuracy: Mapping[str, float]) -> None:
        """Start from a state a policy observed instead of from time 0: a model of the node
        for a lookahead (:mod:`rlsched.simulator.lookahead`).

        Each inference tenant's coming arrivals follow ``arrivals`` (a forecast, not the real
        process), its ``backlog`` requests wait from ``time_s`` (their true waiting times are
        not observed), no batch is in flight and no restart is pending; a retraining job's
        progress is the units that give the served model ``accuracy`` (Ekya's curve
        inverted), the next drift at the next multiple of its window.

        :param seed: seeds the Generator of the coming arrivals and service jitter
        :param time_s: the node's elapsed time, seconds
        :param configuration: the running configuration (the first :meth:`step` pays only the changes from it)
        :param arrivals: per inference tenant, its forecast arrival process in node time
        :param backlog: per inference tenant, requests waiting or in service (missing: none)
        :param accuracy: per served inference tenant, its model's current accuracy (missing: right after a drift)
        """
        # Replaced before the reset, which resets the processes: the real ones may draw from
        # the Generator (an MMPP's initial state), and every start must draw the same stream.
        self._arrivals = {t.name: arrivals[t.name] for t in self.scenario.inference_tenants()}
        self.reset(seed, configuration)
        self.time_s = float(time_s)
        for name, server in self._servers.items():
            waiting = min(int(backlog.get(name, 0)), server.wait_buf.size)
            server.wait_buf[:waiting] = self.time_s
            server.state[q.S_WAITING] = waiting
            server.state[q.S_SERVER_FREE_S] = self.time_s
        for job in self.scenario.tenants:
            if isinstance(job, ContinualLearningJob):
                self._units[job.name] = job.curve.units_for(accuracy.get(job.serves, job.curve.accuracy(job.units_after_drift)))
                self._next_drift_s[job.name] = (math.floor(self.time_s / job.drift_window_s + 1e-9) + 1) * job.drift_window_s

    def freeze_arrivals(self) -> None:
        """Record this episode's arrivals (the current seed's) and replay them from now on.

        For a search in hindsight (:mod:`rlsched.agents.baselines.hindsight`): the recorded
        processes carry no state, so :meth:`snapshot` need not copy them, and the arrivals
        are exactly those every policy met on this seed (they depend on the seed alone, see
        :meth:`_seed_streams`). Call right after :meth:`reset`; resets keep the recording.
        """
        self._seed_streams(self._seed)
        steps = self.scenario.steps
        recorded: dict[str, ArrivalProcess] = {}
        for name, process in self._arrivals.items():
            original = copy.deepcopy(process)
            original.reset(self._arrival_rng[name])
            windows = [original.sample(k * self.interval_s, (k + 1) * self.interval_s, self._arrival_rng[name]) for k in range(steps)]
            recorded[name] = RecordedArrivals(windows, self.interval_s, process.mean_rate_rps())
        self._arrivals = recorded
        self.reset(self._seed, self._config)

    def snapshot(self) -> dict:
        """The simulator's whole mutable state (queues, clocks, Generators, totals), to
        :meth:`restore` later: a search tries several futures from one state.

        Immutable parts (scenario, performance model, cached service curves, the
        configuration objects and their slots) are shared, not copied.
        """
        state = {k: v for k, v in self.__dict__.items() if k not in _SHARED_STATE}
        return copy.deepcopy(state, memo=_shared_memo(state))

    def restore(self, snapshot: dict) -> None:
        """Return to a state taken by :meth:`snapshot` (the snapshot stays usable)."""
        self.__dict__.update(copy.deepcopy(snapshot, memo=_shared_memo(snapshot)))

    @property
    def done(self) -> bool:
        """True once the scenario's duration has been simulated."""
        return self.time_s >= self.scenario.duration_s - 1e-9

    def accuracy_of(self, tenant_name: str) -> float:
        """Current accuracy of the model serving an inference tenant."""
        job = self._retrained_by.get(tenant_name)
        if job is not None:
            return job.curve.accuracy(self._units[job.name])
        tenant = self.scenario.tenant(tenant_name)
        return tenant.accuracy if isinstance(tenant, InferenceTenant) else 1.0

    def observation(self) -> dict[str, dict[str, float]]:
        """Per tenant, what a policy may observe: recent rates, queue, latency vs SLO,
        accuracy, and whether it is active now (1.0) or outside its activity windows (0.0)."""
        obs = {}
        for t in self.scenario.tenants:
            last = self._last.get(t.name)
            entry = {"accuracy": self.accuracy_of(t.serves if isinstance(t, ContinualLearningJob) else t.name),
                     "active": 1.0 if t.is_active(self.time_s) else 0.0}
            if isinstance(t, InferenceTenant):
                server = self._servers[t.name]
                p99 = last.latency_ms_p99 if last else math.nan
                entry.update(
                    arrival_rate_rps=last.arrival_rate_rps if last else 0.0,
                    arrival_rate_ewma_rps=self._rate_ewma[t.name],
                    queue_length=float(server.in_system()),
                    p99_over_slo=(p99 / t.slo_ms) if math.isfinite(p99) else 0.0,
                    slo_attainment=last.slo_attainment if last and math.isfinite(last.slo_attainment) else 1.0,
                    utilization=last.utilization if last else 0.0,
                )
            else:
                entry.update(progress=(last.training_samples if isinstance(t, ContinualLearningJob) else last.best_effort_progress_s) if last else 0.0)
            obs[t.name] = entry
        return obs

    def upcoming_rates_rps(self, windows: int = 1) -> list[dict[str, float]]:
        """Per coming decision interval (``windows`` of them, the next first), each
        inference tenant's arrival intensity as its process defines it
        (:meth:`~rlsched.workloads.arrivals.ArrivalProcess.window_rate_rps`) times the
        fraction of the interval it is active, requests/s.

        The true future, read without drawing: for a hindsight search in a replayed episode only;
        a policy must not see it.
        """
        rates = []
        for k in range(windows):
            t0, t1 = self.time_s + k * self.interval_s, self.time_s + (k + 1) * self.interval_s
            rates.append({name: process.window_rate_rps(t0, t1) * self.scenario.tenant(name).active_seconds(t0, t1) / self.interval_s
                          for name, process in self._arrivals.items()})
        return rates

    # ------------------------------------------------------------------ configuration
    def _instance(self, config: Configuration, p: TenantPlacement) -> tuple[tuple[int, GpuInstance | None], str | None, int | None, float]:
        """(identity, profile, compute slices, memory GiB) of a placement's instance."""
        layout = config.layouts[p.gpu_index]
        if self.gpu_spec.mig_supported and len(layout):
            gi = layout.instances[p.instance_index]
            profile = self.gpu_spec.profiles[gi.profile]
            return (p.gpu_index, gi), gi.profile, profile.compute_slices, profile.memory_gib
        return (p.gpu_index, None), None, None, self.gpu_spec.memory_gib

    def active_set(self, t0_s: float, t1_s: float) -> frozenset[str]:
        """Names of the tenants active at some time of ``[t0_s, t1_s)`` (they hold memory
        and interfere for the whole interval; the others are as if not deployed)."""
        if not self._windowed:
            return self._always_active
        return self._always_active | {t.name for t in self._windowed if t.active_seconds(t0_s, t1_s) > 0.0}

    def _build_slots(self, config: Configuration, active: frozenset[str]) -> dict[str, _Slot]:
        """Placement, speed curves and memory fit of every placed tenant (cached per
        configuration and set of ``active`` tenants: only those hold memory and interfere)."""
        problems = config.problems([t.name for t in self.scenario.inference_tenants()])
        if problems:
            raise ValueError("configuration cannot be applied: " + "; ".join(problems))
        gpu = self.scenario.gpu
        by_instance: dict[tuple, list[Tenant]] = {}
        info = {}
        for t in self.scenario.tenants:
            p = config.placements.get(t.name)
            if p is None:
                continue
            key, profile, slices, memory = self._instance(config, p)
            mode = config.modes[p.gpu_index][p.instance_index]
            by_instance.setdefault(key, []).append(t)
            batch = min(p.batch_size, t.max_batch) if isinstance(t, InferenceTenant) else p.batch_size
            info[t.name] = (p, key, profile, slices, memory, mode, batch)
        slots = {}
        for key, members in by_instance.items():
            members.sort(key=lambda t: t.priority.rank)  # stable: scenario order breaks ties
            # Inactive tenants run nothing: no memory, no interference, ranked after the rest.
            running = [t for t in members if t.name in active]
            members = running + [t for t in members if t.name not in active]
            memory_need = sum(self.perf.memory_gib(gpu, t.model, info[t.name][6]) for t in running)
            oom = memory_need > info[members[0].name][4] + 1e-9
            fillers = running[1:] if running else []
            split = filler_shares([(o.name, CoRunner(o.model, info[o.name][6], info[o.name][0].mps_pct)) for o in fillers]) if len(fillers) > 1 else {}
            for rank, t in enumerate(members):
                p, _, profile, slices, _, mode, batch = info[t.name]
                fill = mode == SharingMode.PRIORITY_FILL
                others = tuple(CoRunner(o.model, info[o.name][6], info[o.name][0].mps_pct) for o in running if o is not t)
                # MPS shares only mean something under MPS; priority fill computes from solo speed.
                mps = p.mps_pct if mode == SharingMode.MPS else 100.0
                # A lone filler's curve is its solo one; the idle fraction scales it each interval.
                colocated = () if fill and rank > 0 else others
                curve_mode = mode
                shares_idle = fill and rank > 0 and t.name in split
                if shares_idle:  # several fillers split the idle time the first tenant leaves
                    (mps, colocated), curve_mode = split[t.name], SharingMode.MPS
                slot = _Slot(t, p, key, mode, batch, rank, fill and rank > 0, oom and t.name in active)
                if isinstance(t, InferenceTenant):
                    slot.service_mean_s, slot.service_sigma = self._curve(t, batch, profile, slices, mps, curve_mode, colocated)
                elif isinstance(t, ContinualLearningJob):
                    step_s = self.perf.train_step_s(gpu, t.model, batch, profile, mps, colocated if shares_idle or not fill else ())
                    slot.work_rate = batch / step_s if step_s > 0 else 0.0
                else:
                    pred = self.perf.predict(gpu, t.model, batch, profile, mps, SharingMode.MPS if fill else mode, colocated if shares_idle or not fill else (), slices)
                    solo = self.perf.predict(gpu, t.model, batch)
                    slot.work_rate = pred.throughput_per_s / solo.throughput_per_s * t.tuning_throughput_factor(mps) if solo.throughput_per_s > 0 else 0.0
                slots[t.name] = slot
        return slots

    def _curve(self, t: InferenceTenant, batch: int, profile, slices, mps: float, mode: SharingMode, colocated) -> tuple[np.ndarray, np.ndarray]:
        """Per-batch service time (index = batch size) and lognormal sigma, cached."""
        key = (t.model, batch, profile, slices, mps, mode, colocated, t.tuning_latency_factor(mps), self.scenario.service_jitter)
        cached = self._curve_cache.get(key)
        if cached is None:
            if mode == SharingMode.PRIORITY_FILL:
                mean_ms, p99_ms = self.perf.latency_curve_ms(self.scenario.gpu, t.model, batch, profile, mps, mode, colocated, slices, high_priority=bool(colocated))
            else:
                mean_ms, p99_ms = self.perf.latency_curve_ms(self.scenario.gpu, t.model, batch, profile, mps, mode, colocated, slices)
            mean_s = np.concatenate([[0.0], np.asarray(mean_ms, dtype=float)]) * (t.tuning_latency_factor(mps) / 1000.0)
            sigma = np.zeros_like(mean_s)
            if self.scenario.service_jitter:
                sigma[1:] = q.lognormal_sigma(mean_ms, p99_ms)
            cached = (mean_s, sigma)
            self._curve_cache[key] = cached
        return cached

    def _downtimes(self, old: Configuration | None, new: Configuration, new_slots: dict[str, _Slot]) -> tuple[dict[str, float], tuple[float, ...]]:
        """Per tenant, the downtime the change from ``old`` to ``new`` costs; per GPU, GI seconds.

        Also records one :class:`ChangeRecord` per changed tenant in ``self._step_changes``.
        """
        self._step_changes = []
        gpu_s = [0.0] * len(new.layouts)
        if old is None:
            return {}, tuple(gpu_s)
        created: set[tuple[int, GpuInstance]] = set()
        for g, (a, b) in enumerate(zip(old.layouts, new.layouts, strict=True)):
            plan = change_plan(a, b)
            gpu_s[g] = plan.estimated_s
            created |= {(g, gi) for gi in plan.created}
        changed: dict[str, tuple[str, tuple[int, GpuInstance | None]]] = {}  # name -> (kind, old instance key)
        for name, slot in new_slots.items():
            before = old.placements.get(name)
            if before is None:
                continue  # newly placed: starting it is its restart
            key_before = self._instance(old, before)[0]
            mode_before = old.modes[before.gpu_index][before.instance_index]
            moved = key_before != slot.instance_key or slot.instance_key in created
            share_changed = slot.mode == SharingMode.MPS and before.mps_pct != slot.placement.mps_pct
            if moved or share_changed or mode_before != slot.mode:
                changed[name] = ("move" if moved else "share" if share_changed else "mode", key_before)
        if self.scenario.make_before_break:
            downtime, served = self._staged_downtimes(old, new, new_slots, changed)
            mechanism = {n: "make-before-break" if downtime[n] <= 1e-9 else "ordered-restart" for n in changed}
        else:
            downtime, served, mechanism = {}, {}, {}
            for name, (kind, _) in changed.items():
                slot = new_slots[name]
                wait_gi = gpu_s[slot.placement.gpu_index] if slot.instance_key in created else 0.0
                downtime[name], served[name], mechanism[name] = wait_gi + slot.tenant.restart_s, 0.0, "full-restart"
        for name in new_slots.keys() - old.placements.keys():
            downtime[name], served[name], mechanism[name] = self.scenario.tenant(name).restart_s, 0.0, "start"
            changed[name] = ("start", (new_slots[name].placement.gpu_index, None))
        self._step_changes = [ChangeRecord(self.time_s, name, changed[name][0], mechanism[name], downtime[name], served[name])
                              for name in sorted(changed, key=[t.name for t in self.scenario.tenants].index)]
        return downtime, tuple(gpu_s)

    def _staged_downtimes(self, old: Configuration, new: Configuration, new_slots: dict[str, _Slot],
                          changed: Mapping[str, tuple[str, tuple[int, GpuInstance | None]]]) -> tuple[dict[str, float], dict[str, float]]:
        """Make-before-break: (per changed tenant, downtime s; seconds its old instance kept serving).

        Per GPU, the GI operations run one after another in the order of
        :func:`~rlsched.hardware.staged_change_plan`; a tenant's new server starts when its
        new GI exists (at once in a GI both layouts keep) and is ready ``restart_s`` later;
        an old GI is destroyed only after its tenants switched, unless the plan breaks it
        (then its tenants stop when it is destroyed and are down until their new server is
        ready). A tenant whose new instance is kept starts its new client next to the old
        one when the GI's memory holds the old clients and the new ones (tenants added in
        priority order; one that does not fit stops its old client first and pays its
        restart). Cross-GPU moves do not delay the old GPU's destroys.
        """
        ready: dict[str, float] = {}  # new server ready, seconds after the change began
        down_from: dict[str, float] = {}  # old client stops
        gi_ready: dict[tuple[int, GpuInstance | None], float] = {}
        rank = {t.name: t.priority.rank for t in self.scenario.tenants}
        # Instances both configurations keep: memory of the old clients plus the new ones.
        kept = {new_slots[n].instance_key for n in changed}
        kept = {k for k in kept if k[1] is None or k[1] in old.layouts[k[0]].instances}
        for key in sorted(kept, key=lambda k: (k[0], k[1] or GpuInstance(-1, ""))):
            capacity = self.gpu_spec.profiles[key[1].profile].memory_gib if key[1] is not None else self.gpu_spec.memory_gib
            used = sum(self.perf.memory_gib(self.scenario.gpu, self.scenario.tenant(n).model, p.batch_size)
                       for n, p in old.placements.items() if self._instance(old, p)[0] == key)
            for name in sorted((n for n in changed if new_slots[n].instance_key == key), key=lambda n: rank[n]):
                slot = new_slots[name]
                need = self.perf.memory_gib(self.scenario.gpu, slot.tenant.model, slot.batch)
                ready[name] = slot.tenant.restart_s
                if used + need > capacity + 1e-9:
                    down_from[name] = 0.0  # no room for both clients: stop the old one first
                    if changed[name][1] == key:
                        used -= self.perf.memory_gib(self.scenario.gpu, slot.tenant.model, old.placements[name].batch_size)
                used += need
        occupants: dict[tuple[int, GpuInstance | None], list[str]] = {}
        for name, p in old.placements.items():
            occupants.setdefault(self._instance(old, p)[0], []).append(name)
        for g, (a, b) in enumerate(zip(old.layouts, new.layouts, strict=True)):
            moves_to: dict[GpuInstance, set[GpuInstance]] = {}
            cost: dict[GpuInstance, float] = {}
            for name in (n for gi in a.instances for n in occupants.get((g, gi), []) if n in new_slots):  # leavers need no wait
                key = self._instance(old, old.placements[name])[0]
                target = new_slots[name].instance_key
                moves_to.setdefault(key[1], set()).update({target[1]} if target[0] == g and target[1] is not None else set())
                tenant = self.scenario.tenant(name)
                cost[key[1]] = cost.get(key[1], 0.0) + self.scenario.weights.priority.get(tenant.priority.value, 1.0) * (1.0 + tenant.restart_s)
            plan = staged_change_plan(a, b, moves_to, cost)
            clock = 0.0
            for op in plan.operations:
                profile = self.gpu_spec.profiles[op.instance.profile]
                if op.kind == "create":
                    clock += profile.create_s
                    gi_ready[(g, op.instance)] = clock
                    for name in (n for n in changed if new_slots[n].instance_key == (g, op.instance)):
                        ready[name] = clock + new_slots[name].tenant.restart_s
                    continue
                leaving = [n for n in occupants.get((g, op.instance), []) if n in changed]
                if not op.breaks:  # its tenants switch to their ready servers, then it goes
                    clock = max([clock] + [ready[n] for n in leaving if n in ready])
                for name in leaving:
                    down_from.setdefault(name, clock)
                clock += profile.destroy_s
        downtime, served = {}, {}
        for name in changed:
            stop = down_from.get(name, ready[name])
            downtime[name] = max(ready[name] - stop, 0.0)
            served[name] = stop
        return downtime, served

    def _handovers(self, t0: float, t1: float, active: frozenset[str]) -> dict[str, tuple[float, _Slot, float]]:
        """Make-before-break switches of this step (``self._step_changes``): per tenant whose
        old instance kept serving while its new server started, (switch time s, the old
        instance's slot, the speed it ran at). The old instance serves until the new one is
        ready, at most until the end of the interval (a switch not ready by then takes effect
        at the next decision boundary); the previous configuration's slots are rebuilt when
        the step before ran another set of active tenants."""
        switching = {c.tenant: c.old_served_s for c in self._step_changes if c.mechanism == "make-before-break" and c.old_served_s > 0.0}
        if not switching:
            return {}
        previous = self._slots if self._slots_for is not None and self._slots_for == self._config else {}
        if not previous or self._slots_active != active:
            previous = self._build_slots(self._config, active)
        handover = {}
        for name, served_s in switching.items():
            old = previous.get(name)
            if old is None or old.out_of_memory:
                continue
            handover[name] = (min(t0 + served_s, t1), old, self._fill_speed(old, self._idle_fraction))
        return handover

    def _fill_speed(self, slot: _Slot, idle_fraction: Mapping[tuple, float]) -> float:
        """The speed a slot runs at: a priority-fill filler at the idle fraction its
        instance's first tenant left (``idle_fraction``, per instance), never below the
        performance model's minimum; anything else at 1."""
        return max(idle_fraction.get(slot.instance_key, 1.0), self.min_idle_fraction) if slot.fill_low else 1.0

    # ------------------------------------------------------------------ step
    def _as_run(self, configuration: Configuration | None) -> Configuration | None:
        """``configuration`` as this node runs it: on a node without a priority-fill scheduler
        (``Scenario.priority_fill_scheduler`` off) its priority-fill instances time-slice.
        The last conversion is kept, so that a configuration held is the same object each step."""
        if configuration is None or self.scenario.priority_fill_scheduler:
            return configuration
        if self._run_as is None or self._run_as[0] is not configuration:
            self._run_as = (configuration, configuration.priority_fill_time_sliced())
        return self._run_as[1]

    def step(self, configuration: Configuration) -> StepResult:
        """Apply ``configuration`` and simulate one decision interval."""
        configuration = self._as_run(configuration)
        t0 = self.time_s
        t1 = t0 + self.interval_s
        active = self.active_set(t0, t1)
        same_config = self._slots_for is configuration or (self._slots_for is not None and self._slots_for == configuration)
        downtime: dict[str, float] = {}
        gpu_s = (0.0,) * len(configuration.layouts)
        handover: dict[str, tuple[float, _Slot, float]] = {}
        if not same_config or active != self._slots_active:
            slots = self._build_slots(configuration, active)
            if not same_config:
                downtime, gpu_s = self._downtimes(self._config, configuration, slots)
                handover = self._handovers(t0, t1, active)
            self._slots, self._slots_for, self._slots_active = slots, configuration, active
        else:
            slots = self._slots
        if same_config:
            self._step_changes = []
        if self._windowed:
            # Nothing runs for a tenant outside its windows, so nothing restarts; one that
            # becomes active while placed cold-starts then, like a newly placed tenant.
            downtime = {name: seconds for name, seconds in downtime.items() if self.scenario.tenant(name).is_active(t0)}
            for t in self._windowed:
                if t.name in slots:
                    for start_s in t.activations_s(t0, t1):
                        self._down_until[t.name] = max(self._down_until[t.name], start_s + t.restart_s)
                        downtime[t.name] = max(downtime.get(t.name, 0.0), t.restart_s)
        self._config = configuration
        for name, seconds in downtime.items():
            server = self._servers.get(name)
            busy_until = server.state[q.S_FLIGHT_DONE_S] if server is not None and server.state[q.S_FLIGHT_N] > 0 else t0
            self._down_until[name] = max(self._down_until[name], max(t0, busy_until) + seconds)
        for job in self.scenario.tenants:  # drift events at interval boundaries
            if isinstance(job, ContinualLearningJob):
                while t0 >= self._next_drift_s[job.name] - 1e-9:
                    self._units[job.name] = job.units_after_drift
                    self._next_drift_s[job.name] += job.drift_window_s

        self._last_units_gain = {}
        weights = self.scenario.weights
        stats: dict[str, TenantStepStats] = {}
        idle_fraction: dict[tuple, float] = {}
        ordered = sorted(slots.values(), key=lambda s: s.rank_in_instance)  # high priority first
        for slot in ordered:
            t = slot.tenant
            up_from = self._down_until[t.name]
            scale = self._fill_speed(slot, idle_fraction)
            if slot.out_of_memory:
                up_from = math.inf
            if isinstance(t, InferenceTenant):
                st = self._serve(t, slot, t0, t1, up_from, scale, handover.get(t.name))
            else:
                st = self._work(t, slot, t0, t1, up_from, scale, handover.get(t.name))
            if slot.mode == SharingMode.PRIORITY_FILL and slot.rank_in_instance == 0:
                idle_fraction[slot.instance_key] = 1.0 - st.utilization
            st.downtime_s = downtime.get(t.name, 0.0)
            st.restarted = t.name in downtime
            st.out_of_memory = slot.out_of_memory
            stats[t.name] = st
        for t in self.scenario.tenants:
            if t.name not in stats:  # unplaced: an inference tenant's requests only queue
                stats[t.name] = self._serve(t, None, t0, t1, math.inf, 1.0) if isinstance(t, InferenceTenant) else TenantStepStats(t.name, t.kind)
        total = GoodputTerms()
        for t in self.scenario.tenants:
            st = stats[t.name]
            if isinstance(t, InferenceTenant):
                st.accuracy = self._served_accuracy(t.name, st)
                st.terms = goodput_terms(weights, t.priority.value, st.on_time, st.accuracy, st.violated, st.dropped, downtime_s=st.downtime_s)
            else:
                progress = st.best_effort_progress_s * (t.work_weight if isinstance(t, BestEffortJob) else 0.0)
                st.terms = goodput_terms(weights, t.priority.value, best_effort_progress_s=progress, downtime_s=st.downtime_s)
            total = total + st.terms
            self._tenant_terms[t.name] = self._tenant_terms[t.name] + st.terms
            self._work_done[t.name] += st.training_samples + st.best_effort_progress_s
            self._downtime_total_s[t.name] += st.downtime_s
        self._idle_fraction = idle_fraction
        self.time_s = t1
        self.step_index += 1
        self.totals = self.totals + total
        self._last = stats
        self.changes.extend(self._step_changes)
        return StepResult(t0, t1, stats, total, gpu_s, self.done, tuple(self._step_changes))

    def summary(self) -> dict[str, dict[str, float | int | str]]:
        """Per tenant, totals since reset: request counts, SLO attainment, latency
        percentiles (ms, from the whole run's histogram), Goodput terms, work done."""
        result: dict[str, dict[str, float | int | str]] = {}
        for t in self.scenario.tenants:
            terms = self._tenant_terms[t.name]
            entry: dict[str, float | int | str] = {"kind": t.kind}
            if isinstance(t, InferenceTenant):
                server = self._servers[t.name]
                tot = server.totals
                completed, dropped, on_time = int(tot[q.O_COMPLETED]), int(tot[q.O_DROPPED]), int(tot[q.O_ON_TIME])
                decided = completed + dropped
                entry.update(
                    arrived=int(tot[q.O_ARRIVED]),
                    completed=completed,
                    dropped=dropped,
                    queued_at_end=server.in_system(),
                    on_time=on_time,
                    slo_ms=t.slo_ms,
                    slo_attainment=on_time / decided if decided else math.nan,
                    latency_ms_mean=tot[q.O_LATENCY_SUM_S] * 1000.0 / completed if completed else math.nan,
                    latency_ms_p50=q.percentile_ms(server.hist_total, 50.0),
                    latency_ms_p99=q.percentile_ms(server.hist_total, 99.0),
                    mean_batch=tot[q.O_BATCHED_REQUESTS] / tot[q.O_BATCHES] if tot[q.O_BATCHES] else math.nan,
                    utilization=tot[q.O_BUSY_S] / self.time_s if self.time_s else 0.0,
                )
            elif isinstance(t, ContinualLearningJob):
                entry.update(training_samples=self._work_done[t.name], accuracy=self.accuracy_of(t.serves))
            else:
                entry.update(best_effort_progress_s=self._work_done[t.name])
            mine = [c for c in self.changes if c.tenant == t.name]
            entry.update(changes=len(mine), staged_changes=sum(c.mechanism == "make-before-break" for c in mine))
            entry.update(downtime_s=self._downtime_total_s[t.name], goodput=terms.goodput, slo_penalty=terms.slo_penalty,
                         best_effort_progress=terms.best_effort_progress, reconfiguration_cost=terms.reconfiguration_cost,
                         objective=terms.total)
            result[t.name] = entry
        return result

    def _served_accuracy(self, name: str, st: TenantStepStats) -> float:
        """Accuracy of the serving model over the interval (mid-interval retraining progress)."""
        for job in self.scenario.tenants:
            if isinstance(job, ContinualLearningJob) and job.serves == name:
                units_end = self._units[job.name]
                units_mid = units_end - self._last_units_gain.get(job.name, 0.0) / 2.0
                return job.curve.accuracy(units_mid)
        return self.scenario.tenant(name).accuracy  # type: ignore[union-attr]

    def _serve(self, t: InferenceTenant, slot: _Slot | None, t0: float, t1: float, up_from: float, speed: float,
               handover: tuple[float, _Slot, float] | None = None) -> TenantStepStats:
        """Serve the interval's requests on ``slot`` at ``speed`` from ``up_from``; with a
        ``handover`` (switch time, old slot, its speed: make-before-break), on the old
        instance until the switch and on the new one after it."""
        server = self._servers[t.name]
        # Drawn whatever the windows, so that the arrival stream stays a function of the seed.
        arrivals = self._arrivals[t.name].sample(t0, t1, self._arrival_rng[t.name])
        server.out.fill(0.0)
        server.hist_step.fill(0)
        if t.active_windows_s:
            arrivals = arrivals[t.active_mask(arrivals)]  # outside the windows they never existed
            if not t.is_active(t0) and server.in_system():
                # The server went away with its window: what it still held is lost.
                server.out[q.O_DROPPED] += server.in_system()
                server.state[q.S_WAITING] = server.state[q.S_FLIGHT_N] = 0
                server.state[q.S_SERVER_FREE_S] = t0
        self.last_arrivals_s[t.name] = arrivals
        segments = [(t0, t1, slot, speed)]
        if handover is not None:
            switch_s, old, old_speed = handover
            segments = [(t0, switch_s, old, old_speed), (switch_s, t1, slot, speed)]
        for start_s, end_s, on, on_speed in segments:
            if end_s <= start_s:
                continue
            if on is None:
                mean_s, sigma, batch = _NO_SERVICE_MEAN, _NO_SERVICE_SIGMA, 1
            else:
                mean_s, sigma, batch = on.service_mean_s, on.service_sigma, on.batch
                if on_speed != 1.0:
                    mean_s = mean_s / on_speed
            part = arrivals[np.searchsorted(arrivals, start_s, "left"):np.searchsorted(arrivals, end_s, "left")] if len(segments) > 1 else arrivals
            q.serve_interval(part, start_s, end_s, max(up_from, start_s), server.wait_buf, server.flight_buf, server.state,
                             mean_s, sigma, batch, t.batch_timeout_ms / 1000.0, t.slo_ms / 1000.0, self._service_rng[t.name], server.hist_step, server.out,
                             t.queue_timeout_s)
        q.close_interval(server.hist_step, server.hist_total, _P50_P99, server.percentiles_ms, _EDGES_MS)
        out = server.out
        server.totals += out
        completed = int(out[q.O_COMPLETED])
        dropped = int(out[q.O_DROPPED])
        on_time = int(out[q.O_ON_TIME])
        rate = out[q.O_ARRIVED] / (t1 - t0)
        self._rate_ewma[t.name] += RATE_EWMA_WEIGHT * (rate - self._rate_ewma[t.name])
        decided = completed + dropped
        return TenantStepStats(
            t.name, t.kind, int(out[q.O_ARRIVED]), completed, dropped, server.in_system(), on_time, completed - on_time, t.slo_ms,
            on_time / decided if decided else math.nan,
            out[q.O_LATENCY_SUM_S] * 1000.0 / completed if completed else math.nan,
            server.percentiles_ms[0],
            server.percentiles_ms[1],
            out[q.O_BATCHED_REQUESTS] / out[q.O_BATCHES] if out[q.O_BATCHES] else math.nan,
            out[q.O_BUSY_S] / (t1 - t0), rate, self._rate_ewma[t.name],
        )

    def _work(self, t: Tenant, slot: _Slot, t0: float, t1: float, up_from: float, speed: float,
              handover: tuple[float, _Slot, float] | None = None) -> TenantStepStats:
        """Training / best-effort progress over the interval (it runs whenever it is up and
        active); with a ``handover`` (make-before-break), on the old instance until the switch."""
        start_s = max(t0, up_from)
        old_s = old_work = 0.0  # seconds on the old instance, and the work done there
        if handover is not None:
            switch_s, old, old_speed = handover
            old_s = t.active_seconds(t0, switch_s)
            old_work = old.work_rate * old_speed * old_s
            start_s = max(start_s, switch_s)
        running_s = t.active_seconds(start_s, t1) if math.isfinite(up_from) else 0.0
        work = slot.work_rate * speed * running_s + old_work
        st = TenantStepStats(t.name, t.kind, utilization=(running_s + old_s) / (t1 - t0))
        if isinstance(t, ContinualLearningJob):
            gain = work / t.samples_per_unit
            self._units[t.name] += gain
            self._last_units_gain[t.name] = gain
            st.training_samples = work
            st.accuracy = t.curve.accuracy(self._units[t.name])
        else:
            st.best_effort_progress_s = work
        return st


#: NodeSimulator attributes a snapshot shares instead of copying (never mutated in place).
_SHARED_STATE = frozenset({"scenario", "perf", "gpu_spec", "interval_s", "_curve_cache", "min_idle_fraction", "_seed", "_windowed", "_always_active"})


def _shared_memo(state: dict) -> dict[int, object]:
    """A deepcopy memo that shares the objects of a simulator state nobody mutates in place:
    the configurations and their slots, and recorded (stateless) arrival processes."""
    shared = [state["_config"], state["_slots"], state["_slots_for"], *state.get("changes", ())]  # change records are frozen
    shared += [p for p in state["_arrivals"].values() if isinstance(p, RecordedArrivals)]
    return {id(x): x for x in shared if x is not None}


class RecordedArrivals(ArrivalProcess):
    """One episode's arrivals, recorded per decision interval and replayed (no state).

    :param windows: per interval k, the sorted arrival times in [k dt, (k + 1) dt), seconds
    :param interval_s: the decision interval dt, seconds
    :param mean_rate_rps: the recorded process's long-run mean rate
    """

    def __init__(self, windows: list[np.ndarray], interval_s: float, mean_rate_rps: float) -> None:
        self.windows = windows
        self.interval_s = interval_s
        self._mean_rate_rps = mean_rate_rps

    def sample(self, t_start_s: float, t_end_s: float, rng: np.random.Generator) -> np.ndarray:
        k = int(round(t_start_s / self.interval_s))
        return self.windows[k] if k < len(self.windows) else np.zeros(0)

    def mean_rate_rps(self) -> float:
        return self._mean_rate_rps

    def window_rate_rps(self, t_start_s: float, t_end_s: float) -> float:
        """The realised rate: recorded arrivals in the window over its length."""
        first, last = int(round(t_start_s / self.interval_s)), int(round(t_end_s / self.interval_s))
        count = sum(len(w) for w in self.windows[first:last])
        return count / (t_end_s - t_start_s) if t_end_s > t_start_s else 0.0


_NO_SERVICE_MEAN = np.array([0.0, 1.0])
_NO_SERVICE_SIGMA = np.zeros(2)
_P50_P99 = np.array([50.0, 99.0])
_EDGES_MS = q.histogram_edges_ms()
