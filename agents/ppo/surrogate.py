"""A fast surrogate of the candidate-choice environment: the planner model's valuing, tabulated.

Why: :class:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv` steps the request-level
simulator and values the candidate library with the planner's model at every decision: about
20 environment steps per second on two cores, where PPO needs orders of magnitude more.

The traffic is exogenous (input-driven: arrivals do not depend on the decisions), and what
the observation and the reward depend on besides the traffic is the running configuration
and the chosen one. So one recorded episode can be tabulated once and replayed under any
sequence of choices:

1. :func:`record_episode` runs one episode on the request-level simulator, the library
   planner deciding (the warm start), and records at every decision what the observer read:
   the smoothed and the last interval's rates, the backlog, the models' accuracy, the
   high-priority tenants' SLO attainment;
2. it fixes the candidate set: the episode's final library plus every configuration the node
   ran, and values every candidate ``k`` from every running one ``j`` at every decision ``t``
   under the observer's three forecasts (the EWMA, the burst, the last interval's rates) with
   the planner's model (:meth:`~rlsched.solver.planner.Planner.assess_many`):
   ``value[t, f, k]`` and ``cost[t, f, j, k]``, exactly the numbers the observer would compute;
3. :class:`SurrogateChoiceEnv` steps through such tables: the observation is
   :func:`~rlsched.agents.ppo.candidate_env.candidate_observation` of the tabulated valuing
   (the same function the request-level environment uses); the reward of choosing ``k`` while
   ``j`` runs at ``t`` is the model's value of ``k`` at the rates interval ``t`` then had (the
   last-interval forecast at ``t + 1``, per interval) less the cost of the move at those rates,
   over the node's requests per interval. Episodes start at a random decision of a random table,
   in the configuration the recorded node ran there (random starts, short episodes).

What the surrogate does not follow from the choices, and takes as recorded along the
planner's path: the backlog (it shifts the forecasts' first window), the retraining tenants'
accuracy, the high-priority SLO attainment feature, and the request-level effects the fluid
model misses (queueing near capacity, a restart's backlog). :func:`surrogate_error` measures
what this costs: a sequence of choices replayed on the request-level simulator, interval by
interval against the surrogate's rewards.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlsched.agents.baselines.planners import MIGRATOR_LOOKAHEAD
from rlsched.agents.candidates import BURST_WINDOW, CANDIDATES, offer_slots
from rlsched.agents.ppo.candidate_env import (ACTION_ADVANTAGES_KEY, CANDIDATE_FEATURES, FEATURE_LIMIT, GLOBAL_FEATURES, CandidateChoiceEnv,
                                              CandidateObserver, burst_ratio_feature, candidate_observation, moved_fraction, read_node)
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.fileio import write_bytes_atomically

#: The observer's forecasts, in the tables' ``f`` axis.
FORECASTS: tuple[str, ...] = ("ewma", "burst", "last")
EWMA, BURST, LAST = range(len(FORECASTS))


@dataclass
class SurrogateEpisode:
    """One recorded episode, tabulated (see the module docstring). ``T`` decisions, ``K`` candidates.

    :param value: ``[T, 3, K]`` predicted Goodput of each candidate over the lookahead, per forecast
    :param cost: ``[T, 3, K, K]`` predicted cost of moving from candidate ``j`` (third axis) to ``k``
    :param moved: ``[K, K]`` fraction of tenants whose placement differs between ``j`` and ``k``
    :param path: ``[T]`` the candidate the recorded node ran at each decision
    :param since_change: ``[T]`` the recorded node's intervals since its last change
    :param burst_ratio: ``[T]`` the largest burst-to-EWMA rate ratio minus 1
    :param attainment: ``[T]`` the high-priority tenants' SLO attainment (recorded: not followed)
    :param reward: ``[T - 1]`` the request-level simulator's reward of each recorded step, scaled
    :param reward_scale: the node's requests per interval at its mean rates (the unit of rewards)
    :param name: what was recorded (scenario and seed)
    """

    value: np.ndarray
    cost: np.ndarray
    moved: np.ndarray
    path: np.ndarray
    since_change: np.ndarray
    burst_ratio: np.ndarray
    attainment: np.ndarray
    reward: np.ndarray
    reward_scale: float
    name: str
    configurations: list[Configuration] | None = None
    """the candidates themselves (kept in memory only, to replay choices on the simulator)"""

    @property
    def decisions(self) -> int:
        return int(self.value.shape[0])

    def save(self, path: Path) -> None:
        """Write the tables to ``path`` (``.npz``), atomically."""
        import io

        buffer = io.BytesIO()
        np.savez_compressed(buffer, value=self.value, cost=self.cost, moved=self.moved, path=self.path, since_change=self.since_change,
                            burst_ratio=self.burst_ratio, attainment=self.attainment, reward=self.reward,
                            reward_scale=np.float64(self.reward_scale), name=np.str_(self.name))
        write_bytes_atomically(path, buffer.getvalue())

    @classmethod
    def load(cls, path: Path) -> SurrogateEpisode:
        """Read tables :meth:`save` wrote; a file that is not one names itself and the field missing."""
        try:
            with np.load(path) as data:
                fields = {k: data[k] for k in ("value", "cost", "moved", "path", "since_change", "burst_ratio", "attainment", "reward")}
                episode = cls(**fields, reward_scale=float(data["reward_scale"]), name=str(data["name"]))
        except KeyError as error:
            raise ConfigError(path, str(error).strip("'\""), None, "a surrogate episode file written by SurrogateEpisode.save") from error
        except (OSError, ValueError) as error:
            raise ConfigError(path, "", None, f"not a surrogate episode file ({error})") from error
        t, forecasts, k = episode.value.shape
        if forecasts != len(FORECASTS) or episode.cost.shape != (t, forecasts, k, k) or episode.path.shape != (t,):
            raise ConfigError(path, "cost", list(episode.cost.shape), f"must be [{t}, {forecasts}, {k}, {k}] for value {list(episode.value.shape)}")
        return episode


def _inputs(env: GpuShareEnv) -> dict[str, Any]:
    """What the observer reads from the node at a decision (:func:`~rlsched.agents.ppo.candidate_env.read_node`)."""
    return dict(zip(("rates", "backlog", "accuracy", "last", "attainment"), read_node(env), strict=True))


def record_episode(env: GpuShareEnv, seed: int, name: str = "", progress: bool = False) -> SurrogateEpisode:
    """Run one episode of ``env`` (reset with ``seed``) with the library planner deciding, and
    tabulate it (see the module docstring)."""
    from tqdm import tqdm

    choice = CandidateChoiceEnv(env)
    choice.reset(seed=seed)
    observer = choice.observer
    assert observer is not None
    inputs, path, since, rewards = [], [], [], []
    with tqdm(desc=f"recording {name}", unit="step", disable=not progress, leave=False) as bar:
        while True:
            inputs.append(_inputs(env))
            path.append(env.current)
            since.append(observer.since_change)
            _, reward, terminated, truncated, _ = choice.step(choice.planner_choice())
            rewards.append(reward)
            bar.update()
            if terminated or truncated:
                break
    inputs.append(_inputs(env))
    path.append(env.current)
    since.append(observer.since_change + int(env.current == observer.last_configuration))
    for t, step in enumerate(inputs):  # the burst forecast: the largest of the last BURST_WINDOW intervals' rates
        window = inputs[max(t + 1 - BURST_WINDOW, 0): t + 1]
        step["burst"] = {n: max(w["last"][n] for w in window) for n in step["rates"]}
    configurations: list[Configuration] = []
    for c in [*path, *observer.library.configurations]:
        if c not in configurations:
            configurations.append(c)
    value, cost = _tabulate(observer, configurations, inputs, name, progress)
    moved = np.array([[moved_fraction(k, j) for k in configurations] for j in configurations], dtype=np.float32)
    burst_ratio = [burst_ratio_feature(step["burst"], step["rates"]) for step in inputs]
    return SurrogateEpisode(value=value, cost=cost, moved=moved, path=np.array([configurations.index(c) for c in path]),
                            since_change=np.array(since), burst_ratio=np.array(burst_ratio, dtype=np.float32),
                            attainment=np.array([s["attainment"] for s in inputs], dtype=np.float32),
                            reward=np.array(rewards, dtype=np.float32), reward_scale=observer.reward_scale, name=name,
                            configurations=configurations)


def _tabulate(observer: CandidateObserver, configurations: list[Configuration], inputs: list[dict[str, Any]], name: str,
              progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """``value[t, f, k]`` and ``cost[t, f, j, k]`` of :class:`SurrogateEpisode`."""
    from tqdm import tqdm

    planner = observer.planner
    count = len(configurations)
    value = np.zeros((len(inputs), len(FORECASTS), count), dtype=np.float32)
    cost = np.zeros((len(inputs), len(FORECASTS), count, count), dtype=np.float32)
    for t, step in enumerate(tqdm(inputs, desc=f"tabulating {name}", unit="decision", disable=not progress, leave=False)):
        forecasts = [planner.forecast([step[f]] * MIGRATOR_LOOKAHEAD, step["backlog"]) for f in ("rates", "burst", "last")]
        options = planner.forecast_options(configurations, forecasts, step["accuracy"])
        for j, running in enumerate(configurations):
            for f, windows in enumerate(forecasts):
                assessed = planner.assess_many(configurations, windows, running, step["accuracy"], None, options[f])
                if j == 0:
                    value[t, f] = [a[0] for a in assessed]
                cost[t, f, j] = [a[1] for a in assessed]
                cost[t, f, j, j] = 0.0
    return value, cost


class SurrogateChoiceEnv(gym.Env[np.ndarray, np.int64]):
    """The candidate choice on tabulated episodes (see the module docstring): the spaces of
    :class:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv`, so a network trained here
    runs there (and in the daemon) unchanged.

    :param episodes: the tables to draw episodes from
    :param episode_steps: decisions per episode (shorter where a table ends first)
    :param paired_horizon: > 0: a step departing from the library planner's choice also
        measures the departure's worth over this many intervals (``info["paired_advantage"]``,
        as the request-level environment does); 0: none
    :param action_advantages: every step also measures every action's paired advantage over
        ``paired_horizon`` intervals (:meth:`slot_advantages`, in
        ``info["action_advantages"]``: what :class:`~rlsched.agents.ppo.expected_ppo.ExpectedPPO` learns from)
    """

    metadata = {"render_modes": []}

    def __init__(self, episodes: list[SurrogateEpisode], episode_steps: int = 60, paired_horizon: int = 0, action_advantages: bool = False) -> None:
        if not episodes:
            raise ValueError("SurrogateChoiceEnv needs at least one recorded episode")
        if action_advantages and paired_horizon <= 0:
            raise ValueError("action advantages need a paired horizon > 0")
        self.action_advantages = action_advantages
        self.episodes = episodes
        self.episode_steps = episode_steps
        self.paired_horizon = paired_horizon
        size = CANDIDATES * len(CANDIDATE_FEATURES) + len(GLOBAL_FEATURES)
        self.observation_space = gym.spaces.Box(-FEATURE_LIMIT, FEATURE_LIMIT, shape=(size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(CANDIDATES)
        self.episode = episodes[0]
        self.t = self.end = self.running = self.since_change = 0
        self.offered = np.zeros(1, dtype=int)
        self.gain_ewma = np.zeros(1)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.episode = self.episodes[int(self.np_random.integers(len(self.episodes)))]
        last_start = max(self.episode.decisions - 1 - self.episode_steps, 0)
        self.t = int(self.np_random.integers(last_start + 1))
        self.end = min(self.t + self.episode_steps, self.episode.decisions - 1)
        self.running = int(self.episode.path[self.t])
        self.since_change = int(self.episode.since_change[self.t])
        return self._observe(), {}

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        chosen = self._candidate(int(action))
        planned = self._candidate(self.planner_choice())
        info: dict[str, Any] = {}
        if self.action_advantages:
            info[ACTION_ADVANTAGES_KEY] = self.slot_advantages(self.paired_horizon)
            info["paired_advantage"] = float(info[ACTION_ADVANTAGES_KEY][int(action)]) if chosen != planned else 0.0
        else:
            info["paired_advantage"] = self._paired_advantage(chosen, planned) if self.paired_horizon and chosen != planned else 0.0
        info["planner_keeps"] = planned == self.running
        reward = self._reward(self.t, self.running, chosen)
        self.since_change = 0 if chosen != self.running else self.since_change + 1
        self.running, self.t = chosen, self.t + 1
        return self._observe(), reward, False, self.t >= self.end, info

    def action_masks(self) -> np.ndarray:
        """True for the slots that hold a candidate."""
        return np.arange(CANDIDATES) < len(self.offered)

    def planner_choice(self) -> int:
        """The slot the library planner would choose (the largest predicted gain at the EWMA forecast)."""
        return int(np.argmax(self.gain_ewma[self.offered]))

    # ------------------------------------------------------------------ internals
    def _reward(self, t: int, running: int, chosen: int) -> float:
        """The model's Goodput of interval ``t`` in ``chosen`` (at the rates it then had: the
        last-interval forecast of ``t + 1``, per interval), less the cost of moving from ``running``."""
        e = self.episode
        return float(e.value[t + 1, LAST, chosen] / MIGRATOR_LOOKAHEAD - e.cost[t + 1, LAST, running, chosen]) / e.reward_scale

    def _order(self, running: int) -> np.ndarray:
        """The candidates as the observer lists them: the running one first."""
        others = np.arange(self.episode.value.shape[2])
        return np.concatenate([[running], others[others != running]])

    def _gains(self, t: int, running: int) -> tuple[np.ndarray, np.ndarray]:
        """(candidate order, predicted gain over keeping at each forecast ``[3, K]``) at decision ``t``."""
        e, order = self.episode, self._order(running)
        objective = e.value[t][:, order] - e.cost[t, :, running][:, order]
        return order, objective - objective[:, :1]

    def _observe(self) -> np.ndarray:
        e, t = self.episode, self.t
        order, gains = self._gains(t, self.running)
        self.order = order
        self.gain_ewma = gains[EWMA]
        self.offered = np.array(offer_slots([gains[EWMA], gains[BURST]]))
        return candidate_observation(list(self.offered), gains[EWMA], gains[BURST], gains[LAST][self.offered],
                                     e.cost[t, EWMA, self.running][order], e.value[t, EWMA][order],
                                     list(e.moved[self.running, order[self.offered]]), e.reward_scale,
                                     self.since_change, float(e.burst_ratio[t]), float(e.attainment[t]))

    def _candidate(self, slot: int) -> int:
        """The candidate in ``slot``; a masked or unknown slot keeps the running one."""
        return int(self.order[self.offered[slot]]) if 0 <= slot < len(self.offered) else self.running

    def _library_choice(self, t: int, running: int) -> int:
        """What the library planner applies at ``t`` while ``running`` runs (a branch's
        continuation; :meth:`_library_choices` for one branch)."""
        return int(self._library_choices(t, np.array([running]))[0])

    def _library_choices(self, t: int, running: np.ndarray) -> np.ndarray:
        """What the library planner applies at ``t`` in each branch, ``running[b]`` running
        there: the candidate of largest objective at the EWMA forecast, the running one on
        ties. The best under the EWMA is always offered, so this needs no offer."""
        objective = self.episode.value[t, EWMA][None, :] - self.episode.cost[t, EWMA, running]
        best = objective.argmax(axis=1)
        rows = np.arange(len(running))
        return np.where(objective[rows, best] > objective[rows, running], best, running)

    def _paired_advantage(self, chosen: int, rule: int) -> float:
        """What applying ``chosen`` instead of ``rule`` earns over :attr:`paired_horizon`
        intervals, both branches then following the library planner (the request-level
        environment's :meth:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv.paired_advantage`)."""
        earned = self._branches(np.array([chosen, rule]), self.paired_horizon)
        return float(earned[0] - earned[1])

    def slot_advantages(self, horizon: int) -> np.ndarray:
        """Every offered slot's paired advantage over the library planner's choice (its own slot
        and the masked ones: 0), over ``horizon`` intervals: the advantage of every action at
        once, all branches on the same tabulated traffic."""
        firsts = np.array([self._candidate(s) for s in range(len(self.offered))] + [self._candidate(self.planner_choice())])
        earned = self._branches(firsts, horizon)
        advantages = np.zeros(CANDIDATES)
        advantages[: len(self.offered)] = earned[:-1] - earned[-1]
        return advantages

    def _branches(self, firsts: np.ndarray, horizon: int) -> np.ndarray:
        """Scaled reward over ``horizon`` intervals from the current decision of each branch
        that applies ``firsts[b]`` now and then follows the library planner
        (:meth:`_library_choices`), all branches stepped together."""
        e = self.episode
        running = np.full(len(firsts), self.running)
        total = np.zeros(len(firsts))
        chosen = firsts
        for t in range(self.t, min(self.t + horizon, e.decisions - 1)):
            if t > self.t:
                chosen = self._library_choices(t, running)
            total += (e.value[t + 1, LAST, chosen] / MIGRATOR_LOOKAHEAD - e.cost[t + 1, LAST, running, chosen]) / e.reward_scale
            running = chosen
        return total


def replay_on_simulator(env: GpuShareEnv, seed: int, episode: SurrogateEpisode, choices: list[int]) -> np.ndarray:
    """The request-level simulator's scaled reward of each step when the candidates ``choices``
    (indices into ``episode.configurations``, one per decision from the first) are applied on
    ``env`` reset with the seed the episode was recorded with."""
    assert episode.configurations is not None, "replaying needs the episode as recorded (its configurations)"
    env.reset(seed=seed)
    if env.current is None:  # nothing deployed yet: the recording's first configuration, as its reset applied it
        env.step_configuration(episode.configurations[int(episode.path[0])])
    rewards = []
    for k in choices:
        _, reward, terminated, truncated, _ = env.step_configuration(episode.configurations[k])
        rewards.append(reward / episode.reward_scale)
        if terminated or truncated:
            break
    return np.array(rewards)


def surrogate_error(env: GpuShareEnv, seed: int, episode: SurrogateEpisode, every: int = 6, horizon: int = 12,
                    slots: int = 3) -> dict[str, Any]:
    """How well the surrogate recorded from ``env`` at ``seed`` stands in for the request-level
    simulator, on what PPO learns from:

    - ``path``: each recorded step's reward, the surrogate's against the simulator's
      (the sums' ratio, and the mean absolute error over the mean reward);
    - ``departures``: at every ``every``-th decision of the recorded path, the ``slots`` offered
      candidates the planner ranks best after its own choice, each one's paired advantage over
      the planner's choice (``horizon`` intervals, then the library planner) on the simulator
      (:meth:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv.paired_advantage`, common
      arrivals) against the surrogate's: their correlation and how often their signs agree.
    """
    assert episode.configurations is not None, "needs the episode as recorded (its configurations)"
    surrogate = SurrogateChoiceEnv([episode], paired_horizon=horizon)
    surrogate.reset(seed=0)
    path_rewards = np.array([surrogate._reward(t, int(episode.path[t]), int(episode.path[t + 1])) for t in range(episode.decisions - 1)])
    choice = CandidateChoiceEnv(env)
    choice.reset(seed=seed)
    pairs = []
    for t in range(episode.decisions - 1):
        planned_slot = choice.planner_choice()
        if t % every == 0 and choice.observer is not None:
            observer = choice.observer
            planned = observer.configuration(planned_slot)
            surrogate.t, surrogate.running = t, int(episode.path[t])
            surrogate._observe()
            objective = observer.scored.objective if observer.scored is not None else None
            assert objective is not None
            ranked = [s for s in np.argsort([-objective[i] for i in observer.offered], kind="stable") if s != planned_slot][:slots]
            for slot in ranked:
                chosen = observer.configuration(int(slot))
                if chosen not in episode.configurations or planned not in episode.configurations:
                    continue
                simulated = choice.paired_advantage(chosen, planned, horizon)
                modelled = surrogate._paired_advantage(episode.configurations.index(chosen), episode.configurations.index(planned))
                pairs.append((simulated, modelled))
        _, _, terminated, truncated, _ = choice.step(planned_slot)
        if terminated or truncated:
            break
    simulated, modelled = (np.array([p[k] for p in pairs]) for k in (0, 1))
    moving = np.abs(simulated) > 1e-9
    return {
        "episode": episode.name,
        "path": {"simulator_sum": float(episode.reward.sum()), "surrogate_sum": float(path_rewards.sum()),
                 "surrogate_over_simulator": float(path_rewards.sum() / episode.reward.sum()),
                 "mean_abs_error_over_mean": float(np.abs(path_rewards - episode.reward).mean() / abs(episode.reward.mean()))},
        "departures": {"count": len(pairs), "correlation": float(np.corrcoef(simulated, modelled)[0, 1]) if len(pairs) > 2 else None,
                       "sign_agreement": float(np.mean(np.sign(simulated[moving]) == np.sign(modelled[moving]))) if moving.any() else None,
                       "simulator_mean": float(simulated.mean()) if pairs else None, "surrogate_mean": float(modelled.mean()) if pairs else None},
    }
