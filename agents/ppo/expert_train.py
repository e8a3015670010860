"""Training ``hedge-ppo``: MaskablePPO on whom the hedge's node follows (``rlsched train``).

A config with an ``expert_choice:`` section (``configs/train/hedge_ppo.yaml``) runs here:

1. record the expert streams of every training and validation episode that is not recorded
   yet (:func:`~rlsched.agents.experts.record_streams`; about a minute per episode);
2. fit the switch cost factor on the training streams' simulated switch costs and report
   its error;
3. train MaskablePPO with :class:`~rlsched.agents.ppo.candidate_policy.CandidateScorerPolicy`
   on :class:`~rlsched.agents.ppo.expert_env.ExpertChoiceEnv` over the training streams; its
   prior is the hand-built rule's verdict, so before any update it is that rule;
4. every ``eval_freq`` steps, validate on the validation streams (episodes of the training
   scenarios from other seeds) against the rule, the planner and the best fixed layout, log
   the figures to TensorBoard and keep the best model;
5. export the best model to ``<run>/policy.onnx`` with its metadata (PPO steps, training
   scenarios, the config, the switch cost factor), and draw the learning curve
   (``<run>/learning_curve.png``, also in TensorBoard).
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from stable_baselines3.common.callbacks import BaseCallback

from rlsched.agents.ppo.config import PpoConfig, _section, plain_values, read_yaml_config
from rlsched.errors import ConfigError
from rlsched.fileio import write_bytes_atomically, write_text_atomically

#: The exported policies' file names in a run folder: the best validated model, and the same
#: network before any PPO update (the ablation's warm start).
POLICY_FILE, WARM_START_FILE = "policy.onnx", "warm_start.onnx"
#: Metadata keys of the exported policy besides :mod:`rlsched.agents.expert_policy`'s.
STEPS_KEY, CONFIG_KEY = "num_timesteps", "config"


@dataclass
class ExpertChoiceConfig:
    """What ``hedge-ppo`` is trained on and how (the ``expert_choice:`` section)."""

    scenarios: tuple[str, ...] = ("default",)
    """training scenarios: bundled names or YAML paths, each optionally followed by
    ``@TENANT=TRACE[:SCALE[:WARP]]`` trace overrides; none may be a held-out one"""
    seeds: tuple[int, ...] = (100, 101, 102)
    """episodes recorded per training scenario (their seeds)"""
    validation_seeds: tuple[int, ...] = (103,)
    """episodes per training scenario the periodic validation runs on (not trained on)"""
    streams: str = ""
    """folder of the recorded streams (empty: ``<run>/streams``); shared folders are reused"""
    calibration_samples: int = 24
    """simulated switch costs recorded per episode (the switch cost factor is fitted on them)"""
    prior_weight: float = 4.0
    """initial weight of the rule's verdict in each slot's score (4: the rule's choice has
    probability 0.95 among 4 slots before any update)"""
    hidden: int = 64
    """width of the scorer's per-slot MLP and of its critic"""
    advantages: str = "paired"
    """paired: each step where the policy departs from the rule gets the exact counterfactual
    advantage (:class:`PairedAdvantages`), the others none; gae: PPO's own estimate"""
    paired_horizon: int = 180
    """intervals each counterfactual branch runs for"""


@dataclass
class ChoiceRunConfig:
    """What every choice-policy training run (``hedge-ppo``, ``candidate-ppo``) sets besides its section."""

    total_timesteps: int = 200_000
    """PPO steps, all environments together"""
    n_envs: int = 8
    """environments stepped together"""
    seed: int = 0
    """seeds the model and the environments"""
    eval_freq: int = 20_000
    """validate every this many steps"""
    progress_bar: bool = True
    """show progress bars"""
    ppo: PpoConfig = field(default_factory=PpoConfig)
    """MaskablePPO hyper-parameters (``net_arch`` and ``activation`` are not used: the scorer's shape is the section's ``hidden``)"""

    def to_dict(self) -> dict[str, Any]:
        """Plain values (tuples as lists) for YAML and the policy's metadata."""
        return plain_values(dataclasses.asdict(self))

    def check(self, path: Path) -> None:
        """A :class:`ConfigError` naming ``path``, the field and its value unless the run's own fields are usable."""
        for name in ("total_timesteps", "n_envs", "eval_freq"):
            if getattr(self, name) <= 0:
                raise ConfigError(path, name, getattr(self, name), "must be > 0")
        if self.ppo.batch_size > self.ppo.n_steps * self.n_envs:
            raise ConfigError(path, "ppo.batch_size", self.ppo.batch_size, f"must be <= n_steps x n_envs = {self.ppo.n_steps * self.n_envs}")


