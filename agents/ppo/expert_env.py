"""The expert-choice environment: whom ``migrator-hedge``'s node follows, and when, on recorded streams.

Every interval the node may keep its leader (slot 0) or hand itself to one of the
:data:`SLOTS` - 1 challengers whose evidence is strongest (:func:`offered_experts`). The
experts are the planner and the fixed layouts the hedge shadows
(:mod:`rlsched.agents.baselines.hedge`); what each earns per interval was recorded once
(:class:`~rlsched.agents.experts.ExpertStreams`), so an episode here is a walk through a
matrix: thousands of steps a second instead of a few. The node earns its leader's recorded
reward, less a switch's predicted cost (:func:`~rlsched.agents.experts.switch_cost_estimate`)
on the interval it switches; the step's reward is that minus what the planner's shadow
earned (a baseline the choices cannot change), per the node's requests per interval.

The observation (:func:`expert_observation`) is the same in training and on a node
(``hedge-ppo``): every feature is a ratio of the node's requests per interval or a
fraction, so one network serves every node shape and GPU type. Each slot's features include
the hand-built rule's verdict (``rule``), which the scorer
(:class:`~rlsched.agents.ppo.candidate_policy.CandidateScorer`) adds to its logits with a
fixed weight its MLP does not see: before any PPO update the policy *is* ``migrator-hedge`` without its
simulated switch check, and PPO learns a residual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rlsched.agents.baselines.hedge import (MEMORY_INTERVALS, LeaderEvidence, LoadEvidenceChoice, SeasonalCheck, evidence_similarity,
                                           leader_evidence, seasonal_forecast)
from rlsched.agents.experts import ExpertStreams, switch_cost_estimate
from rlsched.agents.ppo.candidate_policy import ScorerLayout

#: Slots per decision: keep the leader, and the strongest challengers.
SLOTS = 4
#: Per slot, in order. ``keep``: the leader; ``planner``: the planner's shadow; ``mean``,
#: ``recent``: advantage over the leader per interval (memory-weighted, and over the last
#: intervals); ``z``: ``mean`` over its standard error; ``net``: the advantage summed with the
#: memory's weights minus the predicted switch cost (per 10 intervals of requests); ``cost``:
#: the predicted switch cost (same unit); ``rule``: 1 where the hand-built rule would go.
EXPERT_FEATURES: tuple[str, ...] = ("keep", "planner", "mean", "recent", "z", "net", "cost", "rule")
#: Once per observation: intervals since the last switch (/ :data:`SINCE_SWITCH_SCALE`, capped
#: at 1), intervals of evidence (/ MEMORY_INTERVALS, capped at 1), whether the planner leads,
#: and the mean switch cost measured so far (per 10 intervals). Nothing tells the time left: a
#: node under the daemon has no episode end.
EXPERT_GLOBALS: tuple[str, ...] = ("since_switch", "evidence", "planner_leads", "measured_cost")
SINCE_SWITCH_SCALE = 30.0
#: Costs and summed advantages are given per this many intervals of the node's requests.
SUM_SCALE_INTERVALS = 10.0
#: Every feature is clipped to [-FEATURE_LIMIT, FEATURE_LIMIT].
FEATURE_LIMIT = 10.0
#: The observation's layout for :class:`~rlsched.agents.ppo.candidate_policy.CandidateScorer`.
EXPERT_LAYOUT = ScorerLayout(SLOTS, EXPERT_FEATURES, EXPERT_GLOBALS, "rule", residual_sees_prior=False)


def offered_experts(evidence: LeaderEvidence, z: float) -> list[int]:
    """The leader, then the challengers by the lower end of their advantage (mean - z SE)."""
    lower = evidence.mean - z * evidence.spread
    order = [int(k) for k in np.argsort(-lower, kind="stable") if k != evidence.leader]
    return [evidence.leader] + order[: SLOTS - 1]


def expert_observation(evidence: LeaderEvidence, offered: Sequence[int], rule_choice: int | None,
                       switch_cost: Callable[[int], float], scale: float, since_switch: int, measured_cost: float) -> np.ndarray:
    """The observation of one decision (see :data:`EXPERT_FEATURES` and :data:`EXPERT_GLOBALS`).

    :param offered: the experts in the slots (:func:`offered_experts`; fewer than :data:`SLOTS` are padded)
    :param rule_choice: the expert the hand-built rule would hand the node to (None: keep)
    :param switch_cost: predicted cost of switching from the leader to an expert, request-equivalents
    :param scale: the node's requests per interval at its mean rates
    """
    rows = np.zeros((SLOTS, len(EXPERT_FEATURES)))
    unit = scale * SUM_SCALE_INTERVALS
    chosen = evidence.leader if rule_choice is None else rule_choice
    for slot, k in enumerate(offered):
        keep = k == evidence.leader
        cost = 0.0 if keep else switch_cost(k)
        z = evidence.mean[k] / evidence.spread[k] if evidence.spread[k] > 0 else 0.0
        rows[slot] = (float(keep), float(k == 0), evidence.mean[k] / scale, evidence.recent[k] / scale, z,
                      (evidence.gain(k) - cost) / unit, cost / unit, float(k == chosen))
    glob = np.array([min(since_switch / SINCE_SWITCH_SCALE, 1.0), min(evidence.intervals / MEMORY_INTERVALS, 1.0),
                     float(evidence.leader == 0), measured_cost / unit])
    observation = np.concatenate([rows.ravel(), glob])
    observation[~np.isfinite(observation)] = 0.0
    return np.clip(observation, -FEATURE_LIMIT, FEATURE_LIMIT).astype(np.float32)


class ExpertChoiceEnv(gym.Env[np.ndarray, np.int64]):
    """Follow one of the recorded experts each interval (see the module docstring).

    :param streams: the recorded episodes; each reset draws one
    :param switch_cost_factor: the factor of :func:`~rlsched.agents.experts.switch_cost_estimate`
    :param rule: the hand-built rule whose verdict is a feature (``challenger(evidence) -> int | None``
        after ``switch_costs`` is set): a :class:`~rlsched.agents.baselines.hedge.MigratorHedge`
    """

    metadata = {"render_modes": []}

    def __init__(self, streams: Sequence[ExpertStreams], switch_cost_factor: float, rule: Any) -> None:
        if not streams:
            raise ValueError("ExpertChoiceEnv needs at least one recorded stream")
        self.streams = list(streams)
        self.switch_cost_factor = switch_cost_factor
        self.rule = rule
        size = SLOTS * len(EXPERT_FEATURES) + len(EXPERT_GLOBALS)
        self.observation_space = gym.spaces.Box(-FEATURE_LIMIT, FEATURE_LIMIT, shape=(size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(SLOTS)
        self.stream_index = 0
        self._evidence: dict[int, dict[tuple[int, int], LeaderEvidence]] = {}
        self._use_load: dict[int, np.ndarray] = {}
        self._use_season: dict[int, list[bool]] = {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if options and "stream" in options:
            self.stream_index = int(options["stream"])
        else:
            self.stream_index = int(self.np_random.choice(len(self.streams)))
        self.stream = self.streams[self.stream_index]
        self.step_index = 0
        self.leader = 0
        self.since_switch = 0
        self.switch_costs: list[float] = []
        self.switches = 0
        return self._observe(), {}

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        index = int(action)
        self.last_state = self.state()
        self.last_rule_action = self.rule_action()
        target = self.offered[index] if 0 <= index < len(self.offered) else self.leader
        stream, t = self.stream, self.step_index
        cost = 0.0
        if target != self.leader:
            if t > 0:  # before the first interval nothing runs: choosing is free
                cost = self._switch_cost(target)
                self.switch_costs.append(cost)
                self.switches += 1
            self.leader, self.since_switch = target, 0
        else:
            self.since_switch += 1
        column = stream.profile_intervals + t
        earned = float(stream.rewards[self.leader, column]) - cost
        self.step_index += 1
        truncated = self.step_index >= stream.steps
        observation = self._observe() if not truncated else np.zeros(self.observation_space.shape, dtype=np.float32)
        info = {"earned": earned, "switch_cost": cost, "leader": self.leader, "state": self.last_state, "rule_action": self.last_rule_action}
        # The planner's own reward is subtracted: it does not depend on the choices, so the best
        # policy is unchanged, but the return's variance from the traffic mostly cancels (an
        # input-dependent baseline, Mao et al., ICLR 2019).
        return observation, (earned - float(stream.rewards[0, column])) / stream.reward_scale, False, truncated, info

    def state(self) -> tuple:
        """What the next steps depend on (for :meth:`restore`: counterfactual rollouts)."""
        return (self.stream_index, self.step_index, self.leader, self.since_switch, tuple(self.switch_costs), self.switches)

    def restore(self, state: tuple) -> np.ndarray:
        """Go back to a :meth:`state`; returns its observation."""
        self.stream_index, self.step_index, self.leader, self.since_switch, costs, self.switches = state
        self.stream = self.streams[self.stream_index]
        self.switch_costs = list(costs)
        return self._observe()

    def rule_return(self, intervals: int) -> float:
        """What the node earns over the next ``intervals`` intervals (fewer at the episode's
        end) following the hand-built rule, request-equivalents."""
        earned = 0.0
        for _ in range(intervals):
            if self.step_index >= self.stream.steps:
                break
            _, _, _, _, info = self.step(self.rule_action())
            earned += info["earned"]
        return earned

    def action_masks(self) -> np.ndarray:
        """True for the slots that hold an expert."""
        return np.arange(SLOTS) < len(self.offered)

    def rule_action(self) -> int:
        """The slot the hand-built rule would choose."""
        return self.offered.index(self.rule_choice) if self.rule_choice is not None else 0

    # ------------------------------------------------------------------ internals
    def _switch_cost(self, target: int) -> float:
        t = max(self.step_index - 1, 0)
        return switch_cost_estimate(self.stream.restart_requests(t, self.leader, target), self.switch_cost_factor)

    def _load_choices(self, index: int) -> np.ndarray:
        """Per number of recorded intervals (columns), whether the hedge weighs the evidence
        by load then (:class:`~rlsched.agents.baselines.hedge.LoadEvidenceChoice`, run once
        over the stream as the hedge runs it)."""
        if index not in self._use_load:
            stream = self.streams[index]
            choice = LoadEvidenceChoice(self.rule.decay, self.rule.load_bandwidth, self.rule.load_error_ratio)
            self._use_load[index] = np.array([False, *choice.replay(stream.rewards, stream.loads, self.rule.history)])
        return self._use_load[index]

    def _season_choices(self, index: int) -> list[bool]:
        """Per episode interval, whether the hedge's evidence takes in the seasonal forecast
        then (:class:`~rlsched.agents.baselines.hedge.SeasonalCheck`, run once over the stream
        as the hedge runs it)."""
        if index not in self._use_season:
            stream = self.streams[index]
            check = SeasonalCheck(self.rule.decay, self.rule.history)
            day = stream.day_intervals
            self._use_season[index] = check.replay(stream.rewards, day, stream.profile_intervals) if day is not None else [False] * (stream.steps + 1)
        return self._use_season[index]

    def _observe(self) -> np.ndarray:
        stream, t = self.stream, self.step_index
        # The evidence depends on the interval and the leader only: cached, as the paired
        # rollouts of training revisit the same ones many times.
        cache = self._evidence.setdefault(self.stream_index, {})
        evidence = cache.get((t, self.leader))
        if evidence is None:
            end = stream.profile_intervals + t
            start = max(0, end - self.rule.history)  # what the hedge's shadows keep
            use_load = bool(self._load_choices(self.stream_index)[end])
            similarity = evidence_similarity(stream.loads[start:end], self.rule.load_bandwidth, use_load, t, self.rule.min_evidence_intervals)
            forecast = None
            if self._season_choices(self.stream_index)[t]:
                forecast = seasonal_forecast(stream.rewards[:, :end], stream.day_intervals, self.rule.season_horizon_intervals)
            evidence = leader_evidence(stream.rewards[:, start:end], self.leader, self.rule.decay, similarity, forecast)
            cache[(t, self.leader)] = evidence
        self.rule.switch_costs = self.switch_costs
        self.rule_choice = self.rule.challenger(evidence)
        self.offered = offered_experts(evidence, self.rule.switch_z)
        measured = float(np.mean(self.switch_costs)) if self.switch_costs else 0.0
        return expert_observation(evidence, self.offered, self.rule_choice, self._switch_cost, stream.reward_scale,
                                  self.since_switch, measured)
