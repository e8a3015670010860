"""``migrator-hedge``: shadows of the node replay the observed arrivals, and the node follows the leader."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest

from rlsched.agents.baselines import apply, make_policy
from rlsched.agents.baselines.hedge import (LOAD_BANDWIDTH, MIN_EVIDENCE_INTERVALS, PROFILE_INTERVALS, TRANSITION_INTERVALS, LoadEvidenceChoice, MigratorHedge,
                                           MigratorHedgeLoad, SeasonalCheck, seasonal_forecast)
from rlsched.agents.baselines.hindsight import FixedConfiguration, layout_candidates
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.workloads.arrivals import ObservedArrivals
from rlsched.workloads.tenants import InferenceTenant

TINY = str(Path(__file__).parent / "data" / "env_tiny.yaml")


def test_observed_arrivals_replay_the_logged_times_and_else_poisson_at_the_measured_rate():
    arrivals = ObservedArrivals(10.0, prior_rate_rps=50.0)
    logged = np.array([10.5, 12.0, 19.9])
    arrivals.record(100.0)  # interval 0: a rate only
    arrivals.record(0.3, logged)  # interval 1: the request log
    rng = np.random.default_rng(0)
    state = copy.deepcopy(rng.bit_generator.state)
    assert np.array_equal(arrivals.sample(10.0, 20.0, rng), logged)
    assert rng.bit_generator.state == state  # a replay draws nothing
    counts = [len(arrivals.sample(0.0, 10.0, rng)) for _ in range(200)]
    assert abs(np.mean(counts) - 1000.0) < 3 * math.sqrt(1000.0 / 200)  # Poisson, mean rate x 10 s
    later = [len(arrivals.sample(20.0, 30.0, rng)) for _ in range(200)]
    assert abs(np.mean(later) - 3.0) < 3 * math.sqrt(3.0 / 200)  # not recorded yet: the last measured rate
    fresh = [len(ObservedArrivals(10.0, prior_rate_rps=50.0).sample(0.0, 10.0, rng)) for _ in range(200)]
    assert abs(np.mean(fresh) - 500.0) < 3 * math.sqrt(500.0 / 200)  # nothing recorded: the prior rate
    assert arrivals.window_rate_rps(0.0, 20.0) == pytest.approx(50.15)
    assert arrivals.mean_rate_rps() == pytest.approx(50.15)
    assert copy.deepcopy(arrivals) is arrivals  # every shadow's simulator reads the one record
    arrivals.forget(2)
    assert not np.array_equal(arrivals.sample(10.0, 20.0, rng), logged)  # now Poisson at 0.3 req/s


@pytest.mark.parametrize("rate", [-1.0, math.nan])
def test_observed_arrivals_reject_a_bad_rate(rate):
    with pytest.raises(ValueError, match="arrival rate"):
        ObservedArrivals(10.0, 1.0).record(rate)


def test_a_shadow_of_the_running_configuration_earns_what_the_node_earned():
    """The shadow replays the node's own arrivals: under the node's configuration and seed it
    reproduces the node's episode exactly, so its score measures a what-if, not a forecast."""
    env = GpuShareEnv(TINY)
    observation, _ = env.reset(seed=3)
    hedge = MigratorHedge(profile_intervals=0)
    hedge.reset(env)
    fixed = next(s for s in hedge.shadows if isinstance(s.policy, FixedConfiguration))
    for s in hedge.shadows:  # replay the node's backend stream
        s.observation, _ = s.env.reset(seed=0, options={"configuration": env.current, "backend_seed": env.backend_seed})
        s.policy.reset(s.env)
    truncated = False
    while not truncated:
        hedge.act(observation, env)
        observation, _, _, truncated, _ = apply(env, fixed.policy.configuration)
    hedge.act(observation, env)  # replays the last interval
    assert fixed.env.objective == pytest.approx(env.objective, rel=1e-12)


def _history(shadow, rewards):
    shadow.rewards.clear()
    shadow.rewards.extend(rewards)


