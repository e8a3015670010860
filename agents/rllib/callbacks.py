"""The RLlib callback that logs :mod:`rlsched.metrics` from every env runner (imports ray).

Each env runner adds every step's ``info`` to a :class:`~rlsched.metrics.MetricAggregator`
and, at the end of each ``sample()``, logs the aggregator's totals (sums; the one maximum
by max) under :data:`TOTALS_KEY`. RLlib reduces them over the runners each iteration, and the
driver turns them back into the metrics (:func:`iteration_metrics`): the same ratios of
sums as one aggregator over all steps would give.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from rlsched.metrics import MAX_TOTAL, MetricAggregator

#: Key of the totals in the env runners' metrics (``result["env_runners"][TOTALS_KEY]``).
TOTALS_KEY = "rlsched_totals"


class MetricsCallback(RLlibCallback):
    """Aggregates the step ``info`` of the runner's environments between ``sample()`` ends."""

    def __init__(self) -> None:
        super().__init__()
        self.aggregator = MetricAggregator()

    def on_episode_step(self, *, episode: Any, **kwargs: Any) -> None:
        self.aggregator.add(episode.get_infos(-1))

    def on_sample_end(self, *, env_runner: Any = None, metrics_logger: Any = None, **kwargs: Any) -> None:
        # Repair wall time is kept by the environments, not in info (see rlsched.metrics).
        env = getattr(env_runner, "env", None)
        try:
            timings = env.call("take_repair_timing") if env is not None else ()
        except AttributeError:
            timings = ()
        for timing in timings:
            self.aggregator.add_repair_timing(*timing)
        if metrics_logger is None or self.aggregator.steps == 0:
            return
        for key, value in self.aggregator.totals().items():
            metrics_logger.log_value((TOTALS_KEY, key), value, reduce="max" if key == MAX_TOTAL else "sum")
        self.aggregator.reset()


def iteration_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The :mod:`rlsched.metrics` of one training iteration's steps, from its result dict."""
    totals = result.get("env_runners", {}).get(TOTALS_KEY, {})
    return MetricAggregator.from_totals({k: float(v) for k, v in totals.items()}).summary()
