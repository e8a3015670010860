"""RLlib PPO training (``rlsched train --engine rllib``) on a local Ray instance or a cluster.

The run folder mirrors the SB3 engine's (:mod:`rlsched.agents.ppo.train`):

=========================== ===============================================================
``config.yaml``             the exact config of the run (``rllib:`` section included)
``tb/rllib_1/``             TensorBoard events: the :mod:`rlsched.metrics` names, SB3's
                            ``rollout/ep_rew_mean``/``ep_len_mean`` and ``train/*`` names
                            where RLlib has the quantity, and every other numeric RLlib
                            result under ``rllib/...``
``checkpoint/``             the final RLlib checkpoint (``Algorithm.from_checkpoint``; the
                            policy module under ``learner_group/learner/rl_module/``)
``checkpoints/``            ``rllib_<steps>_steps/`` every ``checkpoint_freq`` steps
``policy.onnx``             the final policy in the daemon's format (:mod:`.export`)
=========================== ===============================================================

Ray is imported inside :func:`train_rllib` (after :func:`~rlsched.agents.rllib.require_ray`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.agents.rllib import require_ray
from rlsched.agents.rllib.config import RllibTrainConfig, load_rllib_config
from rlsched.errors import ConfigError
from rlsched.fileio import write_text_atomically
from rlsched.metrics import STEPS_PER_S

#: TensorBoard run name under ``<run>/tb`` (the SB3 engine writes ``ppo_1``).
TB_RUN = "rllib_1"
CONFIG_FILE = "config.yaml"
CHECKPOINT_DIR = "checkpoints"
FINAL_CHECKPOINT = "checkpoint"
POLICY_FILE = "policy.onnx"
#: Where the policy module lies inside an RLlib checkpoint.
MODULE_IN_CHECKPOINT = Path("learner_group") / "learner" / "rl_module" / "default_policy"
#: RLlib learner results logged under SB3's names as well: (RLlib key, SB3 name, sign).
SB3_LEARNER_NAMES = (("policy_loss", "train/policy_gradient_loss", 1.0), ("vf_loss", "train/value_loss", 1.0),
                     ("entropy", "train/entropy_loss", -1.0), ("curr_kl_coeff", "train/kl_coeff", 1.0),
                     ("default_optimizer_learning_rate", "train/learning_rate", 1.0))


def ppo_algorithm_config(config: RllibTrainConfig, perf_model: str = "calibrated") -> Any:
    """RLlib's ``PPOConfig`` of a training config (the mapping: :mod:`.config`)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.rl_modules.classes.action_masking_rlm import ActionMaskingTorchRLModule

    from rlsched.agents.rllib.callbacks import MetricsCallback
    from rlsched.agents.rllib.env import ENV_ID

    p, runners = config.ppo, config.rllib.num_env_runners
    vectorize = "async" if config.vec_env == "subproc" and config.n_envs > 1 else "sync"
    return (
        PPOConfig()
        .environment(ENV_ID, env_config={"config": config.to_dict(), "perf_model": perf_model})
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=config.n_envs, gym_env_vectorize_mode=vectorize)
        .learners(num_learners=0)
        .training(lr=p.learning_rate, train_batch_size_per_learner=p.n_steps * config.n_envs * max(1, runners), minibatch_size=p.batch_size,
                  num_epochs=p.n_epochs, gamma=p.gamma, lambda_=p.gae_lambda, clip_param=p.clip_range, entropy_coeff=p.ent_coef,
                  vf_loss_coeff=p.vf_coef, grad_clip=p.max_grad_norm,
                  # As SB3's MaskablePPO: no KL penalty, no clipping of the value loss.
                  use_kl_loss=False, vf_clip_param=math.inf)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=ActionMaskingTorchRLModule, model_config={
            "fcnet_hiddens": list(p.net_arch), "fcnet_activation": p.activation, "vf_share_layers": False, "head_fcnet_hiddens": []}))
        .callbacks(MetricsCallback)
        .debugging(seed=config.seed, log_level="ERROR")
    )


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, float]]:
    """Numeric leaves of a nested result dict as (``a/b/c``, value)."""
    if isinstance(value, Mapping):
        for key, sub in value.items():
            yield from _flatten(f"{prefix}/{key}" if prefix else str(key), sub)
    elif isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool) and math.isfinite(float(value)):
        yield prefix, float(value)


