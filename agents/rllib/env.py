"""The environment as RLlib's action-masking module wants it (no ray import here).

RLlib masks actions through the observation: a Dict with ``action_mask`` (1.0 for an
allowed level) and ``observations`` (the env's own). :class:`MaskedDictEnv` wraps the
training env of the SB3 engine (:class:`~rlsched.agents.ppo.family.FamilyEnv` under a
TimeLimit: the same family randomization, the same ``GpuShareEnv``) into that form.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np

#: Name under which :func:`register` puts the environment in Ray's registry (the same
#: environment as gymnasium's ``rlsched/GpuShare-v0``, per episode drawn from the family).
ENV_ID = "rlsched/GpuShare-v0"


class MaskedDictEnv(gym.Wrapper):
    """Observations as ``{"action_mask": float mask, "observations": obs}``; rewards scaled.

    :param env: an env with ``action_masks()`` (flat bool mask over the MultiDiscrete levels)
    :param reward_scale: rewards are multiplied by this (``info`` keeps the raw Goodput terms)
    """

    def __init__(self, env: gym.Env, reward_scale: float = 1.0) -> None:
        super().__init__(env)
        self.reward_scale = reward_scale
        levels = int(np.sum(env.action_space.nvec))
        self.observation_space = gym.spaces.Dict({
            "action_mask": gym.spaces.Box(0.0, 1.0, (levels,), np.float32),
            "observations": env.observation_space,
        })

    def _wrap(self, observation: np.ndarray) -> dict[str, np.ndarray]:
        return {"action_mask": np.asarray(self.env.unwrapped.action_masks(), dtype=np.float32), "observations": observation}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        return self._wrap(observation), info

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        return self._wrap(observation), float(reward) * self.reward_scale, terminated, truncated, info


def make_env(env_config: dict[str, Any]) -> gym.Env:
    """The env creator given to Ray's registry: ``env_config`` holds ``config`` (the training
    config as plain values) and ``perf_model``."""
    # One simulator thread per runner process: the runners already fill the cores.
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    from rlsched.agents.ppo.family import FamilyEnv, ScenarioFamily
    from rlsched.agents.rllib.config import rllib_config_from_dict

    config = rllib_config_from_dict(env_config["config"], "env_config")
    env = FamilyEnv(ScenarioFamily(config.scenario, config.randomization), env_config.get("perf_model", "calibrated"))
    return MaskedDictEnv(gym.wrappers.TimeLimit(env, config.max_episode_steps), config.rllib.reward_scale)


def register() -> None:
    """Register :func:`make_env` as :data:`ENV_ID` with ``ray.tune.registry.register_env``."""
    from ray.tune.registry import register_env

    register_env(ENV_ID, make_env)
