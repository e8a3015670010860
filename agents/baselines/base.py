"""What every baseline policy shares: the interface and the small helpers they build on.

A policy sees the observation and the (unwrapped) environment, and returns an action of the
environment's MultiDiscrete space, an exact :class:`~rlsched.decision.Configuration`, or
exact per-tenant :class:`~rlsched.solver.TenantRequest` s; :func:`apply` sends each through
the ILP repair (:meth:`GpuShareEnv.step`, :meth:`~GpuShareEnv.step_configuration`,
:meth:`~GpuShareEnv.step_requests`), so a baseline cannot apply anything the hardware could
not carry out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from rlsched.decision import BATCH_LEVELS, Configuration, SharingMode, TenantPlacement, equal_shares
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.hardware import GpuInstance, Layout, enumerate_layouts, load_gpu
from rlsched.simulator.perf import CoRunner
from rlsched.solver import TenantRequest
from rlsched.solver.igniter import EXECUTION_BUDGET_FRACTION
from rlsched.workloads.tenants import InferenceTenant, Tenant

#: Batch size of a tenant the scenario's reference does not place.
DEFAULT_BATCH = 8
#: The fraction of its requests a high-priority inference tenant must answer on time: what
#: ``migrator-queue-slo`` holds it to (the planner's ``SloGuard``) and ``static-best-slo``
#: holds its fixed configuration to (issue 23).
HIGH_PRIORITY_SLO_TARGET = 0.99
#: What a policy returns: an action, an exact configuration, or exact per-tenant requests.
Decision = np.ndarray | Configuration | Mapping[str, TenantRequest]


class Policy:
    """A decision rule: :meth:`reset` once per episode, :meth:`act` every decision interval."""

    name: ClassVar[str] = ""

    def reset(self, env: GpuShareEnv) -> None:
        """Prepare for a new episode of ``env`` (called after ``env.reset``)."""

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> Decision:
        """The decision for the next interval."""
        raise NotImplementedError


def high_priority_on_time(env: GpuShareEnv) -> tuple[int, int]:
    """(requests answered on time, requests answered or dropped) of the node's high-priority
    inference tenants so far: the high-priority SLO attainment is their ratio."""
    summary = env.backend.summary()
    on_time = decided = 0
    for tenant in env.scenario.inference_tenants():
        if tenant.priority.value == "high":
            counts = summary[tenant.name]
            on_time += int(counts["on_time"])
            decided += int(counts["completed"]) + int(counts["dropped"])
    return on_time, decided


def apply(env: GpuShareEnv, decision: Decision) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
    """Execute a policy's decision (an action or a configuration) for one interval."""
    if isinstance(decision, Configuration):
        return env.step_configuration(decision)
    if isinstance(decision, Mapping):
        return env.step_requests(decision)
    return env.step(decision)


def whole_device(gpu_name: str) -> Layout:
    """One GI holding the whole GPU (the largest standard profile), or no layout without MIG."""
    gpu = load_gpu(gpu_name)
    if not gpu.mig_supported:
        return Layout(gpu_name, ())
    largest = max((p for p in gpu.profiles.values() if p.variant == "standard"), key=lambda p: (p.compute_slices, p.memory_gib))
    return Layout(gpu_name, (GpuInstance(0, largest.name),))


def whole_device_profile(gpu_name: str) -> str | None:
    """The profile of :func:`whole_device` (None without MIG: the performance model's whole GPU)."""
    layout = whole_device(gpu_name)
    return layout.instances[0].profile if len(layout) else None


def reference_batch(env: GpuShareEnv, tenant: Tenant) -> int:
    """The batch the scenario's reference gives the tenant (:data:`DEFAULT_BATCH` if none),
    within its ``max_batch``."""
    reference = env.scenario.reference
    batch = reference.placements[tenant.name].batch_size if reference and tenant.name in reference.placements else DEFAULT_BATCH
    return min(batch, tenant.max_batch) if isinstance(tenant, InferenceTenant) else batch


def one_gi_per_gpu(env: GpuShareEnv, groups: list[list[tuple[str, float, int]]], mode: SharingMode) -> Configuration:
    """Each GPU as one whole-device GI in ``mode``, holding its group of (tenant, share %, batch)."""
    layout = whole_device(env.scenario.gpu)
    placements = {name: TenantPlacement(g, 0, share, batch) for g, group in enumerate(groups) for name, share, batch in group}
    order = {n: i for i, n in enumerate(env.tenant_names)}
    placements = dict(sorted(placements.items(), key=lambda kv: order[kv[0]]))
    return Configuration(tuple(layout for _ in groups), tuple((mode,) for _ in groups), placements)


