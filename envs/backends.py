"""What the environment drives: a node that applies configurations and reports what happened.

The environment talks to a :class:`Backend` only (reset, step, observe, memory needs), so
the same environment and policies run on the simulator (``"sim"``, :class:`SimBackend`)
and on real GPUs through NVML (``"nvml"``: :class:`rlsched.envs.node_backends.NvmlNodeBackend`,
configured with ``backend_options``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlsched.decision import Configuration
from rlsched.errors import ConfigError
from rlsched.goodput import GoodputTerms
from rlsched.simulator.node import NodeSimulator, StepResult
from rlsched.simulator.perf import PerformanceModelLike
from rlsched.simulator.run import PERF_MODELS, load_performance_model
from rlsched.workloads.scenario import Scenario, load_scenario

#: Backends :func:`make_backend` knows by name.
BACKENDS = ("sim", "nvml")


class Backend(Protocol):
    """A node of GPUs the environment configures, one decision interval per :meth:`step`."""

    scenario: Scenario
    #: the performance model behind the backend's predictions (policies plan with it)
    perf_model: PerformanceModelLike
    #: whether an episode ends at the scenario's duration (the simulator) or the node runs on (real GPUs)
    episodic: bool

    def reset(self, seed: int | None, configuration: Configuration | None) -> None:
        """Start an episode at time 0 in ``configuration`` (None: nothing deployed yet)."""
        ...

    def step(self, configuration: Configuration) -> StepResult:
        """Apply ``configuration`` and run one decision interval."""
        ...

    def observe(self) -> dict[str, dict[str, float]]:
        """Per tenant, the measurements a policy may see (see ``NodeSimulator.observation``)."""
        ...

    def arrival_times_s(self) -> dict[str, np.ndarray] | None:
        """Per inference tenant, the arrival times of the last interval, node seconds (a
        request log); None where the node keeps none (then only the rates are measured)."""
        ...

    def memory_gib(self, tenant: str, batch: int) -> float:
        """Device memory one tenant needs at that batch size, GiB."""
        ...

    @property
    def totals(self) -> GoodputTerms:
        """Goodput terms summed since :meth:`reset` (the episode objective so far)."""
        ...

    def summary(self) -> dict[str, dict[str, float | int | str]]:
        """Per tenant, totals since :meth:`reset` (see ``NodeSimulator.summary``)."""
        ...


def performance_model(perf_model: str | PerformanceModelLike) -> PerformanceModelLike:
    """``"calibrated"`` (issue 3's model), ``"toy"`` (deterministic, for tests) or a model object."""
    if not isinstance(perf_model, str):
        return perf_model
    if perf_model not in PERF_MODELS:
        raise ConfigError("environment", "perf_model", perf_model, f"allowed: {', '.join(PERF_MODELS)}, or a performance model object")
    return load_performance_model(perf_model)


def resolve_scenario(scenario: str | Path | Scenario) -> Scenario:
    """A private copy of a scenario (name of a bundled one, YAML path, or object).

    A copy because arrival processes keep state: two environments must not share one.
    """
    if isinstance(scenario, Scenario):
        return copy.deepcopy(scenario)
    if not isinstance(scenario, str | Path):
        raise ConfigError("environment", "scenario", scenario, "expected a bundled scenario name, a YAML path or a Scenario")
    return load_scenario(scenario)


class TenantMemory:
    """Each tenant's device memory at a batch size, from the performance model, cached.

    Every backend answers ``memory_gib`` the same way: the repair needs it at every step,
    so each (tenant, batch) is asked of the performance model once.
    """

    def __init__(self, scenario: Scenario, perf_model: PerformanceModelLike) -> None:
        self._gpu = scenario.gpu
        self._perf_model = perf_model
        self._models = {t.name: t.model for t in scenario.tenants}
        self._cache: dict[tuple[str, int], float] = {}

    def __call__(self, tenant: str, batch: int) -> float:
        key = (tenant, batch)
        if key not in self._cache:
            self._cache[key] = float(self._perf_model.memory_gib(self._gpu, self._models[tenant], batch))
        return self._cache[key]


class SimBackend:
    """The request-level :class:`~rlsched.simulator.node.NodeSimulator`.

    :param scenario: the node and its tenants
    :param perf_model: the performance model the simulator and the memory needs use
    """

    episodic = True

    def __init__(self, scenario: Scenario, perf_model: PerformanceModelLike) -> None:
        self.scenario = scenario
        self.perf_model = perf_model
        self.simulator = NodeSimulator(scenario, perf_model, seed=0)
        self.memory_gib = TenantMemory(scenario, perf_model)

    def reset(self, seed: int | None, configuration: Configuration | None) -> None:
        self.simulator.reset(seed, configuration)

    def step(self, configuration: Configuration) -> StepResult:
        return self.simulator.step(configuration)

    def observe(self) -> dict[str, dict[str, float]]:
        return self.simulator.observation()

    def arrival_times_s(self) -> dict[str, np.ndarray] | None:
        return self.simulator.last_arrivals_s

    @property
    def totals(self) -> GoodputTerms:
        return self.simulator.totals

    def summary(self) -> dict[str, dict[str, float | int | str]]:
        return self.simulator.summary()


def make_backend(backend: str | Backend, scenario: Scenario, perf_model: str | PerformanceModelLike, options: Mapping[str, Any] | None = None) -> Backend:
    """A backend by name (``"sim"``, ``"nvml"``) or an object that already is one.

    :param options: keyword options of the named backend (``"nvml"``: those of
        :class:`rlsched.envs.node_backends.NvmlNodeBackend`, e.g. ``nvml``, ``apply``, ``source``)
    """
    if not isinstance(backend, str):
        return backend
    if backend == "sim":
        if options:
            raise ConfigError("environment", "backend_options", dict(options), "the sim backend takes no options")
        return SimBackend(scenario, performance_model(perf_model))
    if backend == "nvml":
        from rlsched.envs.node_backends import make_node_backend  # it builds on this module (SimBackend): import late

        return make_node_backend(scenario, performance_model(perf_model), options or {})
    raise ConfigError("environment", "backend", backend, f"allowed: {', '.join(BACKENDS)}, or a Backend object")
