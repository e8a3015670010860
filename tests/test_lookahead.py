"""The simulated check of reconfigurations: the model starts from the observed state only,
its forecast replays the measured rates, the check is reproducible and tells a clearly
better configuration from a clearly worse one."""

import math

import pytest

from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.hardware import parse_layout
from rlsched.simulator.lookahead import ReconfigurationCheck
from rlsched.simulator.node import NodeSimulator
from rlsched.simulator.testing import FakePerformanceModel
from rlsched.workloads.arrivals import MmppArrivals, PoissonArrivals, RateSeriesArrivals
from rlsched.workloads.scenario import Scenario
from rlsched.workloads.tenants import ContinualLearningJob, EkyaCurve, InferenceTenant

GPU = "a100-40gb"


def config(layout: str, placements: dict) -> Configuration:
    lay = parse_layout(layout, GPU)
    return Configuration((lay,), ((SharingMode.MPS,) * len(lay),), placements)


def node(duration_s: float = 100.0) -> Scenario:
    # MMPP arrivals: the real process must not leak into the model (it is replaced by the forecast).
    serve = InferenceTenant("svc", "toy-a", slo_ms=50, arrivals=MmppArrivals((50.0, 5000.0), (10.0, 10.0)), max_batch=8, queue_capacity=512, restart_s=5.0)
    other = InferenceTenant("other", "toy-b", slo_ms=50, arrivals=PoissonArrivals(100.0), max_batch=8, restart_s=5.0)
    job = ContinualLearningJob("cl", serves="svc", model="toy-c", curve=EkyaCurve(0.5, 2.0, 0.05), samples_per_unit=1000, drift_window_s=40, restart_s=5.0)
    return Scenario("lookahead", GPU, 1, duration_s, 10.0, [serve, other, job])


RUNNING = config("4g@0,3g@4", {"svc": TenantPlacement(0, 1, 100, 8), "other": TenantPlacement(0, 0, 50, 8), "cl": TenantPlacement(0, 0, 50, 8)})
#: svc moves to the larger GI (a restart), where it serves more.
LARGER = config("4g@0,3g@4", {"svc": TenantPlacement(0, 0, 100, 8), "other": TenantPlacement(0, 1, 50, 8), "cl": TenantPlacement(0, 1, 50, 8)})


def test_reset_to_observed_starts_from_the_observed_state_only():
    sim = NodeSimulator(node(), FakePerformanceModel(), seed=0)
    accuracy = EkyaCurve(0.5, 2.0, 0.05).accuracy(3.0)
    sim.reset_to_observed(7, 50.0, RUNNING, {"svc": PoissonArrivals(120.0), "other": PoissonArrivals(80.0)}, {"svc": 40}, {"svc": accuracy})
    assert sim.time_s == 50.0 and sim.observation()["svc"]["queue_length"] == 40 and sim.observation()["other"]["queue_length"] == 0
    assert sim.accuracy_of("svc") == pytest.approx(accuracy)  # Ekya's curve inverted: 3 units
    assert all(isinstance(p, PoissonArrivals) for p in sim._arrivals.values()) and sim._arrivals["svc"].rate_rps == 120.0
    result = sim.step(RUNNING)
    assert (result.t_start_s, result.t_end_s) == (50.0, 60.0)
    svc = result.tenants["svc"]
    assert 1000 <= svc.arrived <= 1400  # Poisson at 120 req/s, not the MMPP's 50 or 5000
    assert svc.queued_at_end == 40 + svc.arrived - svc.completed - svc.dropped  # the backlog was served too
    assert sim.accuracy_of("svc") > accuracy  # retraining went on from 3 units
    sim.step(RUNNING), sim.step(RUNNING)
    trained = sim.accuracy_of("svc")
    sim.step(RUNNING)  # the next drift is at t = 80 s (the window's next multiple), not at t = 40 s
    assert sim.accuracy_of("svc") < trained


