"""PPO training: config checks, the run folder, TensorBoard metrics, resume, ONNX parity,
domain randomization, the ppo policies of ``rlsched eval``, and the shipped policy."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlsched.agents.ppo.config import RandomizationConfig, TrainConfig, config_from_dict, load_config
from rlsched.cli.main import main
from rlsched.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY = str(Path(__file__).parent / "data" / "env_tiny.yaml")
#: A few hundred steps of a tiny network on the tiny scenario, with a short warm start.
SMOKE = {
    "scenario": TINY, "eval_scenario": TINY, "total_timesteps": 256, "n_envs": 2, "vec_env": "dummy", "max_episode_steps": 6,
    "eval_freq": 128, "checkpoint_freq": 128, "progress_bar": False,
    "ppo": {"n_steps": 64, "batch_size": 64, "n_epochs": 2, "net_arch": [8]},
    "pretrain": {"teacher": "paris-elsa", "episodes": 1, "epochs": 2, "dagger_iterations": 1, "dagger_episodes": 1},
}
CUSTOM_SCALARS = {"goodput/total", "goodput/goodput", "goodput/slo_penalty", "slo/attainment", "slo/attainment_high", "slo/attainment_normal",
                  "reconfig/rate", "repair/rate", "repair/ms_mean", "perf/steps_per_s", "eval/goodput/total", "eval/repair/ms_mean", "eval/slo/attainment_high",
                  "pretrain/accuracy"}


def _write(tmp_path: Path, config: dict, name: str = "smoke.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One smoke training run (toy performance model), shared by the tests that read it."""
    from rlsched.agents.ppo.train import train

    tmp = tmp_path_factory.mktemp("train")
    return train(_write(tmp, SMOKE), tmp / "run", perf_model="toy")


# ---------------------------------------------------------------- config
def test_shipped_training_configs_load():
    from rlsched.agents.ppo.candidate_train import is_candidate_config, load_candidate_config
    from rlsched.agents.ppo.expert_train import is_expert_config, load_expert_config
    from rlsched.agents.rllib.config import RllibTrainConfig

    for path in (ROOT / "configs" / "train").glob("*.yaml"):
        if is_expert_config(path):  # hedge-ppo's own kind of config
            assert load_expert_config(path).total_timesteps > 0
            continue
        if is_candidate_config(path):  # candidate-ppo's own kind of config
            assert load_candidate_config(path).total_timesteps > 0
            continue
        config = load_config(path, RllibTrainConfig if path.name.startswith("rllib_") else TrainConfig)
        # Training does something: PPO steps, or a warm start (the default ships one alone).
        assert (config.total_timesteps > 0 or config.pretrain.teacher) and config.to_dict() == config_from_dict(config.to_dict(), cls=type(config)).to_dict()  # round-trips


@pytest.mark.parametrize(("raw", "field", "reason"), [
    ({"n_stepz": 3}, "n_stepz", "unknown field"),
    ({"ppo": {"gamma": 1.5}}, "ppo.gamma", "within [0, 1]"),
    ({"n_envs": 0}, "n_envs", "> 0"),
    ({"total_timesteps": -1}, "total_timesteps", ">= 0"),
    ({"total_timesteps": 0}, "total_timesteps", "name a pretrain.teacher"),
    ({"vec_env": "ray"}, "vec_env", "allowed: subproc, dummy"),
    ({"ppo": {"net_arch": "64"}}, "ppo.net_arch", "expected a list"),
    ({"progress_bar": "yes"}, "progress_bar", "true or false"),
    ({"randomization": {"rate_scale": [2.0, 1.0]}}, "randomization.rate_scale", "low <= high"),
    ({"randomization": {"trace_pool": {"probability": 1.5}}}, "randomization.trace_pool.probability", "within [0, 1]"),
    ({"randomization": {"trace_pool": {"time_warp": 0}}}, "randomization.trace_pool.time_warp", "> 0"),
    ({"randomization": {"trace_pool": {"files": "a.csv"}}}, "randomization.trace_pool.files", "expected a list"),
    ({"pretrain": {"teacher": "nope"}}, "pretrain.teacher", "allowed"),
    ({"n_envs": 1, "ppo": {"n_steps": 8, "batch_size": 64}}, "ppo.batch_size", "n_steps x n_envs"),
])
def test_bad_config_names_file_field_and_value(raw, field, reason):
    with pytest.raises(ConfigError) as caught:
        config_from_dict(raw, "my.yaml")
    assert caught.value.source == "my.yaml" and caught.value.field == field and reason in caught.value.reason