def has_section(path: str | Path, section: str) -> bool:
    """True when the YAML training config at ``path`` has a top-level ``section`` (which kind of run it is)."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(raw, dict) and section in raw


@dataclass
class ExpertTrainConfig(ChoiceRunConfig):
    """One ``hedge-ppo`` training run (``rlsched train --config FILE``)."""

    expert_choice: ExpertChoiceConfig = field(default_factory=ExpertChoiceConfig)
    """the training episodes and the policy's shape"""


def is_expert_config(path: str | Path) -> bool:
    """True when the training config at ``path`` is a ``hedge-ppo`` one (has ``expert_choice:``)."""
    return has_section(path, "expert_choice")


def load_expert_config(path: str | Path) -> ExpertTrainConfig:
    """Read and check a ``hedge-ppo`` training config (errors name the file, field and value)."""
    path = Path(path)
    config: ExpertTrainConfig = _section(str(path), "", ExpertTrainConfig, read_yaml_config(path))
    config.check(path)
    choice = config.expert_choice
    if choice.advantages not in ("paired", "gae"):
        raise ConfigError(path, "expert_choice.advantages", choice.advantages, "allowed: paired, gae")
    if choice.paired_horizon <= 0:
        raise ConfigError(path, "expert_choice.paired_horizon", choice.paired_horizon, "must be > 0")
    if not choice.scenarios:
        raise ConfigError(path, "expert_choice.scenarios", [], "name at least one training scenario")
    if not choice.seeds or not choice.validation_seeds:
        raise ConfigError(path, "expert_choice.seeds", list(choice.seeds), "name training and validation seeds")
    if set(choice.seeds) & set(choice.validation_seeds):
        raise ConfigError(path, "expert_choice.validation_seeds", list(choice.validation_seeds), "must differ from expert_choice.seeds")
    from rlsched.agents.experts import scenario_of

    for spec in choice.scenarios:
        scenario_of(spec, f"{path}: expert_choice.scenarios")  # bad scenarios and traces fail before any work
    return config


def record_missing(config: ExpertTrainConfig, folder: Path) -> tuple[list[Path], list[Path]]:
    """(training, validation) stream files, recording the ones not in ``folder`` yet."""
    from tqdm import tqdm

    from rlsched.agents.experts import record_streams, scenario_of, stream_name
    from rlsched.envs.gpushare import GpuShareEnv

    choice = config.expert_choice
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(spec, seed, seed in choice.validation_seeds) for spec in choice.scenarios for seed in choice.seeds + choice.validation_seeds]
    train, validation = [], []
    missing = [(spec, seed) for spec, seed, _ in jobs if not (folder / f"{stream_name(spec, seed)}.pkl").exists()]
    with tqdm(total=len(missing), desc="recording expert streams", unit="episode", disable=not config.progress_bar or not missing) as bar:
        for spec, seed, is_validation in jobs:
            path = folder / f"{stream_name(spec, seed)}.pkl"
            if not path.exists():
                env = GpuShareEnv(scenario_of(spec, "expert_choice.scenarios"))
                record_streams(env, seed, f"{spec} seed {seed}", choice.calibration_samples).save(path)
                bar.update(1)
            (validation if is_validation else train).append(path)
    return train, validation


def validate(streams: list[Any], factor: float, choose: Any) -> np.ndarray:
    """What the node earns on each stream, request-equivalents, choosing with ``choose(env, observation) -> slot``."""
    from rlsched.agents.baselines.hedge import MigratorHedge
    from rlsched.agents.ppo.expert_env import ExpertChoiceEnv

    env = ExpertChoiceEnv(streams, factor, MigratorHedge())
    earned = np.zeros(len(streams))
    for i in range(len(streams)):
        observation, _ = env.reset(options={"stream": i})
        truncated = False
        while not truncated:
            observation, _, _, truncated, info = env.step(choose(env, observation))
            earned[i] += info["earned"]
    return earned


