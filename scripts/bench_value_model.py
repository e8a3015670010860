"""Prediction error of the planner's value model against the request-level simulator.

Runs a scenario (optionally with ``--trace`` overrides) under a configuration that
alternates every ``--switch-every`` intervals between the scenario's reference
configuration and the MPS layout of the hindsight portfolio the planner values most at the
tenants' mean rates (so that restarts, and
the backlog they leave, are part of what is predicted). Before each interval it predicts,
per inference tenant, the interval's Goodput (on-time x accuracy x weight minus the SLO
penalty, :func:`rlsched.goodput.goodput_terms`) from what the planner sees then: the
smoothed rate plus the backlog spread over the interval, and the downtime the simulator
then charges the tenant (the downtime model itself is not what is measured). The models:

- ``steady``: the fluid model at the mean rate (rate variation 0), a restart costing only
  the requests arriving while down (the planner before the burst-aware value model);
- ``burst-aware``: the spread of the recent forecast errors
  (:func:`rlsched.agents.baselines.planners.forecast_spread`) and the backlog a restart
  leaves drained at the option's capacity (:meth:`Planner.restart_loss`);
- ``queue``: ``migrator-queue``'s valuation before stop 66 (:func:`~rlsched.agents.baselines.planners.queue_planner`):
  the forecast spread as ``burst-aware``, the queueing tail near capacity instead of the
  linear overload loss, each tenant's arrival dispersion as its request log measures it
  (:func:`~rlsched.agents.baselines.planners.measured_arrival_dispersion`), and an MPS share
  valued against as many co-runners as its GI holds; a restart priced as its planner prices it;
- ``queue-fitted``: ``migrator-queue``'s valuation now: ``queue`` with the dispersion
  fitted to the on-time fractions measured so far (:class:`~rlsched.agents.baselines.planners.DispersionFit`)
  and the spread capped at the highest rate measured over its window where the rate is not
  rising (:func:`~rlsched.agents.baselines.planners.rate_ceilings`);
- ``queue-drained``: ``queue-fitted`` with each tenant's queue valued by how long the option
  takes to drain it (the planner's ``backlog_drain``,
  :meth:`~rlsched.solver.planner.Planner.backlog_late_requests`), not spread over the
  interval, without the charge past the interval that the planner adds (screened at stops 71
  and 72, not kept: docs/planner-bursts.md).

Prints, per model, the relative mean absolute error (sum |predicted - simulated| / sum
|simulated| over tenant-intervals), the bias (sum (predicted - simulated) / sum
|simulated|), and the same over the intervals with a restart.

    python scripts/bench_value_model.py                       # bursty and steady scenarios, seed 0
    python scripts/bench_value_model.py --scenario default --trace resnet=configs/traces/azure_llm_conv_timestamps.csv:90
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import deque

import numpy as np

from rlsched.agents.baselines.base import observed_load
from rlsched.agents.baselines.hindsight import layout_candidates
from rlsched.decision import SharingMode
from rlsched.agents.baselines.planners import (DispersionFit, forecast_spread, measured_arrival_dispersion, queue_planner, rate_ceilings,
                                               record_residuals)
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.simulator.lookahead import HISTORY_INTERVALS
from rlsched.solver.planner import Planner
from rlsched.workloads.scenario import load_scenario, with_trace_overrides


def measure(scenario_name: str, traces: list[str], seed: int, duration_s: float | None, switch_every: int) -> dict[str, dict[str, float]]:
    """Per model (``steady``, ``burst-aware``, ``queue``, ``queue-fitted``, ``queue-drained``): relative MAE and
    bias, all intervals and restart intervals."""
    scenario = with_trace_overrides(load_scenario(scenario_name), traces)
    if duration_s is not None:
        scenario = dataclasses.replace(scenario, duration_s=duration_s)
    env = GpuShareEnv(scenario)
    env.reset(seed=seed)
    planner = Planner(scenario, env.backend.perf_model, env.backend.memory_gib, restart_backlog=True)
    queue, fitted = queue_planner(env), queue_planner(env)
    # One interval's value: the drain past it is a planning charge, not this interval's Goodput.
    fitted.backlog_horizon_s = 0.0
    names = [t.name for t in scenario.inference_tenants()]
    fit = DispersionFit(names)
    measured_rps: dict[str, deque[float]] = {name: deque(maxlen=HISTORY_INTERVALS) for name in names}
    means = {t.name: t.arrivals.mean_rate_rps() for t in scenario.inference_tenants()}
    reference = scenario.reference or planner.plan(means).configuration
    others = [c for c in layout_candidates(env) if c.layouts != reference.layouts and SharingMode.PRIORITY_FILL not in c.modes[0]]
    alternative = max(others, key=lambda c: planner.evaluate(c, means)[0])
    residuals: dict[str, deque[float]] = {t.name: deque(maxlen=HISTORY_INTERVALS) for t in scenario.inference_tenants()}
    rows: list[tuple[str, float, float, bool]] = []  # (model, predicted, simulated, restarted)
    step, truncated = 0, False
    while not truncated:
        configuration = reference if (step // switch_every) % 2 == 0 else alternative
        rates, backlog, accuracy = observed_load(env)
        window = planner.forecast(rates, backlog)
        spread = forecast_spread(residuals)
        steady = planner.configuration_values(configuration, window, accuracy)
        bursty = planner.configuration_values(configuration, window, accuracy, spread)
        queued = queue.configuration_values(configuration, window, accuracy, spread)
        queued_fitted = fitted.configuration_values(configuration, window, accuracy, spread)
        arrivals = planner.forecast(rates)  # the drain values the queue: no share of the interval's rate
        fitted.backlog_drain, fitted.queued_requests = True, backlog
        queued_drained = fitted.configuration_values(configuration, arrivals, accuracy, spread)
        fitted.backlog_drain = False
        _, _, _, truncated, _ = env.step_configuration(configuration)
        measured = env.backend.observe()
        record_residuals(residuals, rates, measured)
        queue.arrival_dispersion = measured_arrival_dispersion(env.backend.arrival_times_s(), queue.arrival_dispersion)
        result = env.backend.simulator._last
        started_s = env.backend.simulator.time_s - scenario.decision_interval_s
        downtime = {c.tenant: c.downtime_s for c in env.backend.simulator.changes if c.t_s == started_s}
        # What migrator-queue takes in after an interval (MigratorQueue._interval_rates).
        fit.record(fitted, configuration, measured, {name for name, down in downtime.items() if down > 0.0})
        fitted.arrival_dispersion = fit.dispersion(queue.arrival_dispersion)
        fitted.rate_ceiling_rps = rate_ceilings(measured_rps, residuals, measured)
        for t in scenario.inference_tenants():
            st = result[t.name]
            if step == 0:
                continue  # every tenant starts: not a prediction the planner makes
            simulated = st.terms.goodput - st.terms.slo_penalty
            p = configuration.placements[t.name]
            layout = configuration.layouts[p.gpu_index]
            profile = layout.instances[p.instance_index].profile if len(layout) else None
            down = downtime.get(t.name, 0.0)
            # Each model prices a restart as its planner does: steady without the backlog it
            # leaves, burst-aware with it, queue as migrator-queue's planner is configured.
            for model, value, pricing, drain, rates_rps in (
                    ("steady", steady[t.name], planner, None, window),
                    ("burst-aware", bursty[t.name], planner, planner.drain(t, profile, float(p.mps_pct), p.batch_size), window),
                    ("queue", queued[t.name], queue, queue.drain(t, profile, float(p.mps_pct), p.batch_size), window),
                    ("queue-fitted", queued_fitted[t.name], fitted, fitted.drain(t, profile, float(p.mps_pct), p.batch_size), window),
                    ("queue-drained", queued_drained[t.name], fitted, fitted.drain(t, profile, float(p.mps_pct), p.batch_size), arrivals)):
                loss = pricing.restart_loss(t, down, value, rates_rps, drain) if down > 0 else 0.0
                rows.append((model, value - loss, simulated, down > 0))
        step += 1
    out: dict[str, dict[str, float]] = {}
    for model in ("steady", "burst-aware", "queue", "queue-fitted", "queue-drained"):
        pred = np.array([r[1] for r in rows if r[0] == model])
        sim = np.array([r[2] for r in rows if r[0] == model])
        restart = np.array([r[3] for r in rows if r[0] == model])
        scale = np.abs(sim).sum()
        out[model] = {
            "relative_mae": float(np.abs(pred - sim).sum() / scale),
            "bias": float((pred - sim).sum() / scale),
            "restart_relative_mae": float(np.abs(pred - sim)[restart].sum() / max(np.abs(sim[restart]).sum(), 1e-9)) if restart.any() else float("nan"),
            "restart_intervals": float(restart.sum()),
            "tenant_intervals": float(pred.size),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", action="append", help="scenario name or file (repeatable; default: bursty and steady)")
    parser.add_argument("--trace", action="append", default=[], metavar="TENANT=FILE[:SCALE[:WARP]]", help="trace override for every --scenario")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--duration-s", type=float, default=None, help="simulated seconds (default: the scenario's)")
    parser.add_argument("--switch-every", type=int, default=30, help="intervals between configuration switches")
    args = parser.parse_args()
    print(f"{'scenario':<40} {'model':<13} {'rel. MAE':>9} {'bias':>8} {'restart MAE':>12} {'restarts':>9} {'samples':>8}")
    for name in args.scenario or ["bursty", "steady"]:
        label = name + (" " + " ".join(args.trace) if args.trace else "")
        for model, m in measure(name, args.trace, args.seed, args.duration_s, args.switch_every).items():
            print(f"{label[-40:]:<40} {model:<13} {m['relative_mae']:>9.3f} {m['bias']:>+8.3f} {m['restart_relative_mae']:>12.3f} {m['restart_intervals']:>9.0f} {m['tenant_intervals']:>8.0f}")


if __name__ == "__main__":
    main()
