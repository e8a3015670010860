"""The tabulated surrogate of the candidate choice (``agents/ppo/surrogate.py``) and training on it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlsched.agents.ppo.candidate_env import CandidateChoiceEnv
from rlsched.agents.ppo.surrogate import EWMA, LAST, SurrogateChoiceEnv, SurrogateEpisode, record_episode, replay_on_simulator
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError

DATA = Path(__file__).parent / "data"
TINY = str(DATA / "env_tiny.yaml")
TWO_GPUS = str(DATA / "env_tiny_two_gpus.yaml")
SEED = 7


@pytest.fixture(scope="module", params=[TINY, TWO_GPUS], ids=["one-gpu", "two-gpus"])
def recorded(request) -> tuple[str, SurrogateEpisode]:
    return request.param, record_episode(GpuShareEnv(request.param), SEED, "test")


def test_the_tables_hold_what_the_observer_computes_at_the_first_decision(recorded):
    scenario, episode = recorded
    real = CandidateChoiceEnv(GpuShareEnv(scenario))
    real.reset(seed=SEED)
    observer = real.observer
    assert observer is not None and observer.scored is not None and episode.configurations is not None
    running = int(episode.path[0])
    assert episode.configurations[running] == real.env.current
    scored = observer.scored
    gain = scored.objective - scored.objective[0]
    for i, configuration in enumerate(scored.configurations):
        k = episode.configurations.index(configuration)  # every candidate the observer valued is in the set
        tabulated = episode.value[0, EWMA, k] - episode.cost[0, EWMA, running, k] - episode.value[0, EWMA, running]
        assert tabulated == pytest.approx(gain[i], rel=1e-5, abs=1e-3 * episode.reward_scale)


def test_replaying_the_recorded_path_on_the_simulator_gives_the_recorded_rewards(recorded):
    scenario, episode = recorded
    rewards = replay_on_simulator(GpuShareEnv(scenario), SEED, episode, list(episode.path[1:]))
    np.testing.assert_allclose(rewards, episode.reward, rtol=1e-6)


def test_the_surrogate_has_the_request_level_spaces_random_starts_and_short_episodes(recorded):
    scenario, episode = recorded
    env = SurrogateChoiceEnv([episode], episode_steps=3)
    real = CandidateChoiceEnv(GpuShareEnv(scenario))
    assert env.observation_space == real.observation_space and env.action_space == real.action_space
    starts = set()
    for seed in range(20):
        observation, _ = env.reset(seed=seed)
        start = env.t
        starts.add(start)
        assert env.observation_space.contains(observation)
        assert env.running == episode.path[env.t]
        masks = env.action_masks()
        assert masks[0] and masks.sum() == len(env.offered)
        steps, truncated = 0, False
        while not truncated:
            assert env._library_choice(env.t, env.running) == env._candidate(env.planner_choice())  # the continuations' shortcut
            planner_keeps = env._candidate(env.planner_choice()) == env.running
            observation, reward, terminated, truncated, info = env.step(env.planner_choice())
            assert not terminated and np.isfinite(reward) and info["paired_advantage"] == 0.0
            assert info["planner_keeps"] == planner_keeps
            steps += 1
        assert steps == min(3, episode.decisions - 1 - start)
    assert len(starts) > 1


def test_the_reward_is_the_models_value_at_the_intervals_rates_less_the_moves_cost(recorded):
    _, episode = recorded
    env = SurrogateChoiceEnv([episode], episode_steps=1)
    env.reset(seed=0)
    t, running = env.t, env.running
    slot = len(env.offered) - 1
    chosen = int(env.order[env.offered[slot]])
    _, reward, _, _, _ = env.step(slot)
    expected = (episode.value[t + 1, LAST, chosen] / 3 - episode.cost[t + 1, LAST, running, chosen]) / episode.reward_scale
    assert reward == pytest.approx(expected, rel=1e-6)
    assert env.running == chosen


def test_a_departures_paired_advantage_is_the_difference_of_its_two_branches(recorded):
    _, episode = recorded
    horizon = 4
    env = SurrogateChoiceEnv([episode], episode_steps=horizon, paired_horizon=horizon)
    env.reset(seed=1)
    departures = [s for s in range(len(env.offered)) if env._candidate(s) != env._candidate(env.planner_choice())]
    assert departures  # both tiny nodes offer candidates besides the planner's choice here
    t, running = env.t, env.running

    def branch(first: int) -> float:
        total, current = env._reward(t, running, first), first
        for u in range(t + 1, min(t + horizon, episode.decisions - 1)):
            nxt = env._library_choice(u, current)
            total, current = total + env._reward(u, current, nxt), nxt
        return total

    expected = branch(env._candidate(departures[0])) - branch(env._candidate(env.planner_choice()))
    _, _, _, _, info = env.step(departures[0])
    assert info["paired_advantage"] == pytest.approx(expected)


def test_tables_round_trip_and_a_bad_file_names_itself(tmp_path, recorded):
    _, episode = recorded
    episode.save(tmp_path / "e.npz")
    loaded = SurrogateEpisode.load(tmp_path / "e.npz")
    np.testing.assert_array_equal(loaded.cost, episode.cost)
    assert loaded.reward_scale == episode.reward_scale and loaded.configurations is None
    (tmp_path / "bad.npz").write_bytes(b"not an archive")
    with pytest.raises(ConfigError, match="bad.npz"):
        SurrogateEpisode.load(tmp_path / "bad.npz")
    np.savez(tmp_path / "partial.npz", value=episode.value)
    with pytest.raises(ConfigError, match="partial.npz"):
        SurrogateEpisode.load(tmp_path / "partial.npz")


@pytest.mark.parametrize("expected_ppo", [False, True], ids=["maskable-ppo", "expected-ppo"])
def test_training_on_the_surrogate_records_its_tables_and_validates_on_the_simulator(tmp_path, expected_ppo):
    from rlsched.agents.ppo.candidate_train import train_candidate_choice

    config = {"candidate_choice": {"scenarios": [TINY, TWO_GPUS], "validation_seeds": [1_000_003], "prior_weight": 2.0,
                                   "surrogate_episodes": 1, "surrogate_steps": 4, "paired_horizon": 3, "expected_ppo": expected_ppo},
              "total_timesteps": 64, "n_envs": 4, "eval_freq": 32, "progress_bar": False, "ppo": {"n_steps": 16, "batch_size": 32, "n_epochs": 1}}
    path = tmp_path / "surrogate.yaml"
    path.write_text(yaml.safe_dump(config))
    run = train_candidate_choice(path, tmp_path / "run")
    assert len(list((run / "surrogate").glob("*.npz"))) == 2
    summary = json.loads((run / "summary.json").read_text())
    assert [step for step, _ in summary["curve"]] == [0, 32, 64]
    assert len(summary["validation"]["warm_start"]) == 2  # validation episodes ran on the request-level simulator
    assert (run / "policy.onnx").exists()


@pytest.mark.parametrize(("override", "field"), [({"surrogate_episodes": -1}, "surrogate_episodes"), ({"surrogate_steps": 0}, "surrogate_steps"),
                                               ({"expected_ppo": True}, "expected_ppo")])
def test_bad_surrogate_settings_name_the_file_and_field(tmp_path, override, field):
    from rlsched.agents.ppo.candidate_train import load_candidate_config

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"candidate_choice": {"scenarios": [TINY], **override}}))
    with pytest.raises(ConfigError, match=f"bad.yaml.*candidate_choice.{field}"):
        load_candidate_config(path)


def test_every_actions_advantage_is_its_paired_advantage_and_the_planners_own_is_zero(recorded):
    _, episode = recorded
    env = SurrogateChoiceEnv([episode], episode_steps=8, paired_horizon=5, action_advantages=True)
    env.reset(seed=2)
    truncated = False
    while not truncated:
        advantages = env.slot_advantages(5)
        planned = env._candidate(env.planner_choice())
        for slot in range(len(env.offered)):
            chosen = env._candidate(slot)
            assert advantages[slot] == pytest.approx(env._paired_advantage(chosen, planned) if chosen != planned else 0.0, abs=1e-9)
        assert not advantages[len(env.offered):].any()
        slot = int(np.argmax(advantages))
        _, _, _, truncated, info = env.step(slot)
        np.testing.assert_array_equal(info["action_advantages"], advantages)
        assert info["paired_advantage"] == pytest.approx(advantages[slot])


@pytest.fixture(scope="module")
def one_gpu() -> SurrogateEpisode:
    return record_episode(GpuShareEnv(TINY), SEED, "test")


def test_expected_ppo_raises_the_policys_expected_advantage_on_the_states_it_trained_on(one_gpu):
    import torch
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlsched.agents.ppo.candidate_policy import CandidateScorerPolicy
    from rlsched.agents.ppo.expected_ppo import ExpectedPPO

    venv = DummyVecEnv([lambda: SurrogateChoiceEnv([one_gpu], episode_steps=4, paired_horizon=4, action_advantages=True) for _ in range(4)])
    model = ExpectedPPO(CandidateScorerPolicy, venv, n_steps=32, batch_size=32, n_epochs=4, learning_rate=3e-3, seed=0, device="cpu",
                        policy_kwargs={"hidden": 16, "prior_weight": 2.0, "learn_prior": False})
    model.learn(128)
    assert model.action_advantages is not None and model.action_advantages.shape == (32, 4, 12)
    advantages = torch.as_tensor(model.action_advantages.reshape(-1, 12))
    assert advantages.any()  # departures are measured (on the tiny node they all lose: the update moves mass onto the planner's choice)
    observations = torch.as_tensor(model.rollout_buffer.observations.reshape(128, -1))
    masks = torch.as_tensor(model.rollout_buffer.action_masks.reshape(128, 12)).bool()

    def expected_advantage() -> float:
        with torch.no_grad():
            return float((model._log_probs(observations, masks).exp() * advantages).sum(dim=-1).mean())

    before = expected_advantage()
    model.train()  # one more update on the same rollout
    assert expected_advantage() > before


def test_advantage_replay_trains_each_update_on_earlier_rollouts_too(one_gpu, tmp_path):
    """With ``advantage_replay`` 2, an update trains on its own rollout and the two before it,
    as they were collected; a saved and loaded model keeps the setting and starts its replay anew."""
    import torch
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlsched.agents.ppo.candidate_policy import CandidateScorerPolicy
    from rlsched.agents.ppo.expected_ppo import ExpectedPPO

    venv = DummyVecEnv([lambda: SurrogateChoiceEnv([one_gpu], episode_steps=4, paired_horizon=4, action_advantages=True) for _ in range(2)])
    model = ExpectedPPO(CandidateScorerPolicy, venv, advantage_replay=2, n_steps=8, batch_size=16, n_epochs=2, learning_rate=3e-3, seed=0,
                        device="cpu", policy_kwargs={"hidden": 16, "prior_weight": 2.0, "learn_prior": False})
    trained_on, rollouts = [], []
    original_train = model.train

    def train() -> None:
        rollouts.append(torch.as_tensor(model.rollout_buffer.observations.reshape(16, -1)).clone())
        original_train()
        trained_on.append(model.logger.name_to_value["train/states_trained_on"])

    model.train = train
    model.learn(64)  # four rollouts of 16 states
    assert trained_on == [16, 32, 48, 48]
    assert not torch.equal(rollouts[2], rollouts[3])
    # the replay holds the last two rollouts as they were collected
    assert model._replay is not None and [torch.equal(kept[0], r) for kept, r in zip(model._replay, rollouts[2:], strict=True)] == [True, True]
    model.save(tmp_path / "model")
    loaded = ExpectedPPO.load(tmp_path / "model", env=venv, device="cpu")
    assert loaded.advantage_replay == 2 and loaded._replay is None
    with pytest.raises(ValueError, match="advantage_replay"):
        ExpectedPPO(CandidateScorerPolicy, venv, advantage_replay=-1, device="cpu")


def test_on_the_tiny_node_the_surrogate_tracks_the_simulator(one_gpu):
    from rlsched.agents.ppo.surrogate import surrogate_error

    report = surrogate_error(GpuShareEnv(TINY), SEED, one_gpu, every=2, horizon=4)
    assert report["path"]["surrogate_over_simulator"] == pytest.approx(1.0, abs=0.02)
    assert report["departures"]["count"] > 0
    assert report["departures"]["sign_agreement"] >= 0.8


def test_the_benchmark_prints_its_speeds_and_the_error(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_surrogate.py"
    run = subprocess.run([sys.executable, str(script), "--scenario", TINY, "--request-steps", "3", "--surrogate-steps", "200",
                          "--ppo-steps", "64", "--n-envs", "2", "--paired-horizon", "3", "--error", "--every", "3"],
                         capture_output=True, text=True, check=True)
    report = json.loads(run.stdout)
    for key in ("request_level_steps_per_s", "surrogate_steps_per_s_paired_3", "maskable_ppo_paired_training_steps_per_s",
                "expected_ppo_training_steps_per_s", "error"):
        assert report[key], key


def test_a_config_error_raised_in_a_recording_worker_reaches_the_caller_whole():
    import pickle

    error = pickle.loads(pickle.dumps(ConfigError("scenario.yaml", "tenants[0].slo_ms", -1, "must be > 0")))
    assert isinstance(error, ConfigError) and (error.source, error.field, error.value) == ("scenario.yaml", "tenants[0].slo_ms", -1)
    assert "scenario.yaml" in str(error)
