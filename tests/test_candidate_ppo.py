"""``candidate-ppo``: the candidate-choice policy file, deployed on any node, and its training pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlsched.agents.baselines import apply, make_policy
from rlsched.agents.evaluation import run_episode
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError

DATA = Path(__file__).parent / "data"
TINY = str(DATA / "env_tiny.yaml")
TWO_GPUS = str(DATA / "env_tiny_two_gpus.yaml")


def write_config(path: Path, **overrides: object) -> Path:
    config = {"candidate_choice": {"scenarios": [TINY, TWO_GPUS], "validation_seeds": [1_000_003], "prior_weight": 2.0, "paired_horizon": 3},
              "total_timesteps": 24, "n_envs": 1, "eval_freq": 12, "progress_bar": False,
              "ppo": {"n_steps": 12, "batch_size": 12, "n_epochs": 1}}
    config.update(overrides)
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """One training run on the two tiny nodes (PPO updates, validation, exports), shared by the tests that read it."""
    from rlsched.agents.ppo.candidate_train import train_candidate_choice

    tmp = tmp_path_factory.mktemp("candidate")
    return train_candidate_choice(write_config(tmp / "candidate.yaml"), tmp / "run")


def test_training_writes_both_policies_the_curve_and_the_references(run):
    import onnx

    for name in ("policy.onnx", "warm_start.onnx", "learning_curve.png", "summary.json", "config.yaml"):
        assert (run / name).exists(), name
    assert list((run / "tb").rglob("events.out.tfevents.*"))
    warm = {p.key: p.value for p in onnx.load(str(run / "warm_start.onnx")).metadata_props}
    best = {p.key: p.value for p in onnx.load(str(run / "policy.onnx")).metadata_props}
    summary = json.loads((run / "summary.json").read_text())
    assert warm["kind"] == best["kind"] == "candidate-ppo" and warm["num_timesteps"] == "0"
    assert int(best["num_timesteps"]) == summary["best_num_timesteps"] in (0, 12, 24)
    assert json.loads(best["training_scenarios"]) == [TINY, TWO_GPUS]
    assert [step for step, _ in summary["curve"]] == [0, 12, 24] and summary["curve"][0][1] == 1.0
    assert len(summary["validation"]["migrator-ilp"]) == len(summary["validation"]["static-best"]) == 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged = EventAccumulator(str(next((run / "tb").iterdir())))
    logged.Reload()
    # paired advantages: a prior weight of 2 departs from the planner often enough to measure some
    assert {"paired/departures", "validation/x_warm_start", "validation/x_static_best"} <= set(logged.Tags()["scalars"])
    assert max(e.value for e in logged.Scalars("paired/departures")) > 0.0
    # the departures apart by what the planner chose: on these tiny nodes it mostly keeps
    assert max(e.value for e in logged.Scalars("paired/departures_where_planner_keeps")) > 0.0
    assert {"paired/mean_departure_advantage_where_planner_keeps", "paired/mean_departure_advantage_where_planner_moves"} <= set(logged.Tags()["scalars"])


def test_a_stopped_run_resumes_from_its_newest_checkpoint(run, tmp_path):
    """Stopped after its 12-step validation, the run resumes there: the model's step count and
    the validation record carry on (the curve is the whole run's), the warm start is not
    validated again, and the summary says where it resumed."""
    import shutil

    from rlsched.agents.ppo.candidate_train import VALIDATION_FILE, train_candidate_choice

    stopped = tmp_path / "run"
    shutil.copytree(run, stopped)
    for name in ("policy.onnx", "summary.json", "final_model.zip", "checkpoints/model_24_steps.zip"):
        (stopped / name).unlink()
    record = json.loads((stopped / VALIDATION_FILE).read_text())
    record["per_validation"].pop()  # as it was when the run stopped
    (stopped / VALIDATION_FILE).write_text(json.dumps(record))

    train_candidate_choice(None, stopped, resume=True)
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["resumed_at"] == 12 and [step for step, _ in summary["curve"]] == [0, 12, 24]
    assert summary["validation"]["warm_start"] == record["warm_start"] and (stopped / "checkpoints/model_24_steps.zip").exists()
    from sb3_contrib import MaskablePPO

    assert MaskablePPO.load(stopped / "final_model", device="cpu").num_timesteps == 24


def test_resume_needs_a_run_folder_and_the_same_config(run, tmp_path):
    from rlsched.agents.ppo.candidate_train import train_candidate_choice

    with pytest.raises(ConfigError, match="--resume needs a run folder"):
        train_candidate_choice(None, tmp_path / "nothing", resume=True)
    with pytest.raises(ConfigError, match="differs from the run's"):
        train_candidate_choice(write_config(tmp_path / "other.yaml", total_timesteps=48), run, resume=True)
    with pytest.raises(ConfigError, match="already holds a run"):
        train_candidate_choice(write_config(tmp_path / "same.yaml"), run)


@pytest.fixture(scope="module")
def daemon_run(tmp_path_factory) -> Path:
    """One training run observing through the daemon planner's objective, on the two tiny nodes."""
    from rlsched.agents.ppo.candidate_train import train_candidate_choice

    tmp = tmp_path_factory.mktemp("candidate-daemon")
    choice = {"scenarios": [TINY, TWO_GPUS], "validation_seeds": [1_000_003], "prior_weight": 2.0, "paired_horizon": 3, "observer": "daemon"}
    return train_candidate_choice(write_config(tmp / "candidate.yaml", candidate_choice=choice), tmp / "run")


def test_through_the_daemon_observer_the_warm_start_is_queue_slo_offered_on_two_node_shapes(daemon_run):
    """A file trained through the daemon observer says so in its metadata, and before any PPO
    update it chooses what ``queue-slo-offered`` applies, on a one-GPU and a two-GPU node."""
    import onnx

    for name in ("warm_start.onnx", "policy.onnx"):
        assert {p.key: p.value for p in onnx.load(str(daemon_run / name)).metadata_props}["observer"] == "daemon"
    for scenario in (TINY, TWO_GPUS):
        warm = run_episode(GpuShareEnv(scenario), f"candidate-ppo:{daemon_run / 'warm_start.onnx'}", seed=7)
        planner = run_episode(GpuShareEnv(scenario), "queue-slo-offered", seed=7)
        assert warm.configurations == planner.configurations and warm.goodput == planner.goodput
        assert warm.report["planner_disagreements"] == 0
    # The tiny nodes keep their first configuration; on ``default`` the planner moves early.
    decided = {}
    for spec in (f"candidate-ppo:{daemon_run / 'warm_start.onnx'}", "queue-slo-offered"):
        env = GpuShareEnv("default")
        observation, _ = env.reset(seed=0)
        policy = make_policy(spec)
        policy.reset(env)
        decided[spec] = []
        for _ in range(12):
            decision = policy.act(observation, env)
            decided[spec].append(decision)
            observation, *_ = apply(env, decision)
    warm, planner = decided.values()
    assert warm == planner and len({str(c) for c in warm}) > 1


def test_a_file_that_sees_each_slot_per_tenant_kind_starts_as_queue_slo_offered_and_names_its_width(tmp_path):
    """Trained through ``daemon-tenants`` under the high-priority guard (with branch_follow:
    policy, over two rollouts), a file records that observer, the guard and the config's
    ``min_departure_probability``, reads the wider
    observation, and before any update chooses what ``queue-slo-offered`` applies (the guard
    never closes the planner's slot); a file whose metadata names an observer of another width
    is refused with both widths, and one whose guard is neither true nor false is refused too."""
    import onnx

    from rlsched.agents.candidate_ppo import CandidatePpo
    from rlsched.agents.ppo.candidate_env import CANDIDATES, GLOBAL_FEATURES, OBSERVER_FEATURES
    from rlsched.agents.ppo.candidate_train import train_candidate_choice

    choice = {"scenarios": [TINY, TWO_GPUS], "validation_seeds": [1_000_003], "prior_weight": 2.0, "paired_horizon": 3,
              "observer": "daemon-tenants", "choose_at": "planner-moves", "expected_ppo": True, "branch_follow": "policy",
              "high_priority_guard": True, "min_departure_probability": 0.85}
    run = train_candidate_choice(write_config(tmp_path / "c.yaml", candidate_choice=choice, total_timesteps=8, n_envs=2, eval_freq=8,
                                              ppo={"n_steps": 2, "batch_size": 4, "n_epochs": 1}), tmp_path / "run")
    warm = run / "warm_start.onnx"
    model = onnx.load(str(warm))
    meta = {p.key: p.value for p in model.metadata_props}
    assert (meta["observer"], meta["high_priority_guard"], meta["min_departure_probability"]) == ("daemon-tenants", "true", "0.85")
    loaded = CandidatePpo(f"candidate-ppo:{warm}")
    assert loaded.observer_kind == "daemon-tenants" and loaded.high_priority_guard and loaded.min_departure_probability == 0.85
    assert model.graph.input[0].type.tensor_type.shape.dim[1].dim_value == CANDIDATES * len(OBSERVER_FEATURES["daemon-tenants"]) + len(GLOBAL_FEATURES)
    for scenario in (TINY, TWO_GPUS):
        learned = run_episode(GpuShareEnv(scenario), f"candidate-ppo:{warm}", seed=7)
        planner = run_episode(GpuShareEnv(scenario), "queue-slo-offered", seed=7)
        assert learned.configurations == planner.configurations and learned.goodput == planner.goodput
    for prop in model.metadata_props:
        if prop.key == "observer":
            prop.value = "daemon"
    onnx.save(model, str(tmp_path / "mislabelled.onnx"))
    with pytest.raises(ConfigError, match=f"has {CANDIDATES * 16 + 3} features, this rlsched builds {CANDIDATES * 8 + 3}"):
        CandidatePpo(f"candidate-ppo:{tmp_path / 'mislabelled.onnx'}")
    model = onnx.load(str(warm))
    for prop in model.metadata_props:
        if prop.key == "high_priority_guard":
            prop.value = "yes"
    onnx.save(model, str(tmp_path / "unsure.onnx"))
    with pytest.raises(ConfigError, match="high_priority_guard.*yes"):
        CandidatePpo(f"candidate-ppo:{tmp_path / 'unsure.onnx'}")


def test_expected_ppo_trains_on_the_simulator_choosing_at_the_planner_s_moves(tmp_path):
    """With ``choose_at: planner-moves`` and ``expected_ppo``, every PPO sample is a decision
    where the daemon planner moves, with every slot's paired advantage measured on the
    request-level simulator: the update reads them (``expected/*`` scalars), the policy moves,
    and the file records where it chooses (train-retrain cut to 30 intervals, whose second
    retraining job then never runs). The choices of a validation seed are recorded once, and
    each validation scores the policy there: the warm start chooses the planner's slot."""
    import onnx
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlsched.agents.ppo.candidate_train import train_candidate_choice

    suite = Path(__file__).parents[1] / "configs/scenarios/suite"
    retrain = yaml.safe_load((suite / "train-retrain.yaml").read_text())
    retrain["duration_s"] = 30 * retrain["decision_interval_s"]
    for tenant in retrain["tenants"]:
        if "file" in tenant.get("arrivals", {}):
            tenant["arrivals"]["file"] = str((suite / tenant["arrivals"]["file"]).resolve())
        if "active" in tenant:  # the windows within the 30 intervals (retrain-bert's first starts at their end)
            tenant["active"] = [w for w in tenant["active"] if w["from_s"] < retrain["duration_s"]]
    retrain["tenants"] = [t for t in retrain["tenants"] if t.get("active", True)]
    retrain["reference"]["placements"].pop("retrain-bert")
    (tmp_path / "retrain-30.yaml").write_text(yaml.safe_dump(retrain))
    choice = {"scenarios": [str(tmp_path / "retrain-30.yaml")], "validation_seeds": [1_000_003], "prior_weight": 2.0, "paired_horizon": 3,
              "observer": "daemon", "choose_at": "planner-moves", "expected_ppo": True, "choice_validation_seeds": [1_000_005]}
    run = train_candidate_choice(write_config(tmp_path / "expected.yaml", candidate_choice=choice, total_timesteps=4, eval_freq=4,
                                              ppo={"n_steps": 4, "batch_size": 4, "n_epochs": 2}), tmp_path / "run")
    assert {p.key: p.value for p in onnx.load(str(run / "policy.onnx")).metadata_props}["choose_at"] == "planner-moves"
    logged = EventAccumulator(str(next((run / "tb").iterdir())))
    logged.Reload()
    assert {"expected/positive_actions", "expected/states_with_a_better_action"} <= set(logged.Tags()["scalars"])
    assert "paired/departures" not in logged.Tags()["scalars"]  # ExpectedPPO takes every action's advantage, not the chosen one's
    assert logged.Scalars("train/approx_kl")[-1].value > 0.0
    with np.load(run / "choice_validation.npz") as choices:
        assert len(choices["planner"]) > 0 and choices["advantages"].shape == (len(choices["planner"]), 12)
        assert (choices["advantages"][np.arange(len(choices["planner"])), choices["planner"]] == 0.0).all()
        assert (choices["advantages"][~choices["masks"]] == 0.0).all() and (choices["advantages"] != 0.0).any()
    warm, trained = json.loads((run / "validation.json").read_text())["per_validation"]
    assert warm["choice_advantage"] == 0.0 and warm["choice_departures"] == 0.0
    assert set(trained) >= {"choice_advantage", "choice_departures", "choice_losses"}
    assert len(logged.Scalars("validation/choice_advantage")) == 2


@pytest.mark.parametrize("n_envs", [1, 2])
def test_branches_follow_the_policy_as_it_stood_at_each_rollout_s_start(tmp_path, n_envs):
    """With ``branch_follow: policy`` every training environment (in this process or in worker
    processes) receives a copy of the policy at each rollout's start (:class:`BranchPolicySync`),
    which follows it in its branches; the copy does not train with the model."""
    import torch
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from rlsched.agents.ppo.candidate_policy import CANDIDATE_LAYOUTS, CandidateScorerPolicy
    from rlsched.agents.ppo.candidate_train import BranchPolicySync, ScenarioMixEnv
    from rlsched.agents.ppo.expected_ppo import ExpectedPPO

    class Probe(ScenarioMixEnv):
        def follows_policy(self) -> bool:
            return all(env.branch_choose is not None for env in self.envs)

    factories = [lambda: Probe((TINY,), 3, "daemon", "planner-moves", True) for _ in range(n_envs)]
    venv = SubprocVecEnv(factories) if n_envs > 1 else DummyVecEnv(factories)
    try:
        model = ExpectedPPO(CandidateScorerPolicy, venv, n_steps=2, batch_size=2, n_epochs=1, vf_coef=0.0, device="cpu", seed=0,
                            policy_kwargs={"hidden": 8, "prior_weight": 2.0, "learn_prior": False, "layout": CANDIDATE_LAYOUTS["daemon"]})
        assert venv.env_method("follows_policy") == [False] * n_envs
        model.learn(4, callback=[BranchPolicySync()])  # two rollouts: the second copies a policy that has trained
        assert venv.env_method("follows_policy") == [True] * n_envs
        if n_envs == 1:  # the environment's copy, not the model's own policy: training it leaves the copy as it was
            followed = venv.envs[0].envs[0].branch_choose.__closure__[0].cell_contents
            assert followed is not model.policy and followed.optimizer is None
            with torch.no_grad():
                for parameter in model.policy.parameters():
                    parameter.add_(1.0)
            assert all(not torch.equal(a, b) for a, b in zip(followed.parameters(), model.policy.parameters(), strict=True))
    finally:
        venv.close()


@pytest.mark.parametrize("key, value, match", [
    ("observer", "oracle", "observer"),
    # the guard reads the daemon objective's per-tenant gains, which the plain observer does not weigh
    ("high_priority_guard", "true", "high_priority_guard.*true only with observer daemon"),
])
def test_a_plain_file_relabelled_beyond_what_it_can_run_is_refused(tmp_path, run, key, value, match):
    import onnx

    relabelled = onnx.load(str(run / "policy.onnx"))
    relabelled.metadata_props.add(key=key, value=value)
    onnx.save(relabelled, str(tmp_path / "odd.onnx"))
    with pytest.raises(ConfigError, match=match):
        make_policy(f"candidate-ppo:{tmp_path / 'odd.onnx'}")


def test_a_file_s_choose_at_sets_where_its_policy_chooses_and_an_unknown_one_is_refused(tmp_path, run):
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(run / "policy.onnx")).metadata_props}
    assert meta["choose_at"] == "every-decision"
    for value in ("planner-moves", "sometimes"):
        relabelled = onnx.load(str(run / "policy.onnx"))
        next(p for p in relabelled.metadata_props if p.key == "choose_at").value = value
        onnx.save(relabelled, str(tmp_path / f"{value}.onnx"))
    policy = make_policy(f"candidate-ppo:{tmp_path / 'planner-moves.onnx'}")
    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    policy.reset(env)
    assert policy.observer.choose_at == "planner-moves"
    with pytest.raises(ConfigError, match="choose_at"):
        make_policy(f"candidate-ppo:{tmp_path / 'sometimes.onnx'}")


