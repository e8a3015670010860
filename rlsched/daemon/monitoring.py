"""Monitoring of the daemon: per-cycle metrics, TensorBoard events and a Prometheus endpoint.

:func:`cycle_metrics` builds a cycle's metrics: the names training logs come from
:mod:`rlsched.metrics` (``goodput/...``, ``slo/...``, ``reconfig/...``, ``repair/...``,
``perf/steps_per_s``), so that a daemon run and a training run plot side by side; the
daemon adds per-tenant SLO series and its fallback count. The
Prometheus exporter follows DCGM's habits: ``rlsched_gpu_instance_*`` series with the
``gpu``, ``GPU_I_PROFILE`` and ``GPU_I_ID`` labels DCGM puts on MIG series, per-tenant
series with a ``tenant`` label, and counters ending in ``_total``. It has its own
CollectorRegistry (no process/platform collectors leak in) and binds 127.0.0.1 by default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from rlsched.metrics import STEPS_PER_S, step_metrics
from rlsched.simulator.node import StepResult


def cycle_metrics(info: Mapping[str, Any], step: StepResult | None, steps_per_s: float, fallbacks: int, planner_decided: bool = False,
                  repair_ms: float | None = None, planner_milps: tuple[int, int] | None = None) -> dict[str, float]:
    """Scalar metrics of one decision cycle, from the environment's ``info`` and step result.

    :param info: the env's step ``info`` (Goodput terms, repair and reconfiguration facts)
    :param step: the backend's step result (per-tenant SLO statistics), None if unavailable
    :param steps_per_s: decision cycles per wall second, recent average
    :param fallbacks: fallbacks to the planner so far
    :param planner_decided: whether the planner took this cycle's decision (a fallback, or a
        step the PPO policy was unsure of); its running mean is the planner's share
    :param repair_ms: the cycle's repair wall time, ms (``env.last_repair_ms``; not in ``info``)
    :param planner_milps: (planner MILPs solved, of them stopped at their wall-clock time limit)
        since the daemon started (:data:`~rlsched.solver.planner.PLANNER_SOLVES`): on a node
        whose CPUs are busy, solves cut short plan worse
    """
    out = step_metrics(info, repair_ms)
    out[STEPS_PER_S] = float(steps_per_s)
    out["daemon/fallbacks"] = float(fallbacks)
    out["daemon/planner_decided"] = float(planner_decided)
    if planner_milps is not None:
        out["daemon/planner_milps"], out["daemon/planner_milps_time_limited"] = map(float, planner_milps)
    if step is not None:
        out["reconfig/gpu_seconds"] = float(sum(step.gpu_reconfiguration_s))
        for name, st in step.tenants.items():
            if st.kind != "inference":
                continue
            if math.isfinite(st.slo_attainment):
                out[f"slo/{name}/attainment"] = float(st.slo_attainment)
            if math.isfinite(st.latency_ms_p99):
                out[f"slo/{name}/latency_ms_p99"] = float(st.latency_ms_p99)
            out[f"goodput/{name}"] = float(st.terms.goodput)
    return out


class TensorBoardLog:
    """Scalars per cycle in TensorBoard event files (the writer training uses).

    :param logdir: the event folder
    :param flush_every: cycles between flushes (the writer also flushes every 2 minutes)
    """

    def __init__(self, logdir: str, flush_every: int = 100) -> None:
        from torch.utils.tensorboard import SummaryWriter  # torch is heavy: import only when logging

        self.writer = SummaryWriter(log_dir=logdir, flush_secs=120)
        self.flush_every = flush_every

    def write(self, cycle: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            if math.isfinite(value):
                self.writer.add_scalar(name, value, cycle)
        if cycle % self.flush_every == 0:
            self.writer.flush()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


@dataclass(frozen=True)
class InstanceSample:
    """One GPU instance's values for the exporter.

    :param gpu: GPU index
    :param profile: GI profile (``GPU_I_PROFILE``), ``"gpu"`` for a whole GPU without MIG
    :param gi_id: NVML GI id where known, else the instance's index in the layout (``GPU_I_ID``)
    :param mode: sharing mode of the instance
    :param tenants: tenants placed in it
    :param memory_used_bytes: device memory used (measured by NVML, or the performance
        model's need of its tenants on the simulator), bytes
    :param gr_engine_active: graphics-engine active ratio (GPM, or the tenants' summed
        utilization on the simulator), None if unknown
    """

    gpu: int
    profile: str
    gi_id: int
    mode: str
    tenants: int
    memory_used_bytes: float | None
    gr_engine_active: float | None


class PrometheusExporter:
    """The daemon's ``/metrics``, served from a thread until :meth:`close`.

    :param host: address to bind (127.0.0.1 unless the operator says otherwise)
    :param port: TCP port (0: any free one; see :attr:`port`)
    """

    def __init__(self, host: str, port: int) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        instance = ["gpu", "GPU_I_PROFILE", "GPU_I_ID"]
        self.cycles = Counter("rlsched_daemon_cycles", "Decision cycles completed", registry=registry)
        self.fallbacks = Counter("rlsched_daemon_fallbacks", "Decisions taken by the fallback planner, by reason", ["reason"], registry=registry)
        self.decisions = Counter("rlsched_daemon_decisions", "Decision cycles by the policy that decided (the planner: fallbacks and unsure steps)", ["policy"], registry=registry)
        self.gi_operations = Counter("rlsched_gi_operations", "GPU/compute-instance create and destroy operations issued", registry=registry)
        self.reconfigurations = Counter("rlsched_reconfigurations", "Cycles whose configuration differs from the one before", registry=registry)
        self.planner_milps = Counter("rlsched_planner_milps", "Planner MILPs solved, by outcome (time_limited: stopped at the wall-clock limit)",
                                     ["outcome"], registry=registry)
        self._planner_milps_seen = (0.0, 0.0)
        self.repair_ms = Gauge("rlsched_repair_duration_ms", "Policy output repair (ILP) time of the last cycle, milliseconds", registry=registry)
        self.steps_per_s = Gauge("rlsched_daemon_cycles_per_second", "Decision cycles per wall second, recent average", registry=registry)
        self.goodput = Gauge("rlsched_goodput", "Goodput terms of the last interval (request equivalents)", ["term"], registry=registry)
        self.slo = Gauge("rlsched_tenant_slo_attainment_ratio", "On-time requests / decided requests of the last interval", ["tenant"], registry=registry)
        self.p99 = Gauge("rlsched_tenant_latency_p99_ms", "p99 latency of the last interval, milliseconds", ["tenant"], registry=registry)
        self.tenant_goodput = Gauge("rlsched_tenant_goodput", "Goodput of the last interval (request equivalents)", ["tenant"], registry=registry)
        self.rate = Gauge("rlsched_tenant_arrival_rate_rps", "Arrival rate of the last interval, requests/s", ["tenant"], registry=registry)
        self.gi_info = Gauge("rlsched_gpu_instance_info", "1 per GPU instance of the applied layout", [*instance, "mode"], registry=registry)
        self.gi_tenants = Gauge("rlsched_gpu_instance_tenants", "Tenants placed in the GPU instance", instance, registry=registry)
        self.gi_fb_used = Gauge("rlsched_gpu_instance_fb_used_bytes", "Device memory used in the GPU instance, bytes (DCGM_FI_DEV_FB_USED-style)", instance, registry=registry)
        self.gi_gr_active = Gauge("rlsched_gpu_instance_gr_engine_active_ratio", "Graphics engine active ratio of the GPU instance (DCGM_FI_PROF_GR_ENGINE_ACTIVE-style)", instance, registry=registry)
        self.server, self.thread = start_http_server(port, addr=host, registry=registry)
        self.host = host
        self.port = int(self.server.server_address[1])

    def update(self, metrics: Mapping[str, float], step: StepResult | None, instances: list[InstanceSample], gi_operations: int, reconfigured: bool,
               decided_by: str) -> None:
        """Publish one cycle (per-instance series are replaced: old instances disappear).

        :param decided_by: name of the policy that took the cycle's decision
        """
        self.cycles.inc()
        self.decisions.labels(policy=decided_by).inc()
        self.gi_operations.inc(gi_operations)
        if reconfigured:
            self.reconfigurations.inc()
        self.repair_ms.set(metrics.get("repair/ms_mean", 0.0))
        if "daemon/planner_milps" in metrics:
            solved, limited = metrics["daemon/planner_milps"], metrics["daemon/planner_milps_time_limited"]
            seen_solved, seen_limited = self._planner_milps_seen
            self.planner_milps.labels(outcome="time_limited").inc(limited - seen_limited)
            self.planner_milps.labels(outcome="solved").inc(solved - limited - (seen_solved - seen_limited))
            self._planner_milps_seen = (solved, limited)
        self.steps_per_s.set(metrics.get("perf/steps_per_s", 0.0))
        for name, value in metrics.items():
            if name.startswith("goodput/") and name.count("/") == 1:
                self.goodput.labels(term=name.split("/", 1)[1]).set(value)
        if step is not None:
            for name, st in step.tenants.items():
                if st.kind != "inference":
                    continue
                self.slo.labels(tenant=name).set(st.slo_attainment)
                self.p99.labels(tenant=name).set(st.latency_ms_p99)
                self.tenant_goodput.labels(tenant=name).set(st.terms.goodput)
                self.rate.labels(tenant=name).set(st.arrival_rate_rps)
        for gauge in (self.gi_info, self.gi_tenants, self.gi_fb_used, self.gi_gr_active):
            gauge.clear()
        for s in instances:
            labels = {"gpu": str(s.gpu), "GPU_I_PROFILE": s.profile, "GPU_I_ID": str(s.gi_id)}
            self.gi_info.labels(**labels, mode=s.mode).set(1)
            self.gi_tenants.labels(**labels).set(s.tenants)
            if s.memory_used_bytes is not None:
                self.gi_fb_used.labels(**labels).set(s.memory_used_bytes)
            if s.gr_engine_active is not None:
                self.gi_gr_active.labels(**labels).set(s.gr_engine_active)

    def fallback(self, reason: str) -> None:
        self.fallbacks.labels(reason=reason).inc()

    def close(self) -> None:
        """Stop serving and release the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
