"""The daemon loop (``rlsched serve``): every decision interval observe, decide, repair, apply.

One cycle: the guarded policy (:mod:`rlsched.daemon.policies`) decides from the last
observation, the environment repairs the decision into a feasible configuration (the ILP)
and its backend applies it and runs the interval (the simulator as fast as it can; NVML in
real time), then the state file, TensorBoard and ``/metrics`` are updated. The environment
is the one training uses, so the policy sees exactly the observations it was trained on.

Every fallback and apply failure is a structured (JSON) log line and a
``daemon/fallbacks`` count. A failed apply leaves each GPU in its old layout (the NVML
backend rolls back), keeps the last good configuration and retries at the next cycle.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlsched.agents.baselines import apply as apply_decision
from rlsched.daemon.config import REAL_BACKENDS, DaemonConfig
from rlsched.daemon.monitoring import InstanceSample, PrometheusExporter, TensorBoardLog, cycle_metrics
from rlsched.envs.node_backends import ApplyError, NvmlNodeBackend, SimNodeBackend
from rlsched.daemon.policies import GuardedPolicy, Verdict, build_policy
from rlsched.daemon.state import DaemonState
from rlsched.decision import Configuration, SharingMode
from rlsched.envs.backends import performance_model, resolve_scenario
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError, RlschedError
from rlsched.hardware import load_gpu
from rlsched.solver.planner import PLANNER_SOLVES
from rlsched.workloads.scenario import without_priority_fill_scheduler

LOG = logging.getLogger("rlsched.daemon")
#: Cycles the cycles/s average is taken over.
RATE_WINDOW = 50


class JsonLines(logging.Formatter):
    """One JSON object per log line: time, level, event and the record's ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(), "event": record.getMessage()}
        entry.update(getattr(record, "fields", {}))
        return json.dumps(entry, default=str)


def log_event(level: int, event: str, **fields: Any) -> None:
    """A structured log line (``event`` plus fields)."""
    LOG.log(level, event, extra={"fields": fields})