class _FavouringSession:
    """Stands in for a file's network: scores one open slot other than the planner's
    ``logit`` above the other open slots (all 0), so its softmax probability is known."""

    def __init__(self, policy, logit: float) -> None:
        self.policy, self.logit, self.favourite = policy, logit, None

    def run(self, names, feeds):
        mask = feeds["action_mask"][0]
        planner = self.policy.observer.planner_choice()
        others = [k for k in np.flatnonzero(mask) if k != planner]
        scores = np.zeros((1, mask.size), dtype=np.float32)
        self.favourite = int(others[0]) if others else planner
        scores[0, self.favourite] = self.logit
        return [np.array([self.favourite]), scores]


@pytest.mark.parametrize("min_probability, departs", [(0.0, True), (0.8, True), (0.99, False)])
def test_below_its_min_departure_probability_the_planner_takes_over(tmp_path, run, min_probability, departs):
    """A slot other than the planner's, at softmax probability e^4 / (e^4 + open - 1) (0.83-0.99
    with 2-12 open slots), is applied at or above the file's ``min_departure_probability``; below
    it the planner's slot is applied and counted as a takeover."""
    import onnx

    stamped = onnx.load(str(run / "policy.onnx"))
    stamped.metadata_props.add(key="min_departure_probability", value=str(min_probability))
    onnx.save(stamped, str(tmp_path / "gated.onnx"))
    policy = make_policy(f"candidate-ppo:{tmp_path / 'gated.onnx'}")
    env = GpuShareEnv(TINY)
    observation, _ = env.reset(seed=0)
    policy.reset(env)
    policy.session = session = _FavouringSession(policy, logit=4.0)
    contested = 0
    for _ in range(6):
        current = env.current
        decision = policy.act(observation, env)
        if current is not None:
            planner = policy.observer.planner_choice()
            open_slots = int(policy.observer.action_masks().sum())
            if session.favourite != planner:
                contested += 1
                probability = np.exp(4.0) / (np.exp(4.0) + open_slots - 1)
                assert (probability >= min_probability) == departs
                expected = session.favourite if departs else planner
                assert decision == policy.observer.configuration(expected)
        observation, *_ = apply(env, decision)
    assert contested > 0
    assert policy.report["planner_takeovers"] == (0 if departs else contested)
    assert policy.report["planner_disagreements"] == (contested if departs else 0)