def arrival_rates_rps(env: GpuShareEnv) -> dict[str, float]:
    """Each inference tenant's smoothed arrival rate as measured so far, requests/s.

    A tenant not measured yet (the daemon's first cycle on real GPUs, or an unreadable
    observation source) gets the scenario's declared mean rate: the load it was planned for.
    """
    measured = env.backend.observe()
    return {t.name: float(measured[t.name].get("arrival_rate_ewma_rps", 0.0)) if t.name in measured else t.arrivals.mean_rate_rps()
            for t in env.scenario.inference_tenants()}


def observed_load(env: GpuShareEnv) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """What a forecast starts from, per inference tenant: the smoothed arrival rate
    (:func:`arrival_rates_rps`), requests/s; the backlog (waiting or in service; none when
    not measured), requests; and, where measured, its model's accuracy."""
    measured = env.backend.observe()
    rates = arrival_rates_rps(env)
    backlog = {name: float(measured.get(name, {}).get("queue_length", 0.0)) for name in rates}
    accuracy = {name: float(measured[name]["accuracy"]) for name in rates if "accuracy" in measured.get(name, {})}
    return rates, backlog, accuracy


def measured_service(env: GpuShareEnv) -> dict[str, tuple[float, float]]:
    """Per inference tenant the node measured last interval, its (arrival rate, requests/s;
    fraction of decided requests on time): what :meth:`~rlsched.solver.planner.Planner.measured_values`
    floors the running configuration's value with. A tenant without both is left out."""
    measured = env.backend.observe()
    return {t.name: (float(m["arrival_rate_rps"]), float(m["slo_attainment"])) for t in env.scenario.inference_tenants()
            if "arrival_rate_rps" in (m := measured.get(t.name, {})) and math.isfinite(float(m.get("slo_attainment", math.nan)))}