def result_scalars(result: Mapping[str, Any], config: RllibTrainConfig, wall_s: float, steps: int) -> dict[str, float]:
    """The TensorBoard scalars of one iteration (see the module docstring).

    :param wall_s: wall time since the previous iteration's result, seconds
    :param steps: environment steps sampled in that time
    """
    from rlsched.agents.rllib.callbacks import TOTALS_KEY, iteration_metrics

    out = iteration_metrics(dict(result))
    if wall_s > 0 and steps > 0:
        out[STEPS_PER_S] = steps / wall_s
    runners = result.get("env_runners", {})
    if "episode_return_mean" in runners and math.isfinite(runners["episode_return_mean"]):
        out["rollout/ep_rew_mean"] = float(runners["episode_return_mean"]) / config.rllib.reward_scale
    if "episode_len_mean" in runners and math.isfinite(runners["episode_len_mean"]):
        out["rollout/ep_len_mean"] = float(runners["episode_len_mean"])
    learner = result.get("learners", {}).get("default_policy", {})
    for key, name, sign in SB3_LEARNER_NAMES:
        if key in learner:
            out[name] = sign * float(learner[key])
    for name, value in _flatten("rllib", {k: v for k, v in result.items() if k not in ("config",)}):
        if TOTALS_KEY not in name:
            out[name] = value
    return out


def sampled_steps(result: Mapping[str, Any]) -> int:
    """Environment steps sampled since the start of training (RLlib's lifetime counter)."""
    return int(result.get("num_env_steps_sampled_lifetime") or result["env_runners"]["num_env_steps_sampled_lifetime"])


def _run_config(config_path: str | Path | None, run_dir: Path, resume: bool) -> RllibTrainConfig:
    """The checked config of a new run (nothing is written yet)."""
    if resume:
        raise ConfigError("--resume", "--resume", True, "the RLlib engine starts fresh runs only (Algorithm.from_checkpoint(RUN/checkpoint) continues one in Python)")
    if config_path is None:
        raise ConfigError("--config", "--config", None, "a new run needs a config file (configs/train/rllib_*.yaml)")
    config = load_rllib_config(config_path)
    if (run_dir / CONFIG_FILE).exists():
        raise ConfigError(run_dir, "--out", str(run_dir), "already holds a run; use another folder")
    return config


def _init_ray(config: RllibTrainConfig, address: str | None, verbose: int) -> bool:
    """Join the cluster (``--address``, ``rllib.address``, ``RAY_ADDRESS``) or start a local
    Ray; returns whether this call started Ray (and so must shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    address = address or config.rllib.address or os.environ.get("RAY_ADDRESS", "")
    if address:
        ray.init(address=address, log_to_driver=bool(verbose))
    else:
        ray.init(num_cpus=config.rllib.num_cpus, include_dashboard=False, log_to_driver=bool(verbose))
    return True


def train_rllib(config_path: str | Path | None, run_dir: str | Path, resume: bool = False, address: str | None = None,
                perf_model: str = "calibrated", verbose: int = 0) -> Path:
    """Train a run with RLlib PPO; returns the run folder (``policy.onnx`` included).

    :param config_path: the training config (``configs/train/rllib_*.yaml``)
    :param run_dir: the run folder
    :param resume: not supported (an error), kept for the CLI's uniform call
    :param address: Ray cluster address (overrides the config and ``RAY_ADDRESS``)
    :param perf_model: ``calibrated`` or ``toy`` (tests)
    :param verbose: 1: forward the Ray workers' logs to this terminal
    """
    run_dir = Path(run_dir)
    config = _run_config(config_path, run_dir, resume)
    require_ray()  # after the config check, before the run folder is written
    write_text_atomically(run_dir / CONFIG_FILE, config.to_yaml())
    import ray
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    from rlsched.agents.rllib.env import register
    from rlsched.agents.rllib.export import export_rllib_run

    started_ray = _init_ray(config, address, verbose)
    algo = writer = None
    try:
        register()
        algo = ppo_algorithm_config(config, perf_model).build_algo()
        writer = SummaryWriter(str(run_dir / "tb" / TB_RUN))
        steps, last_steps, last_time = 0, 0, time.perf_counter()
        next_checkpoint = config.checkpoint_freq
        with tqdm(total=config.total_timesteps, unit="step", disable=not config.progress_bar, desc="rllib ppo") as bar:
            while steps < config.total_timesteps:
                result = algo.train()
                now = time.perf_counter()
                steps = sampled_steps(result)
                scalars = result_scalars(result, config, now - last_time, steps - last_steps)
                for name, value in scalars.items():
                    writer.add_scalar(name, value, steps)
                writer.flush()
                bar.update(steps - last_steps)
                bar.set_postfix({"steps/s": f"{scalars.get(STEPS_PER_S, 0.0):.0f}", "goodput/total": f"{scalars.get('goodput/total', float('nan')):.0f}"})
                last_steps, last_time = steps, now
                if steps >= next_checkpoint:
                    algo.save_to_path(str((run_dir / CHECKPOINT_DIR / f"rllib_{steps}_steps").resolve()))
                    next_checkpoint += config.checkpoint_freq
        algo.save_to_path(str((run_dir / FINAL_CHECKPOINT).resolve()))
        # From the checkpoint, as `rlsched export-policy` does: the export checks the save.
        export_rllib_run(run_dir)
    finally:
        if writer is not None:
            writer.close()
        if algo is not None:
            algo.stop()
        if started_ray:
            ray.shutdown()
    return run_dir
