"""PPO training (``rlsched train``): MaskablePPO on a randomized scenario family.

The run folder (RL Zoo habit) holds everything a result can be reproduced from:

=========================== ===============================================================
``config.yaml``             the exact config of the run (written atomically before training)
``model.zip``               the final model; ``vecnormalize.pkl`` its normalization stats
``best/``                   ``best_model.zip`` + ``vecnormalize.pkl``: best evaluation so far
``checkpoints/``            ``ppo_<steps>_steps.zip`` + ``ppo_vecnormalize_<steps>_steps.pkl``
``tb/``                     TensorBoard events (SB3 scalars + :mod:`rlsched.metrics` names)
``timelines/``              the partition timeline PNG of each evaluation
``evaluations.npz``         the evaluation returns (SB3 format)
``pretrain.json``           the behaviour-cloning warm start's fit (when a teacher is set)
``pretrain/``               the student of each fit (``student_<round>.onnx``; round 0: the teacher's own episodes)
``policy.onnx``             the exported policy (:mod:`rlsched.agents.ppo.export`)
=========================== ===============================================================

``resume=True`` continues from the newest checkpoint of the run folder (model, VecNormalize
stats and step count) with the config stored there.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import torch
from sb3_contrib import MaskablePPO
from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.utils import set_random_seed
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecNormalize

from rlsched.agents.ppo.callbacks import MetricsEvalCallback, RolloutMetricsCallback
from rlsched.agents.ppo.config import TrainConfig, load_config
from rlsched.agents.ppo.family import FamilyEnv, ScenarioFamily
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.fileio import write_bytes_atomically, write_text_atomically

if TYPE_CHECKING:
    from rlsched.agents.ppo.pretrain import Demonstrations

CONFIG_FILE = "config.yaml"
PRETRAIN_FILE = "pretrain.json"
PRETRAIN_DIR = "pretrain"
MODEL_FILE = "model.zip"
VECNORMALIZE_FILE = "vecnormalize.pkl"
BEST_DIR = "best"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PREFIX = "ppo"
ACTIVATIONS: dict[str, type[torch.nn.Module]] = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}


def _training_env_factory(config: TrainConfig, rank: int, perf_model: str) -> Callable[[], gym.Env]:
    def make() -> gym.Env:
        # One simulator thread per process: the processes already fill the cores.
        os.environ.setdefault("NUMBA_NUM_THREADS", "1")
        torch.set_num_threads(1)
        env = FamilyEnv(ScenarioFamily(config.scenario, config.randomization), perf_model)
        env = gym.wrappers.TimeLimit(env, config.max_episode_steps)
        env = Monitor(env)
        env.reset(seed=config.seed + rank)
        return env

    return make


def _eval_env_factory(config: TrainConfig, perf_model: str) -> Callable[[], gym.Env]:
    def make() -> gym.Env:
        return Monitor(gym.wrappers.TimeLimit(GpuShareEnv(config.eval_scenario, perf_model=perf_model), config.max_episode_steps))

    return make


def make_vec_env(config: TrainConfig, perf_model: str = "calibrated") -> VecEnv:
    """The training environments (``config.n_envs`` of them, ``subproc`` or ``dummy``)."""
    factories = [_training_env_factory(config, rank, perf_model) for rank in range(config.n_envs)]
    if config.vec_env == "subproc" and config.n_envs > 1:
        return SubprocVecEnv(factories, start_method="spawn")
    return DummyVecEnv(factories)


def new_model(config: TrainConfig, venv: VecEnv, seed: int, tensorboard_dir: Path | None = None, verbose: int = 0) -> MaskablePPO:
    """A freshly initialized MaskablePPO with the config's hyper-parameters and network."""
    p = config.ppo
    return MaskablePPO(
        "MlpPolicy", venv, learning_rate=p.learning_rate, n_steps=p.n_steps, batch_size=p.batch_size, n_epochs=p.n_epochs,
        gamma=p.gamma, gae_lambda=p.gae_lambda, clip_range=p.clip_range, ent_coef=p.ent_coef, vf_coef=p.vf_coef,
        max_grad_norm=p.max_grad_norm, seed=seed, device=config.device, verbose=verbose,
        tensorboard_log=None if tensorboard_dir is None else str(tensorboard_dir),
        policy_kwargs={"net_arch": {"pi": list(p.net_arch), "vf": list(p.net_arch)}, "activation_fn": ACTIVATIONS[p.activation]},
    )


