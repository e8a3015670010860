"""Config of the RLlib engine: a training config (:class:`~rlsched.agents.ppo.config.TrainConfig`,
the same fields and meanings as the SB3 engine's) plus an ``rllib:`` section.

How the shared fields map onto RLlib's PPO:

================================ ==========================================================
``n_envs``, ``vec_env``          environments per env runner (``num_envs_per_env_runner``),
                                 stepped in subprocesses (``subproc``: gymnasium's async
                                 vectorization) or in the runner's process (``dummy``: sync)
``ppo.n_steps``                  steps per environment per update: the train batch is
                                 ``n_steps x n_envs x max(1, num_env_runners)``
``ppo.batch_size``, ``n_epochs`` ``minibatch_size``, ``num_epochs``
``ppo.learning_rate``, ``gamma`` ``lr``, ``gamma``, ``lambda_`` (``gae_lambda``), ``clip_param``
...                              (``clip_range``), ``entropy_coeff``, ``vf_loss_coeff``,
                                 ``grad_clip`` (``max_grad_norm``); like SB3: no KL penalty,
                                 no value clipping
``ppo.net_arch``, ``activation`` ``fcnet_hiddens``, ``fcnet_activation`` (separate policy
                                 and value networks, as in SB3)
``checkpoint_freq``              an RLlib checkpoint (``checkpoints/rllib_<steps>_steps``)
================================ ==========================================================

Not available with RLlib (a non-default value is an error, not silently ignored):
observation and reward normalization (``normalize_obs``/``normalize_reward`` must be false;
observations are already in [0, 1], rewards are scaled by ``rllib.reward_scale``), the
behaviour-cloning warm start (``pretrain.teacher`` must be empty) and ``--resume``. The
periodic evaluation (``eval_*``) and ``device`` are not used: RLlib runs on CPU here, and the
exported ``policy.onnx`` is evaluated with ``rlsched eval --policies ppo:RUN``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsched.agents.ppo.config import TrainConfig, config_from_dict, load_config
from rlsched.errors import ConfigError


@dataclass
class RayConfig:
    """Where the RLlib engine runs and how wide (the ``rllib:`` section)."""

    address: str = ""
    """Ray cluster to join (``auto``, ``HOST:6379`` or ``ray://HOST:10001``); empty: the
    ``RAY_ADDRESS`` environment variable if set, else a local Ray instance (``--address``
    overrides both)"""
    num_cpus: int = 2
    """CPUs of the local Ray instance (not used when joining a cluster)"""
    num_env_runners: int = 1
    """EnvRunner actors sampling in parallel (0: sample in the driver process); on a
    cluster, raise this to the CPUs you want to sample with"""
    reward_scale: float = 1e-4
    """rewards are multiplied by this for learning (Goodput per interval is ~1e4 and RLlib has
    no reward normalization); logged returns (``rollout/ep_rew_mean``) are unscaled"""


@dataclass
class RllibTrainConfig(TrainConfig):
    """A training run of the RLlib engine (``rlsched train --engine rllib --config FILE``)."""

    rllib: RayConfig = field(default_factory=RayConfig)
    """Ray and RLlib settings"""


def _check(config: RllibTrainConfig, source: str) -> RllibTrainConfig:
    """Reject what the RLlib engine cannot do (instead of ignoring it)."""
    unsupported: list[tuple[str, Any, bool, str]] = [
        ("normalize_obs", config.normalize_obs, False, "the RLlib engine does not normalize observations (they are in [0, 1]); set false"),
        ("normalize_reward", config.normalize_reward, False, "the RLlib engine scales rewards by rllib.reward_scale instead; set false"),
        ("pretrain.teacher", config.pretrain.teacher, "", "the behaviour-cloning warm start is SB3-only; leave empty with --engine rllib"),
    ]
    for name, value, allowed, reason in unsupported:
        if value != allowed:
            raise ConfigError(source, name, value, reason)
    if not config.rllib.reward_scale > 0:
        raise ConfigError(source, "rllib.reward_scale", config.rllib.reward_scale, "must be > 0")
    if config.rllib.num_cpus < 1:
        raise ConfigError(source, "rllib.num_cpus", config.rllib.num_cpus, "must be >= 1")
    return config


def rllib_config_from_dict(raw: Any, source: str = "<memory>") -> RllibTrainConfig:
    """A checked :class:`RllibTrainConfig` from plain values."""
    config = config_from_dict(raw, source, RllibTrainConfig)
    assert isinstance(config, RllibTrainConfig)
    return _check(config, source)


def load_rllib_config(path: str | Path) -> RllibTrainConfig:
    """Read and check an RLlib training config file (``configs/train/rllib_*.yaml``)."""
    config = load_config(path, RllibTrainConfig)
    assert isinstance(config, RllibTrainConfig)
    return _check(config, str(path))