def test_cli_train_bad_config_exits_2(tmp_path, capsys):
    assert main(["train", "--config", str(_write(tmp_path, {"ppo": {"lr": 1}})), "--out", str(tmp_path / "r")]) == 2
    assert "ppo.lr" in capsys.readouterr().err


# ---------------------------------------------------------------- metrics
def test_aggregated_attainment_is_a_ratio_of_sums():
    from rlsched.metrics import MetricAggregator, step_metrics

    base = {"goodput/total": 1.0, "repaired": True, "reconfigured": False, "restarted_tenants": []}
    a = {**base, "slo_counts": {"high": {"on_time": 9, "decided": 10}}}
    b = {**base, "goodput/total": 3.0, "slo_counts": {"high": {"on_time": 0, "decided": 90}, "low": {"on_time": 5, "decided": 10}}}
    summary = MetricAggregator().add(a).add(b).add({"layout": ()}).summary(wall_s=0.5)
    assert summary["slo/attainment_high"] == pytest.approx(9 / 100)  # not the mean of 0.9 and 0.0
    assert summary["slo/attainment"] == pytest.approx(14 / 110) and "slo/attainment_normal" not in summary
    assert summary["goodput/total"] == 2.0 and summary["repair/rate"] == 1.0 and summary["perf/steps_per_s"] == 4.0
    assert step_metrics(a)["slo/attainment_high"] == 0.9 and step_metrics({}) == {}


def test_repair_wall_time_is_aggregated_from_beside_info():
    from rlsched.metrics import MetricAggregator, RepairTiming, step_metrics

    info = {"goodput/total": 1.0, "repaired": False}
    assert "repair/ms_mean" not in MetricAggregator().add(info).summary()  # not timed: not reported as zero
    timing = RepairTiming()
    for ms in (1.0, 5.0, 3.0):
        timing.add(ms)
    assert timing.take() == (3, 9.0, 5.0) and timing.take() == (0, 0.0, 0.0)
    # Two environments' timings over four steps: the mean is per timed repair.
    summary = MetricAggregator().add(info).add(info).add(info).add(info).add_repair_timing(3, 9.0, 5.0).add_repair_timing(1, 7.0, 7.0).summary()
    assert (summary["repair/ms_mean"], summary["repair/ms_max"]) == (4.0, 7.0)
    assert (step_metrics(info, 2.5)["repair/ms_mean"], step_metrics(info, 2.5)["repair/ms_max"]) == (2.5, 2.5)


# ---------------------------------------------------------------- training run
def test_run_folder_holds_config_stats_model_checkpoints_and_timelines(run):
    assert yaml.safe_load((run / "config.yaml").read_text()) == config_from_dict(SMOKE).to_dict()
    for name in ("model.zip", "vecnormalize.pkl", "best/best_model.zip", "best/vecnormalize.pkl", "pretrain.json", "evaluations.npz",
                 "checkpoints/ppo_128_steps.zip", "checkpoints/ppo_vecnormalize_128_steps.pkl", "timelines/step_0.png", "pretrain/student_0.onnx", "pretrain/student_1.onnx",
                 "pretrain/demonstrations_0.npz", "pretrain/demonstrations_1.npz"):
        assert (run / name).stat().st_size > 0, name
    fit = json.loads((run / "pretrain.json").read_text())
    assert fit["pretrain/dagger_rounds"] == 1 and [r["round"] for r in fit["rounds"]] == [0, 1] and 0 <= fit["pretrain/accuracy"] <= 1
    # The kept student is the better validated of the two fits.
    best = max(fit["rounds"], key=lambda r: r["pretrain/validation_goodput"])
    assert fit["pretrain/best_round"] == best["round"] and fit["pretrain/validation_goodput"] == best["pretrain/validation_goodput"]
    assert "pretrain/student_goodput" in fit["rounds"][0] and fit["rounds"][1]["samples"] > fit["rounds"][0]["samples"]


