"""``hedge-ppo``: recorded expert streams, the expert-choice environment, its training and its deployment."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import numpy as np
import pytest

from rlsched.agents.baselines import apply, make_policy
from rlsched.agents.baselines.hedge import MIN_EVIDENCE_INTERVALS, MigratorHedge
from rlsched.agents.experts import STREAM_FORMAT, ExpertStreams, fit_switch_cost_factor, record_streams
from rlsched.agents.ppo.expert_env import EXPERT_LAYOUT, SLOTS, ExpertChoiceEnv
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.workloads.tenants import InferenceTenant

TINY = str(Path(__file__).parent / "data" / "env_tiny.yaml")


def synthetic(rewards: np.ndarray, profile: int = 20, restart_s: float = 1.0, rate_rps: float = 10.0) -> ExpertStreams:
    """Streams of given rewards (experts x profile+steps): one tenant, every switch restarts it."""
    experts, columns = rewards.shape
    steps = columns - profile
    downtime = np.full((experts, experts, 1), restart_s)
    for k in range(experts):
        downtime[k, k] = 0.0
    return ExpertStreams(source="synthetic", names=["planner"] + [f"fixed {k}" for k in range(experts - 1)], rewards=rewards,
                         profile_intervals=profile, rates_rps=np.full((steps, 1), rate_rps), downtime_s=downtime,
                         planner_downtime_s=np.full((steps, 2, experts, 1), restart_s), reward_scale=100.0,
                         calibration=[(3, 1, 2, 3.0 * restart_s * rate_rps)], node_rewards=np.zeros(steps),
                         loads=np.ones((columns, 1)))


@pytest.fixture(scope="module")
def tiny_streams() -> ExpertStreams:
    return record_streams(GpuShareEnv(TINY), seed=5, source="tiny", calibration_samples=2)


def test_recorded_streams_hold_every_shadows_rewards_and_what_a_switch_restarts(tiny_streams, tmp_path):
    s = tiny_streams
    env = GpuShareEnv(TINY)
    experts = s.rewards.shape[0]
    assert s.names[0] == "planner" and experts > 2
    assert s.steps == 6 and s.rewards.shape[1] == s.profile_intervals + 6 and s.rates_rps.shape == (6, 2)
    assert s.loads.shape == (s.profile_intervals + 6, len(env.scenario.tenants))  # the hedge's loads, the profile's included
    inference = [k for k, t in enumerate(env.scenario.tenants) if isinstance(t, InferenceTenant)]
    np.testing.assert_allclose(s.loads[s.profile_intervals:, inference] * [t.arrivals.mean_rate_rps() for t in env.scenario.inference_tenants()], s.rates_rps)
    assert np.all(s.rates_rps > 0)
    # A switch between two different fixed layouts restarts someone; staying restarts no one.
    assert all(s.downtime_s[k, k].sum() == 0 for k in range(experts))
    assert any(s.downtime_s[i, j].sum() > 0 for i in range(1, experts) for j in range(1, experts) if i != j)
    assert len(s.calibration) == 2 and all(cost >= 0 for *_, cost in s.calibration)
    assert s.reward_scale == pytest.approx(300.0 * env.scenario.decision_interval_s)
    path = tmp_path / "s.pkl"
    s.save(path)
    again = ExpertStreams.load(path)
    assert np.array_equal(again.rewards, s.rewards) and again.names == s.names


def test_a_stream_file_of_another_kind_is_refused_by_name(tmp_path):
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="bad.pkl"):
        ExpertStreams.load(bad)
    old = tmp_path / "old.pkl"  # a recording of format 2 (no day)
    fields = dataclasses.asdict(synthetic(np.zeros((3, 25))))
    fields.pop("day_intervals")
    old.write_bytes(pickle.dumps({**fields, "format": 2}))
    with pytest.raises(ValueError, match=rf"old.pkl: field 'format' is 2, expected {STREAM_FORMAT} .*delete it"):
        ExpertStreams.load(old)


def test_the_switch_cost_factor_fits_the_simulated_costs():
    factor, error = fit_switch_cost_factor([synthetic(np.zeros((3, 30)))])
    assert factor == pytest.approx(3.0) and error == pytest.approx(0.0, abs=1e-12)


def test_following_an_expert_earns_its_rewards_and_a_switch_pays_its_predicted_cost():
    rng = np.random.default_rng(0)
    rewards = rng.normal(100.0, 5.0, size=(3, 30))
    rewards[2, 20:] += 50.0  # expert 2 is far better during the episode, not in the profile
    stream = synthetic(rewards)
    env = ExpertChoiceEnv([stream], switch_cost_factor=2.0, rule=MigratorHedge())
    env.reset(seed=0)
    assert env.action_masks().tolist() == [True] * 3 + [False] * (SLOTS - 3)
    leader = env.leader
    _, reward, _, _, info = env.step(0)  # keep
    assert info["earned"] == pytest.approx(rewards[leader, 20]) and info["switch_cost"] == 0.0
    assert reward == pytest.approx((rewards[leader, 20] - rewards[0, 20]) / 100.0)  # the planner's reward is the baseline
    target_slot = next(k for k, e in enumerate(env.offered) if e != env.leader)
    target = env.offered[target_slot]
    _, _, _, _, info = env.step(target_slot)
    assert info["leader"] == target
    assert info["switch_cost"] == pytest.approx(2.0 * 1.0 * 10.0)  # factor x restart s x rate
    assert info["earned"] == pytest.approx(rewards[target, 21] - 20.0)
    truncated = False
    while not truncated:
        _, _, _, truncated, _ = env.step(0)
    assert env.step_index == stream.steps


def test_the_rule_verdict_is_a_feature_and_the_untrained_scorer_follows_it():
    """Before any PPO update the policy is the hand-built rule: a clear, large and lasting
    advantage makes the rule switch, and the scorer with its prior picks the same slot."""
    import torch
    from sb3_contrib import MaskablePPO

    from rlsched.agents.ppo.candidate_policy import CandidateScorerPolicy

    rewards = np.full((3, 200), 100.0)
    rewards[1] += np.random.default_rng(1).normal(0.0, 1.0, 200)
    rewards[2, :] = 160.0 + np.random.default_rng(2).normal(0.0, 1.0, 200)
    env = ExpertChoiceEnv([synthetic(rewards, profile=150)], switch_cost_factor=1.0, rule=MigratorHedge())
    observation, _ = env.reset(seed=0)
    assert env.leader == 0 and env.rule_choice == 2  # the profile already shows expert 2's lead
    assert env.offered[env.rule_action()] == 2
    model = MaskablePPO(CandidateScorerPolicy, env, n_steps=16, batch_size=16, seed=0,
                        policy_kwargs={"prior_weight": 4.0, "layout": EXPERT_LAYOUT})
    action, _ = model.predict(observation, deterministic=True, action_masks=env.action_masks())
    assert int(action) == env.rule_action()
    with torch.no_grad():
        logits = model.policy.mlp_extractor.forward_actor(torch.as_tensor(observation[None]))
    assert float(torch.softmax(logits.masked_fill(~torch.as_tensor(env.action_masks()), -1e8), -1)[0, env.rule_action()]) > 0.9


def write_config(path: Path, streams: Path, **overrides: object) -> Path:
    import yaml

    config = {"expert_choice": {"scenarios": [TINY], "seeds": [1], "validation_seeds": [2], "streams": str(streams), "calibration_samples": 2},
              "total_timesteps": 64, "n_envs": 2, "eval_freq": 32, "progress_bar": False,
              "ppo": {"n_steps": 16, "batch_size": 16, "n_epochs": 1}}
    for key, value in overrides.items():
        config[key] = value
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(("override", "field"), [
    ({"total_timesteps": -5}, "total_timesteps"),
    ({"expert_choice": {"scenarios": [TINY], "seeds": [1], "validation_seeds": [1]}}, "expert_choice.validation_seeds"),
    ({"expert_choice": {"scenarios": ["no-such-scenario"], "seeds": [1], "validation_seeds": [2]}}, "no-such-scenario"),
    ({"expert_choice": {"scenario": [TINY]}}, "expert_choice.scenario"),
])
def test_a_bad_training_config_names_the_file_and_field(tmp_path, override, field):
    from rlsched.agents.ppo.expert_train import load_expert_config

    path = write_config(tmp_path / "bad.yaml", tmp_path / "streams", **override)
    with pytest.raises(ConfigError) as error:
        load_expert_config(path)
    assert "bad.yaml" in str(error.value) or field == "no-such-scenario"
    assert field in str(error.value)


def test_training_exports_a_policy_the_hedge_deploys(tmp_path):
    """The pipeline end to end on the tiny node: streams, PPO updates, the learning curve,
    the exported best policy and warm start, and both deployed as ``hedge-ppo:PATH``."""
    import onnx

    from rlsched.agents.ppo.expert_train import is_expert_config, train_expert_choice

    config = write_config(tmp_path / "hedge.yaml", tmp_path / "streams")
    assert is_expert_config(config)
    run = train_expert_choice(config, tmp_path / "run")
    for name in ("policy.onnx", "warm_start.onnx", "learning_curve.png", "summary.json", "config.yaml"):
        assert (run / name).exists(), name
    assert list((run / "tb").rglob("events.out.tfevents.*"))
    meta = {p.key: p.value for p in onnx.load(str(run / "warm_start.onnx")).metadata_props}
    assert meta["kind"] == "hedge-ppo" and meta["num_timesteps"] == "0" and float(meta["switch_cost_factor"]) >= 0
    env = GpuShareEnv(TINY)
    for spec in (f"hedge-ppo:{run}", f"hedge-ppo:{run / 'warm_start.onnx'}"):
        policy = make_policy(spec)
        observation, _ = env.reset(seed=0)
        policy.reset(env)
        truncated = False
        while not truncated:
            observation, _, _, truncated, _ = apply(env, policy.act(observation, env))
        assert policy.report["steps"] == 6 and "rule_disagreements" in policy.report


def test_a_policy_file_of_another_kind_is_refused(tmp_path):
    bad = tmp_path / "other.onnx"
    bad.write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="other.onnx"):
        make_policy(f"hedge-ppo:{bad}")
    with pytest.raises(ConfigError, match="no such"):
        make_policy(f"hedge-ppo:{tmp_path / 'missing.onnx'}")


def test_hedge_ppo_needs_a_policy_file_and_says_how_to_make_one():
    with pytest.raises(ConfigError, match="rlsched train --config configs/train/hedge_ppo.yaml"):
        make_policy("hedge-ppo")


def test_the_rule_in_the_expert_env_reads_the_day_before_as_the_hedge_does():
    day, profile, steps = 20, 40, 60
    phase = np.arange(profile + steps) % day
    planner = np.where(phase < 10, 110.0, -400.0)  # every day's second half is a burst the planner loses
    rewards = np.stack([planner, np.full(len(phase), 100.0), np.zeros(len(phase))])

    def run(day_intervals):
        stream = synthetic(rewards, profile=profile)
        stream.day_intervals = day_intervals
        rule = MigratorHedge(memory_intervals=3, switch_margin_intervals=0.0, switch_z=0.0, season_horizon_intervals=10)
        env = ExpertChoiceEnv([stream], 0.0, rule)
        env.reset(options={"stream": 0})
        leaders, earned, truncated = [], 0.0, False
        while not truncated:
            _, _, _, truncated, info = env.step(env.rule_action())
            leaders.append(info["leader"])
            earned += info["earned"]
        return leaders, earned

    lagging, without = run(None)
    leaders, with_forecast = run(day)
    bursts = [t for t in range(MIN_EVIDENCE_INTERVALS + day, steps) if phase[profile + t] >= 10]
    assert any(lagging[t] == 0 for t in bursts)  # the recent past alone follows the planner into its bursts
    assert all(leaders[t] == 1 for t in bursts) and with_forecast > without