@pytest.mark.parametrize("value", ["1", "-0.1", "often"])
def test_a_min_departure_probability_outside_zero_to_one_is_refused(tmp_path, run, value):
    import onnx

    stamped = onnx.load(str(run / "policy.onnx"))
    stamped.metadata_props.add(key="min_departure_probability", value=value)
    onnx.save(stamped, str(tmp_path / "odd.onnx"))
    with pytest.raises(ConfigError, match=r"min_departure_probability.*\[0, 1\)"):
        make_policy(f"candidate-ppo:{tmp_path / 'odd.onnx'}")


def test_the_warm_start_is_the_library_planner_on_two_node_shapes(run):
    """Before any PPO update the network chooses what ``planner-library`` applies, on a
    one-GPU and a two-GPU node, from the same file."""
    for scenario in (TINY, TWO_GPUS):
        warm = run_episode(GpuShareEnv(scenario), f"candidate-ppo:{run / 'warm_start.onnx'}", seed=7)
        library = run_episode(GpuShareEnv(scenario), "planner-library", seed=7)
        assert warm.configurations == library.configurations and warm.goodput == library.goodput
        assert warm.report["planner_disagreements"] == 0 and warm.report["ppo_steps"] == 0


def test_the_policy_decides_without_solving_once_the_library_knows_the_load(run):
    env = GpuShareEnv(TINY)
    policy = make_policy(f"candidate-ppo:{run}")
    observation, _ = env.reset(seed=0)
    policy.reset(env)
    solves = []
    truncated = False
    while not truncated:
        observation, _, _, truncated, _ = apply(env, policy.act(observation, env))
        solves.append(policy.report["library_solves"])
    assert solves[-1] - solves[0] <= len(solves)  # at most one solve per new load bin, never more
    assert np.all(np.diff(solves) >= 0)