def test_check_prefers_the_better_configuration_and_is_reproducible():
    check = ReconfigurationCheck(node(), FakePerformanceModel(), horizon_intervals=6, samples=2)
    busy = (20.0, {"svc": 700.0, "other": 50.0}, {"svc": 100.0, "other": 0.0}, {})  # more than the 3g GI carries
    assert check.gain(RUNNING, RUNNING, *busy) == 0.0
    gain = check.gain(LARGER, RUNNING, *busy)
    assert gain > 0.0 and check.gain(LARGER, RUNNING, *busy) == gain
    assert check.gain(RUNNING, LARGER, *busy) < 0.0  # going back is worse than staying
    # At a load the smaller GI carries, the move's restarts cost and gain nothing.
    assert check.gain(LARGER, RUNNING, 20.0, {"svc": 20.0, "other": 50.0}, {"svc": 0.0, "other": 0.0}, {}) < 0.0


def test_check_horizon_stops_at_the_episode_end_only_if_there_is_one():
    check = ReconfigurationCheck(node(duration_s=100.0), FakePerformanceModel(), horizon_intervals=6, samples=1)
    steps = []
    original = check.model.step
    check.model.step = lambda configuration: steps.append(configuration) or original(configuration)
    check.gain(LARGER, RUNNING, 80.0, {"svc": 900.0, "other": 50.0}, {}, {}, intervals_left=2)
    assert len(steps) == 2 * 2  # 2 intervals left, for each candidate
    check.gain(LARGER, RUNNING, 80.0, {"svc": 900.0, "other": 50.0}, {}, {})  # a real node runs on
    assert len(steps) == 2 * 2 + 2 * 6
    with pytest.raises(ValueError, match="samples"):
        ReconfigurationCheck(node(), FakePerformanceModel(), samples=0)
    with pytest.raises(ValueError, match="history_intervals"):
        ReconfigurationCheck(node(), FakePerformanceModel(), history_intervals=0)
    assert math.isfinite(check.gain(LARGER, RUNNING, 90.0, {"svc": 1.0, "other": 1.0}, {}, {}, intervals_left=1))


def record(check: ReconfigurationCheck, svc_rates: list[float]) -> None:
    for i, rate in enumerate(svc_rates):
        check.record(10.0 * (i + 1), {"svc": rate, "other": 50.0, "cl": 1.0})  # a non-tenant key is ignored


def test_forecast_replays_the_measured_rates_and_falls_back_to_the_smoothed_rate():
    check = ReconfigurationCheck(node(), FakePerformanceModel(), horizon_intervals=5, samples=1, history_intervals=4)
    smoothed = {"svc": 300.0, "other": 50.0}
    record(check, [1.0, 2.0])
    short = check.forecast(smoothed, 20.0, 5, seed=3)
    assert isinstance(short["svc"], PoissonArrivals) and short["svc"].rate_rps == 300.0  # 2 intervals: too few
    record(check, [1.0, 2.0, 10.0, 20.0, 30.0, 40.0])  # the first two repeat times already recorded: ignored
    assert list(check._history["svc"]) == [10.0, 20.0, 30.0, 40.0]  # the last 4 intervals only
    starts = set()
    for seed in range(20):
        replay = check.forecast(smoothed, 60.0, 5, seed)["svc"]
        assert isinstance(replay, RateSeriesArrivals)
        rates = [replay.window_rate_rps(60.0 + 10 * i, 70.0 + 10 * i) for i in range(5)]
        start = [10.0, 20.0, 30.0, 40.0].index(rates[0])
        assert rates == [[10.0, 20.0, 30.0, 40.0][(start + i) % 4] for i in range(5)]  # looped, in order, from node time 60 s
        starts.add(start)
        assert check.forecast(smoothed, 60.0, 5, seed)["svc"].rates_rps.tolist() == replay.rates_rps.tolist()  # reproducible
    assert starts == {0, 1, 2, 3}


def test_bursts_in_the_history_reach_the_check():
    """A tenant bursting one interval in four values the larger GI where a steady tenant of
    the same mean rate does not: a smoothed rate would hide the bursts."""
    verdicts = {}
    for label, svc_rates in (("steady", [200.0] * 8), ("bursty", [50.0, 50.0, 50.0, 650.0] * 2)):
        check = ReconfigurationCheck(node(), FakePerformanceModel(), horizon_intervals=6, samples=4)
        record(check, svc_rates)
        verdicts[label] = check.gain(LARGER, RUNNING, 80.0, {"svc": 200.0, "other": 50.0}, {"svc": 0.0, "other": 0.0}, {})
    assert verdicts["steady"] < 0.0 < verdicts["bursty"]