def measured_arrival_rates(measured: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Per tenant in the backend's last measurements (``env.backend.observe()``), its arrival
    rate, requests/s; a tenant without one is left out: what
    :meth:`~rlsched.simulator.lookahead.ReconfigurationCheck.record` takes every interval."""
    return {name: m["arrival_rate_rps"] for name, m in measured.items() if "arrival_rate_rps" in m}


def intervals_left(env: GpuShareEnv, elapsed_s: float) -> int | None:
    """Decision intervals until the episode ends, ``elapsed_s`` node seconds in (None on a
    backend that runs on, as a real node does): the horizon
    :meth:`~rlsched.simulator.lookahead.ReconfigurationCheck.gain` is cut to."""
    if not env.backend.episodic:
        return None
    return round((env.scenario.duration_s - elapsed_s) / env.scenario.decision_interval_s)


class LatencyTable:
    """Memoized performance-model predictions (mean batch latency, ms) for a scenario's GPU."""

    def __init__(self, env: GpuShareEnv) -> None:
        self.gpu = env.scenario.gpu
        self.perf = env.backend.perf_model
        self._cache: dict[tuple, float] = {}

    def mean_ms(self, model: str, batch: int, profile: str | None, mps_pct: float = 100.0,
                mode: SharingMode = SharingMode.MPS, colocated: tuple[CoRunner, ...] = ()) -> float:
        """Mean latency of one batch, ms."""
        key = (model, batch, profile, mps_pct, mode, colocated)
        if key not in self._cache:
            self._cache[key] = float(self.perf.predict(self.gpu, model, batch, profile, mps_pct, mode, colocated).latency_ms_mean)
        return self._cache[key]


class CapacityModel:
    """What a tenant can serve where, from the performance model (used by the planners).

    The capacity of an inference tenant in a GI (at a share, with co-runners) is the largest
    throughput, over its batch levels, of a batch whose predicted mean latency fits half
    its SLO (iGniter's budget), requests/s; 0 when no batch fits.
    """

    def __init__(self, env: GpuShareEnv) -> None:
        self.env = env
        self.table = LatencyTable(env)
        self.gpu = load_gpu(env.scenario.gpu)
        self._cache: dict[tuple, tuple[float, int]] = {}

    def profiles(self) -> list[str | None]:
        """Standard GI profiles by compute size (``[None]``: the whole GPU without MIG)."""
        if not self.gpu.mig_supported:
            return [None]
        return [p.name for p in sorted((p for p in self.gpu.profiles.values() if p.variant == "standard"), key=lambda p: p.compute_slices)]

    def slices(self, profile: str | None) -> float:
        """Compute slices of a profile (the whole device without MIG)."""
        from rlsched.solver import NON_MIG_COMPUTE_SLICES

        return float(self.gpu.profiles[profile].compute_slices) if profile else NON_MIG_COMPUTE_SLICES

    def capacity(self, t: InferenceTenant, profile: str | None, mps_pct: float = 100.0, mode: SharingMode = SharingMode.MPS,
                 colocated: tuple[CoRunner, ...] = ()) -> tuple[float, int]:
        """(requests/s it sustains within half its SLO, the batch that achieves it)."""
        key = (t.name, profile, mps_pct, mode, colocated)
        if key not in self._cache:
            best = (0.0, 1)
            for batch in BATCH_LEVELS:
                if batch > t.max_batch:
                    break
                latency = self.table.mean_ms(t.model, batch, profile, mps_pct, mode, colocated)
                if latency <= EXECUTION_BUDGET_FRACTION * t.slo_ms:
                    best = max(best, (batch * 1000.0 / latency, batch))
            self._cache[key] = best
        return self._cache[key]

    def served_fraction(self, t: InferenceTenant, rate_rps: float, profile: str | None, mps_pct: float = 100.0) -> float:
        """min(1, capacity / rate): the share of its load a placement can serve in time."""
        return 1.0 if rate_rps <= 0 else min(1.0, self.capacity(t, profile, mps_pct)[0] / rate_rps)


def fit_to_node(env: GpuShareEnv, model: CapacityModel, rates: dict[str, float], sizes: dict[str, int]) -> None:
    """Make GI sizes (indices into ``model.profiles()``, changed in place) fit the node as
    PARIS partitions it: one GI per tenant, packed into the node's MIG layouts (on each GPU,
    a sub-multiset of a maximal layout), the whole GPU used.

    While they do not pack, the tenant that keeps the largest served fraction of its rate
    shrinks one size; then, while some tenant can grow one size and still pack, the one with
    the least capacity per request of its rate grows. Without MIG, or with more tenants than
    GIs fit even at the smallest size, the repair shares GIs.
    """
    profiles = model.profiles()
    if profiles == [None]:
        return
    maximal = [Counter(i.profile for i in layout.instances) for layout in enumerate_layouts(model.gpu, maximal=True)]

    def packs(names: list[str], gpus: list[Counter]) -> bool:
        if not names:
            return True
        profile = profiles[sizes[names[0]]]
        for g, used in enumerate(gpus):
            grown = used + Counter([profile])
            if any(all(grown[p] <= m[p] for p in grown) for m in maximal) and packs(names[1:], gpus[:g] + [grown] + gpus[g + 1:]):
                return True
            if not used:
                break  # the empty GPUs are interchangeable
        return False

    def fits() -> bool:
        return packs(sorted(sizes, key=lambda n: -sizes[n]), [Counter() for _ in range(env.scenario.gpu_count)])

    tenant = {t.name: t for t in env.scenario.inference_tenants()}
    while not fits():
        shrinkable = [n for n in tenant if sizes[n] > 0]
        if not shrinkable:
            return
        victim = max(shrinkable, key=lambda n: (model.served_fraction(tenant[n], rates[n], profiles[sizes[n] - 1]), sizes[n]))
        sizes[victim] -= 1
    while True:
        growable = []
        for n in (n for n in tenant if sizes[n] < len(profiles) - 1):
            sizes[n] += 1
            if fits():
                growable.append(n)
            sizes[n] -= 1
        if not growable:
            return
        sizes[min(growable, key=lambda n: model.capacity(tenant[n], profiles[sizes[n]])[0] / max(rates[n], 1e-9))] += 1


def sized_requests(env: GpuShareEnv, model: CapacityModel, rates: dict[str, float], headroom: float) -> dict[str, TenantRequest]:
    """Per tenant, a whole GI of the smallest size that serves ``headroom x`` its rate
    within half its SLO (the largest GI if none does), at the batch that achieves it, the
    sizes then fitted to the node's MIG layouts (:func:`fit_to_node`); retraining and
    best-effort jobs get a GI of the smallest size each (without MIG: they split the compute
    left over, at least one quarter slice each).
    """
    profiles = model.profiles()
    sizes: dict[str, int] = {}
    for t in env.scenario.inference_tenants():
        sizes[t.name] = next((k for k, p in enumerate(profiles) if model.capacity(t, p)[0] >= headroom * rates[t.name]), len(profiles) - 1)
    background = [t for t in env.scenario.tenants if not isinstance(t, InferenceTenant)]
    if profiles != [None]:
        sizes.update({t.name: 0 for t in background})  # a GI of the smallest size each, packed with the rest
    fit_to_node(env, model, rates, sizes)
    requests: dict[str, TenantRequest] = {}
    used = 0.0
    for t in env.scenario.inference_tenants():
        choice = profiles[sizes[t.name]]
        batch = model.capacity(t, choice)[1]
        used += model.slices(choice)
        requests[t.name] = TenantRequest(model.slices(choice), env.backend.memory_gib(t.name, batch), mode=SharingMode.MPS, mps_pct=100.0, batch_size=batch)
    total = model.slices(profiles[-1]) * env.scenario.gpu_count
    for t in background:
        batch = reference_batch(env, t)
        slices = model.slices(profiles[sizes[t.name]]) if t.name in sizes else max(0.25, (total - used) / len(background))
        requests[t.name] = TenantRequest(slices, env.backend.memory_gib(t.name, batch), mode=SharingMode.MPS, batch_size=batch)
    return {n: requests[n] for n in env.tenant_names}
