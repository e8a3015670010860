"""Behaviour-cloning warm start: the PPO policy first imitates a baseline ("teacher"), then PPO
improves on it.

From scratch, PPO spends most of a short budget (the environment runs ~200-400 steps/s on
two cores) climbing out of random configurations that serve almost nothing on time. The
teacher's episodes are run on draws of the same scenario family; each step's label is the
action that encodes the configuration the teacher decides (:meth:`ActionCodec.encode`), so
the student learns what the repair should be asked for. DAgger rounds (Ross, Gordon and
Bagnell, AISTATS 2011) then let the student act and the teacher label the states the
student reaches, so it also learns the way back from its own mistakes. The value network is
fitted to the discounted, VecNormalize-scaled returns of the episodes, so that PPO's first
advantages are not noise that would undo the imitation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlsched.agents.baselines import Decision, Policy, apply, make_policy
from rlsched.agents.ppo.family import ScenarioFamily
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.fileio import write_bytes_atomically
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

    @staticmethod
    def concatenate(parts: list[Demonstrations]) -> Demonstrations:
        """One set of demonstrations holding every part's steps and episodes."""
        return Demonstrations(np.concatenate([p.observations for p in parts]), np.concatenate([p.actions for p in parts]),
                              np.concatenate([p.masks for p in parts]), [r for p in parts for r in p.episode_rewards])

    def save(self, path: str | Path) -> None:
        """Write them to an ``.npz`` file (atomically): the labels cost a teacher decision
        each (~50 ms for the planner), so refits (``scripts/refit_student.py``) reuse them."""
        import io

        buffer = io.BytesIO()
        np.savez_compressed(buffer, observations=self.observations, actions=self.actions, masks=self.masks,
                            rewards=np.concatenate(self.episode_rewards) if self.episode_rewards else np.zeros(0),
                            episode_lengths=np.array([len(r) for r in self.episode_rewards], dtype=np.int64))
        write_bytes_atomically(path, buffer.getvalue())

    @staticmethod
    def load(path: str | Path) -> Demonstrations:
        """The demonstrations :meth:`save` wrote; a clear error for a missing or foreign file."""
        try:
            with np.load(path) as data:
                observations, actions, masks = data["observations"], data["actions"], data["masks"]
                rewards, lengths = data["rewards"], data["episode_lengths"]
        except FileNotFoundError:
            raise ConfigError(path, "file", str(path), "no such demonstrations file") from None
        except (KeyError, ValueError, OSError) as exc:
            raise ConfigError(path, "file", str(path), f"not a demonstrations file written by Demonstrations.save: {exc}") from None
        if not len(observations) == len(actions) == len(masks) == int(lengths.sum()) == len(rewards):
            raise ConfigError(path, "episode_lengths", int(lengths.sum()), f"the file holds {len(observations)} steps")
        return Demonstrations(observations, actions, masks, np.split(rewards, np.cumsum(lengths)[:-1]) if len(lengths) else [])


def _label(env: GpuShareEnv, decision: Decision) -> np.ndarray:
    """The action that asks for what the teacher decided: its configuration, or for a
    teacher stating per-tenant requests, the configuration the repair makes of them."""
    if isinstance(decision, Configuration):
        return env.codec.encode(decision)
    if isinstance(decision, np.ndarray):
        return decision.astype(np.int64)
    return env.codec.encode(env.repair_requests(decision)[0].configuration)


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


@dataclass(frozen=True)
class _EpisodeJob:
    """One demonstration episode (picklable: worker processes run it)."""

    family: ScenarioFamily
    teacher: str
    fixed: Configuration | None
    seed: int
    max_steps: int
    perturbation: float
    student: str | None
    perf_model: str | PerformanceModelLike


_PERF_MODELS: dict[str, PerformanceModelLike] = {}


def _episode(job: _EpisodeJob) -> tuple[Demonstrations, float]:
    """Run one episode; returns its labelled steps and its objective (episode Goodput)."""
    from rlsched.agents.baselines.hindsight import FixedConfiguration, TrueRatePlanner
    from rlsched.agents.onnx_policy import OnnxPolicy
    from rlsched.simulator.run import load_performance_model

    perf_model = job.perf_model
    if isinstance(perf_model, str):  # loaded once per worker process
        perf_model = _PERF_MODELS.setdefault(perf_model, load_performance_model(perf_model))
    rng = np.random.default_rng(job.seed)
    env = GpuShareEnv(job.family.sample(rng), perf_model=perf_model)
    env.action_space.seed(job.seed)
    observation, _ = env.reset(seed=job.seed)
    if job.fixed is not None:
        teacher: Policy = FixedConfiguration(job.fixed)
    else:
        teacher = TrueRatePlanner() if job.teacher == TrueRatePlanner.name else make_policy(job.teacher)
    teacher.reset(env)
    student = OnnxPolicy.load(job.student) if job.student else None
    observations, actions, masks, rewards = [], [], [], []
    for _ in range(job.max_steps):
        mask = env.action_masks()
        decision = teacher.act(observation, env)
        if rng.random() < job.perturbation:
            executed = env.action_space.sample(mask=_component_masks(env, mask))
        elif student is not None:
            executed = student.act(observation, mask)
        else:
            executed = decision
        observations.append(observation)
        actions.append(_label(env, decision))  # before the step: the repair starts from the running configuration
        masks.append(mask)
        next_observation, reward, _, truncated, _ = apply(env, executed)
        rewards.append(reward)
        observation = next_observation
        if truncated:
            break
    demos = Demonstrations(np.asarray(observations, dtype=np.float32), np.asarray(actions, dtype=np.int64), np.asarray(masks, dtype=bool),
                           [np.asarray(rewards, dtype=np.float64)])
    return demos, env.objective