def test_tensorboard_has_the_custom_scalars_and_the_timeline_image(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (run / "tb").glob("ppo_*")
    accumulator = EventAccumulator(str(events), size_guidance={"images": 0})
    accumulator.Reload()
    scalars = set(accumulator.Tags()["scalars"])
    assert CUSTOM_SCALARS <= scalars, CUSTOM_SCALARS - scalars
    assert {"train/approx_kl", "rollout/ep_rew_mean", "eval/mean_reward"} <= scalars  # SB3's own
    assert "eval/partition_timeline" in accumulator.Tags()["images"]
    attainment = [e.value for e in accumulator.Scalars("slo/attainment_high")]
    assert attainment and all(0.0 <= v <= 1.0 for v in attainment)


def test_warm_start_rounds_are_in_tensorboard(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run / "tb" / "pretrain"))
    accumulator.Reload()
    validation = accumulator.Scalars("pretrain/validation_goodput")
    rounds = json.loads((run / "pretrain.json").read_text())["rounds"]
    assert [e.step for e in validation] == [0, 1]
    assert [e.value for e in validation] == pytest.approx([r["pretrain/validation_goodput"] for r in rounds], rel=1e-6)


def test_zero_ppo_steps_ship_the_warm_start(tmp_path):
    from rlsched.agents.onnx_policy import OnnxPolicy
    from rlsched.agents.ppo.export import export_run
    from rlsched.agents.ppo.train import train

    config = {**SMOKE, "total_timesteps": 0, "pretrain": {**SMOKE["pretrain"], "dagger_iterations": 0}}
    run_dir = train(_write(tmp_path, config), tmp_path / "run", perf_model="toy")
    exported = OnnxPolicy.load(export_run(run_dir))
    student = OnnxPolicy.load(run_dir / "pretrain" / "student_0.onnx")
    rng = np.random.default_rng(0)
    observations = rng.random((200, exported.obs_dim), dtype=np.float32)
    # No PPO step ran: the exported policy is the warm-start student itself.
    assert np.array_equal(exported.act(observations), student.act(observations))


def test_resume_continues_from_the_newest_checkpoint(run, tmp_path):
    from rlsched.agents.ppo.train import latest_checkpoint, train
    from sb3_contrib import MaskablePPO

    crashed = tmp_path / "run"
    shutil.copytree(run, crashed)
    # As if the run had died after its first checkpoint.
    for name in ("model.zip", "vecnormalize.pkl", "checkpoints/ppo_256_steps.zip", "checkpoints/ppo_vecnormalize_256_steps.pkl"):
        (crashed / name).unlink()
    assert latest_checkpoint(crashed)[2] == 128
    train(None, crashed, resume=True, perf_model="toy")
    assert MaskablePPO.load(crashed / "model.zip").num_timesteps == 256
    with pytest.raises(ConfigError, match="already holds a run"):
        train(crashed / "config.yaml", crashed, perf_model="toy")


def test_onnx_export_matches_sb3_predict(run, random_observations_and_masks):
    import pickle

    from rlsched.agents.onnx_policy import OnnxPolicy
    from rlsched.agents.ppo.export import export_run
    from sb3_contrib import MaskablePPO

    path = export_run(run, run / "parity.onnx", which="final")
    policy = OnnxPolicy.load(path)
    model = MaskablePPO.load(run / "model.zip", device="cpu")
    with open(run / "vecnormalize.pkl", "rb") as handle:
        stats = pickle.load(handle)
    obs, masks, starts = random_observations_and_masks(policy.obs_dim, policy.nvec)
    expected, _ = model.predict(stats.normalize_obs(obs), deterministic=True, action_masks=masks)
    assert np.array_equal(policy.act(obs, masks), expected)
    assert np.array_equal(policy.act(obs[0], masks[0]), expected[0])
    chosen = np.take_along_axis(masks, starts + policy.act(obs, masks), axis=1)
    assert chosen.all()  # never a masked level
    # The exported log-probability is SB3's for the same action under the masked distribution.
    import torch

    action, log_prob = policy.act_with_log_prob(obs, masks)
    assert np.array_equal(action, expected) and log_prob.shape == (len(obs),)
    with torch.no_grad():
        distribution = model.policy.get_distribution(torch.as_tensor(stats.normalize_obs(obs)), action_masks=masks)
        sb3_log_prob = distribution.log_prob(torch.as_tensor(expected)).numpy()
    np.testing.assert_allclose(log_prob, sb3_log_prob, rtol=1e-4, atol=1e-4)
    assert policy.takeover_probability == 0.0  # the smoke config sets none