def configure_logging(level: str) -> None:
    """JSON lines on stderr for the ``rlsched.daemon`` logger."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    LOG.handlers[:] = [handler]
    LOG.setLevel(level.upper())
    LOG.propagate = False


class Daemon:
    """``rlsched serve``.

    :param config: the daemon configuration (file + flags)
    :param backend_options: extra keyword options of the NVML node backend (tests inject the
        fake NVML, its clock and sleep, an observation source)
    :param on_cycle: called after every cycle with the daemon (tests scrape ``/metrics`` here)
    """

    def __init__(self, config: DaemonConfig, backend_options: Mapping[str, Any] | None = None,
                 on_cycle: Callable[[Daemon], None] | None = None) -> None:
        self.config = config
        self.on_cycle = on_cycle
        self.scenario = resolve_scenario(config.scenario)
        if config.backend in REAL_BACKENDS:
            # rlsched starts no priority-fill scheduler on a real node: the planners are told.
            self.scenario = without_priority_fill_scheduler(self.scenario)
        self.stop_requested = False
        self.fallbacks = 0
        #: The process's planner MILP counts when the daemon started (it reports its own).
        self._planner_milps_start = PLANNER_SOLVES.snapshot()
        self.cycle = 0
        self.gi_operations = 0
        self.exporter: PrometheusExporter | None = None
        self.env = self._make_env(dict(backend_options or {}))
        request_log = getattr(self.env.backend, "request_log", None) is not None
        self.guard = GuardedPolicy(build_policy(config.policy, config.policy_path, config.backend, request_log), build_policy(config.fallback_policy),
                                   config.observation_tolerance)
        self.unscheduled_priority_fill: frozenset[str] = frozenset()

    def _make_env(self, options: dict[str, Any]) -> GpuShareEnv:
        config = self.config
        perf = performance_model(config.perf_model)
        if config.backend == "sim":
            return GpuShareEnv(self.scenario, backend=SimNodeBackend(self.scenario, perf), perf_model=perf)
        options.setdefault("apply", config.apply)
        options.setdefault("interval_s", config.interval_s)
        options.setdefault("gpu_types", config.gpu_types)
        if "source" not in options and config.observations.get("source") == "prometheus":
            from rlsched.node.sources import PrometheusSource, endpoints_from_config

            endpoints = endpoints_from_config(config.observations.get("endpoints"), config.source)
            options["source"] = PrometheusSource(self.scenario, endpoints, float(config.observations.get("timeout_s", 2.0)), clock=options.get("clock", time.monotonic))
        if "request_log" not in options and config.observations.get("request_log"):
            from rlsched.node.sources import RequestLog

            options["request_log"] = RequestLog(config.observations["request_log"], self.scenario)
        if config.clients and "clients" not in options:
            from rlsched.node.mps import TenantClient

            options["clients"] = {name: TenantClient(tuple(c["argv"]), c.get("env", {}), float(c.get("restart_s", 0.0))) for name, c in config.clients.items()}
        if config.backend == "mig-parted" and "mig_parted" not in options:
            from rlsched.node.mig_parted_backend import MigPartedBackend

            options["mig_parted"] = MigPartedBackend(config.mig_parted["config_path"], node=config.mig_parted.get("node"))
        return GpuShareEnv(self.scenario, backend="nvml", perf_model=perf, backend_options=options)

    # ------------------------------------------------------------------ running
    def run(self) -> int:
        """Run until ``config.cycles`` cycles are done or SIGTERM/SIGINT; returns the exit code (0)."""
        config = self.config
        state = self._load_state()
        self.cycle, self.fallbacks = state.cycle, state.fallbacks
        start = state.last_good if state.last_good is not None else self.scenario.reference
        previous_handlers = self._install_signal_handlers()
        writer = TensorBoardLog(config.logdir) if config.logdir else None
        try:
            host_port = config.metrics_host_port()
            if host_port is not None:
                self.exporter = PrometheusExporter(*host_port)
            self._check_drift(start)
            observation, _ = self.env.reset(seed=config.seed + self.cycle, options={"configuration": start})
            self.guard.reset(self.env)
            log_event(logging.INFO, "start", cycle=self.cycle, backend=config.backend, policy=self.guard.policy.name,
                      fallback=self.guard.fallback.name, apply=config.apply, resumed=state.last_good is not None,
                      metrics=f"{self.exporter.host}:{self.exporter.port}" if self.exporter else None, logdir=config.logdir)
            started_cycle = self.cycle
            times: deque[float] = deque([time.perf_counter()], maxlen=RATE_WINDOW + 1)
            while not self.stop_requested and (config.cycles is None or self.cycle - started_cycle < config.cycles):
                observation = self._cycle(observation, state, writer, times)
                if self.on_cycle is not None:
                    self.on_cycle(self)
            log_event(logging.INFO, "stop", cycle=self.cycle, fallbacks=self.fallbacks, gi_operations=self.gi_operations,
                      objective=self.env.objective)
            return 0
        finally:
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            if writer is not None:
                writer.close()
            if self.exporter is not None:
                self.exporter.close()
            if isinstance(self.env.backend, NvmlNodeBackend):
                self.env.backend.close()

    def _cycle(self, observation: Any, state: DaemonState, writer: TensorBoardLog | None, times: deque[float]) -> Any:
        env = self.env
        verdict = self.guard.decide(observation, env)
        try:
            try:
                observation, reward, _, truncated, info = apply_decision(env, verdict.decision)
            except ConfigError as exc:
                # The env refused the policy's decision (a check the guard does not repeat).
                if verdict.reason is not None:
                    raise
                verdict = self.guard.decide_fallback(observation, env, "invalid-output", str(exc))
                observation, reward, _, truncated, info = apply_decision(env, verdict.decision)
        except ApplyError as exc:
            self._record_fallback("apply-failed", exc.detail.replace("\n", " | "))
            self.gi_operations += exc.gi_operations
            self.cycle += 1
            self._save(state)
            return observation
        if verdict.reason is not None:
            self._record_fallback(verdict.reason, verdict.detail)
        ops = int(getattr(env.backend, "last_gi_operations", 0))
        self.gi_operations += ops
        self.cycle += 1
        self._save(state)
        times.append(time.perf_counter())
        steps_per_s = (len(times) - 1) / max(times[-1] - times[0], 1e-9)
        # The planner decided: the fallback, or the planner a PPO policy hands its unsure steps to.
        planner_decided = verdict.reason is not None or verdict.policy != self.guard.policy.name
        planner_milps = tuple(now - start for now, start in zip(PLANNER_SOLVES.snapshot(), self._planner_milps_start, strict=True))
        metrics = cycle_metrics(info, env.last_step, steps_per_s, self.fallbacks, planner_decided, env.last_repair_ms, planner_milps)
        log_event(logging.DEBUG, "cycle", cycle=self.cycle, policy=verdict.policy, fallback=verdict.reason, reward=round(float(reward), 3),
                  layout=list(info["layout"]), gi_operations=ops, repair_ms=round(env.last_repair_ms, 3),
                  check_gain=getattr(self.guard.policy, "last_check_gain", None))
        self._warn_unscheduled_priority_fill(env.current)
        if writer is not None:
            writer.write(self.cycle, metrics)
        if self.exporter is not None:
            self.exporter.update(metrics, env.last_step, self._instances(), ops, bool(info["reconfigured"]), verdict.policy)
        if truncated:
            # The simulated episode ended; the node goes on in the configuration it has.
            observation, _ = env.reset(seed=self.config.seed + self.cycle, options={"configuration": env.current})
            self.guard.reset(env)
        return observation

    def _warn_unscheduled_priority_fill(self, configuration: Configuration | None) -> None:
        """Warn, whenever the set of tenants concerned changes, that the node runs
        priority-fill instances without a priority scheduler (``Scenario.priority_fill_scheduler``
        off, as on every real node: rlsched starts none), so their tenants time-slice."""
        if self.scenario.priority_fill_scheduler or configuration is None:
            return
        tenants = frozenset(name for name, p in configuration.placements.items()
                            if configuration.modes[p.gpu_index][p.instance_index] == SharingMode.PRIORITY_FILL)
        if tenants and tenants != self.unscheduled_priority_fill:
            log_event(logging.WARNING, "priority fill without a scheduler", cycle=self.cycle, tenants=sorted(tenants),
                      detail="rlsched starts no priority-fill scheduler on a real node: these tenants time-slice their instance "
                             "(a real H100 gave the high-priority one 1.6-2.4x its solo latency, not 1.05x); "
                             "--policy auto plans MPS only here")
        self.unscheduled_priority_fill = tenants

    def _record_fallback(self, reason: str, detail: str) -> None:
        self.fallbacks += 1
        log_event(logging.WARNING, "fallback", cycle=self.cycle, reason=reason, detail=detail, fallbacks=self.fallbacks)
        if self.exporter is not None:
            self.exporter.fallback(reason)

    # ------------------------------------------------------------------ state
    def _load_state(self) -> DaemonState:
        path = self.config.state
        state = DaemonState.load(path) if path else None
        if state is None:
            return DaemonState(scenario=self.scenario.name, backend=self.config.backend)
        if state.scenario != self.scenario.name:
            raise ConfigError(path, "scenario", state.scenario, f"the state belongs to another scenario than {self.scenario.name!r}; move it away to start afresh")
        if state.last_good is not None and sorted(state.last_good.placements) != sorted(t.name for t in self.scenario.tenants):
            raise ConfigError(path, "placements", sorted(state.last_good.placements), "the scenario's tenants changed; move the state away to start afresh")
        return state

    def _save(self, state: DaemonState) -> None:
        if not self.config.state:
            return
        state.cycle, state.fallbacks = self.cycle, self.fallbacks
        state.last_good = self.env.current
        state.save(self.config.state)

    def _check_drift(self, start: Any) -> None:
        """Report a node whose layouts differ from the state's (someone else changed them): the
        next apply changes only what differs."""
        backend = self.env.backend
        if not isinstance(backend, NvmlNodeBackend) or start is None:
            return
        try:
            seen = [layout.spec() for layout in backend.read_layouts()]
        except RlschedError as exc:
            log_event(logging.WARNING, "layouts unreadable", detail=str(exc))
            return
        expected = [layout.spec() for layout in start.layouts]
        if seen != expected:
            log_event(logging.WARNING, "layout drift", observed=seen, expected=expected)

    # ------------------------------------------------------------------ monitoring
    def _instances(self) -> list[InstanceSample]:
        env, config = self.env, self.env.current
        if config is None:
            return []
        spec = load_gpu(self.scenario.gpu)
        step = env.last_step
        backend = env.backend
        gi_ids: dict[tuple[int, Any], int] = {}
        telemetry: dict[tuple[int, int], Any] = {}
        if isinstance(backend, NvmlNodeBackend):
            telemetry = {(t.gpu, t.gi_id): t for t in backend.instances}
            try:
                for device in backend.mig.devices(refresh=False):
                    gi_ids.update({(device.index, o.instance): o.gi_id for o in device.reader.read()})
            except backend.mig.nvml.NVMLError:
                pass
        out = []
        for g, layout in enumerate(config.layouts):
            for i in range(config.instance_count(g)):
                gi = layout.instances[i] if len(layout) else None
                tenants = config.tenants_in(g, i)
                gi_id = gi_ids.get((g, gi), i) if gi is not None else -1
                measured = telemetry.get((g, gi_id))
                if measured is not None:
                    memory, active = measured.memory_used_bytes, measured.gr_engine_active
                elif isinstance(backend, NvmlNodeBackend):
                    memory, active = None, None
                else:
                    memory = sum(backend.memory_gib(n, config.placements[n].batch_size) for n in tenants) * 2**30
                    active = min(1.0, sum(step.tenants[n].utilization for n in tenants if n in step.tenants)) if step else None
                profile = gi.profile if gi is not None else ("gpu" if not spec.mig_supported else "none")
                out.append(InstanceSample(g, profile, gi_id, config.modes[g][i].value, len(tenants), memory, active))
        return out

    def _install_signal_handlers(self) -> dict[int, Any]:
        """SIGTERM/SIGINT finish the current cycle and stop (state saved); main thread only."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._request_stop)
        return previous

    def _request_stop(self, signum: int, frame: Any) -> None:
        self.stop_requested = True


def serve(config: DaemonConfig, backend_options: Mapping[str, Any] | None = None) -> int:
    """Configure logging and run the daemon (what ``rlsched serve`` calls)."""
    configure_logging(config.log_level)
    return Daemon(config, backend_options).run()