def test_a_policy_file_of_another_kind_or_shape_is_refused(tmp_path, run):
    import onnx

    bad = tmp_path / "other.onnx"
    bad.write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="other.onnx"):
        make_policy(f"candidate-ppo:{bad}")
    with pytest.raises(ConfigError, match="no such"):
        make_policy(f"candidate-ppo:{tmp_path / 'missing.onnx'}")
    with pytest.raises(ConfigError, match="rlsched train --config configs/train/candidate_ppo.yaml"):
        make_policy("candidate-ppo:")
    relabelled = onnx.load(str(run / "policy.onnx"))
    for prop in relabelled.metadata_props:
        if prop.key == "kind":
            prop.value = "hedge-ppo"
    onnx.save(relabelled, str(tmp_path / "hedge.onnx"))
    with pytest.raises(ConfigError, match="not a candidate-ppo policy"):
        make_policy(f"candidate-ppo:{tmp_path / 'hedge.onnx'}")


@pytest.mark.parametrize(("override", "field"), [
    ({"total_timesteps": 0}, "total_timesteps"),
    ({"candidate_choice": {"scenarios": [TINY], "validation_seeds": [3]}}, "candidate_choice.validation_seeds"),
    ({"candidate_choice": {"scenarios": [TINY], "prior_weight": 0.0}}, "candidate_choice.prior_weight"),
    ({"candidate_choice": {"scenarios": []}}, "candidate_choice.scenarios"),
    ({"candidate_choice": {"scenarios": [TINY], "paired_horizon": -1}}, "candidate_choice.paired_horizon"),
    ({"candidate_choice": {"scenarios": ["no-such-scenario"]}}, "no-such-scenario"),
    ({"candidate_choice": {"scenarios": [TINY], "observer": "oracle"}}, "candidate_choice.observer"),
    ({"candidate_choice": {"scenarios": [TINY], "observer": "daemon", "surrogate_episodes": 2}}, "candidate_choice.surrogate_episodes"),
    ({"candidate_choice": {"scenarios": [TINY], "choose_at": "sometimes"}}, "candidate_choice.choose_at"),
    ({"candidate_choice": {"scenarios": [TINY], "choose_at": "planner-moves", "surrogate_episodes": 2}}, "candidate_choice.surrogate_episodes"),
    ({"candidate_choice": {"scenarios": [TINY], "paired_horizon": 3, "expected_ppo": True}}, "candidate_choice.expected_ppo"),
    ({"candidate_choice": {"scenarios": [TINY], "paired_horizon": 3, "advantage_replay": 2}}, "candidate_choice.advantage_replay"),
    ({"candidate_choice": {"scenarios": [TINY], "advantage_replay": -1}}, "candidate_choice.advantage_replay"),
    ({"candidate_choice": {"scenarios": [TINY], "paired_horizon": 3, "choice_validation_seeds": [1_000_005]}}, "candidate_choice.choice_validation_seeds"),
    ({"candidate_choice": {"scenarios": [TINY], "paired_horizon": 3, "choose_at": "planner-moves", "choice_validation_seeds": [5]}},
     "candidate_choice.choice_validation_seeds"),
    ({"candidate_choice": {"scenarios": [TINY], "branch_follow": "oracle"}}, "candidate_choice.branch_follow"),
    ({"candidate_choice": {"scenarios": [TINY], "paired_horizon": 3, "choose_at": "planner-moves", "expected_ppo": True, "branch_follow": "policy"}},
     "candidate_choice.branch_follow"),  # the plain observer's state is not copied into a branch
    ({"candidate_choice": {"scenarios": [TINY], "paired_horizon": 3, "observer": "daemon", "branch_follow": "policy"}}, "candidate_choice.branch_follow"),
    ({"candidate_choice": {"scenarios": [TINY], "high_priority_guard": True}}, "candidate_choice.high_priority_guard"),
    ({"candidate_choice": {"scenarios": [TINY], "min_departure_probability": 1.0}}, "candidate_choice.min_departure_probability"),
    ({"candidate_choice": {"scenarios": [TINY], "min_departure_probability": "often"}}, "candidate_choice.min_departure_probability"),
    ({"ppo": {"n_steps": 4, "batch_size": 64}}, "ppo.batch_size"),
])
def test_a_bad_training_config_names_the_file_and_field(tmp_path, override, field):
    from rlsched.agents.ppo.candidate_train import is_candidate_config, load_candidate_config

    path = write_config(tmp_path / "bad.yaml", **override)
    assert is_candidate_config(path)
    with pytest.raises(ConfigError) as error:
        load_candidate_config(path)
    assert field in str(error.value)
    assert "bad.yaml" in str(error.value) or field == "no-such-scenario"