def _takeover_copy(source: Path, out: Path, probability: str, keep_log_prob: bool = True, key: str = "planner_takeover_probability") -> Path:
    """``source`` with its planner-takeover metadata (or another ``key``) set to ``probability``
    (and, optionally, without the action_log_prob output, as an export from before it existed)."""
    import onnx

    model = onnx.load(source)
    for item in list(model.metadata_props):
        if item.key == key:
            model.metadata_props.remove(item)
    model.metadata_props.add(key=key, value=probability)
    if not keep_log_prob:
        kept = [o for o in model.graph.output if o.name != "action_log_prob"]
        del model.graph.output[:]
        model.graph.output.extend(kept)
    out.write_bytes(model.SerializeToString())
    return out


def test_planner_takes_over_when_the_policy_is_unsure(run, tmp_path):
    from rlsched.agents.evaluation import run_episode
    from rlsched.envs.gpushare import GpuShareEnv

    env = GpuShareEnv(TINY, perf_model="toy")
    planner = run_episode(env, "migrator-ilp", 3)
    # p = 1: every step the network is not certain of goes to the planner: its episode exactly.
    always = _takeover_copy(run / "pretrain" / "student_0.onnx", tmp_path / "always.onnx", "1.0")
    handed = run_episode(env, f"ppo:{always}", 3)
    assert handed.report["planner_steps"] == handed.report["steps"] == len(handed.rewards)
    assert handed.goodput == planner.goodput and handed.layouts == planner.layouts
    from rlsched.agents.evaluation import evaluate, format_table

    result, _ = evaluate(TINY, [f"ppo:{always}"], perf_model="toy", progress=False)
    assert "the planner (migrator-ilp) decided 100% of the steps" in format_table(result)
    # p = 0 (the default): the network alone, and no report.
    alone = run_episode(env, f"ppo:{run / 'pretrain' / 'student_0.onnx'}", 3)
    assert alone.report is None
    # In between: the planner decides exactly the steps whose action probability is below p.
    from rlsched.agents.onnx_policy import PpoPolicy

    observation, _ = env.reset(seed=3)
    policy = PpoPolicy(f"ppo:{_takeover_copy(run / 'pretrain' / 'student_0.onnx', tmp_path / 'half.onnx', '0.5')}")
    policy.reset(env)
    _, log_prob = policy.onnx.act_with_log_prob(observation, env.action_masks())
    decision = policy.act(observation, env)
    assert policy.decider == ("migrator-ilp" if np.exp(log_prob) < 0.5 else "ppo")
    assert isinstance(decision, np.ndarray) == (policy.decider == "ppo")


@pytest.mark.parametrize("probability, keep, reason", [("1.5", True, "within \\[0, 1\\]"), ("\"high\"", True, "within \\[0, 1\\]"),
                                                      ("0.5", False, "no action_log_prob output")])
def test_bad_takeover_metadata_is_a_clear_error(run, tmp_path, probability, keep, reason):
    from rlsched.agents.onnx_policy import PpoPolicy

    path = _takeover_copy(run / "pretrain" / "student_0.onnx", tmp_path / "bad.onnx", probability, keep)
    with pytest.raises(ConfigError, match=reason) as error:
        PpoPolicy(f"ppo:{path}")
    assert "bad.onnx" in str(error.value) and "planner_takeover_probability" in str(error.value)