def test_the_node_follows_a_challenger_only_on_a_large_clear_advantage():
    env = GpuShareEnv(TINY)
    observation, _ = env.reset(seed=0)
    hedge = MigratorHedge(memory_intervals=1e9, switch_margin_intervals=2.0, switch_z=2.0, profile_intervals=0)  # no fading: plain sums
    hedge.reset(env)
    assert len(hedge.shadows) == 1 + len(layout_candidates(env))
    planner, challenger = hedge.shadows[0], hedge.shadows[-1]
    for s in hedge.shadows:
        _history(s, [0.0] * MIN_EVIDENCE_INTERVALS)
    _history(planner, [100.0] * MIN_EVIDENCE_INTERVALS)
    _history(challenger, [115.0] * MIN_EVIDENCE_INTERVALS)  # ahead by 1.8 intervals' reward: within the margin
    hedge._follow_leader()
    assert hedge.leader == 0
    _history(challenger, [400.0, -100.0] * (MIN_EVIDENCE_INTERVALS // 2))  # far ahead on average, but not clearly
    hedge._follow_leader()
    assert hedge.leader == 0
    _history(challenger, [130.0] * (MIN_EVIDENCE_INTERVALS - 1))  # clearly ahead, on too little evidence
    _history(planner, [100.0] * (MIN_EVIDENCE_INTERVALS - 1))
    hedge._follow_leader()
    assert hedge.leader == 0
    _history(challenger, [130.0] * MIN_EVIDENCE_INTERVALS)
    _history(planner, [100.0] * MIN_EVIDENCE_INTERVALS)
    hedge._follow_leader()
    assert hedge.leader == len(hedge.shadows) - 1 and hedge.report["leader_changes"] == 1
    observation, *_ = apply(env, hedge.act(observation, env))
    assert env.current == challenger.policy.configuration


def test_shadows_start_with_the_profiled_traffic_and_the_node_with_its_best_rule():
    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    hedge = MigratorHedge(profile_intervals=4, min_evidence_intervals=4)
    hedge.reset(env)
    assert all(len(s.rewards) == 4 for s in hedge.shadows)  # the tiny episode has 6 intervals: 4 profiled
    means = [np.mean(s.rewards) for s in hedge.shadows]
    assert hedge.report["profiled_leader"] == hedge.shadows[hedge.leader].name
    assert hedge.leader == 0 or means[hedge.leader] > means[0]
    assert hedge.report["leader_changes"] == 0 and hedge._transition is None


def test_a_node_without_a_daily_pattern_profiles_the_default_span_and_forecasts_nothing():
    env = GpuShareEnv(TINY)  # Poisson arrivals only
    env.reset(seed=0)
    hedge = MigratorHedge()
    hedge.reset(env)
    assert hedge.day is None
    assert all(len(s.rewards) == PROFILE_INTERVALS for s in hedge.shadows)


def test_the_seasonal_forecast_reads_the_day_before_each_coming_interval():
    rewards = np.arange(10.0)[None, :]  # intervals 0..9 kept; the next ones are 10, 11, ...
    assert seasonal_forecast(rewards, 6, 2).tolist() == [[4.0, 5.0]]
    assert seasonal_forecast(rewards, 6, 9).tolist() == [[4.0, 5.0, 6.0, 7.0, 8.0, 9.0]]  # a day ahead at most
    assert seasonal_forecast(rewards[:, -5:], 6, 3).tolist() == [[5.0, 6.0]]  # interval 4 is no longer kept
    assert seasonal_forecast(rewards[:, -3:], 6, 2).shape == (1, 0)


def test_the_day_before_is_trusted_only_where_it_forecast_the_rewards_better():
    day, rng = 24, np.random.default_rng(0)
    phase = np.sin(2 * np.pi * np.arange(4 * day) / day)
    periodic = np.stack([np.zeros(4 * day), 100 * phase + rng.normal(0, 5, 4 * day)])  # who earns more depends on the hour
    noise = np.stack([np.zeros(4 * day), rng.normal(0, 100, 4 * day)])  # bursts at random times
    assert SeasonalCheck(math.exp(-1 / 120), 480).replay(periodic, day, day)[-1]
    assert not SeasonalCheck(math.exp(-1 / 120), 480).replay(noise, day, day)[-1]
    assert SeasonalCheck(math.exp(-1 / 120), 480).replay(periodic, day, day)[:MIN_EVIDENCE_INTERVALS] == [False] * MIN_EVIDENCE_INTERVALS


def test_the_node_keeps_its_layout_when_the_day_before_says_a_burst_is_coming():
    def leader_after(season_horizon):
        env = GpuShareEnv(TINY)
        env.reset(seed=0)
        # Memory of 8 intervals: the evidence reads the last 32 (4 memories), not yesterday's burst.
        hedge = MigratorHedge(memory_intervals=8, switch_margin_intervals=0.0, switch_z=0.0, profile_intervals=0,
                              simulate_switch_cost=False, season_horizon_intervals=season_horizon)
        hedge.reset(env)
        day = 40
        hedge.day, hedge.replayed = day, 60
        hedge.season_check.errors = np.array([1.0, 0.0])  # the day before has forecast well
        # Intervals 0..59 kept: the planner earned a little more than the fixed layouts, but in
        # intervals 20..27, one day before the coming 60..67, a burst cost it dearly.
        for s in hedge.shadows:
            s.rewards = type(s.rewards)([100.0] * 60, maxlen=60)
        _history(hedge.shadows[0], [105.0] * 20 + [-500.0] * 8 + [105.0] * 32)
        hedge.leader = len(hedge.shadows) - 1
        hedge._follow_leader()
        return hedge.leader
    assert leader_after(0) == 0  # the recent past alone: the planner takes the node
    assert leader_after(20) != 0  # with the day before the next 20 intervals: the layout keeps it


def test_a_switch_costs_what_the_node_fell_short_of_its_new_leader_then_raises_the_margin():
    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    hedge = MigratorHedge(memory_intervals=1e9, switch_margin_intervals=0.0, switch_z=0.0, profile_intervals=0)
    hedge.reset(env)
    planner, challenger = hedge.shadows[0], hedge.shadows[-1]
    for s in hedge.shadows:
        _history(s, [0.0] * MIN_EVIDENCE_INTERVALS)
    _history(challenger, [10.0] * MIN_EVIDENCE_INTERVALS)
    hedge._follow_leader()
    assert hedge.leader == len(hedge.shadows) - 1 and hedge._transition == []
    for k in range(TRANSITION_INTERVALS):
        challenger.rewards.append(10.0)
        hedge._measure_switch_cost(node_reward=10.0 - 5.0 * (k < 4))  # short by 5 for 4 intervals
    assert hedge.switch_costs == [20.0] and hedge._transition is None
    # Back to the planner now needs a summed advantage above 20.
    _history(challenger, [0.0] * MIN_EVIDENCE_INTERVALS)
    _history(planner, [1.5] * MIN_EVIDENCE_INTERVALS)  # 18 in all
    hedge._follow_leader()
    assert hedge.leader == len(hedge.shadows) - 1
    _history(planner, [2.0] * MIN_EVIDENCE_INTERVALS)  # 24 in all
    hedge._follow_leader()
    assert hedge.leader == 0


def test_a_what_if_leaves_the_shadow_as_it_was_and_a_switch_is_priced_by_it():
    env = GpuShareEnv(TINY)
    observation, _ = env.reset(seed=0)
    hedge = MigratorHedge(profile_intervals=0)
    hedge.reset(env)
    for _ in range(2):  # two observed intervals
        observation, *_ = apply(env, hedge.act(observation, env))
    hedge.act(observation, env)
    planner, fixed = hedge.shadows[0], hedge.shadows[-1]
    before = (planner.env.objective, planner.env.current, planner.env.backend.simulator.time_s)
    rewards = planner.what_if(FixedConfiguration(fixed.policy.configuration), 3)
    assert len(rewards) == 3
    assert (planner.env.objective, planner.env.current, planner.env.backend.simulator.time_s) == before
    assert planner.what_if(FixedConfiguration(fixed.policy.configuration), 3) == rewards  # the same state, the same draws
    rule = FixedConfiguration(fixed.policy.configuration)
    switched = planner.what_if(rule, TRANSITION_INTERVALS)  # cut at the episode's end
    assert 0 < len(switched) < TRANSITION_INTERVALS
    expected = max(0.0, sum(fixed.what_if(rule, len(switched))) - sum(switched))
    assert hedge._simulated_switch_cost(len(hedge.shadows) - 1) == pytest.approx(expected, rel=1e-12, abs=1e-9)


def test_evidence_is_weighed_by_how_alike_the_load_was_while_that_forecasts_better():
    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    hedge = MigratorHedge(memory_intervals=1e9, switch_margin_intervals=0.0, switch_z=0.0, profile_intervals=0, load_bandwidth=0.3)
    hedge.reset(env)
    planner, challenger = hedge.shadows[0], hedge.shadows[-1]
    tenants = len(env.scenario.tenants)
    # The challenger wins by 50 at the usual load, loses by 60 at twice the load.
    calm, busy = np.ones(tenants), np.full(tenants, 2.0)
    for s in hedge.shadows:
        _history(s, [0.0] * 24)
    _history(planner, [100.0] * 24)
    _history(challenger, [40.0, 150.0] * 12)
    hedge.loads.extend([busy, calm] * 12)
    hedge.load_choice.use_load = False
    assert hedge.evidence().mean[-1] == pytest.approx(-5.0)  # by recency alone: every interval alike
    hedge._follow_leader()
    assert hedge.leader == 0
    hedge.load_choice.use_load = True
    assert hedge.evidence().mean[-1] == pytest.approx(-5.0)  # not before the node has measured its own intervals
    hedge.replayed = MIN_EVIDENCE_INTERVALS
    assert hedge.evidence().mean[-1] == pytest.approx(50.0, abs=0.1)  # now calm: a busy interval weighs e^(-tenants / 0.18)
    hedge.loads[-1] = np.full(tenants, 5.0)
    assert hedge.evidence().mean[-1] == pytest.approx(-5.0)  # a load never seen: too little alike, by recency alone
    hedge.loads[-1] = calm
    hedge._follow_leader()
    assert hedge.leader == len(hedge.shadows) - 1


def _choose(alternate_with_load: bool, intervals: int = 240) -> LoadEvidenceChoice:
    """The choice after ``intervals`` of two experts whose difference flips every 30 intervals,
    with the load (alternate_with_load) or at random (the load then explains nothing)."""
    rng = np.random.default_rng(0)
    phase = (np.arange(intervals) // 30) % 2
    load = phase if alternate_with_load else rng.integers(0, 2, intervals)
    rewards = np.stack([np.full(intervals, 100.0), 100.0 + np.where(phase == 1, 50.0, -50.0) + rng.normal(0, 5, intervals)])
    loads = load[:, None].astype(float)
    choice = LoadEvidenceChoice(math.exp(-1 / 120), 0.3)
    for n in range(1, intervals + 1):
        choice.update(rewards[:, :n], loads[:n])
    return choice


def test_the_load_weighs_the_evidence_only_where_it_forecasts_who_earns_more():
    explained = _choose(alternate_with_load=True)
    assert explained.use_load and explained.errors[1] < 0.7 * explained.errors[0]
    unexplained = _choose(alternate_with_load=False)
    assert not unexplained.use_load
    off = LoadEvidenceChoice(0.99, 0.0)
    off.update(np.ones((2, 3)), np.ones((3, 1)))
    assert not off.use_load and not off.forecasts


def test_the_load_weighted_hedge_is_an_opt_in_variant():
    assert MigratorHedge().load_bandwidth == 0.0
    variant = make_policy("migrator-hedge-load")
    assert isinstance(variant, MigratorHedgeLoad) and variant.load_bandwidth == LOAD_BANDWIDTH > 0
    assert MigratorHedgeLoad(load_bandwidth=0.2, switch_z=2.0).load_bandwidth == 0.2


def test_a_shadow_records_the_load_of_every_interval_it_replays():
    env = GpuShareEnv(TINY)
    observation, _ = env.reset(seed=0)
    hedge = MigratorHedge(profile_intervals=4, min_evidence_intervals=4)
    hedge.reset(env)
    assert len(hedge.loads) == len(hedge.shadows[0].rewards) == 4
    observation, *_ = apply(env, hedge.act(observation, env))
    hedge.act(observation, env)
    assert len(hedge.loads) == len(hedge.shadows[0].rewards) == 5
    measured = env.backend.observe()
    expected = [measured[t.name]["arrival_rate_rps"] / t.arrivals.mean_rate_rps() if isinstance(t, InferenceTenant) else measured[t.name]["active"]
                for t in env.scenario.tenants]
    np.testing.assert_allclose(hedge.loads[-1], expected)


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="memory_intervals"):
        MigratorHedge(memory_intervals=0.0)
    with pytest.raises(ValueError, match="switch_margin_intervals"):
        MigratorHedge(switch_margin_intervals=-1.0)
    with pytest.raises(ValueError, match="switch_z"):
        MigratorHedge(switch_z=-1.0)
    with pytest.raises(ValueError, match="load_bandwidth"):
        MigratorHedge(load_bandwidth=float("nan"))


def test_the_queue_hedge_runs_either_planner_on_the_node_when_it_follows_it():
    from rlsched.agents.baselines.hedge import MigratorHedgeQueue
    from rlsched.agents.baselines.planners import MigratorIlp, MigratorQueue

    # default at resnet 2,000 req/s, where the two planners disagree (priority fill or not).
    import dataclasses

    from rlsched.workloads.arrivals import PoissonArrivals
    from rlsched.workloads.scenario import load_scenario

    rates = {"resnet": 2000.0, "vgg": 160.0, "bert": 100.0, "alexnet": 220.0}
    scenario = load_scenario("default")
    scenario = dataclasses.replace(scenario, duration_s=60.0,
                                   tenants=[dataclasses.replace(t, arrivals=PoissonArrivals(rate_rps=rates[t.name])) for t in scenario.tenants])
    env = GpuShareEnv(scenario)
    observation, _ = env.reset(seed=0)
    hedge = MigratorHedgeQueue(profile_intervals=0)
    hedge.reset(env)
    assert [s.name for s in hedge.shadows[:3]] == ["planner", "planner-queue", "fixed 0"]
    decisions = []
    for k, rule in enumerate((MigratorIlp, MigratorQueue)):
        hedge.switch_to(k)
        alone = rule()
        alone.reset(env)
        decisions.append(hedge.act(observation, env))
        alone.observe(env)  # as the hedge's planner took in the interval while the other led
        assert decisions[-1] == alone.act(observation, env)
    assert decisions[0] != decisions[1]
    # The plain hedge has the one planner.
    plain = MigratorHedge(profile_intervals=0)
    plain.reset(env)
    assert [s.name for s in plain.shadows].count("planner-queue") == 0 and len(plain.planners) == 1


def test_the_groupings_hedge_also_holds_the_groupings_that_earned_most_on_the_profile():
    import random

    from rlsched.agents.baselines.hedge import PROFILED_GROUPINGS, MigratorHedgeGroupings, MigratorHedgeQueue
    from rlsched.agents.baselines.hindsight import PROFILING_SEED_OFFSET, preceding_scenario, ranking_candidates, rollout

    env = GpuShareEnv("default")
    env.reset(seed=0)
    hedge = MigratorHedgeGroupings(profile_intervals=4)
    hedge.reset(env)
    usual = layout_candidates(env)
    extra = [s.policy.configuration for s in hedge.shadows[2 + len(usual):]]
    assert len(extra) == PROFILED_GROUPINGS and hedge.report["profiled_groupings"] == [s.name for s in hedge.shadows[2 + len(usual):]]
    others = [c for c in ranking_candidates(env) if c not in usual]
    assert all(c in others for c in extra) and len({str(c) for c in extra}) == len(extra)
    # They earned at least as much on the profile as any other grouping (a sample of them).
    profile = GpuShareEnv(preceding_scenario(env.scenario, 4 * env.scenario.decision_interval_s))
    seed = env.backend_seed + PROFILING_SEED_OFFSET
    least = min(rollout(profile, seed, FixedConfiguration(c))[0] for c in extra)
    assert all(rollout(profile, seed, FixedConfiguration(c))[0] <= least + 1e-6 for c in random.Random(0).sample([c for c in others if c not in extra], 20))
    # Without a profile there is nothing to choose them on; migrator-hedge-queue holds none.
    for hedge in (MigratorHedgeGroupings(profile_intervals=0), MigratorHedgeQueue(profile_intervals=4)):
        hedge.reset(env)
        assert len(hedge.shadows) == 2 + len(usual) and hedge.report["profiled_groupings"] == []


def test_the_profiled_groupings_stop_leading_once_the_active_tenants_change():
    env = GpuShareEnv(TINY)
    observation, _ = env.reset(seed=0)
    hedge = MigratorHedge(profile_intervals=4, min_evidence_intervals=1, simulate_switch_cost=False)
    hedge.reset(env)
    grouping = len(hedge.shadows) - 1
    hedge.groupings, hedge.leader = [grouping], grouping  # as if the profile had chosen it and it led
    observation, *_ = apply(env, hedge.act(observation, env))
    hedge.act(observation, env)  # the same tenants as at the start: it keeps the node
    assert hedge.retired == [] and hedge.leader == grouping
    hedge.start_tenants = frozenset({"resnet"})  # as if bert had been deployed since the start
    observation, *_ = apply(env, env.current)
    hedge.act(observation, env)
    assert hedge.retired == [grouping] and hedge.report["groupings_retired_at"] == 2
    assert hedge.leader != grouping and hedge.report["leader_changes"] == 1
    # However much it earns from now on, it never takes the node back.
    for s in hedge.shadows:
        s.rewards.extend([1e9 if s is hedge.shadows[grouping] else 0.0] * 10)
    hedge._follow_leader()
    assert hedge.leader != grouping


def test_the_mps_hedge_holds_only_the_fixed_layouts_a_node_without_a_priority_fill_scheduler_runs():
    from rlsched.agents.baselines.hedge import MigratorHedgeMps
    from rlsched.workloads.scenario import load_scenario, without_priority_fill_scheduler

    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    candidates = layout_candidates(env)
    assert any(c.uses_priority_fill() for c in candidates) and not all(c.uses_priority_fill() for c in candidates)
    fixed = {}
    for rule in (MigratorHedge, MigratorHedgeMps):
        hedge = rule(profile_intervals=0)
        hedge.reset(env)
        fixed[rule.name] = [s.policy.configuration for s in hedge.shadows if isinstance(s.policy, FixedConfiguration)]
    assert fixed["migrator-hedge"] == candidates
    assert fixed["migrator-hedge-mps"] == [c for c in candidates if not c.uses_priority_fill()]
    # On a scenario that declares no priority-fill scheduler, the plain hedge holds the same.
    node = GpuShareEnv(without_priority_fill_scheduler(load_scenario(TINY)))
    node.reset(seed=0)
    hedge = MigratorHedge(profile_intervals=0)
    hedge.reset(node)
    assert [s.policy.configuration for s in hedge.shadows if isinstance(s.policy, FixedConfiguration)] == fixed["migrator-hedge-mps"]
    assert make_policy("migrator-hedge-mps").name == "migrator-hedge-mps"
