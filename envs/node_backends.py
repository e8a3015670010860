"""Environment backends that drive a real node (``backend="nvml"``), and the simulator with an
operation count (what the daemon runs on ``--backend sim``).

Both implement :class:`rlsched.envs.backends.Backend`, so ``gymnasium.make("rlsched/GpuShare-v0",
backend="nvml", backend_options={...})`` and ``rlsched serve`` share one code path: the
environment repairs the decision, the backend applies it and reports the interval.

:class:`NvmlNodeBackend` steps take real time: the configuration's MIG layouts are applied
through :class:`~rlsched.node.nvml_backend.NvmlMigBackend` (a dry run unless ``apply``),
MPS shares through :class:`~rlsched.node.mps.MpsManager` (tenants whose instance goes away
are stopped first), then the backend waits out the decision interval and reads the
observation source (:class:`~rlsched.node.sources.PrometheusSource`) and NVML telemetry.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlsched.node.mig_parted_backend import MigPartedBackend
from rlsched.node.mps import ClientTarget, MpsManager, TenantClient, client_targets
from rlsched.node.nvml_backend import NvmlMigBackend, RetryPolicy
from rlsched.node.sources import InstanceTelemetry, NvmlTelemetry, PrometheusSource, RequestLog, SourceError
from rlsched.decision import Configuration, SharingMode
from rlsched.envs.backends import SimBackend, TenantMemory
from rlsched.errors import RlschedError
from rlsched.goodput import GoodputTerms, goodput_terms
from rlsched.hardware import GpuInstance, change_plan, load_gpu
from rlsched.simulator.node import StepResult, TenantStepStats
from rlsched.simulator.perf import PerformanceModelLike
from rlsched.workloads.scenario import Scenario
from rlsched.workloads.tenants import InferenceTenant

LOG = logging.getLogger("rlsched.daemon")


class ApplyError(RlschedError):
    """A configuration could not be applied; each GPU is back in its old layout (rolled back)
    or, if even that failed, reported ``broken`` in :attr:`detail`.

    :param detail: the apply report, one line per GPU
    :param gi_operations: GI/CI operations tried, rollback included
    """

    def __init__(self, detail: str, gi_operations: int) -> None:
        super().__init__(detail)
        self.detail, self.gi_operations = detail, gi_operations


class SimNodeBackend(SimBackend):
    """The simulator, counting the GI operations its steps would issue on hardware.

    A GI is destroyed or created exactly where the minimal change plan says
    (:func:`rlsched.hardware.change_plan`, the plan the NVML backend carries out), so the
    count is what an NVML node would have done: a restart that re-deploys an unchanged
    layout shows 0.
    """

    def __init__(self, scenario: Scenario, perf_model: PerformanceModelLike) -> None:
        super().__init__(scenario, perf_model)
        self.applied: Configuration | None = None
        self.gi_operations = 0
        self.last_gi_operations = 0

    def reset(self, seed: int | None, configuration: Configuration | None) -> None:
        super().reset(seed, configuration)
        self.applied = configuration

    def step(self, configuration: Configuration) -> StepResult:
        result = super().step(configuration)
        ops = 0
        for g, target in enumerate(configuration.layouts):
            old = self.applied.layouts[g] if self.applied is not None else type(target)(target.gpu, ())
            plan = change_plan(old, target)
            ops += len(plan.destroyed) + len(plan.created)
        self.applied = configuration
        self.last_gi_operations = ops
        self.gi_operations += ops
        return result


class NvmlNodeBackend:
    """A node of real GPUs (or :class:`~rlsched.node.fake_nvml.FakeNvml`) as an environment backend.

    :param scenario: the node (GPU type and count) and its tenants
    :param perf_model: memory needs of tenants (the repair packs with them)
    :param nvml: the pynvml module or a stand-in (None: import pynvml)
    :param apply: really change MIG layouts and restart MPS clients (False: plan and log only)
    :param interval_s: decision interval, seconds (None: the scenario's)
    :param source: per-tenant measurements (None: none; the observation then shows only the
        configuration and NVML telemetry)
    :param clients: tenant -> how to start its client (MPS shares are applied only with these)
    :param mps: the MPS manager (None: one built from ``clients``)
    :param mig_parted: apply layouts through mig-parted instead of NVML (NVML still reads)
    :param gpu_types: catalog type per GPU (None: the scenario's GPU for each)
    :param retry: IN_USE back-off of the NVML backend
    :param sleep: waits, seconds (the fake's ``sleep`` keeps tests instant)
    :param clock: monotonic clock, seconds (the fake's ``clock`` in tests)
    :param telemetry: read NVML memory/GPM per instance every interval
    :param request_log: the frontend's request log (None: none; policies then see rates only)
    :param wall_clock: wall-clock time, seconds since the epoch (the request log's time base)
    """

    #: A real node runs on: no episode end (see :class:`rlsched.envs.backends.Backend`).
    episodic = False

    def __init__(
        self,
        scenario: Scenario,
        perf_model: PerformanceModelLike,
        *,
        nvml: Any = None,
        apply: bool = False,
        interval_s: float | None = None,
        source: PrometheusSource | None = None,
        clients: Mapping[str, TenantClient] | None = None,
        mps: MpsManager | None = None,
        mig_parted: MigPartedBackend | None = None,
        gpu_types: Sequence[str] | None = None,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        telemetry: bool = True,
        request_log: RequestLog | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.scenario = scenario
        self.perf_model = perf_model
        self.apply = apply
        self.interval_s = float(interval_s if interval_s is not None else scenario.decision_interval_s)
        self.source = source
        self.mps = mps if mps is not None else (MpsManager(clients) if clients else None)
        self.mig_parted = mig_parted
        self.sleep, self.clock = sleep, clock
        self.mig = NvmlMigBackend(nvml, gpu_types=gpu_types or [scenario.gpu] * scenario.gpu_count, retry=retry, sleep=sleep, clock=clock)
        self.mig.__enter__()
        self.telemetry = NvmlTelemetry(self.mig.nvml) if telemetry else None
        self.instances: list[InstanceTelemetry] = []
        self.gi_operations = 0
        self.last_gi_operations = 0
        self.memory_gib = TenantMemory(scenario, perf_model)
        self._measured: dict[str, dict[str, float]] = {}
        self._totals = GoodputTerms()
        self._tenant_totals: dict[str, dict[str, float]] = {}
        self._time_s = 0.0
        self._mig_parted_applied: tuple | None = None
        self._applied: Configuration | None = None  # the configuration the MPS clients run
        #: Per tenant, the seconds its client was down in the last interval's change (a client
        #: stopped and started again; a staged switch costs none).
        self._downtime_s: dict[str, float] = {}
        self.request_log = request_log
        self.wall_clock = wall_clock
        self._arrival_times: dict[str, np.ndarray] = {}

    def close(self) -> None:
        """Shut NVML down (the backend is unusable afterwards)."""
        self.mig.__exit__(None, None, None)

    # ------------------------------------------------------------------ Backend protocol
    def reset(self, seed: int | None, configuration: Configuration | None) -> None:
        """Start counting from now; the hardware is left as it is (the first step applies)."""
        self._totals = GoodputTerms()
        self._tenant_totals = {t.name: {"completed": 0.0, "dropped": 0.0, "on_time": 0.0} for t in self.scenario.inference_tenants()}
        self._time_s = 0.0
        self._measured = {}
        self._arrival_times = {}
        if self.request_log is not None:
            try:
                self.request_log.read()  # what was logged before is not this run's
            except SourceError as exc:
                LOG.warning("request log unreadable at reset: %s", exc)
        if self.source is not None:
            try:
                self.source.measure()  # the counters' baseline
            except SourceError as exc:
                LOG.warning("observation source unreadable at reset: %s", exc)

    def read_layouts(self) -> list:
        """The layouts NVML sees now, GPU 0..G-1."""
        return self.mig.read_layouts()

    def step(self, configuration: Configuration) -> StepResult:
        """Apply, wait out the interval, measure. Raises :class:`ApplyError` (after the interval,
        so that a failing GPU is retried once per interval, not in a busy loop)."""
        started, wall_started = self.clock(), self.wall_clock()
        reconfiguration_s, ops, failure = self._apply(configuration)
        self.last_gi_operations = ops
        self.gi_operations += ops
        remaining = self.interval_s - (self.clock() - started)
        if remaining > 0:
            self.sleep(remaining)
        if failure is not None:
            raise ApplyError(failure, ops)
        measured = self._measure()
        self._read_request_log(wall_started, self.wall_clock())
        return self._result(configuration, measured, reconfiguration_s)

    def arrival_times_s(self) -> dict[str, np.ndarray] | None:
        """The last interval's arrivals from the request log, in node seconds (None without one)."""
        return self._arrival_times if self.request_log is not None else None

    def _read_request_log(self, wall_start_s: float, wall_end_s: float) -> None:
        """The logged arrivals of the interval just run, mapped onto its node time
        [t0, t0 + interval): the wall interval (which applying a change may have stretched)
        is scaled to the decision interval, and a line logged late lands at its start."""
        if self.request_log is None:
            return
        try:
            logged = self.request_log.read()
        except SourceError as exc:
            LOG.warning("%s", exc)
            logged = {}
        t0, span_s = self._time_s, max(wall_end_s - wall_start_s, 1e-9)
        self._arrival_times = {name: np.clip(t0 + (times - wall_start_s) * self.interval_s / span_s, t0, np.nextafter(t0 + self.interval_s, t0))
                               for name, times in logged.items()}

    def observe(self) -> dict[str, dict[str, float]]:
        keys = ("arrival_rate_rps", "arrival_rate_ewma_rps", "queue_length", "p99_over_slo", "slo_attainment", "utilization", "accuracy")
        return {name: {k: v for k, v in m.items() if k in keys} for name, m in self._measured.items()}

    @property
    def totals(self) -> GoodputTerms:
        return self._totals

    def summary(self) -> dict[str, dict[str, float | int | str]]:
        out: dict[str, dict[str, float | int | str]] = {}
        for name, tot in self._tenant_totals.items():
            decided = tot["completed"] + tot["dropped"]
            out[name] = {"kind": "inference", "completed": int(tot["completed"]), "dropped": int(tot["dropped"]), "on_time": int(tot["on_time"]),
                         "slo_attainment": tot["on_time"] / decided if decided else math.nan}
        return out

    # ------------------------------------------------------------------ internals
    def _apply(self, config: Configuration) -> tuple[tuple[float, ...], int, str | None]:
        """(per-GPU seconds without instances, operations, failure text or None)."""
        layouts = list(config.layouts)
        self._downtime_s = {}
        if self.mig_parted is not None:
            return self._apply_mig_parted(layouts)
        staged = self.apply and self.mps is not None and self._applied is not None and self.scenario.make_before_break
        hooks = _StagedClients(self, self._applied, config) if staged else None  # type: ignore[arg-type]
        if self.apply and self.mps is not None and self._applied is not None and not staged:
            # A busy GI cannot be destroyed: stop the clients of instances that go away first.
            current = self.mig.read_layouts()
            doomed = {(g, gi) for g, (old, new) in enumerate(zip(current, layouts)) for gi in change_plan(old, new).destroyed}
            applied = self._applied
            self.mps.stop_tenants([
                name for name, p in applied.placements.items()
                if len(applied.layouts[p.gpu_index]) and (p.gpu_index, applied.layouts[p.gpu_index].instances[p.instance_index]) in doomed
            ])
        report = self.mig.apply(layouts, dry_run=not self.apply, moves_to=staged_moves(self._applied, config) if staged else None, hooks=hooks)
        ops = sum(len(g.operations) for g in report.gpus)
        seconds = tuple(g.unavailable_s for g in report.gpus)
        if not report.ok:
            if hooks is not None and all(g.outcome in ("rolled-back", "skipped", "unchanged") for g in report.gpus):
                hooks.settle(self._applied)  # every tenant back on its old instance
            return seconds, ops, str(report)
        if not report.dry_run:
            LOG.debug("applied: %s", report)
        if hooks is not None:
            hooks.stage_in_kept_instances()
        if self.apply and self.mps is not None:
            uuids = [self.mig.mig_device_uuids(g) for g in range(len(layouts))]
            restarted = self.mps.apply(client_targets(config, uuids), dry_run=False).restarted
            self._downtime_s = self._restart_downtime_s(config, {n: self.mps.clients[n].restart_s for n in restarted}, seconds)
        self._applied = config
        return seconds, ops, None

    def _restart_downtime_s(self, config: Configuration, restart_s: Mapping[str, float], unavailable_s: Sequence[float]) -> dict[str, float]:
        """Seconds each restarted tenant (client stopped, then started again; ``restart_s``: its
        client's restart, seconds) was without a ready client in ``config``: its restart, plus
        its GPU's seconds without instances (``unavailable_s``) where its GI is a new one.
        Staged tenants switched without a gap and are not among them."""
        downtime: dict[str, float] = {}
        for name, seconds in restart_s.items():
            g, gi = _gi_of(config, name)
            new_gi = self._applied is None or (gi is not None and gi not in self._applied.layouts[g].instances)
            downtime[name] = seconds + (unavailable_s[g] if new_gi else 0.0)
        return downtime

    def _apply_mig_parted(self, layouts: list) -> tuple[tuple[float, ...], int, str | None]:
        # mig-parted rebuilds every GPU on a label change: only relabel when the layouts change.
        key = tuple(layout.spec() for layout in layouts)
        if key == self._mig_parted_applied:
            return (0.0,) * len(layouts), 0, None
        report = self.mig_parted.apply(layouts, dry_run=not self.apply)
        self._mig_parted_applied = key if self.apply else self._mig_parted_applied
        return (0.0,) * len(layouts), 0, None if report.ok else str(report)

    def _measure(self) -> dict[str, dict[str, float]]:
        measured: dict[str, dict[str, float]] = {}
        if self.source is not None:
            try:
                measured = self.source.measure()
            except SourceError as exc:
                LOG.warning("observation source: %s", exc)
        if self.telemetry is not None:
            self.instances = self.telemetry.read(self.scenario.gpu_count)
        self._measured = measured
        return measured

    def _result(self, config: Configuration, measured: dict[str, dict[str, float]], reconfiguration_s: tuple[float, ...]) -> StepResult:
        t0 = self._time_s
        self._time_s += self.interval_s
        tenants: dict[str, TenantStepStats] = {}
        total = GoodputTerms()
        for t in self.scenario.tenants:
            m = measured.get(t.name, {})
            stats = TenantStepStats(t.name, t.kind)
            if isinstance(t, InferenceTenant):
                completed, dropped, on_time = m.get("completed", 0.0), m.get("dropped", 0.0), m.get("on_time", 0.0)
                stats = TenantStepStats(
                    t.name, t.kind, arrived=int(completed + dropped), completed=int(completed), dropped=int(dropped),
                    on_time=int(on_time), violated=int(m.get("violated", 0.0)), slo_ms=t.slo_ms,
                    slo_attainment=on_time / (completed + dropped) if completed + dropped else math.nan,
                    latency_ms_mean=m.get("latency_ms_mean", math.nan), latency_ms_p99=m.get("latency_ms_p99", math.nan),
                    utilization=m.get("utilization", 0.0), arrival_rate_rps=m.get("arrival_rate_rps", 0.0),
                    arrival_rate_ewma_rps=m.get("arrival_rate_ewma_rps", 0.0), downtime_s=self._downtime_s.get(t.name, 0.0),
                )
                stats.terms = goodput_terms(self.scenario.weights, t.priority.value, on_time, 1.0, stats.violated, dropped,
                                            downtime_s=stats.downtime_s)
                tot = self._tenant_totals.setdefault(t.name, {"completed": 0.0, "dropped": 0.0, "on_time": 0.0})
                tot["completed"] += completed
                tot["dropped"] += dropped
                tot["on_time"] += on_time
            total = total + stats.terms
            tenants[t.name] = stats
        self._totals = self._totals + total
        return StepResult(t0, self._time_s, tenants, total, reconfiguration_s, False)


def _gi_of(config: Configuration, name: str) -> tuple[int, GpuInstance | None]:
    """(GPU, GI or None on a GPU without MIG) of a placed tenant."""
    p = config.placements[name]
    layout = config.layouts[p.gpu_index]
    return p.gpu_index, layout.instances[p.instance_index] if len(layout) else None


def staged_moves(old: Configuration, new: Configuration) -> list[dict[GpuInstance, set[GpuInstance]]]:
    """Per GPU, per old GI holding tenants that stay placed, the GIs (on that GPU) they move
    into: what orders the GI operations make-before-break
    (:func:`~rlsched.hardware.staged_change_plan`)."""
    moves: list[dict[GpuInstance, set[GpuInstance]]] = [{} for _ in old.layouts]
    for name in old.placements.keys() & new.placements.keys():
        (g, o), (h, n) = _gi_of(old, name), _gi_of(new, name)
        if o is not None:
            moves[g].setdefault(o, set()).update({n} if h == g and n is not None else set())
    return moves


class _StagedClients:
    """The :class:`~rlsched.node.nvml_backend.StageHooks` of a make-before-break change:
    clients start on a new GI right after it exists and the old ones stop once they are
    ready (:meth:`MpsManager.stage`); clients still on a GI about to go are moved back (in a
    rollback, to their old GI if it exists) or stopped.

    :param backend: the node backend (its MIG backend, MPS manager, sleep and memory model)
    :param old: the configuration the clients run now
    :param new: the configuration being applied
    """

    def __init__(self, backend: NvmlNodeBackend, old: Configuration, new: Configuration) -> None:
        self.backend, self.old, self.new = backend, old, new
        assert backend.mps is not None
        self.mps: MpsManager = backend.mps

    def _uuid(self, g: int, gi: GpuInstance | None) -> str | None:
        return self.backend.mig.mig_device_uuids(g, raw=True).get(gi) if gi is not None else None  # type: ignore[arg-type]

    def _target(self, config: Configuration, name: str, uuid: str) -> ClientTarget:
        p = config.placements[name]
        mode = config.modes[p.gpu_index][p.instance_index]
        return ClientTarget(uuid, p.mps_pct if mode == SharingMode.MPS else None)

    def created(self, gpu_index: int, instance: GpuInstance, rollback: bool) -> None:
        goal = self.old if rollback else self.new
        uuid = self._uuid(gpu_index, instance)
        if uuid is None:
            return
        names = [n for n in goal.placements if n in self.mps.clients and _gi_of(goal, n) == (gpu_index, instance)]
        self.mps.stage({n: self._target(goal, n, uuid) for n in names}, self.backend.sleep)

    def before_destroy(self, gpu_index: int, instance: GpuInstance, rollback: bool) -> None:
        uuid = self._uuid(gpu_index, instance)
        if uuid is None:
            return
        if rollback:  # back to the old GI where it still exists, before this one goes
            back = {}
            for name in self.mps.on_device(uuid):
                if name in self.old.placements:
                    home = self._uuid(*_gi_of(self.old, name))
                    if home is not None and home != uuid:
                        back[name] = self._target(self.old, name, home)
            self.mps.stage(back, self.backend.sleep)
        self.mps.stop_tenants(self.mps.on_device(uuid))

    def stage_in_kept_instances(self) -> None:
        """Tenants whose GI is kept but whose share or mode changes: the new client starts
        next to the old one when the GI's memory holds the clients there plus the new one."""
        uuids = [self.backend.mig.mig_device_uuids(g) for g in range(len(self.new.layouts))]
        wanted = client_targets(self.new, uuids)
        staged: dict[str, ClientTarget] = {}
        for name, target in sorted(wanted.items()):
            running = self.mps.running.get(name)
            if name not in self.mps.clients or running is None or running[0] == target:
                continue
            g, gi = _gi_of(self.new, name)
            spec = load_gpu(self.new.layouts[g].gpu)
            capacity = spec.profiles[gi.profile].memory_gib if gi is not None else spec.memory_gib
            there = [n for n in self.mps.on_device(target.device_uuid)] + list(staged)
            held = sum(self.backend.memory_gib(n, self.old.placements[n].batch_size) for n in there if n in self.old.placements)
            if held + self.backend.memory_gib(name, self.new.placements[name].batch_size) <= capacity + 1e-9:
                staged[name] = target
        self.mps.stage(staged, self.backend.sleep)

    def settle(self, config: Configuration) -> None:
        """After a rollback: every tenant's client on its instance of ``config``."""
        uuids = [self.backend.mig.mig_device_uuids(g) for g in range(len(config.layouts))]
        self.mps.apply(client_targets(config, uuids), dry_run=False)


def make_node_backend(scenario: Scenario, perf_model: PerformanceModelLike, options: Mapping[str, Any]) -> NvmlNodeBackend:
    """The ``backend="nvml"`` of the environment (keyword options of :class:`NvmlNodeBackend`)."""
    return NvmlNodeBackend(scenario, perf_model, **options)
