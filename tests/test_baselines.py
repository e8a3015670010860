"""Baseline policies: one interface, named as in issue 5, feasible decisions, cited papers."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from rlsched.agents.baselines import POLICIES, apply, make_policy
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.hardware import gpu_names
from rlsched.workloads.suite import load_suite

TINY = str(Path(__file__).parent / "data" / "env_tiny.yaml")


@pytest.fixture(scope="module")
def env() -> GpuShareEnv:
    return GpuShareEnv(TINY)


@pytest.mark.parametrize("name", list(POLICIES))
def test_policy_runs_an_episode_with_feasible_configurations(env, name):
    policy = make_policy(name)
    assert policy.name == name
    observation, _ = env.reset(seed=0)
    policy.reset(env)
    total, truncated = 0.0, False
    while not truncated:
        observation, reward, terminated, truncated, info = apply(env, policy.act(observation, env))
        assert info["configuration"].problems(env.tenant_names) == [] and not terminated
        total += reward
    assert math.isfinite(total) and total == pytest.approx(env.objective)


@pytest.mark.parametrize("name", list(POLICIES))
def test_docstring_cites_its_paper_and_departures(name):
    doc = POLICIES[name].__doc__ or ""
    assert "Depart" in doc or "departs" in doc or "no paper" in doc


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ConfigError, match="'nope'.*static-equal"):
        make_policy("nope")


def test_static_policies_need_no_repair(env):
    for name in ("static-equal", "fikit", "igniter"):
        env.reset(seed=0)
        policy = make_policy(name)
        policy.reset(env)
        _, _, _, _, info = apply(env, policy.act(None, env))
        assert not info["repaired"], name


def test_igniter_gives_a_busier_tenant_at_least_as_much_share():
    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    policy = make_policy("igniter")
    policy.reset(env)
    resnet = env.scenario.tenant("resnet")
    _, low = policy.alone(resnet, 50.0)
    _, high = policy.alone(resnet, 800.0)
    assert high >= low


def _goodputs(scenario: str) -> dict[str, float]:
    from rlsched.agents.evaluation import evaluate

    result, _ = evaluate(scenario, list(POLICIES), episodes=1, seed=0, progress=False)
    return {name: m["goodput"] for name, m in result["policies"].items()}


def test_hindsight_is_at_least_every_policy_on_the_small_scenario():
    goodput = _goodputs(TINY)
    assert all(goodput["hindsight"] >= g - 1e-6 for g in goodput.values()), goodput
    assert goodput["static-best"] >= max(goodput[n] for n in ("static-equal", "fikit", "igniter", "paris-elsa")) - 1e-6


def test_hindsight_alone_seeds_the_groupings_that_earn_most_held_fixed(monkeypatch):
    from rlsched.agents.baselines import hindsight

    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    private = hindsight.replay_env(env)
    groupings = hindsight.best_groupings(private, env.backend_seed, hindsight.RANKED_SEEDS)
    assert groupings and [g for g, _ in groupings] == sorted((g for g, _ in groupings), reverse=True)
    usual = [private.repaired_configuration(c) for c in hindsight.layout_candidates(private)]
    assert all(applied[-1] not in usual for _, applied in groupings)  # other groupings than static-best's
    seeded = hindsight.Hindsight()
    seeded.reset(env)
    monkeypatch.setattr(hindsight, "RANKED_SEEDS", 0)
    without = hindsight.Hindsight()
    without.reset(env)
    # Every grouping seed is its own trajectory, and the reference is at least the best of them.
    assert seeded.report["seeds"] == without.report["seeds"] + len(groupings)
    assert seeded.objective_in_hindsight >= groupings[0][0] - 1e-6


SUITE_SCENARIOS = [s.source for name in ("train", "heldout") for s in load_suite(name).scenarios]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SUITE_SCENARIOS, ids=[Path(s).stem for s in SUITE_SCENARIOS])
def test_hindsight_is_at_least_every_policy_on_every_episode_of_every_suite_scenario(scenario):
    from rlsched.agents.evaluation import evaluate

    result, _ = evaluate(scenario, [*POLICIES, "ppo"], episodes=2, seed=0, progress=False)
    rows = {name: row for name, row in result["policies"].items() if "n/a" not in row}
    bound = rows["hindsight"]["goodput_per_episode"]
    for name, row in rows.items():
        assert all(b >= g - 1e-6 for b, g in zip(bound, row["goodput_per_episode"], strict=True)), (name, bound, row)


def test_paris_elsa_partitions_fit_the_node_so_the_repair_changes_nothing():
    from rlsched.agents.evaluation import evaluate

    result, _ = evaluate("diurnal", ["paris-elsa"], episodes=1, seed=0, progress=False)
    row = result["policies"]["paris-elsa"]
    assert row["repair_rate"] == 0.0 and row["goodput"] > 0  # before the fit: every step repaired, 0.61x static-best


def test_the_traffic_before_an_episode_replays_the_traces_earlier_with_the_tenants_active_at_its_start():
    from rlsched.agents.baselines.hindsight import day_intervals, preceding_scenario
    from rlsched.workloads.scenario import load_scenario

    suite = Path(__file__).parents[1] / "configs" / "scenarios" / "suite"
    scenario = load_scenario(suite / "heldout-deploy.yaml")  # 30 minutes; its traces replay a day per hour (time_warp 24)
    assert day_intervals(scenario) == 360
    assert day_intervals(load_scenario(Path(__file__).parent / "data" / "env_tiny.yaml")) is None  # Poisson only
    before = preceding_scenario(scenario, 3600.0)
    assert before.duration_s == 3600.0
    for now, earlier in zip(scenario.tenants, before.tenants, strict=True):
        if hasattr(getattr(now, "arrivals", None), "offset_s"):
            a = now.arrivals
            assert earlier.arrivals.offset_s == pytest.approx((a.offset_s - 3600.0 * a.time_warp) % a.period_s)
        # vgg (retired at 20 minutes) ran all day before; alexnet and the tuning job (deployed later) did not.
        assert [earlier.is_active(t) for t in (0.0, 1800.0, 3599.0)] == [now.is_active(0.0)] * 3


def test_static_profiled_chooses_on_the_previous_day_of_the_traces():
    from rlsched.agents.baselines.hindsight import PROFILING_TRACE_S, profiling_scenarios
    from rlsched.agents.evaluation import evaluate
    from rlsched.workloads.scenario import load_scenario

    scenario = load_scenario("diurnal")  # one hour = one day of its traces (time_warp 24)
    (earlier,) = profiling_scenarios(scenario)
    for now, before in zip(scenario.tenants, earlier.tenants, strict=True):
        a, b = now.arrivals, before.arrivals
        if hasattr(a, "offset_s"):
            assert b.offset_s == pytest.approx((a.offset_s - min(PROFILING_TRACE_S, a.period_s)) % a.period_s)
        else:
            assert b is a
    half_day = load_scenario(Path(__file__).parents[1] / "configs" / "scenarios" / "suite" / "train-out-of-phase.yaml")
    profiles = profiling_scenarios(half_day)  # 30 minutes = 12 trace hours: two episodes cover the day
    shifts = [(t.arrivals.offset_s - p.tenants[0].arrivals.offset_s) % t.arrivals.period_s for p in profiles for t in half_day.tenants[:1]]
    assert shifts == [PROFILING_TRACE_S, PROFILING_TRACE_S / 2]
    result, _ = evaluate("diurnal", ["static-profiled", "static-best"], episodes=1, seed=0, progress=False)
    goodput = {name: row["goodput"] for name, row in result["policies"].items()}
    assert goodput["static-profiled"] <= goodput["static-best"]  # it chose without seeing this episode


def test_static_profiled_plans_its_candidates_for_the_profiled_day_not_the_episode(monkeypatch):
    from rlsched.agents.baselines import hindsight
    from rlsched.agents.baselines.hindsight import PROFILING_TRACE_S, StaticProfiled, profiling_scenarios
    from rlsched.workloads.scenario import load_scenario

    planned_for = []
    real = hindsight.planned_candidates

    def spy(private, backend_seed):
        planned_for.append((private.scenario, backend_seed))
        return real(private, backend_seed)

    monkeypatch.setattr(hindsight, "planned_candidates", spy)
    half_day = load_scenario(Path(__file__).parents[1] / "configs" / "scenarios" / "suite" / "train-out-of-phase.yaml")
    env = GpuShareEnv(dataclasses.replace(half_day, duration_s=100.0))
    env.reset(seed=0, options={"backend_seed": 3})
    policy = StaticProfiled()
    policy.reset(env)
    profiles = profiling_scenarios(env.scenario)
    assert [seed for _, seed in planned_for] == [3 + hindsight.PROFILING_SEED_OFFSET + k for k in range(len(profiles))]
    traced = env.scenario.tenants[0]
    offsets = [scenario.tenants[0].arrivals.offset_s for scenario, _ in planned_for]
    assert offsets == [p.tenants[0].arrivals.offset_s for p in profiles]
    assert traced.arrivals.offset_s not in offsets and offsets[0] == (traced.arrivals.offset_s - PROFILING_TRACE_S) % traced.arrivals.period_s
    assert policy.configuration is not None


def test_static_best_rankings_tries_every_grouping_and_beats_one_ranking_where_it_misgroups():
    from rlsched.agents.baselines.hindsight import best_fixed_configuration, layout_candidates, ranking_candidates, replay_env
    from rlsched.agents.experts import scenario_of

    # DeepSeek-R1 c62 on default's resnet, 5 minutes: the long-run means rank vgg (heavy per
    # request) first, and every grouping that ranking gives earns less than another one.
    scenario = dataclasses.replace(scenario_of("default@resnet=configs/traces/servegen_deepseek_r1_client62.csv:1547:24"), duration_s=300.0)
    env = GpuShareEnv(scenario)
    env.reset(seed=0)
    usual, every = layout_candidates(env), ranking_candidates(env)
    assert every[:len(usual)] == usual and len(every) == len(set(map(str, every))) > 10 * len(usual)
    one_ranking, _ = best_fixed_configuration([(replay_env(env), env.backend_seed)])
    policy = make_policy("static-best-rankings")  # the search over every ranking, on the episode it is evaluated on
    policy.reset(env)
    assert policy.objective_in_hindsight > 1.2 * one_ranking


def test_static_best_slo_keeps_the_best_fixed_configuration_whose_high_priority_tenants_meet_the_target(monkeypatch):
    """``best_fixed_configuration(..., slo_target=...)``, what ``static-best-slo`` searches with:
    the best objective among the candidates whose high-priority tenants answer the target
    fraction on time; where none does, the one that answers the most on time."""
    from rlsched.agents.baselines import hindsight

    env = GpuShareEnv("default")
    env.reset(seed=0)
    first, second, third = hindsight.layout_candidates(env)[:3]
    candidates = [first, second, third]
    outcomes = [(100.0, 0.95), (90.0, 0.995), (80.0, 0.999)]  # (objective, attainment) per candidate
    attainment = {}

    def rollout(private, seed, plan):
        configuration = getattr(plan, "configuration", None)
        known = [k for k, c in enumerate(candidates) if c == configuration]
        objective, attainment["last"] = outcomes[known[0]] if known else (0.0, 0.0)  # the static baselines: nothing
        return objective, [configuration]

    monkeypatch.setattr(hindsight, "rollout", rollout)
    monkeypatch.setattr(hindsight, "high_priority_on_time", lambda private: (round(1000 * attainment["last"]), 1000))
    episodes = [(env, 0)]
    assert hindsight.best_fixed_configuration(episodes, candidates) == (100.0, first)
    assert hindsight.best_fixed_configuration(episodes, candidates, slo_target=0.99) == (90.0, second)
    outcomes[1:] = [(90.0, 0.98), (80.0, 0.985)]
    assert hindsight.best_fixed_configuration(episodes, candidates, slo_target=0.99) == (80.0, third)


MIXED_NODE = {
    "duration_s": 30, "decision_interval_s": 10,
    "tenants": [
        {"name": "resnet", "model": "resnet50", "slo_ms": 50, "priority": "high", "max_batch": 32, "batch_timeout_ms": 2, "restart_s": 5.0,
         "arrivals": {"kind": "mmpp", "rates_rps": [50, 400], "mean_sojourn_s": [20, 10]}},
        {"name": "bert", "model": "bert-base", "slo_ms": 100, "max_batch": 32, "batch_timeout_ms": 5, "restart_s": 8.0,
         "arrivals": {"kind": "poisson", "rate_rps": 80}, "active": [{"from_s": 10, "until_s": 30}]},
        {"name": "vgg", "model": "vgg19", "slo_ms": 200, "priority": "low", "max_batch": 32, "batch_timeout_ms": 5, "restart_s": 8.0,
         "arrivals": {"kind": "poisson", "rate_rps": 40}},
        {"name": "retrain-bert", "kind": "continual-learning", "serves": "bert", "model": "bert", "restart_s": 10.0,
         "ekya": {"b0": 0.5, "b1": 2.0, "b2": 0.05}, "samples_per_unit": 3000, "drift_window_s": 30},
        {"name": "tune", "kind": "best-effort", "model": "resnet50", "restart_s": 8.0},
    ]}


@pytest.mark.parametrize("gpu", gpu_names())
def test_decision_policies_run_on_every_gpu_type_of_the_catalog(tmp_path, gpu):
    """Held-out nodes use GPU types and shapes the repo's scenarios do not: every catalog
    GPU (MIG or not), two of them, inference, retraining and best-effort tenants, one
    of them deployed mid-episode. The planners and the fixed-layout baselines decide
    feasible configurations on each (an A30 with two retraining jobs once made the planner
    MILP infeasible, stop 48)."""
    import yaml

    from rlsched.agents.evaluation import run_episode
    from rlsched.workloads.scenario import load_scenario

    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"name": f"mixed-{gpu}", "gpu": gpu, "gpu_count": 2, **MIXED_NODE}))
    scenario = load_scenario(path)
    for name in ("static-best", "migrator-ilp", "migrator-pf", "fikit", "igniter", "ekya"):
        env = GpuShareEnv(scenario)
        episode = run_episode(env, name, 0)
        assert len(episode.rewards) == 3 and all(math.isfinite(r) for r in episode.rewards), name
        assert all(c.problems(env.tenant_names) == [] for c in episode.configurations), name


def test_static_best_also_tries_each_priority_fill_candidate_time_sliced_and_the_rankings_hold_them():
    from rlsched.agents.baselines.hindsight import StaticBest, StaticBestRankings, layout_candidates, planned_candidates, replay_env
    from rlsched.workloads.scenario import load_scenario, without_priority_fill_scheduler

    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    usual = layout_candidates(env)
    tried = StaticBest().candidates(env)
    filled = [c for c in usual if c.uses_priority_fill()]
    variants = usual + [c.priority_fill_time_sliced() for c in filled]
    planned = [c for c in planned_candidates(replay_env(env), env.backend_seed) if c not in variants]
    assert filled and tried == variants + planned
    assert all(c in StaticBestRankings().candidates(env) for c in tried)
    # Where priority fill already runs time-sliced, the variants would repeat it.
    node = GpuShareEnv(without_priority_fill_scheduler(load_scenario(TINY)))
    node.reset(seed=0)
    assert StaticBest().candidates(node)[:len(layout_candidates(node))] == layout_candidates(node)


def test_static_best_tries_the_planners_configurations_for_the_true_rates_with_a_layout_per_gpu():
    """On a node of two GPUs where one service needs a whole GPU, a planned candidate gives the
    GPUs different layouts, which no layout candidate does, and ``static-best`` holds one
    that earns more than every layout candidate."""
    from rlsched.agents.baselines.hindsight import best_fixed_configuration, layout_candidates, planned_candidates, replay_env
    from rlsched.workloads.scenario import load_scenario

    scenario = load_scenario("configs/scenarios/suite/train-two-gpus.yaml")
    env = GpuShareEnv(dataclasses.replace(scenario, duration_s=20 * scenario.decision_interval_s))
    env.reset(seed=0)
    planned = planned_candidates(replay_env(env), env.backend_seed)
    assert any(c.layouts[0] != c.layouts[1] for c in planned)
    assert all(c.layouts[0] == c.layouts[1] for c in layout_candidates(env))
    fixed_layouts, _ = best_fixed_configuration([(replay_env(env), env.backend_seed)], layout_candidates(env))
    with_planned, held = best_fixed_configuration([(replay_env(env), env.backend_seed)], layout_candidates(env) + planned)
    assert with_planned > fixed_layouts and held.layouts[0] != held.layouts[1]
