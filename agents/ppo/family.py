"""Domain randomization: a family of scenarios around a base one, and an env that draws one per episode.

Each episode of :class:`FamilyEnv` runs a fresh draw of :meth:`ScenarioFamily.sample`: per
tenant arrival rates, MMPP burstiness and SLOs scaled, priorities optionally permuted
(tenant mixes), the GPU type optionally drawn, and trace replays started at a random offset
inside the *training part* of each trace. The observation and action shapes stay those of
the base scenario (same tenants, same GI size levels), which :class:`FamilyEnv` checks.

Train / held-out split of the real traces in ``configs/traces`` (see also
``configs/scenarios/default-heldout.yaml``):

- ``servegen_mm_image_client0.csv``: held out entirely (never replayed in training);
- ``servegen_m_large_rate_10min.csv`` (14 days): training replays start within the first
  ``trace_train_fraction`` (0.7: days 1-9.8); the held-out scenario replays days 11-12;
- ``azure_llm_conv_timestamps.csv`` (58 minutes): shorter than one episode, replayed whole
  in training (rate-scaled), and not used by the held-out scenario;
- ``servegen_mm_image_client<N>.csv`` (N > 0, other clients of the same ServeGen workload as
  the held-out client 0): a *trace pool* (``randomization.trace_pool``) that a tenant replays
  instead of its own trace in some episodes; ``configs/train/ppo_default.yaml`` keeps client 1
  out of it for its validation scenario (``default-validation``).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import yaml

from rlsched.agents.ppo.config import RandomizationConfig
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.hardware import load_gpu
from rlsched.simulator.perf import PerformanceModelLike
from rlsched.simulator.run import load_performance_model
from rlsched.workloads.arrivals import ArrivalProcess, MmppArrivals, PoissonArrivals
from rlsched.workloads.scenario import Scenario, load_scenario, scenario_path, scenarios_dir
from rlsched.workloads.tenants import InferenceTenant
from rlsched.workloads.traces import load_trace


def _log_uniform(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    low, high = bounds
    return float(math.exp(rng.uniform(math.log(low), math.log(high)))) if low > 0 and high > low else float(low)


def _gi_sizes(gpu: str) -> tuple[int, ...]:
    spec = load_gpu(gpu)
    return tuple(sorted({p.compute_slices for p in spec.profiles.values() if p.variant == "standard"})) if spec.mig_supported else ()


def trace_files(scenario_name_or_path: str | Path) -> list[str]:
    """File names of the traces a scenario YAML replays (``arrivals.file`` of each tenant)."""
    raw = yaml.safe_load(scenario_path(scenario_name_or_path).read_text()) or {}
    return [Path(t["arrivals"]["file"]).name for t in raw.get("tenants", []) if isinstance(t.get("arrivals"), dict) and "file" in t["arrivals"]]


class ScenarioFamily:
    """Random variations of a base scenario (see the module docstring).

    :param base: the scenario name or YAML path the variations start from
    :param config: the randomization ranges
    """

    def __init__(self, base: str | Path, config: RandomizationConfig) -> None:
        self.config = config
        self.base = load_scenario(base)
        held_out = sorted(set(trace_files(base)) & set(config.held_out_traces))
        if held_out:
            raise ConfigError(self.base.source, "tenants[].arrivals.file", held_out[0], "this trace is held out of training (randomization.held_out_traces)")
        self.trace_pool = self._load_trace_pool()
        sizes = _gi_sizes(self.base.gpu)
        for gpu in config.gpus:
            if _gi_sizes(gpu) != sizes:
                raise ConfigError("randomization", "gpus", gpu, f"its GI sizes {_gi_sizes(gpu)} differ from {self.base.gpu}'s {sizes}: the action space would change shape")

    def _load_trace_pool(self) -> list[ArrivalProcess]:
        """The pool's traces at rate scale 1, checked against the scenario and the held-out list."""
        pool = self.config.trace_pool
        inference = {t.name for t in self.base.tenants if isinstance(t, InferenceTenant)}
        for name in pool.tenants:
            if name not in inference:
                raise ConfigError("randomization", "trace_pool.tenants", name, f"not an inference tenant of {self.base.name} ({', '.join(sorted(inference))})")
        if pool.probability > 0 and not (pool.files and pool.tenants):
            raise ConfigError("randomization", "trace_pool.probability", pool.probability, "needs trace_pool.files and trace_pool.tenants")
        traces: list[ArrivalProcess] = []
        for i, file in enumerate(pool.files):
            if Path(file).name in self.config.held_out_traces:
                raise ConfigError("randomization", f"trace_pool.files[{i}]", file, "this trace is held out of training (randomization.held_out_traces)")
            path = Path(file) if Path(file).is_absolute() else scenarios_dir().parent / "traces" / file
            if not path.is_file():
                raise ConfigError("randomization", f"trace_pool.files[{i}]", file, f"no such trace file ({path})")
            trace = load_trace(path, time_warp=pool.time_warp)
            if not trace.mean_rate_rps() > 0:
                raise ConfigError("randomization", f"trace_pool.files[{i}]", file, "the trace has no requests")
            traces.append(trace)
        return traces

    def _pool_arrivals(self, own: ArrivalProcess, rng: np.random.Generator) -> ArrivalProcess:
        """A random pool trace at the tenant's own mean rate (times the rate randomization),
        from a random point of the trace (a pool trace is training data throughout)."""
        trace = self.trace_pool[int(rng.integers(len(self.trace_pool)))]
        scale = own.mean_rate_rps() / trace.mean_rate_rps() * _log_uniform(rng, self.config.rate_scale)
        return dataclasses.replace(trace, rate_scale=scale, offset_s=float(rng.uniform(0.0, trace.period_s)))  # type: ignore[type-var]

    def _arrivals(self, arrivals: ArrivalProcess, rng: np.random.Generator) -> ArrivalProcess:
        scale = _log_uniform(rng, self.config.rate_scale)
        if isinstance(arrivals, PoissonArrivals):
            return dataclasses.replace(arrivals, rate_rps=arrivals.rate_rps * scale)
        if isinstance(arrivals, MmppArrivals):
            # Spread the state rates around their mean: burstier or calmer, same mean load.
            spread = float(rng.uniform(*self.config.burstiness))
            mean = arrivals.mean_rate_rps() / arrivals.rate_scale
            rates = [max(0.0, mean + spread * (r - mean)) for r in arrivals.rates_rps]
            return MmppArrivals(rates, list(arrivals.mean_sojourn_s), arrivals.rate_scale * scale)
        if hasattr(arrivals, "offset_s") and hasattr(arrivals, "period_s"):
            # A trace: start somewhere inside its training part when an episode fits there.
            span = self.base.duration_s * arrivals.time_warp
            room = self.config.trace_train_fraction * arrivals.period_s - span
            offset = float(rng.uniform(0.0, room)) if room > 0 else 0.0
            return dataclasses.replace(arrivals, rate_scale=arrivals.rate_scale * scale, offset_s=offset)
        return arrivals

    def sample(self, rng: np.random.Generator) -> Scenario:
        """One variation of the base scenario."""
        tenants: list[Any] = []
        for t in self.base.tenants:
            if isinstance(t, InferenceTenant):
                # The rng only serves the pool when there is one: configs without draw as before.
                pool = self.config.trace_pool
                swap = pool.probability > 0 and t.name in pool.tenants and rng.random() < pool.probability
                arrivals = self._pool_arrivals(t.arrivals, rng) if swap else self._arrivals(t.arrivals, rng)
                t = dataclasses.replace(t, arrivals=arrivals, slo_ms=t.slo_ms * _log_uniform(rng, self.config.slo_scale))
            tenants.append(t)
        if rng.random() < self.config.priority_shuffle_probability:
            inference = [i for i, t in enumerate(tenants) if isinstance(t, InferenceTenant)]
            priorities = [tenants[i].priority for i in inference]
            for i, p in zip(inference, rng.permutation(len(priorities)), strict=True):
                tenants[i] = dataclasses.replace(tenants[i], priority=priorities[p])
        gpu = self.config.gpus[int(rng.integers(len(self.config.gpus)))] if self.config.gpus else self.base.gpu
        # The reference names profiles of the base GPU; another GPU type starts empty.
        reference = self.base.reference if gpu == self.base.gpu else None
        return dataclasses.replace(self.base, tenants=tenants, gpu=gpu, reference=reference)