def latest_checkpoint(run_dir: Path) -> tuple[Path, Path, int] | None:
    """(model, VecNormalize stats, steps) of the newest checkpoint in the run folder, or None."""
    found = []
    for path in (run_dir / CHECKPOINT_DIR).glob(f"{CHECKPOINT_PREFIX}_*_steps.zip"):
        match = re.fullmatch(rf"{CHECKPOINT_PREFIX}_(\d+)_steps\.zip", path.name)
        stats = run_dir / CHECKPOINT_DIR / f"{CHECKPOINT_PREFIX}_vecnormalize_{match.group(1)}_steps.pkl" if match else None
        if match and stats is not None and stats.exists():
            found.append((int(match.group(1)), path, stats))
    if not found:
        return None
    steps, model, stats = max(found)
    return model, stats, steps


def _prepare_run(config_path: str | Path | None, run_dir: Path, resume: bool) -> TrainConfig:
    """The config of the run; writes it to the run folder (fresh run) or checks it (resume)."""
    stored = run_dir / CONFIG_FILE
    if resume:
        if not stored.exists():
            raise ConfigError(run_dir, CONFIG_FILE, str(stored), "--resume needs a run folder with its config.yaml")
        config = load_config(stored)
        if config_path is not None and load_config(config_path) != config:
            raise ConfigError(config_path, "file", str(config_path), f"differs from the run's {stored}; resume without --config or start a new run")
        return config
    if config_path is None:
        raise ConfigError("--config", "--config", None, "a new run needs a config file (configs/train/*.yaml)")
    config = load_config(config_path)
    if (run_dir / MODEL_FILE).exists() or latest_checkpoint(run_dir) is not None:
        raise ConfigError(run_dir, "--out", str(run_dir), "already holds a run; use --resume or another folder")
    write_text_atomically(stored, config.to_yaml())
    return config