def collect(family: ScenarioFamily, teacher: str, episodes: int, max_steps: int, seed: int, perf_model: str | PerformanceModelLike,
            perturbation: float = 0.0, family_draws: int = 8, student: str | Path | None = None, workers: int = 1,
            progress: bool = False, teacher_seed: int | None = None) -> tuple[Demonstrations, list[float]]:
    """Run ``episodes`` episodes on random draws of ``family``, every step labelled with the
    teacher's decision; returns the demonstrations and each episode's objective.

    :param teacher: a baseline name, :data:`FAMILY_STATIC_BEST`, or ``planner-true-rates``
        (:class:`~rlsched.agents.baselines.hindsight.TrueRatePlanner`: the training draw's
        coming arrival rates are known to the simulator, so the teacher may use them)
    :param perf_model: a performance model name (``calibrated``, ``toy``) or object (a name
        is loaded once in each worker process)
    :param perturbation: probability that a step executes a random action instead of the
        acting policy's (DART-style noise injection; without it, a cloned policy that
        drifts once keeps drifting)
    :param family_draws: draws :func:`family_static_best` chooses its configuration on
    :param student: an exported policy (``.onnx``) that acts instead of the teacher (DAgger:
        the teacher only labels the states the student reaches); None: the teacher acts
    :param workers: processes running episodes in parallel (the Goodput-MILP teacher takes
        ~50 ms a step, so collecting is the slow part of a warm start)
    :param progress: show a progress bar over the episodes
    :param teacher_seed: seed of the draws :func:`family_static_best` chooses on (default
        ``seed + 1000``; DAgger rounds pass one seed so that every round has the same teacher)
    """
    from tqdm import tqdm

    from rlsched.simulator.run import load_performance_model

    fixed = None
    if teacher == FAMILY_STATIC_BEST:
        model = load_performance_model(perf_model) if isinstance(perf_model, str) else perf_model
        fixed = family_static_best(family, family_draws, seed + 1_000 if teacher_seed is None else teacher_seed, model)
    jobs = [_EpisodeJob(family, teacher, fixed, seed + k, max_steps, perturbation, None if student is None else str(student), perf_model)
            for k in range(episodes)]
    bar = tqdm(total=episodes, desc="demonstrations" if student is None else "DAgger", unit="episode", disable=not progress)
    results = []
    if workers > 1 and episodes > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(min(workers, episodes), initializer=_single_threaded) as pool:
            for result in pool.imap(_episode, jobs):
                results.append(result)
                bar.update(1)
    else:
        for job in jobs:
            results.append(_episode(job))
            bar.update(1)
    bar.close()
    return Demonstrations.concatenate([d for d, _ in results]), [objective for _, objective in results]


def _single_threaded() -> None:
    """Worker processes: one thread each (the processes already fill the cores)."""
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    torch.set_num_threads(1)


def _component_masks(env: GpuShareEnv, mask: np.ndarray) -> tuple[np.ndarray, ...]:
    """The flat mask split per MultiDiscrete component (what ``space.sample(mask=...)`` takes)."""
    return tuple(np.split(mask.astype(np.int8), np.cumsum(env.action_space.nvec)[:-1]))


def warm_start(model: object, venv: object, demos: Demonstrations, epochs: int, learning_rate: float, batch_size: int, gamma: float) -> dict[str, float]:
    """Fit ``model``'s policy to the demonstrations (cross-entropy) and its value network to
    their returns; sets ``venv``'s (VecNormalize) observation and return statistics to theirs.
    Called again after each DAgger round, on all demonstrations so far.

    :returns: ``pretrain/accuracy`` (fraction of steps whose whole action the deterministic
        policy reproduces) and ``pretrain/policy_loss`` after the last epoch
    """
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    # Statistics of exactly these demonstrations (a DAgger round refits on all of them).
    venv.obs_rms = RunningMeanStd(shape=venv.observation_space.shape)  # type: ignore[attr-defined]
    venv.obs_rms.update(demos.observations.astype(np.float64))  # type: ignore[attr-defined]
    # VecNormalize scales rewards by the std of the running discounted return: do the same.
    running = np.concatenate([np.array([np.sum(r[: i + 1] * gamma ** np.arange(i, -1, -1)) for i in range(len(r))]) for r in demos.episode_rewards])
    venv.ret_rms = RunningMeanStd(shape=())  # type: ignore[attr-defined]
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