@pytest.mark.parametrize("scenario", [TINY, TWO_GPUS])
def test_the_daemon_serves_the_same_file_on_both_node_shapes(tmp_path, run, scenario):
    """``rlsched serve`` runs the policy file itself (no fallback) on a one-GPU and a two-GPU node."""
    from rlsched.daemon.config import DaemonConfig
    from rlsched.daemon.loop import Daemon

    config = DaemonConfig(scenario=scenario, backend="sim", policy=f"candidate-ppo:{run}", cycles=6, metrics_addr=None,
                          perf_model="calibrated", source=str(tmp_path / "daemon.yaml"), logdir=str(tmp_path / "tb"))
    daemon = Daemon(config)
    assert daemon.run() == 0
    assert daemon.cycle == 6 and daemon.fallbacks == 0
    assert daemon.guard.policy.name == "candidate-ppo" and daemon.guard.policy.library.worker is not None  # solves beside the loop


def test_the_daemon_serves_a_file_trained_through_the_daemon_observer(tmp_path, daemon_run):
    """``rlsched serve`` runs a daemon-observer file with its planner's library solving on the worker."""
    from rlsched.daemon.config import DaemonConfig
    from rlsched.daemon.loop import Daemon

    config = DaemonConfig(scenario=TWO_GPUS, backend="sim", policy=f"candidate-ppo:{daemon_run}", cycles=6, metrics_addr=None,
                          perf_model="calibrated", source=str(tmp_path / "daemon.yaml"), logdir=str(tmp_path / "tb"))
    daemon = Daemon(config)
    assert daemon.run() == 0
    assert daemon.cycle == 6 and daemon.fallbacks == 0
    policy = daemon.guard.policy
    assert policy.observer_kind == "daemon" and policy.observer.policy.background_solves and policy.library.worker is not None