def train_expert_choice(config_path: str | Path, out: str | Path) -> Path:
    """Run the whole pipeline of the module docstring; returns the run folder."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlsched.agents.baselines.hedge import MigratorHedge
    from rlsched.agents.expert_policy import EXPERT_CHOICE_KIND, FACTOR_KEY
    from rlsched.agents.onnx_policy import KIND_KEY
    from rlsched.agents.experts import ExpertStreams, fit_switch_cost_factor
    from rlsched.agents.ppo.expert_env import EXPERT_LAYOUT, ExpertChoiceEnv

    config = load_expert_config(config_path)
    run = Path(out)
    run.mkdir(parents=True, exist_ok=True)
    write_text_atomically(run / "config.yaml", yaml.safe_dump(config.to_dict(), sort_keys=False))
    choice = config.expert_choice
    folder = Path(choice.streams) if choice.streams else run / "streams"
    train_files, validation_files = record_missing(config, folder)
    train = [ExpertStreams.load(p) for p in train_files]
    validation = [ExpertStreams.load(p) for p in validation_files]
    factor, factor_error = fit_switch_cost_factor(train)
    _, validation_factor_error = fit_switch_cost_factor(validation) if any(s.calibration for s in validation) else (factor, float("nan"))

    torch.manual_seed(config.seed)
    venv = DummyVecEnv([lambda: ExpertChoiceEnv(train, factor, MigratorHedge()) for _ in range(config.n_envs)])
    venv.seed(config.seed)
    model = scorer_model(config, venv, run, normalize_advantage=choice.advantages == "gae",  # paired ones are exact, mostly zero: keep their scale
                         policy_kwargs={"hidden": choice.hidden, "prior_weight": choice.prior_weight, "layout": EXPERT_LAYOUT, "learn_prior": False})

    metadata = {KIND_KEY: EXPERT_CHOICE_KIND, FACTOR_KEY: json.dumps(factor), CONFIG_KEY: json.dumps(config.to_dict()),
                "training_scenarios": json.dumps(list(choice.scenarios)),
                "switch_cost_factor_error": json.dumps({"train": factor_error, "validation": validation_factor_error})}
    rule = validate(validation, factor, lambda env, _: env.rule_action())
    planner = np.array([s.rewards[0, s.profile_intervals:].sum() for s in validation])
    fixed_best = np.array([s.rewards[1:, s.profile_intervals:].sum(axis=1).max() for s in validation])
    curve: list[tuple[int, float]] = []

    def evaluate(model: Any, steps: int, logger: Any) -> float:
        def learned(env: ExpertChoiceEnv, observation: np.ndarray) -> int:
            action, _ = model.predict(observation, deterministic=True, action_masks=env.action_masks())
            return int(action)

        earned = validate(validation, factor, learned)
        ratio = float(np.mean(earned / rule))
        curve.append((steps, ratio))
        logger.record("validation/x_rule", ratio)
        logger.record("validation/x_planner", float(np.mean(earned / planner)))
        logger.record("validation/x_best_fixed", float(np.mean(earned / fixed_best)))
        return ratio

    started = time.perf_counter()
    callbacks = [PeriodicValidation(run, config.eval_freq, metadata, evaluate)] + ([PairedAdvantages(train, factor, choice.paired_horizon)] if choice.advantages == "paired" else [])
    model.learn(config.total_timesteps, callback=callbacks, progress_bar=config.progress_bar)
    seconds = time.perf_counter() - started
    model.save(run / "final_model")
    best = MaskablePPO.load(run / "best_model", device="cpu")
    steps = json.loads((run / "best.json").read_text())["num_timesteps"]
    export_scorer(best.policy, run / POLICY_FILE, {**metadata, STEPS_KEY: str(steps)})
    summary = {"train_seconds": seconds, "steps_per_s": config.total_timesteps / seconds, "best_num_timesteps": steps,
               "switch_cost_factor": factor, "switch_cost_factor_error": {"train": factor_error, "validation": validation_factor_error},
               "curve": curve, "validation": {"rule": rule.tolist(), "planner": planner.tolist(), "best_fixed": fixed_best.tolist(),
                                               "streams": [s.source for s in validation]}}
    write_text_atomically(run / "summary.json", json.dumps(summary, indent=2) + "\n")
    plot_curve(curve, planner, fixed_best, rule, run / "learning_curve.png", model.logger)
    return run


def scorer_model(config: ChoiceRunConfig, venv: Any, run: Path, normalize_advantage: bool, policy_kwargs: dict[str, Any],
                 expected: bool = False, advantage_replay: int = 0) -> Any:
    """MaskablePPO with :class:`~rlsched.agents.ppo.candidate_policy.CandidateScorerPolicy` on
    ``venv``, set from ``config.ppo``, logging to ``run/tb``. Pass ``learn_prior: False`` in
    ``policy_kwargs`` unless PPO may move every state at once toward or away from the prior.
    ``expected``: :class:`~rlsched.agents.ppo.expected_ppo.ExpectedPPO` (its objective over every action),
    training each update also on ``advantage_replay`` earlier rollouts."""
    from sb3_contrib import MaskablePPO

    from rlsched.agents.ppo.candidate_policy import CandidateScorerPolicy
    from rlsched.agents.ppo.expected_ppo import ExpectedPPO

    p = config.ppo
    extra = {"advantage_replay": advantage_replay} if expected else {}
    return (ExpectedPPO if expected else MaskablePPO)(CandidateScorerPolicy, venv, **extra, learning_rate=p.learning_rate, n_steps=p.n_steps, batch_size=p.batch_size,
                       n_epochs=p.n_epochs, gamma=p.gamma, gae_lambda=p.gae_lambda, clip_range=p.clip_range, ent_coef=p.ent_coef,
                       vf_coef=p.vf_coef, max_grad_norm=p.max_grad_norm, seed=config.seed, device="cpu", tensorboard_log=str(run / "tb"),
                       normalize_advantage=normalize_advantage, policy_kwargs=policy_kwargs)


class PeriodicValidation(BaseCallback):
    """Validates a choice policy at the start of training (the warm start, exported first to
    ``run/warm_start.onnx`` so that it can be evaluated while PPO trains) and every
    ``eval_freq`` steps; logs to TensorBoard, saves a checkpoint per validation and keeps the
    best model (``run/best_model``, ``run/best.json``).

    :param evaluate: ``evaluate(model, num_timesteps, logger) -> score`` (higher is better);
        it records its own figures, this callback the speed and the dump
    :param resumed: the model continues a stopped run from a checkpoint: the warm start and
        the validations before it are the run folder's (``best.json`` keeps the best score),
        and the next validation is at the next multiple of ``eval_freq``
    """

    def __init__(self, run: Path, eval_freq: int, metadata: dict[str, str], evaluate: Any, resumed: bool = False) -> None:
        super().__init__()
        self.run, self.eval_freq, self.metadata, self.evaluate, self.resumed = run, eval_freq, metadata, evaluate, resumed
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
        self.best = json.loads((run / "best.json").read_text())["score"] if resumed else -np.inf
        self.next_at = 0
        self.started = time.perf_counter()
        self.started_at_steps = 0

    def _validate(self) -> None:
        score = self.evaluate(self.model, self.num_timesteps, self.logger)
        steps = self.num_timesteps - self.started_at_steps
        self.logger.record("perf/steps_per_s", steps / max(time.perf_counter() - self.started, 1e-9))
        self.logger.dump(self.num_timesteps)
        self.model.save(self.run / "checkpoints" / f"model_{self.num_timesteps}_steps")
        if score > self.best:
            self.best = score
            self.model.save(self.run / "best_model")
            write_text_atomically(self.run / "best.json", json.dumps({"num_timesteps": self.num_timesteps, "score": score}) + "\n")

    def _on_training_start(self) -> None:
        self.started, self.started_at_steps = time.perf_counter(), self.num_timesteps
        if self.resumed:
            self.next_at = (self.num_timesteps // self.eval_freq + 1) * self.eval_freq
            return
        export_scorer(self.model.policy, self.run / WARM_START_FILE, {**self.metadata, STEPS_KEY: "0"})
        self._validate()
        self.next_at = self.eval_freq

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.next_at:
            self._validate()
            self.next_at += self.eval_freq
        return True


class PairedAdvantages(BaseCallback):
    """Replaces PPO's advantage estimates by exact, paired counterfactual ones.

    The expert-choice environment is a deterministic replay, so what a departure from the
    hand-built rule is worth can be measured rather than estimated: from the state the step
    started in, one branch takes the policy's action and the other the rule's, both then
    follow the rule for ``horizon`` intervals on the same recorded traffic, and the
    difference of what they earn (per the node's requests per interval) is the step's
    advantage. Steps where the policy chose as the rule did get 0. This is the paired
    baseline for input-driven environments (the traffic's noise cancels between branches)
    and it makes PPO's update one step of policy improvement over the rule; the clipped
    objective, the masks and the entropy term are MaskablePPO's.
    """

    def __init__(self, streams: list[Any], factor: float, horizon: int) -> None:
        from rlsched.agents.baselines.hedge import MigratorHedge
        from rlsched.agents.ppo.expert_env import ExpertChoiceEnv

        super().__init__()
        self.env = ExpertChoiceEnv(streams, factor, MigratorHedge())
        self.horizon = horizon
        self.steps: list[list[tuple[tuple, int, int]]] = []

    def _on_rollout_start(self) -> None:
        self.steps = []

    def _on_step(self) -> bool:
        self.steps.append([(info["state"], int(a), int(info["rule_action"])) for info, a in zip(self.locals["infos"], self.locals["actions"], strict=True)])
        return True

    def _branch(self, state: tuple, action: int) -> float:
        self.env.restore(state)
        _, _, _, truncated, info = self.env.step(action)
        return info["earned"] + (0.0 if truncated else self.env.rule_return(self.horizon - 1))

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer
        advantages = np.zeros_like(buffer.advantages)
        departures = 0
        for t, row in enumerate(self.steps):
            for i, (state, action, rule_action) in enumerate(row):
                if action != rule_action:
                    gain = self._branch(state, action) - self._branch(state, rule_action)
                    advantages[t, i] = gain / self.env.stream.reward_scale
                    departures += 1
        buffer.advantages[:] = advantages
        self.logger.record("paired/departures", departures / max(advantages.size, 1))
        self.logger.record("paired/positive", float((advantages > 0).sum()) / max(departures, 1))


def export_scorer(policy: Any, path: Path, metadata: dict[str, str]) -> None:
    """The scorer as ONNX: ``observation`` float32 [batch, obs], ``action_mask`` bool [batch,
    slots] -> ``action`` int64 [batch] (masked argmax of the scores), ``scores`` float32 [batch, slots]."""
    import onnx
    import torch

    class Deployed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scorer = policy.mlp_extractor

        def forward(self, observation: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            scores = self.scorer.forward_actor(observation)
            masked = torch.where(action_mask, scores, torch.full_like(scores, -1e8))
            return torch.argmax(masked, dim=1), scores

    slots = policy.mlp_extractor.slots
    buffer = io.BytesIO()
    dummy = (torch.zeros(1, policy.observation_space.shape[0]), torch.ones(1, slots, dtype=torch.bool))
    # The TorchScript exporter: the scorer is a few fixed-shape layers, and the torch.export
    # one would need onnxscript, which rlsched does not install. It warns that it is legacy.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(Deployed().eval(), dummy, buffer, input_names=["observation", "action_mask"], output_names=["action", "scores"],
                          dynamic_axes={"observation": {0: "batch"}, "action_mask": {0: "batch"}}, opset_version=17, dynamo=False)
    graph = onnx.load_from_string(buffer.getvalue())
    for key, value in metadata.items():
        graph.metadata_props.add(key=key, value=value)
    write_bytes_atomically(path, graph.SerializeToString())


def plot_curve(curve: list[tuple[int, float]], planner: np.ndarray, fixed_best: np.ndarray, rule: np.ndarray, path: Path, logger: Any,
               policy_label: str = "hedge-ppo (validation)", warm_label: str = "warm start (the hand-built rule)",
               ylabel: str = "Goodput, x the warm start (surrogate)", summed: bool = False) -> None:
    """Validation Goodput (x ``rule``, the warm start's) against PPO steps, with the planner's and
    the best fixed layout's lines; saved as PNG and logged to TensorBoard. ``summed``: the
    lines are ratios of summed Goodput (as the curve's must then be), else means of the
    episodes' ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from stable_baselines3.common.logger import Image

    steps, ratio = zip(*curve, strict=True) if curve else ((), ())
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(steps, ratio, marker="o", label=policy_label)
    axes.axhline(1.0, color="gray", linestyle="--", label=warm_label)
    def relative(reference: np.ndarray) -> float:
        return float(reference.sum() / rule.sum() if summed else np.mean(reference / rule))

    axes.axhline(relative(planner), color="tab:red", linestyle=":", label="planner (migrator-ilp)")
    axes.axhline(relative(fixed_best), color="tab:green", linestyle="-.", label="best fixed layout (hindsight)")
    axes.set_xlabel("PPO steps")
    axes.set_ylabel(ylabel)
    axes.legend(fontsize=8)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    write_bytes_atomically(path, buffer.getvalue())
    logger.record("validation/learning_curve", Image(plt.imread(io.BytesIO(buffer.getvalue())), "HWC"), exclude=("stdout", "log", "json", "csv"))
    logger.dump(curve[-1][0] if curve else 0)
