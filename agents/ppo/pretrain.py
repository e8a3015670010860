"""Behaviour-cloning warm start: the PPO policy first imitates a baseline ("teacher"), then PPO
improves on it.

From scratch, PPO spends most of a short budget (the environment runs ~200-400 steps/s on
two cores) climbing out of random configurations that serve almost nothing on time. The
teacher's episodes are run on draws of the same scenario family; each step's label is the
action that encodes the configuration the teacher actually applied
(:meth:`ActionCodec.encode`), so the student learns what the repair should be asked for.
The value network is fitted to the discounted, VecNormalize-scaled returns of those
episodes, so that PPO's first advantages are not noise that would undo the imitation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rlsched.agents.baselines import Decision, apply, make_policy
from rlsched.agents.ppo.family import ScenarioFamily
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.simulator.perf import PerformanceModelLike


@dataclass
class Demonstrations:
    """The teacher's steps: observations, action labels, masks, and per-episode rewards.

    :param observations: float32 ``[steps, obs_dim]`` (raw, before normalization)
    :param actions: int64 ``[steps, components]``
    :param masks: bool ``[steps, sum(nvec)]``
    :param episode_rewards: per episode, the rewards of its steps (request-equivalents)
    """

    observations: np.ndarray
    actions: np.ndarray
    masks: np.ndarray
    episode_rewards: list[np.ndarray]


def _label(env: GpuShareEnv, decision: Decision, applied: Configuration) -> np.ndarray | None:
    """The action that asks for what the teacher decided (None when only its applied
    configuration could tell, and it did not apply it)."""
    if isinstance(decision, Configuration):
        return env.codec.encode(decision)
    if isinstance(decision, np.ndarray):
        return decision.astype(np.int64)
    return env.codec.encode(applied) if applied is not None else None


#: Teacher name of :func:`family_static_best` (next to the baselines' names).
FAMILY_STATIC_BEST = "family-static-best"


def family_static_best(family: ScenarioFamily, draws: int, seed: int, perf_model: PerformanceModelLike) -> Configuration:
    """The fixed configuration with the highest mean episode Goodput over ``draws`` draws of
    the family, among the static-best winners of those draws.

    Static-best's winner depends on each episode's future (hindsight), so cloning it per
    episode gives labels the observation cannot explain, and the per-component argmax of
    the clone mixes parts of different configurations. One configuration for the whole
    family is a consistent label that uses training draws only.
    """
    from rlsched.agents.baselines.hindsight import FixedConfiguration, StaticBest, rollout

    rng = np.random.default_rng(seed)
    envs, winners = [], []
    for k in range(draws):
        env = GpuShareEnv(family.sample(rng), perf_model=perf_model)
        env.reset(seed=seed + k)
        teacher = StaticBest()
        teacher.reset(env)
        envs.append(env)
        if teacher.configuration not in winners:
            winners.append(teacher.configuration)
    scores = [np.mean([rollout(env, env.backend_seed, FixedConfiguration(c))[0] for env in envs]) for c in winners]
    return winners[int(np.argmax(scores))]


def collect(family: ScenarioFamily, teacher: str, episodes: int, max_steps: int, seed: int, perf_model: PerformanceModelLike,
            perturbation: float = 0.0, family_draws: int = 8) -> Demonstrations:
    """Run the teacher for ``episodes`` episodes of random draws of ``family``.

    :param teacher: a baseline name, or :data:`FAMILY_STATIC_BEST`
    :param family_draws: draws :func:`family_static_best` chooses its configuration on

    :param perturbation: probability that a step executes a random action instead of the
        teacher's (its label stays the teacher's decision): the student then also sees
        states off the teacher's path and learns the way back (DART-style noise injection;
        without it, a cloned policy that drifts once keeps drifting)
    """
    from rlsched.agents.baselines.hindsight import FixedConfiguration

    fixed = family_static_best(family, family_draws, seed + 1_000, perf_model) if teacher == FAMILY_STATIC_BEST else None
    rng = np.random.default_rng(seed)
    observations, actions, masks, rewards = [], [], [], []
    for episode in range(episodes):
        env = GpuShareEnv(family.sample(rng), perf_model=perf_model)
        env.action_space.seed(seed + episode)
        observation, _ = env.reset(seed=seed + episode)
        policy = FixedConfiguration(fixed) if fixed is not None else make_policy(teacher)
        policy.reset(env)
        episode_rewards = []
        for _ in range(max_steps):
            mask = env.action_masks()
            decision = policy.act(observation, env)
            perturbed = rng.random() < perturbation
            next_observation, reward, _, truncated, info = apply(env, env.action_space.sample(mask=_component_masks(env, mask)) if perturbed else decision)
            label = _label(env, decision, None if perturbed else info["configuration"])
            if label is not None:
                observations.append(observation)
                actions.append(label)
                masks.append(mask)
            episode_rewards.append(reward)
            observation = next_observation
            if truncated:
                break
        rewards.append(np.asarray(episode_rewards, dtype=np.float64))
    return Demonstrations(np.asarray(observations, dtype=np.float32), np.asarray(actions, dtype=np.int64), np.asarray(masks, dtype=bool), rewards)


def _component_masks(env: GpuShareEnv, mask: np.ndarray) -> tuple[np.ndarray, ...]:
    """The flat mask split per MultiDiscrete component (what ``space.sample(mask=...)`` takes)."""
    return tuple(np.split(mask.astype(np.int8), np.cumsum(env.action_space.nvec)[:-1]))


def warm_start(model: object, venv: object, demos: Demonstrations, epochs: int, learning_rate: float, batch_size: int, gamma: float) -> dict[str, float]:
    """Fit ``model``'s policy to the demonstrations (cross-entropy) and its value network to
    their returns; seeds ``venv``'s (VecNormalize) observation and return statistics with them.

    :returns: ``pretrain/accuracy`` (fraction of steps whose whole action the deterministic
        policy reproduces) and ``pretrain/policy_loss`` after the last epoch
    """
    venv.obs_rms.update(demos.observations.astype(np.float64))  # type: ignore[attr-defined]
    # VecNormalize scales rewards by the std of the running discounted return: do the same.
    running = np.concatenate([np.array([np.sum(r[: i + 1] * gamma ** np.arange(i, -1, -1)) for i in range(len(r))]) for r in demos.episode_rewards])
    venv.ret_rms.update(running)  # type: ignore[attr-defined]
    scale = float(np.sqrt(venv.ret_rms.var + venv.epsilon))  # type: ignore[attr-defined]
    targets = []
    for r in demos.episode_rewards:
        scaled = np.clip(r / scale, -venv.clip_reward, venv.clip_reward)  # type: ignore[attr-defined]
        value, out = 0.0, np.empty_like(scaled)
        for i in range(len(scaled) - 1, -1, -1):
            value = scaled[i] + gamma * value
            out[i] = value
        targets.append(out)
    policy = model.policy  # type: ignore[attr-defined]
    obs = torch.as_tensor(venv.normalize_obs(demos.observations), dtype=torch.float32)  # type: ignore[attr-defined]
    actions = torch.as_tensor(demos.actions)
    masks = torch.as_tensor(demos.masks)
    returns = torch.as_tensor(np.concatenate(targets), dtype=torch.float32)
    optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    generator = torch.Generator().manual_seed(0)
    policy.set_training_mode(True)
    loss_value = float("nan")
    for _ in range(epochs):
        for batch in torch.randperm(len(obs), generator=generator).split(batch_size):
            values, log_prob, _ = policy.evaluate_actions(obs[batch], actions[batch], action_masks=masks[batch])
            policy_loss = -log_prob.mean()
            loss = policy_loss + 0.5 * torch.nn.functional.mse_loss(values.flatten(), returns[batch])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
            optimizer.step()
            loss_value = policy_loss.item()
    policy.set_training_mode(False)
    with torch.no_grad():
        predicted = policy._predict(obs, deterministic=True, action_masks=masks)  # noqa: SLF001  SB3's batch predict
    accuracy = float((predicted == actions).all(dim=1).float().mean())
    return {"pretrain/accuracy": accuracy, "pretrain/policy_loss": loss_value}