class FamilyEnv(gym.Env[np.ndarray, np.ndarray]):
    """``rlsched/GpuShare-v0`` on a new draw of a :class:`ScenarioFamily` every episode.

    :param family: the scenarios to draw from
    :param perf_model: ``"calibrated"``, ``"toy"`` or a model object (loaded once, shared by
        every episode's simulator)
    """

    metadata = {"render_modes": []}

    def __init__(self, family: ScenarioFamily, perf_model: str | PerformanceModelLike = "calibrated") -> None:
        self.family = family
        self.perf_model = load_performance_model(perf_model) if isinstance(perf_model, str) else perf_model
        self.env = GpuShareEnv(family.base, perf_model=self.perf_model)
        self.repair_timing = self.env.repair_timing  # kept across the episodes' environments
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Draw a scenario and start an episode of it."""
        super().reset(seed=seed)
        scenario = self.family.sample(self.np_random)
        env = GpuShareEnv(scenario, perf_model=self.perf_model)
        if env.observation_space != self.observation_space or env.action_space != self.action_space:
            raise ConfigError(scenario.source, "tenants", [t.name for t in scenario.tenants], "a randomized scenario changed the observation or action space")
        env.repair_timing = self.repair_timing
        self.env = env
        return self.env.reset(seed=int(self.np_random.integers(2**31 - 1)), options=options)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One decision interval of the current episode's scenario."""
        return self.env.step(action)

    @property
    def last_repair_ms(self) -> float:
        """Wall time of the last step's repair, ms (see :attr:`GpuShareEnv.last_repair_ms`)."""
        return self.env.last_repair_ms

    def take_repair_timing(self) -> tuple[int, float, float]:
        """The repairs' wall time since the last call, every episode's (see :meth:`GpuShareEnv.take_repair_timing`)."""
        return self.repair_timing.take()

    def action_masks(self) -> np.ndarray:
        """The current scenario's action mask (see :meth:`GpuShareEnv.action_masks`)."""
        return self.env.action_masks()
