"""A model-predictive check of a proposed reconfiguration, run in the calibrated simulator.

The planner values a configuration with a fluid model (:mod:`rlsched.solver.planner`): it
is optimistic about on-time service near capacity and does not price the backlog a restart
leaves. :class:`ReconfigurationCheck` asks the request-level simulator instead: from the
observed state (time, running configuration, backlog, accuracy), with each inference
tenant's coming arrivals drawn as Poisson at its forecast (EWMA) rate, it runs the proposal
and the running configuration for ``horizon_intervals`` intervals on ``samples`` common
random streams and returns the mean difference of their rewards. The real future is never
read: the model starts from :meth:`~rlsched.simulator.node.NodeSimulator.reset_to_observed`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rlsched.decision import Configuration
from rlsched.simulator.node import NodeSimulator
from rlsched.simulator.perf import PerformanceModelLike
from rlsched.workloads.scenario import Scenario

#: Intervals simulated per candidate, and random streams per check (chosen on training
#: traces: README, "What was tried", row "simulated check of reconfigurations").
HORIZON_INTERVALS = 6
SAMPLES = 8


class ReconfigurationCheck:
    """Whether a proposed configuration beats keeping the running one, by simulation.

    :param scenario: the node's tenants, GPU and weights
    :param perf_model: the performance model the simulator uses
    :param horizon_intervals: decision intervals simulated per candidate
    :param samples: common random streams per check (the mean is compared)
    """

    def __init__(self, scenario: Scenario, perf_model: PerformanceModelLike,
                 horizon_intervals: int = HORIZON_INTERVALS, samples: int = SAMPLES) -> None:
        if horizon_intervals < 1 or samples < 1:
            raise ValueError(f"horizon_intervals and samples must be >= 1 (got {horizon_intervals}, {samples})")
        self.model = NodeSimulator(scenario, perf_model, seed=0)
        self.interval_s = float(scenario.decision_interval_s)
        self.horizon_intervals = horizon_intervals
        self.samples = samples

    def gain(self, proposal: Configuration, running: Configuration, time_s: float, rates_rps: Mapping[str, float],
             backlog: Mapping[str, float], accuracy: Mapping[str, float], intervals_left: int | None = None) -> float:
        """Mean reward of applying ``proposal`` minus keeping ``running``, over the horizon,
        request-equivalents.

        :param time_s: the node's elapsed time, seconds (also seeds the streams: a check is reproducible)
        :param rates_rps: per inference tenant, the forecast arrival rate, requests/s
        :param backlog: per inference tenant, requests waiting or in service
        :param accuracy: per served inference tenant, its model's current accuracy
        :param intervals_left: decision intervals until the episode ends, which cuts the
            horizon (None: the node runs on, as a real one does)
        """
        horizon = self.horizon_intervals if intervals_left is None else max(1, min(self.horizon_intervals, intervals_left))
        base_seed = int(round(time_s / self.interval_s)) * 1000
        differences = [self._value(proposal, running, time_s, rates_rps, backlog, accuracy, horizon, base_seed + k)
                       - self._value(running, running, time_s, rates_rps, backlog, accuracy, horizon, base_seed + k)
                       for k in range(self.samples)]
        return float(np.mean(differences))

    def _value(self, configuration: Configuration, running: Configuration, time_s: float, rates_rps: Mapping[str, float],
               backlog: Mapping[str, float], accuracy: Mapping[str, float], horizon: int, seed: int) -> float:
        self.model.reset_to_observed(seed, time_s, running, dict(rates_rps), dict(backlog), dict(accuracy))
        return sum(self.model.step(configuration).reward for _ in range(horizon))