def test_a_background_solve_joins_the_library_after_it_is_done():
    """With ``background=True`` a new load's solve runs on the worker, started once the decision
    is made; the decision loop does not wait, and the solution joins at the first refresh after
    it is done."""
    from rlsched.agents.baselines.planners import MIGRATOR_LOOKAHEAD
    from rlsched.agents.candidates import CandidateLibrary
    from rlsched.solver.planner import Planner

    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    library = CandidateLibrary(env, Planner(env.scenario, env.backend.perf_model, env.backend.memory_gib), background=True)
    library.seed(MIGRATOR_LOOKAHEAD)
    seeded = library.solves
    windows = [{t.name: t.arrivals.mean_rate_rps() * 7.0 for t in env.scenario.inference_tenants()}] * MIGRATOR_LOOKAHEAD
    library.request(windows)
    assert len(library.requested) == 1 and library.running == []  # started once the decision is made
    library.start_solves()
    assert len(library.running) == 1 and library.requested == []
    future, _ = library.running[0]
    future.result(timeout=60)  # wait here, as the next decision would not
    library.refresh()
    assert library.solves == seeded + 1 and not library.running
    assert Planner(env.scenario, env.backend.perf_model, env.backend.memory_gib).plan(windows).configuration in library.configurations


SUITE = sorted((Path(__file__).parents[1] / "configs" / "scenarios" / "suite").glob("*.yaml"))


@pytest.mark.parametrize("scenario", SUITE, ids=[p.stem for p in SUITE])
def test_the_shipped_file_decides_on_every_suite_scenario(scenario):
    """``candidate-ppo`` (the shipped file) runs on every node shape of the suite (1-2 GPUs,
    A100 and H100, 4-8 tenants): its first decisions are valid configurations of that node,
    and it records its PPO steps."""
    from rlsched.agents.candidate_ppo import SHIPPED_CANDIDATE_POLICY

    assert SHIPPED_CANDIDATE_POLICY.exists()
    env = GpuShareEnv(str(scenario))
    policy = make_policy("candidate-ppo")
    observation, _ = env.reset(seed=0)
    policy.reset(env)
    assert policy.report["ppo_steps"] > 0  # the shipped network has PPO updates after its warm start
    for _ in range(3):
        running = env.current
        decision = policy.act(observation, env)
        assert not decision.problems(env.tenant_names)
        assert decision == running or decision in policy.library.configurations  # keep, or one of the planner's solutions
        observation, _, _, _, _ = apply(env, decision)