def _warm_start(config: TrainConfig, model: MaskablePPO, venv: VecNormalize, perf_model: str, run_dir: Path) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Behaviour cloning of the configured teacher, then its DAgger rounds (see
    :mod:`rlsched.agents.ppo.pretrain`).

    Each round's new labels are kept as ``pretrain/demonstrations_<round>.npz`` (for refits:
    ``scripts/refit_student.py``), each fit's student as ``pretrain/student_<round>.onnx``,
    validated on ``eval_scenario``; the model and its normalization end as the best
    validated student (a refit on more labels does not always decide better on whole
    episodes).

    Every round's ``pretrain/*`` values also go to TensorBoard (``tb/pretrain``, step = round).

    :returns: the summary (``pretrain/*`` scalars) and one record per round
    """
    import copy

    from torch.utils.tensorboard import SummaryWriter

    from rlsched.agents.ppo.pretrain import Demonstrations, collect

    p = config.pretrain
    family = ScenarioFamily(config.scenario, config.randomization)
    validation_env = GpuShareEnv(config.eval_scenario, perf_model=perf_model)
    seed = config.seed + 20_000
    teacher_seed = seed + 1_000  # one family-static-best configuration for every round
    demos, objectives = collect(family, p.teacher, p.episodes, config.max_episode_steps, seed, perf_model, p.perturbation, p.family_draws,
                                workers=p.workers, progress=config.progress_bar, teacher_seed=teacher_seed)
    demos.save(run_dir / PRETRAIN_DIR / "demonstrations_0.npz")
    teacher_goodput = float(np.mean(objectives))
    # One point per round (x axis: the round) in TensorBoard, next to PPO's scalars.
    writer = SummaryWriter(str(run_dir / "tb" / "pretrain"))
    writer.add_scalar("pretrain/teacher_goodput", teacher_goodput, 0)
    rounds: list[dict[str, float]] = []
    best: tuple[float, int, dict, object, object] | None = None
    for round_ in range(p.dagger_iterations + 1):
        if round_ > 0:
            # Refit from fresh weights: continuing the previous fit for another `epochs`
            # passes over-trained the student (accuracy 0.96 on its labels, fewer right
            # decisions on held-out traces than a 30-epoch fit from scratch).
            model.policy._build(model.lr_schedule)  # noqa: SLF001  SB3's own initialization
        student = run_dir / PRETRAIN_DIR / f"student_{round_}.onnx"
        fit = _fit_student(config, model, venv, demos, p.epochs, student, validation_env, p.validation_episodes)
        validation = fit["pretrain/validation_goodput"]
        rounds.append({"round": float(round_), **fit})
        for key, value in rounds[-1].items():
            if key.startswith("pretrain/"):
                writer.add_scalar(key, value, round_)
        writer.flush()
        if best is None or validation > best[0]:
            best = (validation, round_, copy.deepcopy(model.policy.state_dict()), copy.deepcopy(venv.obs_rms), copy.deepcopy(venv.ret_rms))
        if round_ == p.dagger_iterations:
            break
        seed += max(p.episodes, p.dagger_episodes)  # fresh draws every round
        new, objectives = collect(family, p.teacher, p.dagger_episodes, config.max_episode_steps, seed, perf_model, p.dagger_perturbation, p.family_draws,
                                  student=student, workers=p.workers, progress=config.progress_bar, teacher_seed=teacher_seed)
        new.save(run_dir / PRETRAIN_DIR / f"demonstrations_{round_ + 1}.npz")
        rounds[-1]["pretrain/student_goodput"] = float(np.mean(objectives))  # this student, acting on training draws
        writer.add_scalar("pretrain/student_goodput", rounds[-1]["pretrain/student_goodput"], round_)
        demos = Demonstrations.concatenate([demos, new])
    writer.close()
    _, round_, weights, venv.obs_rms, venv.ret_rms = best
    model.policy.load_state_dict(weights)
    summary = {key: value for key, value in rounds[round_].items() if key.startswith("pretrain/")}
    return {**summary, "pretrain/teacher_goodput": teacher_goodput, "pretrain/best_round": float(round_), "pretrain/dagger_rounds": float(p.dagger_iterations)}, rounds


def _fit_student(config: TrainConfig, model: MaskablePPO, venv: VecNormalize, demos: Demonstrations, epochs: int, out: Path,
                 validation_env: GpuShareEnv, validation_episodes: int) -> dict[str, float]:
    """Fit ``model`` to the demonstrations, export it to ``out`` and validate the export on
    ``eval_scenario`` (mean episode Goodput, seeds ``seed + 10,000`` on)."""
    from rlsched.agents.evaluation import run_episode
    from rlsched.agents.ppo.export import build_onnx
    from rlsched.agents.ppo.pretrain import warm_start

    p = config.pretrain
    fit = warm_start(model, venv, demos, epochs, p.learning_rate, p.batch_size, config.ppo.gamma)
    write_bytes_atomically(out, build_onnx(model, venv.obs_rms.mean, venv.obs_rms.var, venv.clip_obs).SerializeToString())
    validation = float(np.mean([run_episode(validation_env, f"ppo:{out}", config.seed + 10_000 + k).goodput for k in range(validation_episodes)]))
    return {"samples": float(len(demos.actions)), **fit, "pretrain/validation_goodput": validation}


def refit_student(run_dir: str | Path, out: str | Path, rounds: list[int] | None = None, epochs: int | None = None, seed: int | None = None,
                  validation_episodes: int | None = None, perf_model: str = "calibrated") -> dict[str, float]:
    """Fit a fresh student to a run's saved warm-start labels and validate it, without asking
    the teacher again (the planner's labels are the slow part of a run).

    :param run_dir: a run folder whose warm start saved ``pretrain/demonstrations_<round>.npz``
    :param out: the student's .onnx file
    :param rounds: which rounds' labels to fit (default: all saved)
    :param epochs: passes over the labels (default: the run's ``pretrain.epochs``)
    :param seed: initialization seed (default: the run's ``seed``)
    :param validation_episodes: episodes on ``eval_scenario`` (default: the run's)
    :returns: samples, the fit's ``pretrain/*`` values and ``pretrain/validation_goodput``
    """
    from rlsched.agents.ppo.pretrain import Demonstrations

    run_dir = Path(run_dir)
    config = load_config(run_dir / CONFIG_FILE)
    p = config.pretrain
    saved = {int(m.group(1)): path for path in (run_dir / PRETRAIN_DIR).glob("demonstrations_*.npz") if (m := re.fullmatch(r"demonstrations_(\d+)\.npz", path.name))}
    if not saved:
        raise ConfigError(run_dir, PRETRAIN_DIR, str(run_dir / PRETRAIN_DIR), "no saved demonstrations (a run with a pretrain.teacher saves them)")
    rounds = sorted(saved) if rounds is None else rounds
    missing = [r for r in rounds if r not in saved]
    if missing or not rounds:
        raise ConfigError(run_dir, "--rounds", rounds, f"saved rounds: {sorted(saved)}")
    for name, value in (("--epochs", epochs), ("--validation-episodes", validation_episodes)):
        if value is not None and value < 1:
            raise ConfigError("refit", name, value, "must be >= 1")
    demos = Demonstrations.concatenate([Demonstrations.load(saved[r]) for r in rounds])
    torch.set_num_threads(1)
    venv = VecNormalize(DummyVecEnv([_eval_env_factory(config, perf_model)]), norm_obs=config.normalize_obs, norm_reward=config.normalize_reward,
                        clip_obs=config.clip_obs, gamma=config.ppo.gamma)
    model = new_model(config, venv, config.seed if seed is None else seed)
    validation_env = GpuShareEnv(config.eval_scenario, perf_model=perf_model)
    return _fit_student(config, model, venv, demos, p.epochs if epochs is None else epochs, Path(out), validation_env,
                        p.validation_episodes if validation_episodes is None else validation_episodes)


def _save_atomically(save: Callable[[Path], object], path: Path) -> None:
    """Save through a temporary file and a rename: a reader never sees half a model."""
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    save(tmp)
    os.replace(tmp, path)


def train(config_path: str | Path | None, run_dir: str | Path, resume: bool = False, perf_model: str = "calibrated", verbose: int = 0) -> Path:
    """Train (or resume) a run; returns the run folder.

    :param config_path: the training config (YAML); optional when resuming
    :param run_dir: the run folder
    :param resume: continue from the newest checkpoint of ``run_dir``
    :param perf_model: ``calibrated`` or ``toy`` (tests)
    :param verbose: SB3 verbosity (0: quiet, 1: per-rollout table)
    """
    run_dir = Path(run_dir)
    config = _prepare_run(config_path, run_dir, resume)
    set_random_seed(config.seed)
    torch.set_num_threads(1)
    venv = make_vec_env(config, perf_model)
    eval_venv = DummyVecEnv([_eval_env_factory(config, perf_model)])
    eval_venv.seed(config.seed + 10_000)
    checkpoint = latest_checkpoint(run_dir) if resume else None
    pretrain_metrics: dict[str, float] = {}
    if checkpoint is not None:
        model_path, stats_path, _ = checkpoint
        venv = VecNormalize.load(str(stats_path), venv)
        model = MaskablePPO.load(model_path, env=venv, device=config.device)
    else:
        if resume:
            raise ConfigError(run_dir, CHECKPOINT_DIR, str(run_dir / CHECKPOINT_DIR), "no checkpoint to resume from")
        venv = VecNormalize(venv, norm_obs=config.normalize_obs, norm_reward=config.normalize_reward, clip_obs=config.clip_obs, gamma=config.ppo.gamma)
        model = new_model(config, venv, config.seed, run_dir / "tb", verbose)
        if config.pretrain.teacher:
            pretrain_metrics, rounds = _warm_start(config, model, venv, perf_model, run_dir)
            write_text_atomically(run_dir / PRETRAIN_FILE, json.dumps({**pretrain_metrics, "rounds": rounds}, indent=2) + "\n")
    # The eval env normalizes observations like training (stats synced at each evaluation)
    # and reports raw rewards.
    eval_venv = VecNormalize(eval_venv, norm_obs=config.normalize_obs, norm_reward=False, clip_obs=config.clip_obs, training=False)
    eval_scenario = eval_venv.get_attr("unwrapped")[0].scenario
    per_env = lambda steps: max(1, steps // config.n_envs)  # noqa: E731  callbacks count calls, one per n_envs steps
    callbacks = CallbackList([
        RolloutMetricsCallback(pretrain_metrics),
        CheckpointCallback(per_env(config.checkpoint_freq), str(run_dir / CHECKPOINT_DIR), name_prefix=CHECKPOINT_PREFIX, save_vecnormalize=True),
        MetricsEvalCallback(
            eval_venv, n_eval_episodes=config.eval_episodes, eval_freq=per_env(config.eval_freq), log_path=str(run_dir),
            best_model_save_path=str(run_dir / BEST_DIR), deterministic=True, verbose=verbose,
            gpu=eval_scenario.gpu, interval_s=eval_scenario.decision_interval_s, timeline_dir=run_dir / "timelines",
        ),
    ])
    remaining = config.total_timesteps - model.num_timesteps
    try:
        if remaining > 0:
            model.learn(remaining, callback=callbacks, progress_bar=config.progress_bar, reset_num_timesteps=checkpoint is None, tb_log_name="ppo")
        _save_atomically(lambda tmp: model.save(tmp), run_dir / MODEL_FILE)
        _save_atomically(lambda tmp: venv.save(str(tmp)), run_dir / VECNORMALIZE_FILE)
    finally:
        venv.close()
        eval_venv.close()
    return run_dir
