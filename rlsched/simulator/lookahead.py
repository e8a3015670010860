"""A model-predictive check of a proposed reconfiguration, run in the calibrated simulator.

The planner values a configuration with a fluid model (:mod:`rlsched.solver.planner`): it
is optimistic about on-time service near capacity and does not price the backlog a restart
leaves. :class:`ReconfigurationCheck` asks the request-level simulator instead: from the
observed state (time, running configuration, backlog, accuracy) it runs the proposal and the
running configuration for ``horizon_intervals`` intervals on ``samples`` common random
streams and returns the mean difference of their rewards.

The coming arrivals are a forecast made of the tenant's own recent past, never of the real
future (the model starts from
:meth:`~rlsched.simulator.node.NodeSimulator.reset_to_observed`): each stream replays, from
a random start, the per-interval arrival rates measured over the last
``history_intervals`` intervals (looped; Poisson within an interval). A bursty tenant's
bursts therefore come back in the forecast in proportion to how often they came, where a
smoothed rate would hide them (an arrival model that hid them made the check refuse
changes that guard against bursts, and a short horizon made it refuse changes that pay
back slowly: README, "Draws of the training family"). A
tenant with fewer than ``MIN_HISTORY_INTERVALS`` measured intervals gets Poisson arrivals
at its smoothed (EWMA) rate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import numpy as np

from rlsched.decision import Configuration
from rlsched.simulator.node import NodeSimulator
from rlsched.simulator.perf import PerformanceModelLike
from rlsched.workloads.arrivals import ArrivalProcess, PoissonArrivals, RateSeriesArrivals
from rlsched.workloads.scenario import Scenario

#: Intervals simulated per candidate, random streams per check, and measured intervals a
#: forecast replays (chosen on training traces: README, "What was tried", rows "simulated
#: check of reconfigurations" and "check with replayed measured rates, 24 intervals").
HORIZON_INTERVALS = 24
SAMPLES = 8
HISTORY_INTERVALS = 30
#: Fewer measured intervals than this: the forecast is Poisson at the smoothed rate.
MIN_HISTORY_INTERVALS = 3


class ReconfigurationCheck:
    """Whether a proposed configuration beats keeping the running one, by simulation.

    Feed it each interval's measured arrival rates with :meth:`record`; ask it with :meth:`gain`.

    :param scenario: the node's tenants, GPU and weights
    :param perf_model: the performance model the simulator uses
    :param horizon_intervals: decision intervals simulated per candidate
    :param samples: common random streams per check (the mean is compared)
    :param history_intervals: the most recent measured intervals the forecast replays
    """

    def __init__(self, scenario: Scenario, perf_model: PerformanceModelLike, horizon_intervals: int = HORIZON_INTERVALS,
                 samples: int = SAMPLES, history_intervals: int = HISTORY_INTERVALS) -> None:
        if min(horizon_intervals, samples, history_intervals) < 1:
            raise ValueError(f"horizon_intervals, samples and history_intervals must be >= 1 "
                             f"(got {horizon_intervals}, {samples}, {history_intervals})")
        self.model = NodeSimulator(scenario, perf_model, seed=0)
        self.interval_s = float(scenario.decision_interval_s)
        self.horizon_intervals = horizon_intervals
        self.samples = samples
        self._history: dict[str, deque[float]] = {t.name: deque(maxlen=history_intervals) for t in scenario.inference_tenants()}
        self._last_recorded_s: float | None = None

    def record(self, interval_end_s: float, arrival_rates_rps: Mapping[str, float]) -> None:
        """Remember one interval's measured arrival rate per inference tenant, requests/s.

        :param interval_end_s: when the interval ended, node seconds (a second record of the
            same interval is ignored, so a caller may record on every decision)
        :param arrival_rates_rps: per inference tenant; tenants missing are not measured
        """
        if interval_end_s == self._last_recorded_s:
            return
        self._last_recorded_s = interval_end_s
        for name, rate in arrival_rates_rps.items():
            if name in self._history:
                self._history[name].append(float(rate))

    def gain(self, proposal: Configuration, running: Configuration, time_s: float, rates_rps: Mapping[str, float],
             backlog: Mapping[str, float], accuracy: Mapping[str, float], intervals_left: int | None = None) -> float:
        """Mean reward of applying ``proposal`` minus keeping ``running``, over the horizon,
        request-equivalents.

        :param time_s: the node's elapsed time, seconds (also seeds the streams: a check is reproducible)
        :param rates_rps: per inference tenant, the smoothed arrival rate, requests/s (the
            forecast of a tenant with too short a history)
        :param backlog: per inference tenant, requests waiting or in service
        :param accuracy: per served inference tenant, its model's current accuracy
        :param intervals_left: decision intervals until the episode ends, which cuts the
            horizon (None: the node runs on, as a real one does)
        """
        horizon = self.horizon_intervals if intervals_left is None else max(1, min(self.horizon_intervals, intervals_left))
        base_seed = int(round(time_s / self.interval_s)) * 1000
        differences = []
        for k in range(self.samples):
            # Both candidates see the same forecast and the same stream: only the configuration differs.
            forecast = self.forecast(rates_rps, time_s, horizon, base_seed + k)
            differences.append(self._value(proposal, running, time_s, forecast, backlog, accuracy, horizon, base_seed + k)
                               - self._value(running, running, time_s, forecast, backlog, accuracy, horizon, base_seed + k))
        return float(np.mean(differences))

    def forecast(self, rates_rps: Mapping[str, float], time_s: float, horizon: int, seed: int) -> dict[str, ArrivalProcess]:
        """One stream's coming arrivals per inference tenant, from ``time_s`` on: the
        measured history replayed from a start drawn with ``seed``, or Poisson at the
        smoothed rate while the history is short."""
        start_rng = np.random.default_rng((seed, 1))  # apart from the simulator's own stream
        processes: dict[str, ArrivalProcess] = {}
        for name, history in self._history.items():
            if len(history) < MIN_HISTORY_INTERVALS:
                processes[name] = PoissonArrivals(float(rates_rps[name]))
                continue
            start = int(start_rng.integers(len(history)))
            rates = np.roll(np.asarray(history), -start)[np.arange(horizon) % len(history)]
            processes[name] = RateSeriesArrivals(np.arange(horizon) * self.interval_s, rates, horizon * self.interval_s, offset_s=-time_s)
        return processes

    def _value(self, configuration: Configuration, running: Configuration, time_s: float, forecast: Mapping[str, ArrivalProcess],
               backlog: Mapping[str, float], accuracy: Mapping[str, float], horizon: int, seed: int) -> float:
        self.model.reset_to_observed(seed, time_s, running, forecast, backlog, accuracy)
        return sum(self.model.step(configuration).reward for _ in range(horizon))
