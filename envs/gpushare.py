"""``rlsched/GpuShare-v0``: one node of shared GPUs as a Gymnasium environment.

Every step is one decision interval of the scenario: the action (per-tenant requests, see
:mod:`rlsched.envs.actions`) is repaired by the ILP into an exact
:class:`~rlsched.decision.Configuration`, the backend (the simulator by default) runs the
interval under it, and the reward is the interval's Goodput objective
(:mod:`rlsched.goodput`), so the episode return is the episode objective.

Episodes end by truncation only: when the registration's ``max_episode_steps`` is reached,
or when the scenario's duration has been simulated, whichever comes first (the system goes
on; nothing terminal happens).

``info`` is a function of the seed and the actions alone (Gymnasium's checker steps twice
from one seed and compares). Wall-clock timings are not, so they live beside it: the last
repair's in :attr:`GpuShareEnv.last_repair_ms`, all since the last collection in
:meth:`GpuShareEnv.take_repair_timing`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlsched.decision import Configuration
from rlsched.envs.actions import ActionCodec
from rlsched.envs.backends import Backend, make_backend, resolve_scenario
from rlsched.envs.observations import ObservationEncoder
from rlsched.errors import ConfigError
from rlsched.metrics import RepairTiming
from rlsched.simulator.node import StepResult
from rlsched.simulator.perf import PerformanceModelLike
from rlsched.solver import InfeasibleRequest, RepairProblem, RepairResult, RepairWeights, TenantRequest, repair, repair_configuration
from rlsched.workloads.scenario import Scenario

#: Repairs remembered per environment (request + running configuration -> result).
REPAIR_CACHE_SIZE = 4096
#: A repair whose weighted distance is at most this gave exactly what was asked.
EXACT_DISTANCE = 1e-6


class GpuShareEnv(gym.Env[np.ndarray, np.ndarray]):
    """A node of ``scenario.gpu_count`` GPUs shared by the scenario's tenants.

    :param scenario: a bundled scenario name (``"default"``), a YAML path, or a Scenario
    :param backend: ``"sim"`` (the request-level simulator), ``"nvml"`` (a real node, see
        :class:`rlsched.envs.node_backends.NvmlNodeBackend`) or a :class:`Backend` object
    :param backend_options: keyword options of the named backend (``"nvml"``: NVML module,
        ``apply``, observation ``source``, ...)
    :param perf_model: ``"calibrated"``, ``"toy"`` or a performance model object (sim backend)
    :param repair_weights: prices of the repair objective (how "nearest" is measured)
    :param render_mode: None or ``"ansi"`` (a text line per step)
    """

    # A text line per decision; render_fps is nominal (one line per step), set because
    # Gymnasium's checker asks every renderable env for it.
    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        scenario: str | Path | Scenario = "default",
        backend: str | Backend = "sim",
        perf_model: str | PerformanceModelLike = "calibrated",
        repair_weights: RepairWeights = RepairWeights(),
        render_mode: str | None = None,
        backend_options: Mapping[str, Any] | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError("environment", "render_mode", render_mode, f"allowed: None, {', '.join(self.metadata['render_modes'])}")
        self.scenario = resolve_scenario(scenario)
        self.backend = make_backend(backend, self.scenario, perf_model, backend_options)
        self.codec = ActionCodec(self.scenario, self.backend.memory_gib)
        self.encoder = ObservationEncoder(self.scenario, self.backend.memory_gib, self._whole_gpu_capacity_rps)
        self.action_space = self.codec.space
        self.observation_space = self.encoder.space
        self.repair_weights = repair_weights
        self.render_mode = render_mode
        self.last_repair_ms = 0.0  # wall time of the last step's decode + repair, ms
        # Every step's, until a metrics reader takes them (shared by FamilyEnv's episodes).
        self.repair_timing = RepairTiming()
        self.tenant_names = [t.name for t in self.scenario.tenants]
        self.current: Configuration | None = self.scenario.reference
        self.last_step: StepResult | None = None
        self.backend_seed: int | None = None  # the seed the backend's episode started from
        self.raw_observation: np.ndarray | None = None  # the last observation before clipping
        self._measured: dict[str, dict[str, float]] = {}  # the backend's last measurements
        self._repair_cache: dict[tuple, tuple[RepairResult, bool]] = {}
        self._gpu_reconfiguration_s: tuple[float, ...] = (0.0,) * self.scenario.gpu_count
        self._check_every_action_is_executable()

    def _whole_gpu_capacity_rps(self, tenant_name: str) -> float:
        """Requests/s the whole GPU (no MIG) serves for an inference tenant at its ``max_batch``
        (the performance model's prediction: the scale of the ``load`` observations)."""
        tenant = self.scenario.tenant(tenant_name)
        return float(self.backend.perf_model.predict(self.scenario.gpu, tenant.model, tenant.max_batch).throughput_per_s)

    def _check_every_action_is_executable(self) -> None:
        """Memory is the one hard limit the repair cannot trade away; at batch 1 every
        tenant must be packable, so that the fallback of :meth:`_repair` always succeeds."""
        smallest = self.codec.with_smallest_batches(self.codec.decode(np.zeros(self.action_space.shape, dtype=np.int64)).problem)
        try:
            repair(smallest, None, self.repair_weights)
        except InfeasibleRequest as exc:
            raise ConfigError(self.scenario.source, "tenants", self.tenant_names, f"the tenants cannot all be placed even at batch 1: {exc}") from None

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode.

        :param seed: seeds ``np_random``, from which the backend's seed is drawn
        :param options: ``{"configuration": Configuration}`` to start from another
            configuration than the scenario's reference; ``{"backend_seed": int}`` to replay
            the backend episode of another env (see :attr:`backend_seed`; hindsight baselines)
        """
        super().reset(seed=seed)
        options = options or {}
        start = options.get("configuration", self.scenario.reference)
        if start is not None and not isinstance(start, Configuration):
            raise ConfigError("reset options", "configuration", start, "expected a Configuration")
        # Drawn even when replaying, so that np_random advances the same way.
        drawn = int(self.np_random.integers(2**63 - 1))
        replay = options.get("backend_seed")
        if replay is not None and (isinstance(replay, bool) or not isinstance(replay, int | np.integer)):
            raise ConfigError("reset options", "backend_seed", replay, "expected an integer")
        self.backend_seed = drawn if replay is None else int(replay)
        self.backend.reset(self.backend_seed, start)
        self.current = start
        self.last_step = None
        self._gpu_reconfiguration_s = (0.0,) * self.scenario.gpu_count
        return self._observation(0.0), self._configuration_info(start)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Repair the action's requests into a configuration and run one interval under it."""
        started = time.perf_counter()
        decoded = self.codec.decode(action)
        result, fallback = self._repair(decoded.problem)
        self._timed(started)
        repaired = bool(decoded.clamped) or fallback or result.distance > EXACT_DISTANCE
        return self._run(result, repaired, fallback, {"clamped": {k: list(v) for k, v in decoded.clamped.items()}})

    def step_requests(self, requests: Mapping[str, TenantRequest]) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Like :meth:`step`, for a policy that states exact per-tenant requests (compute
        slices, memory, GPU, mode, share, batch) instead of action levels."""
        started = time.perf_counter()
        result, fallback = self.repair_requests(requests)
        self._timed(started)
        return self._run(result, fallback or result.distance > EXACT_DISTANCE, fallback, {"clamped": {}})

    def repair_requests(self, requests: Mapping[str, TenantRequest]) -> tuple[RepairResult, bool]:
        """The repair of exact per-tenant requests from the running configuration (what
        :meth:`step_requests` runs; deterministic and cached), and whether it fell back."""
        missing = [n for n in self.tenant_names if n not in requests]
        if missing:
            raise ConfigError("policy output", "requests", missing[0], "every tenant needs a request")
        return self._repair(RepairProblem((self.scenario.gpu,) * self.scenario.gpu_count, {n: requests[n] for n in self.tenant_names},
                                          make_before_break=self.scenario.make_before_break))

    def step_configuration(self, configuration: Configuration) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Like :meth:`step`, for a policy that asks for an exact configuration (a baseline).

        An infeasible configuration is repaired by the ILP like an action would be.
        """
        started = time.perf_counter()
        result, fallback = self._repair_configuration(configuration)
        self._timed(started)
        repaired = fallback or result.configuration != configuration
        return self._run(result, repaired, fallback, {"clamped": {}})

    def take_repair_timing(self) -> tuple[int, float, float]:
        """``(count, sum_ms, max_ms)`` of the repairs since the last call (a metrics reader's
        collection, e.g. once per rollout: ``VecEnv.env_method("take_repair_timing")``)."""
        return self.repair_timing.take()

    def repaired_configuration(self, decision: np.ndarray | Configuration) -> Configuration:
        """The configuration :meth:`step` (an action) or :meth:`step_configuration` would
        apply for ``decision`` from the running one, without applying it (a check before
        acting; the step that follows repeats only the cached repair)."""
        if isinstance(decision, Configuration):
            return self._repair_configuration(decision)[0].configuration
        return self._repair(self.codec.decode(decision).problem)[0].configuration

    def action_masks(self) -> np.ndarray:
        """Levels each tenant may use (sb3-contrib MaskablePPO); masked levels are still
        executable (clamped), the mask only keeps the policy from wasting probability."""
        return self.codec.masks()

    def render(self) -> str | None:
        """A text line: time, applied layout per GPU, last reward."""
        if self.render_mode != "ansi":
            return None
        layouts = " | ".join(self._configuration_info(self.current)["layout"])
        t = self.last_step.t_end_s if self.last_step else 0.0
        reward = self.last_step.reward if self.last_step else 0.0
        return f"t={t:.0f}s layout=[{layouts}] reward={reward:.1f}"

    # ------------------------------------------------------------------ internals
    def _repair_configuration(self, configuration: Configuration) -> tuple[RepairResult, bool]:
        """The repair of an exact configuration (a baseline's), and whether it fell back."""
        if not isinstance(configuration, Configuration):
            raise ConfigError("policy output", "configuration", configuration, "expected a Configuration")
        unknown = sorted(set(configuration.placements) - set(self.tenant_names))
        if unknown:
            raise ConfigError("policy output", "placements", unknown[0], f"unknown tenant (tenants: {', '.join(self.tenant_names)})")
        missing = [n for n in self.tenant_names if n not in configuration.placements]
        if missing:
            raise ConfigError("policy output", "placements", missing[0], "every tenant needs a placement")
        memory = {n: self.backend.memory_gib(n, p.batch_size) for n, p in configuration.placements.items()}
        try:
            return repair_configuration(configuration, memory, self.current, self.repair_weights), False
        except InfeasibleRequest:
            # Memory cannot be packed: repair the nearest per-tenant request instead, which
            # falls back to batch 1 if it must.
            return self._repair(self.codec.decode(self.codec.encode(configuration)).problem)

    def _repair(self, problem: RepairProblem) -> tuple[RepairResult, bool]:
        """The repaired configuration, and whether the batch-1 fallback was needed.

        The repair is a pure function of the request and the running configuration, so
        results are memoized: a policy repeating an inexact request (the ILP's fast path
        only covers exact ones) costs a dictionary lookup, not a solve.
        """
        current = self.current
        key = (tuple(problem.tenants.items()), None if current is None else (current.layouts, current.modes, tuple(current.placements.items())))
        cached = self._repair_cache.get(key)
        if cached is not None:
            return cached
        try:
            outcome = repair(problem, current, self.repair_weights), False
        except InfeasibleRequest:
            # Memory cannot be packed at the requested batches; batch 1 always can (checked
            # at construction), so the action still executes, with the smallest batches.
            outcome = repair(self.codec.with_smallest_batches(problem), current, self.repair_weights), True
        if len(self._repair_cache) >= REPAIR_CACHE_SIZE:
            self._repair_cache.pop(next(iter(self._repair_cache)))  # oldest first
        self._repair_cache[key] = outcome
        return outcome

    def _timed(self, started: float) -> None:
        """Record the decision time since ``started`` (a ``time.perf_counter`` reading)."""
        self.last_repair_ms = (time.perf_counter() - started) * 1e3
        self.repair_timing.add(self.last_repair_ms)

    def _run(self, result: RepairResult, repaired: bool, fallback: bool, extra: dict[str, Any]) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        config = result.configuration
        previous = self.current
        step = self.backend.step(config)
        self.current = config
        self.last_step = step
        self._gpu_reconfiguration_s = tuple(step.gpu_reconfiguration_s)
        observation = self._observation(step.t_end_s / self.scenario.duration_s)
        info: dict[str, Any] = {
            "repaired": bool(repaired),
            "repair_distance": float(result.distance),
            "repair_fast_path": bool(result.fast_path),
            "repair_fallback": bool(fallback),
            "reconfigured": previous is None or config != previous,
            "restarted_tenants": sorted(name for name, st in step.tenants.items() if st.restarted),
            # Tenants inside their activity windows now (a backend that does not say: all).
            "active_tenants": [name for name in self.tenant_names if self._measured.get(name, {}).get("active", 1.0) > 0.0],
            "slo_counts": self._slo_counts(step),
            **self._configuration_info(config),
            **{k: float(v) for k, v in step.terms.as_dict().items()},
            **extra,
        }
        return observation, float(step.reward), False, bool(step.done), info

    def _slo_counts(self, step: StepResult) -> dict[str, dict[str, int]]:
        """Per priority class of the inference tenants: requests on time and decided
        (completed + dropped) this interval, so that attainment can be summed over steps
        (``rlsched.metrics``)."""
        counts: dict[str, dict[str, int]] = {}
        for tenant in self.scenario.inference_tenants():
            stats = step.tenants[tenant.name]
            entry = counts.setdefault(tenant.priority.value, {"on_time": 0, "decided": 0})
            entry["on_time"] += int(stats.on_time)
            entry["decided"] += int(stats.completed) + int(stats.dropped)
        return counts

    def _observation(self, elapsed_fraction: float) -> np.ndarray:
        # Kept unclipped too: the daemon falls back when a feature leaves the training range.
        self._measured = self.backend.observe()
        self.raw_observation = self.encoder.raw(self._measured, self.current, self._gpu_reconfiguration_s, elapsed_fraction)
        return self.encoder.clip(self.raw_observation)

    def _configuration_info(self, config: Configuration | None) -> dict[str, Any]:
        """The applied configuration in plain values: layout specs, modes and placements."""
        if config is None:
            return {"layout": tuple("" for _ in range(self.scenario.gpu_count)), "modes": (), "placements": {}, "configuration": None}
        return {
            "layout": tuple(layout.spec() for layout in config.layouts),
            "modes": tuple(tuple(m.value for m in modes) for modes in config.modes),
            "placements": {
                name: {"gpu": p.gpu_index, "instance": p.instance_index, "mps_pct": float(p.mps_pct), "batch_size": int(p.batch_size)}
                for name, p in config.placements.items()
            },
            "configuration": config,
        }

    def snapshot(self) -> tuple:
        """The episode's whole state on the simulator backend, to :meth:`restore` later: a
        what-if run from here leaves the episode as it was."""
        simulator = getattr(self.backend, "simulator", None)
        if simulator is None:
            raise TypeError(f"backend {type(self.backend).__name__} has no simulator state to snapshot")
        return (simulator.snapshot(), self.current, self.last_step, self._gpu_reconfiguration_s, dict(self._measured), self.raw_observation)

    def restore(self, snapshot: tuple) -> None:
        """Return to a state :meth:`snapshot` took."""
        self.backend.simulator.restore(snapshot[0])
        self.current, self.last_step, self._gpu_reconfiguration_s, self._measured, self.raw_observation = snapshot[1:]

    @property
    def objective(self) -> float:
        """The episode objective so far (Goodput terms summed since reset)."""
        return float(self.backend.totals.total)