def test_reconfiguration_check_keeps_the_running_configuration_unless_a_gain_is_predicted(run, tmp_path, monkeypatch):
    from rlsched.agents.evaluation import run_episode
    from rlsched.envs.gpushare import GpuShareEnv
    from rlsched.simulator.lookahead import ReconfigurationCheck

    env = GpuShareEnv(TINY, perf_model="toy")
    planner = run_episode(env, "migrator-ilp", 3)
    assert planner.reconfigurations > 0  # there is something to check
    # The planner decides every step (p = 1), each change checked on 2 random streams.
    always = _takeover_copy(run / "pretrain" / "student_0.onnx", tmp_path / "always.onnx", "1.0")
    checked = f"ppo:{_takeover_copy(always, tmp_path / 'checked.onnx', '2', key='reconfiguration_check_samples')}"
    recorded = []
    original_record = ReconfigurationCheck.record
    # The policy's own check (2 streams), not the one migrator-ilp keeps when it takes over.
    monkeypatch.setattr(ReconfigurationCheck, "record",
                        lambda self, t, rates: (self.samples == 2 and recorded.append((t, dict(rates)))) or original_record(self, t, rates))
    real = run_episode(env, checked, 3)
    assert real.report["checked_changes"] >= real.report["kept_by_check"] and real.report["checked_changes"] > 0
    # The check's forecast is fed every interval's measured rates, once per interval, of the inference tenants only.
    interval_s = env.scenario.decision_interval_s
    assert [t for t, _ in recorded] == [interval_s * (k + 1) for k in range(real.report["steps"] - 1)]
    inference = {t.name for t in env.scenario.inference_tenants()}
    assert all(set(rates) == inference and min(rates.values()) >= 0.0 for _, rates in recorded)
    assert any(rate > 0.0 for _, rates in recorded for rate in rates.values())
    monkeypatch.setattr(ReconfigurationCheck, "record", original_record)
    from rlsched.agents.evaluation import evaluate, format_table

    result, _ = evaluate(TINY, [checked], perf_model="toy", progress=False)
    report = result["reports"][checked][0]
    assert f"the reconfiguration check kept {report['kept_by_check']:,} of {report['checked_changes']:,} proposed changes out" in format_table(result)
    # Forced answers for the policy's check only: migrator-ilp's own check stays as it is.
    original_gain = ReconfigurationCheck.gain
    monkeypatch.setattr(ReconfigurationCheck, "gain", lambda self, *state, **left: 1.0 if self.samples == 2 else original_gain(self, *state, **left))
    passed = run_episode(env, checked, 3)
    assert passed.goodput == planner.goodput and passed.layouts == planner.layouts and passed.report["kept_by_check"] == 0
    monkeypatch.setattr(ReconfigurationCheck, "gain", lambda self, *state, **left: -1.0 if self.samples == 2 else original_gain(self, *state, **left))
    kept = run_episode(env, checked, 3)
    assert kept.reconfigurations == 0 and kept.report["kept_by_check"] == kept.report["checked_changes"] > 0


@pytest.mark.parametrize("samples", ["-1", "2.5", "\"many\""])
def test_bad_check_metadata_is_a_clear_error(run, tmp_path, samples):
    from rlsched.agents.onnx_policy import PpoPolicy

    path = _takeover_copy(run / "pretrain" / "student_0.onnx", tmp_path / "bad.onnx", samples, key="reconfiguration_check_samples")
    with pytest.raises(ConfigError, match="integer >= 0") as error:
        PpoPolicy(f"ppo:{path}")
    assert "bad.onnx" in str(error.value) and "reconfiguration_check_samples" in str(error.value)


