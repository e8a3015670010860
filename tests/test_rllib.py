"""The RLlib engine (``rlsched train --engine rllib``): config checks, the missing-extra
error, the Dict-observation env and the metric totals run without ray; the tiny training
run, its TensorBoard metrics and the ONNX parity need the extra (marked ``rllib``, skipped
without ray; ``make test-distributed`` installs it and runs them)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlsched.agents.rllib.config import RllibTrainConfig, load_rllib_config, rllib_config_from_dict
from rlsched.cli.main import main
from rlsched.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY = str(Path(__file__).parent / "data" / "env_tiny.yaml")
#: A few iterations of a tiny network on the tiny scenario: 2 iterations of 2 x 24 steps,
#: sampled by one remote env runner (so the metrics cross processes, as on a cluster).
TINY_RUN = {
    "scenario": TINY, "eval_scenario": TINY, "total_timesteps": 96, "n_envs": 2, "vec_env": "dummy", "max_episode_steps": 6,
    "normalize_obs": False, "normalize_reward": False, "checkpoint_freq": 48, "progress_bar": False,
    "ppo": {"n_steps": 24, "batch_size": 16, "n_epochs": 2, "net_arch": [8]},
    "rllib": {"num_cpus": 2, "num_env_runners": 1},
}
#: Names the run must log exactly as the SB3 engine does.
SAME_AS_SB3 = {"goodput/total", "goodput/goodput", "goodput/slo_penalty", "goodput/reconfiguration_cost", "slo/attainment",
               "slo/attainment_high", "slo/attainment_normal", "reconfig/rate", "reconfig/restarts_per_step", "repair/rate",
               "repair/fallback_rate", "repair/ms_mean", "repair/ms_max", "perf/steps_per_s", "rollout/ep_rew_mean", "rollout/ep_len_mean",
               "train/value_loss", "train/policy_gradient_loss", "train/entropy_loss"}


def _write(tmp_path: Path, config: dict, name: str = "rllib.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


# ---------------------------------------------------------------- without ray
def test_shipped_rllib_config_loads_and_matches_the_default_hyper_parameters():
    from rlsched.agents.ppo.config import load_config

    config = load_rllib_config(ROOT / "configs" / "train" / "rllib_ppo.yaml")
    default = load_config(ROOT / "configs" / "train" / "ppo_default.yaml")
    assert isinstance(config, RllibTrainConfig) and config.rllib.address == "" and config.rllib.num_env_runners == 1
    assert config.ppo == default.ppo and config.randomization == default.randomization and config.scenario == default.scenario


#: The least a valid RLlib config must set (the SB3 defaults normalize; RLlib cannot).
VALID = {"normalize_obs": False, "normalize_reward": False}


@pytest.mark.parametrize(("raw", "field", "reason"), [
    ({"rllib": {"num_env_runner": 2}}, "rllib.num_env_runner", "unknown field"),
    ({"rllib": {"num_env_runners": -1}}, "rllib.num_env_runners", ">= 0"),
    ({"rllib": {"reward_scale": 0}}, "rllib.reward_scale", "> 0"),
    ({"rllib": {"address": 6379}}, "rllib.address", "expected a string"),
    ({"normalize_obs": True}, "normalize_obs", "does not normalize"),
    ({"normalize_reward": True}, "normalize_reward", "reward_scale"),
    ({"pretrain": {"teacher": "static-equal"}}, "pretrain.teacher", "SB3-only"),
])
def test_bad_rllib_config_names_file_field_and_value(raw, field, reason):
    with pytest.raises(ConfigError) as caught:
        rllib_config_from_dict({**VALID, **raw}, "my.yaml")
    assert caught.value.source == "my.yaml" and caught.value.field == field and reason in caught.value.reason


def test_cli_rllib_bad_config_exits_2(tmp_path, capsys):
    # Checked before ray is needed: reported the same with or without the extra.
    bad = _write(tmp_path, {**TINY_RUN, "rllib": {"num_cpu": 1}})
    assert main(["train", "--engine", "rllib", "--config", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert "rllib.num_cpu" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_missing_ray_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    assert main(["train", "--engine", "rllib", "--config", str(_write(tmp_path, TINY_RUN)), "--out", str(tmp_path / "r")]) == 2
    assert "pip install 'rlsched[distributed]'" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_address_needs_the_rllib_engine(tmp_path, capsys):
    assert main(["train", "--config", str(ROOT / "configs" / "train" / "ppo_default.yaml"), "--out", str(tmp_path / "r"), "--address", "auto"]) == 2
    assert "--engine rllib" in capsys.readouterr().err


def test_metric_totals_of_parallel_spans_combine_into_the_whole_spans_metrics():
    from rlsched.envs.gpushare import GpuShareEnv
    from rlsched.metrics import MAX_TOTAL, MetricAggregator

    env = GpuShareEnv(TINY, perf_model="toy")
    env.reset(seed=0)
    infos = [env.step(env.action_space.sample())[4] for _ in range(6)]
    whole, left, right = MetricAggregator(), MetricAggregator(), MetricAggregator()
    for i, info in enumerate(infos):
        whole.add(info).add_repair_timing(1, i + 1.0, i + 1.0)
        (left if i % 2 else right).add(info).add_repair_timing(1, i + 1.0, i + 1.0)
    a, b = left.totals(), right.totals()
    merged = {k: max(a.get(k, 0.0), b.get(k, 0.0)) if k == MAX_TOTAL else a.get(k, 0.0) + b.get(k, 0.0) for k in {*a, *b}}
    assert MetricAggregator.from_totals(merged).summary() == pytest.approx(whole.summary())
    assert (whole.summary()["repair/ms_mean"], whole.summary()["repair/ms_max"]) == (3.5, 6.0)
    assert MetricAggregator.from_totals(whole.totals()).totals() == whole.totals()


def test_masked_dict_env_carries_the_mask_and_scales_the_reward():
    import gymnasium as gym

    from rlsched.agents.rllib.env import MaskedDictEnv
    from rlsched.envs.gpushare import GpuShareEnv

    raw, wrapped = GpuShareEnv(TINY, perf_model="toy"), MaskedDictEnv(GpuShareEnv(TINY, perf_model="toy"), reward_scale=1e-3)
    obs, _ = wrapped.reset(seed=3)
    raw_obs, _ = raw.reset(seed=3)
    assert isinstance(wrapped.observation_space, gym.spaces.Dict) and wrapped.observation_space.contains(obs)
    assert np.array_equal(obs["observations"], raw_obs) and np.array_equal(obs["action_mask"], raw.action_masks().astype(np.float32))
    action = wrapped.action_space.sample()
    obs, reward, _, _, info = wrapped.step(action)
    _, raw_reward, _, _, raw_info = raw.step(action)
    assert reward == pytest.approx(raw_reward * 1e-3) and info["goodput/total"] == raw_info["goodput/total"]
    assert wrapped.observation_space.contains(obs)


# ---------------------------------------------------------------- with ray (extra "distributed")
@pytest.fixture(scope="module")
def rllib_run(tmp_path_factory):
    """One tiny RLlib PPO run (toy performance model, local Ray, one remote env runner)."""
    pytest.importorskip("ray.rllib")
    from rlsched.agents.rllib.train import train_rllib

    tmp = tmp_path_factory.mktemp("rllib")
    return train_rllib(_write(tmp, TINY_RUN), tmp / "run", perf_model="toy")


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (run / "tb").glob("rllib_*")
    accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


@pytest.mark.rllib
def test_tiny_rllib_run_reports_steps_returns_and_the_sb3_metric_names(rllib_run):
    scalars = _scalars(rllib_run)
    assert SAME_AS_SB3 <= set(scalars), SAME_AS_SB3 - set(scalars)
    steps = [s for s, _ in scalars["goodput/total"]]
    assert len(steps) == 2 and steps[-1] >= TINY_RUN["total_timesteps"]  # two iterations of 2 x 24 steps
    assert [v for _, v in scalars["rllib/env_runners/num_env_steps_sampled_lifetime"]] == pytest.approx([float(s) for s in steps])
    assert all(v == 6.0 for _, v in scalars["rollout/ep_len_mean"])  # episodes truncated at max_episode_steps
    assert all(0.0 <= v <= 1.0 for tag in ("slo/attainment", "slo/attainment_high", "reconfig/rate", "repair/rate") for _, v in scalars[tag])
    assert all(v > 0 for _, v in scalars["perf/steps_per_s"])
    # The logged return is unscaled: an episode's Goodput, i.e. ~6 steps of goodput/total.
    per_step = np.mean([v for _, v in scalars["goodput/total"]])
    assert np.mean([v for _, v in scalars["rollout/ep_rew_mean"]]) == pytest.approx(6 * per_step, rel=0.5)
    for name in ("config.yaml", "policy.onnx", "checkpoint", "checkpoints/rllib_48_steps"):
        assert (rllib_run / name).exists(), name


@pytest.mark.rllib
def test_rllib_onnx_export_matches_the_modules_masked_argmax(rllib_run, random_observations_and_masks):
    import torch
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.rl_module import RLModule

    from rlsched.agents.onnx_policy import OnnxPolicy
    from rlsched.agents.rllib.train import FINAL_CHECKPOINT, MODULE_IN_CHECKPOINT

    policy = OnnxPolicy.load(rllib_run / "policy.onnx")
    module = RLModule.from_checkpoint(str((rllib_run / FINAL_CHECKPOINT / MODULE_IN_CHECKPOINT).resolve()))
    obs, masks, starts = random_observations_and_masks(policy.obs_dim, policy.nvec)
    with torch.no_grad():
        batch = {Columns.OBS: {"observations": torch.from_numpy(obs), "action_mask": torch.from_numpy(masks.astype(np.float32))}}
        logits = module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS].numpy()
    expected = np.stack([chunk.argmax(axis=1) for chunk in np.split(logits, np.cumsum(policy.nvec)[:-1], axis=1)], axis=1)
    assert np.array_equal(policy.act(obs, masks), expected)
    assert np.take_along_axis(masks, starts + policy.act(obs, masks), axis=1).all()  # never a masked level
    assert policy.metadata["engine"] == "rllib"


@pytest.mark.rllib
def test_rllib_policy_evaluates_like_a_baseline(rllib_run, tmp_path):
    import json

    out = tmp_path / "eval.json"
    spec = f"ppo:{rllib_run / 'policy.onnx'}"
    assert main(["eval", "--scenario", TINY, "--policies", spec, "--json", str(out), "--no-progress", "--perf-model", "toy"]) == 0
    assert json.loads(out.read_text())["policies"][spec]["goodput"] is not None


@pytest.mark.rllib
def test_export_policy_cli_exports_an_rllib_runs_checkpoints(rllib_run, tmp_path):
    from rlsched.agents.onnx_policy import OnnxPolicy

    final, early = tmp_path / "final.onnx", tmp_path / "early.onnx"
    assert main(["export-policy", "--run", str(rllib_run), "--out", str(final)]) == 0
    assert main(["export-policy", "--run", str(rllib_run), "--out", str(early), "--which", "48"]) == 0
    assert main(["export-policy", "--run", str(rllib_run), "--which", "7"]) == 2
    shipped, again = OnnxPolicy.load(rllib_run / "policy.onnx"), OnnxPolicy.load(final)
    obs = np.random.default_rng(1).random((200, shipped.obs_dim), dtype=np.float32)
    assert np.array_equal(shipped.act(obs), again.act(obs)) and OnnxPolicy.load(early).metadata["source"] == "checkpoints/rllib_48_steps"