def test_export_writes_the_takeover_probability(run, tmp_path, capsys):
    from rlsched.agents.onnx_policy import OnnxPolicy

    out = tmp_path / "p.onnx"
    assert main(["export-policy", "--run", str(run), "--out", str(out), "--which", "final", "--planner-takeover-probability", "0.4"]) == 0
    assert OnnxPolicy.load(out).takeover_probability == 0.4 and OnnxPolicy.load(out).check_samples == 0  # the smoke config: no check
    assert main(["export-policy", "--run", str(run), "--out", str(out), "--which", "final", "--reconfiguration-check-samples", "8"]) == 0
    assert OnnxPolicy.load(out).check_samples == 8
    assert main(["export-policy", "--run", str(run), "--out", str(tmp_path / "r.onnx"), "--reconfiguration-check-samples", "-2"]) == 2
    err = capsys.readouterr().err
    assert "reconfiguration_check_samples" in err and "-2" in err and not (tmp_path / "r.onnx").exists()
    assert main(["export-policy", "--run", str(run), "--out", str(tmp_path / "q.onnx"), "--planner-takeover-probability", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "planner_takeover_probability" in err and "1.5" in err and not (tmp_path / "q.onnx").exists()


def test_ppo_run_folder_policy_evaluates_like_a_baseline(run, tmp_path, capsys):
    import json

    out = tmp_path / "eval.json"
    assert main(["eval", "--scenario", TINY, "--policies", f"ppo:{run},static-equal", "--json", str(out), "--no-progress", "--perf-model", "toy"]) == 0
    result = json.loads(out.read_text())["policies"]
    assert list(result) == [f"ppo:{run}", "static-equal"] and result[f"ppo:{run}"]["goodput"] is not None
    assert (run / "policy.onnx").exists()


# ---------------------------------------------------------------- randomization
def test_family_keeps_shapes_and_trains_only_on_the_training_part_of_traces():
    from rlsched.agents.ppo.family import FamilyEnv, ScenarioFamily

    family = ScenarioFamily("default", RandomizationConfig(priority_shuffle_probability=1.0, gpus=("a100-40gb", "a100-80gb")))
    rng = np.random.default_rng(0)
    for _ in range(20):
        scenario = family.sample(rng)
        alexnet = scenario.tenant("alexnet").arrivals
        assert alexnet.offset_s + scenario.duration_s * alexnet.time_warp <= 0.7 * alexnet.period_s
        assert sorted(t.priority.value for t in scenario.tenants) == ["high", "low", "normal", "normal"]
    env = FamilyEnv(family, perf_model="toy")
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        assert env.observation_space.contains(obs) and env.action_masks().shape == (int(env.action_space.nvec.sum()),)
        env.step(env.action_space.sample())


def test_family_rejects_held_out_traces_and_other_action_spaces():
    from rlsched.agents.ppo.family import ScenarioFamily

    with pytest.raises(ConfigError, match="held out"):
        ScenarioFamily("default-heldout", RandomizationConfig())
    with pytest.raises(ConfigError, match="action space"):
        ScenarioFamily("default", RandomizationConfig(gpus=("a30-24gb",)))


def test_trace_pool_swaps_a_tenants_trace_at_its_own_mean_rate():
    from rlsched.agents.ppo.config import TracePoolConfig
    from rlsched.agents.ppo.family import ScenarioFamily
    from rlsched.workloads.arrivals import ServeGenArrivals, TimestampArrivals

    pool = TracePoolConfig(files=("servegen_mm_image_client5.csv", "servegen_mm_image_client12.csv"), tenants=("vgg",), probability=0.5)
    family = ScenarioFamily("default", RandomizationConfig(rate_scale=(1.0, 1.0), trace_pool=pool))
    own_rps = family.base.tenant("vgg").arrivals.mean_rate_rps()
    rng = np.random.default_rng(0)
    draws = [family.sample(rng) for _ in range(40)]
    swapped = [s.tenant("vgg").arrivals for s in draws if isinstance(s.tenant("vgg").arrivals, ServeGenArrivals)]
    assert 10 < len(swapped) < 30 and all(isinstance(s.tenant("vgg").arrivals, ServeGenArrivals | TimestampArrivals) for s in draws)
    assert all(a.mean_rate_rps() == pytest.approx(own_rps) and a.time_warp == 24.0 and 0 <= a.offset_s < a.period_s for a in swapped)
    # Both pool traces are drawn, each from its own random point.
    assert len({a.offset_s for a in swapped}) == len(swapped) and len({a.clients[0][0].rate_rps for a in swapped}) == 2
    # The other tenants never swap; without a pool the draws are those of before (same rng use).
    assert all(type(s.tenant("alexnet").arrivals) is type(family.base.tenant("alexnet").arrivals) for s in draws)
    plain = ScenarioFamily("default", RandomizationConfig(rate_scale=(1.0, 1.0)))
    off = ScenarioFamily("default", RandomizationConfig(rate_scale=(1.0, 1.0), trace_pool=dataclasses.replace(pool, probability=0.0)))

    def summary(scenario):
        return [(t.slo_ms, t.arrivals.mean_rate_rps(), getattr(t.arrivals, "offset_s", None)) for t in scenario.tenants]

    assert summary(plain.sample(np.random.default_rng(3))) == summary(off.sample(np.random.default_rng(3)))


@pytest.mark.parametrize(("pool", "field", "reason"), [
    ({"files": ("servegen_mm_image_client0.csv",), "tenants": ("vgg",), "probability": 0.5}, "trace_pool.files[0]", "held out"),
    ({"files": ("nope.csv",), "tenants": ("vgg",), "probability": 0.5}, "trace_pool.files[0]", "no such trace file"),
    ({"files": ("servegen_mm_image_client5.csv",), "tenants": ("gpt",), "probability": 0.5}, "trace_pool.tenants", "not an inference tenant"),
    ({"tenants": ("vgg",), "probability": 0.5}, "trace_pool.probability", "needs trace_pool.files"),
])
def test_trace_pool_errors_name_the_field_and_value(pool, field, reason):
    from rlsched.agents.ppo.config import TracePoolConfig
    from rlsched.agents.ppo.family import ScenarioFamily

    with pytest.raises(ConfigError) as caught:
        ScenarioFamily("default", RandomizationConfig(trace_pool=TracePoolConfig(**pool)))
    assert caught.value.field == field and reason in caught.value.reason


def test_perturbed_demonstrations_keep_the_teachers_labels():
    from rlsched.agents.ppo.family import ScenarioFamily
    from rlsched.agents.ppo.pretrain import collect

    family = ScenarioFamily(TINY, RandomizationConfig())
    calm, _ = collect(family, "static-equal", 1, 6, 0, "toy")
    noisy, _ = collect(family, "static-equal", 1, 6, 0, "toy", perturbation=1.0)
    # static-equal decides one configuration; every label asks for it, executed or not.
    assert len(np.unique(calm.actions, axis=0)) == 1 and np.array_equal(np.unique(noisy.actions, axis=0), np.unique(calm.actions, axis=0))
    assert len(noisy.observations) == 6 and noisy.masks.shape == (6, int(np.sum(calm.masks[0].size)))
    assert not np.array_equal(noisy.observations[1:], calm.observations[1:])  # random actions went elsewhere


def test_demonstrations_round_trip_and_a_foreign_file_is_a_clear_error(tmp_path):
    from rlsched.agents.ppo.family import ScenarioFamily
    from rlsched.agents.ppo.pretrain import Demonstrations, collect

    demos, _ = collect(ScenarioFamily(TINY, RandomizationConfig()), "static-equal", 2, 6, 0, "toy")
    demos.save(tmp_path / "d.npz")
    back = Demonstrations.load(tmp_path / "d.npz")
    for field in ("observations", "actions", "masks"):
        assert np.array_equal(getattr(back, field), getattr(demos, field)) and getattr(back, field).dtype == getattr(demos, field).dtype
    assert [r.tolist() for r in back.episode_rewards] == [r.tolist() for r in demos.episode_rewards] and len(back.episode_rewards) == 2
    np.savez(tmp_path / "foreign.npz", observations=np.zeros(3))
    with pytest.raises(ConfigError, match="foreign.npz.*not a demonstrations file"):
        Demonstrations.load(tmp_path / "foreign.npz")
    with pytest.raises(ConfigError, match="no such demonstrations file"):
        Demonstrations.load(tmp_path / "missing.npz")


REFIT = ROOT / "scripts" / "refit_student.py"


def test_refit_student_fits_a_runs_saved_labels(run, tmp_path):
    import subprocess
    import sys

    from rlsched.agents.onnx_policy import OnnxPolicy
    from rlsched.agents.ppo.pretrain import Demonstrations

    out = tmp_path / "refit.onnx"
    done = subprocess.run([sys.executable, str(REFIT), str(run), "--rounds", "0", "--epochs", "1", "--seed", "3", "--validation-episodes", "1",
                           "--perf-model", "toy", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["samples"] == len(Demonstrations.load(run / "pretrain" / "demonstrations_0.npz").actions) and result["rounds"] == [0]
    assert np.isfinite(result["pretrain/validation_goodput"]) and 0 <= result["pretrain/accuracy"] <= 1
    assert OnnxPolicy.load(out).obs_dim == OnnxPolicy.load(run / "pretrain" / "student_0.onnx").obs_dim
    bad = subprocess.run([sys.executable, str(REFIT), str(run), "--rounds", "0,7", "--perf-model", "toy", "--out", str(tmp_path / "x.onnx")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--rounds" in bad.stderr and "saved rounds: [0, 1]" in bad.stderr and not (tmp_path / "x.onnx").exists()


def test_dagger_student_acts_and_the_teacher_labels(run):
    from rlsched.agents.ppo.family import ScenarioFamily
    from rlsched.agents.ppo.pretrain import collect

    family = ScenarioFamily(TINY, RandomizationConfig())
    taught, _ = collect(family, "static-equal", 2, 6, 0, "toy")
    # The smoke run's student decides differently from static-equal, so it visits other
    # states; the labels stay static-equal's one configuration.
    dagger, objectives = collect(family, "static-equal", 2, 6, 0, "toy", student=run / "pretrain" / "student_0.onnx")
    assert np.array_equal(np.unique(dagger.actions, axis=0), np.unique(taught.actions, axis=0)) and len(objectives) == 2
    assert not np.array_equal(dagger.observations, taught.observations)
    # Episodes in worker processes give exactly the same demonstrations.
    parallel, parallel_objectives = collect(family, "static-equal", 2, 6, 0, "toy", student=run / "pretrain" / "student_0.onnx", workers=2)
    assert np.array_equal(parallel.observations, dagger.observations) and parallel_objectives == objectives


# ---------------------------------------------------------------- registry and shipped policy
def test_policy_names_accept_ppo_next_to_all():
    from rlsched.agents.baselines import POLICIES
    from rlsched.agents.evaluation import policy_names

    assert policy_names("ppo,all") == ["ppo", *POLICIES]
    assert policy_names("ppo@0,ppo,ppo@0.37") == ["ppo@0", "ppo", "ppo@0.37"]
    with pytest.raises(ConfigError, match="no such"):
        policy_names("ppo:/no/such/file.onnx")
    for bad in ("ppo@1.5", "ppo@high", "ppo@"):
        with pytest.raises(ConfigError, match="within \\[0, 1\\]"):
            policy_names(bad)


def test_takeover_suffix_overrides_the_files_probability(run, tmp_path):
    from rlsched.agents.evaluation import run_episode
    from rlsched.envs.gpushare import GpuShareEnv

    env = GpuShareEnv(TINY, perf_model="toy")
    student = run / "pretrain" / "student_0.onnx"  # no takeover in its metadata
    planner, forced = run_episode(env, "migrator-ilp", 4), run_episode(env, f"ppo:{student}@1", 4)
    assert forced.goodput == planner.goodput and forced.report["planner_takeover_probability"] == 1.0
    always = _takeover_copy(student, tmp_path / "always.onnx", "1.0")
    alone, network = run_episode(env, f"ppo:{always}@0", 4), run_episode(env, f"ppo:{student}", 4)
    assert alone.report is None and alone.goodput == network.goodput and alone.layouts == network.layouts
    old = _takeover_copy(student, tmp_path / "old.onnx", "0.5", keep_log_prob=False)
    with pytest.raises(ConfigError, match="action_log_prob"):
        run_episode(env, f"ppo:{old}@0.5", 4)
    assert run_episode(env, f"ppo:{old}@0", 4).goodput == network.goodput  # without the takeover, an old export still runs


def test_shipped_policy_fits_the_default_scenario():
    from rlsched.agents.onnx_policy import SHIPPED_POLICY, PpoPolicy
    from rlsched.envs.gpushare import GpuShareEnv

    assert SHIPPED_POLICY.stat().st_size < 5_000_000
    env = GpuShareEnv("default", perf_model="toy")
    obs, _ = env.reset(seed=0)
    policy = PpoPolicy("ppo")
    policy.reset(env)
    action = policy.act(obs, env)
    assert policy.onnx.takeover_probability == 0.6 and "action_log_prob" in policy.onnx.outputs and policy.onnx.check_samples == 8
    assert env.action_space.contains(action) or policy.decider == "migrator-ilp"
    # The shipped file was trained by the shipped config (one source of truth for its recipe).
    shipped = config_from_dict(yaml.safe_load(policy.onnx.metadata["config"]))
    assert shipped.to_dict() == load_config(ROOT / "configs" / "train" / "ppo_default.yaml").to_dict()
