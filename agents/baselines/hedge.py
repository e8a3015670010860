"""``migrator-hedge``: the planner, hedged by the fixed layouts it competes with.

Every interval the planner (:class:`~rlsched.agents.baselines.planners.MigratorIlp`) and
every candidate fixed configuration of the hindsight portfolio
(:func:`~rlsched.agents.baselines.hindsight.layout_candidates`) run in a *shadow* of the
node: a simulated copy of it, driven by the arrivals the node observed over the interval
that has just passed (:class:`~rlsched.workloads.arrivals.ObservedArrivals`: the request
log where the node keeps one, as the simulator does; else Poisson arrivals at the measured
rates, which hide the bursts inside an interval). Before the first interval every shadow
is run on the traffic just before the episode (the node's previous day, with today's
tenants), so the node starts with the rule that earned most there. Each shadow keeps its
recent rewards, and the node follows the leader: the planner's decision while the planner
leads, the leading fixed configuration otherwise. A challenger takes over only on a large and
clear advantage that also covers what switches have been measured to cost on this node
(:meth:`MigratorHedge._follow_leader`). On a node whose traffic repeats daily the evidence
also holds a seasonal forecast: what each rule earned a day before each of the coming
intervals, where that day has forecast the rewards far better than the recent past
(:data:`SEASON_ERROR_RATIO`), so that the node does not follow the planner into the day's
burst. So on traffic where adapting pays (shifting mixes,
retraining, tenants that come and go) the planner keeps the node, and on traffic whose
bursts its fluid forecast cannot see, the node holds the fixed layout that earns most on
the traffic that comes: ``static-best``'s choice, made online from the past instead of in
hindsight.

``migrator-hedge-load`` (:class:`MigratorHedgeLoad`, opt-in) also weighs each past interval's
evidence by how alike its load was to the last interval's, on nodes where that has forecast
the rewards better (:class:`LoadEvidenceChoice`). Measured closed loop on 82 episodes
(docs/planner-bursts.md, before the seasonal forecast) it earned 0.6% more on average, up to 9%
more on some day/night and two-GPU nodes and up to 5% less on others, so it is not the default.

The constants were chosen on the training suite's scenarios, ``default``, two tuning traces,
the held-out suite's ``heldout-deploy`` (where following fixed leaders without the profile
and the measured switch cost lost 38%) and two day/night traces (which the simulated
switch cost is for); the seasonal forecast's on recorded streams of 27 scenarios and on
``heldout-eight-tenants`` (its check's ratio): docs/planner-bursts.md, which also lists the
traces still held out.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import Any, ClassVar

import numpy as np

from rlsched.agents.baselines.base import Decision, Policy, apply
from rlsched.agents.baselines.hindsight import (PROFILING_SEED_OFFSET, FixedConfiguration, day_intervals, grouping_rollouts, layout_candidates,
                                                preceding_scenario)
from rlsched.agents.baselines.planners import MigratorIlp, MigratorQueue
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.workloads.arrivals import ObservedArrivals
from rlsched.workloads.tenants import InferenceTenant

#: Intervals over which a shadow's past rewards fade by 1/e (20 minutes at 10-second
#: intervals): long enough that a bursty tenant's bursts weigh in every score, short enough
#: that a day/night swing hands the node back to the planner within its phase.
MEMORY_INTERVALS = 120.0
#: A challenger takes the node from the leader only if its advantage, summed with the
#: memory's weights, beats the leader's mean reward over this many intervals, the mean cost
#: of the switches measured so far and this switch's simulated cost (a restart and the
#: backlog it leaves cost 2-10 intervals' worth) ...
SWITCH_MARGIN_INTERVALS = 3.0
#: ... and its mean advantage per interval is this many standard errors above zero (the
#: shadows share one arrival stream, so the per-interval differences are the decisions'
#: own, but a burst or a restart still makes single intervals swing widely; 2 held the
#: planner too long on day/night traffic, 0 let noise switch) ...
SWITCH_Z = 1.0
#: ... over at least this many measured intervals (the first ones are dominated by the
#: initial restarts, not by what a rule is worth: switching on them left a retraining node
#: with stale models for the rest of the episode).
MIN_EVIDENCE_INTERVALS = 12
#: Intervals after a switch over which the node's shortfall against the new leader's shadow
#: is counted as the switch's cost (a restart's backlog drains within them).
TRANSITION_INTERVALS = 12
#: Intervals of the traffic before the episode every shadow is first run on, on a node with
#: no daily pattern (no traced tenant) ...
PROFILE_INTERVALS = 120
#: ... and at most (a node's day, :func:`~rlsched.agents.baselines.hindsight.day_intervals`,
#: is profiled whole up to this: the compressed days of the scenarios last 360 intervals; a
#: longer day is forecast from the node's own previous day once it has run one).
MAX_PROFILE_INTERVALS = 360
#: The seasonal forecast: each expert's rewards one day before each of this many coming
#: intervals join the evidence (a day/night trace's bursts come at the same time of day, and
#: the past alone cannot see the one that is about to come: on DeepSeek c30 the node followed
#: the planner through the calm half of the day into the burst). 0: no forecast ...
SEASON_HORIZON_INTERVALS = 60
#: ... each weighing as the last measured interval does ...
SEASON_WEIGHT = 1.0
#: ... while yesterday's rewards at the same time of day have forecast each replayed
#: interval's far better than the recent past has: their squared errors, faded as the rewards
#: are, below this fraction of the recent past's. On the day/night traces they are 0.03-0.2
#: of it; on an eight-tenant node whose planner earned otherwise the day before, 0.7-1.1
#: (following yesterday's leader there lost 3%); on bursts at random times yesterday says
#: nothing about today ...
SEASON_ERROR_RATIO = 0.5
#: ... and only on a day of at most this many intervals (a real day at 10-second intervals;
#: the rewards of one day are kept).
MAX_DAY_INTERVALS = 8640
#: The backend seed of every shadow: they share one stream, so only the decisions differ.
SHADOW_SEED = 0
#: Shadows of a node that runs on (the daemon) are episodes this long, seconds.
UNBOUNDED_S = 1e12
#: ``migrator-hedge-groupings`` also holds, as fixed experts, this many other groupings of the
#: tenants into GIs (:func:`~rlsched.agents.baselines.hindsight.ranking_candidates`): those
#: that earned most on the profile's traffic. The usual candidates rank the tenants one way;
#: on DeepSeek-R1 chunk1 and c30 another grouping earned 1.21x and 1.11x what the hedge
#: earned without it (docs/planner-bursts.md, stop 38).
PROFILED_GROUPINGS = 3
#: Bandwidth of ``migrator-hedge-load``'s load similarity (``migrator-hedge``: 0, never). Each
#: past interval then counts by exp(-d^2 / 2 LOAD_BANDWIDTH^2) besides its recency, d the
#: Euclidean distance between its load and the last interval's. A load is, per inference
#: tenant, its measured rate over its declared mean rate and, per other tenant (retraining,
#: best effort), 1 while it is active, else 0. Where which rule earns more depends on the load
#: (the planner wins at the day's calm and loses in its bursts; a layout suits a mix of
#: tenants), evidence from loads unlike the present one says little about the next intervals:
#: weighed by recency alone, a day/night swing handed the node to a rule just as its phase
#: ended. Where it does not, the similarity only thins the evidence (LoadEvidenceChoice).
#: Chosen with scripts/tune_hedge.py on recorded expert streams of the training scenarios.
LOAD_BANDWIDTH = 0.7
#: The load-weighted evidence is used while its forecasts of the experts' rewards over the
#: next LOAD_FORECAST_INTERVALS intervals have missed by less than this fraction of the
#: recency-only evidence's (squared errors, faded as the rewards are) ...
LOAD_ERROR_RATIO = 0.8
#: ... (a switch pays back over about as many intervals as a restart's backlog takes).
LOAD_FORECAST_INTERVALS = 12


class Shadow:
    """One decision rule replayed on the observed arrivals, with its recent rewards."""

    def __init__(self, name: str, policy: Policy, env: GpuShareEnv, start: Configuration | None, history: int) -> None:
        self.name = name
        self.policy = policy
        self.env = env
        self.observation, _ = env.reset(seed=0, options={"configuration": start, "backend_seed": SHADOW_SEED})
        policy.reset(env)
        self.rewards: deque[float] = deque(maxlen=history)  # per interval, oldest first

    def step(self) -> None:
        """Run the next observed interval under the rule's decision."""
        self.observation, reward, _, _, _ = apply(self.env, self.policy.act(self.observation, self.env))
        self.rewards.append(reward)

    def what_if(self, policy: Policy, intervals: int) -> list[float]:
        """The rewards of ``intervals`` coming intervals from this shadow's state under
        ``policy`` (a fresh rule; arrivals not logged yet come at the last measured rates);
        the shadow is left as it was."""
        saved = self.env.snapshot()
        try:
            observation = self.observation
            policy.reset(self.env)
            rewards = []
            for _ in range(intervals):
                observation, reward, _, truncated, _ = apply(self.env, policy.act(observation, self.env))
                rewards.append(reward)
                if truncated:
                    break
            return rewards
        finally:
            self.env.restore(saved)


class MigratorHedge(Policy):
    """Follow the leader between the planner and the fixed layouts, on shadows of the node.

    :param memory_intervals: intervals over which a shadow's rewards fade by 1/e
    :param switch_margin_intervals: how many of the leader's mean interval rewards a
        challenger must beat it by to take the node (and never less than the mean cost of
        the switches measured on this node so far)
    :param switch_z: how many standard errors above zero a challenger's mean advantage per
        interval must be
    :param min_evidence_intervals: measured intervals before the first switch
    :param profile_intervals: intervals of the traffic before the episode that every shadow
        is run on at reset, as its first evidence (0: none; None: the node's day, between
        :data:`PROFILE_INTERVALS` and :data:`MAX_PROFILE_INTERVALS`)
    :param season_horizon_intervals: coming intervals of the seasonal forecast
        (:data:`SEASON_HORIZON_INTERVALS`; 0: none)
    :param simulate_switch_cost: before a switch, also simulate what it would cost from the
        leader's shadow (:meth:`_simulated_switch_cost`), and require the advantage to cover it
    :param load_bandwidth: weigh each interval of evidence by how alike its load was to the
        last interval's, where that has forecast the rewards better (:data:`LOAD_BANDWIDTH`,
        :class:`LoadEvidenceChoice`; 0, the default: by recency alone)
    :param load_error_ratio: how much better (:data:`LOAD_ERROR_RATIO`)
    :param profiled_groupings: also hold, as fixed experts, this many other groupings of the
        tenants: those that earned most on the profile (:data:`PROFILED_GROUPINGS`; 0, the
        default: none; none without a profile). They were chosen for the tenants active at
        the start, so once a tenant is deployed or retired, or a job starts or stops, they
        can no longer lead (a leading one hands the node to the best other expert at once)

    Departs from MIGRator (whose planner it wraps), which has no fixed-layout experts: the
    fixed layouts are the priority-fill and MPS variants of each maximal layout, tenants
    ranked by their declared mean rates (the load the node was planned for). On real GPUs
    the telemetry measures rates, not a request log, so a shadow replays Poisson arrivals at
    the measured per-interval rates: it sees bursts at the decision interval's scale, not
    within it (on ``default`` such shadows value every layout 30-40% too high).
    """

    name = "migrator-hedge"
    #: The planners among the experts, (shadow name, rule); the first is the one the node
    #: follows first and the one "the planner" means in the report.
    planner_rules: tuple[tuple[str, type[MigratorIlp]], ...] = (("planner", MigratorIlp),)
    #: Whether the fixed experts include priority-fill layouts where the scenario's node has a
    #: priority-fill scheduler (False: never, as on a real rlsched node, which has none).
    fixed_priority_fill: ClassVar[bool] = True

    def __init__(self, memory_intervals: float = MEMORY_INTERVALS, switch_margin_intervals: float = SWITCH_MARGIN_INTERVALS,
                 switch_z: float = SWITCH_Z, min_evidence_intervals: int = MIN_EVIDENCE_INTERVALS,
                 profile_intervals: int | None = None, simulate_switch_cost: bool = True,
                 load_bandwidth: float = 0.0, load_error_ratio: float = LOAD_ERROR_RATIO,
                 season_horizon_intervals: int = SEASON_HORIZON_INTERVALS, profiled_groupings: int = 0) -> None:
        if memory_intervals <= 0 or switch_margin_intervals < 0 or switch_z < 0 or not load_bandwidth >= 0 or not load_error_ratio > 0:
            raise ValueError(f"memory_intervals must be > 0, switch_margin_intervals, switch_z and load_bandwidth >= 0, load_error_ratio > 0 "
                             f"(got {memory_intervals}, {switch_margin_intervals}, {switch_z}, {load_bandwidth}, {load_error_ratio})")
        self.load_bandwidth, self.load_error_ratio = load_bandwidth, load_error_ratio
        self.decay = math.exp(-1.0 / memory_intervals)
        self.switch_margin_intervals = switch_margin_intervals
        self.switch_z = switch_z
        self.min_evidence_intervals = max(1, min_evidence_intervals)
        self.profile_intervals = None if profile_intervals is None else max(0, profile_intervals)
        self.season_horizon_intervals = max(0, season_horizon_intervals)
        self.simulate_switch_cost = simulate_switch_cost
        self.profiled_groupings = max(0, profiled_groupings)
        self.history = math.ceil(4.0 * memory_intervals)  # older rewards weigh below e^-4
        self.retired: list[int] = []  # shadows that can no longer lead (set at reset)

    def reset(self, env: GpuShareEnv) -> None:
        scenario = env.scenario
        self.measured = {t.name: ObservedArrivals(scenario.decision_interval_s, t.arrivals.mean_rate_rps()) for t in scenario.inference_tenants()}
        shadow_scenario = dataclasses.replace(
            scenario,
            duration_s=scenario.duration_s if env.backend.episodic else UNBOUNDED_S,
            tenants=[dataclasses.replace(t, arrivals=self.measured[t.name]) if isinstance(t, InferenceTenant) else t for t in scenario.tenants])

        day = day_intervals(scenario)
        # The day the seasonal forecast reads (None: no forecast).
        self.day = day if day is not None and day <= MAX_DAY_INTERVALS and self.season_horizon_intervals else None
        self.season_check = SeasonalCheck(self.decay, self.history)
        kept = kept_intervals(self.history, self.day)

        def shadow(name: str, policy: Policy) -> Shadow:
            private = GpuShareEnv(shadow_scenario, backend="sim", perf_model=env.backend.perf_model, repair_weights=env.repair_weights)
            return Shadow(name, policy, private, env.current, kept)

        # Per interval of the shadows' rewards, the node's load (see LOAD_BANDWIDTH).
        self.load_scales = {t.name: max(t.arrivals.mean_rate_rps(), 1e-9) if isinstance(t, InferenceTenant) else None for t in scenario.tenants}
        self.loads: deque[np.ndarray] = deque(maxlen=kept)
        self.load_choice = LoadEvidenceChoice(self.decay, self.load_bandwidth, self.load_error_ratio)
        self.replayed = 0  # intervals of the node's own traffic replayed
        if self.profile_intervals is None:
            profile = PROFILE_INTERVALS if day is None else min(max(day, PROFILE_INTERVALS), MAX_PROFILE_INTERVALS)
        else:
            profile = self.profile_intervals
        fixed = [c for c in layout_candidates(env) if self._runs_here(env, c)]
        groupings = self._profiled_groupings(env, profile) if profile and self.profiled_groupings else []
        self.shadows = [shadow(name, rule()) for name, rule in self.planner_rules]
        self.shadows += [shadow(f"fixed {k}", FixedConfiguration(c)) for k, c in enumerate(fixed + groupings)]
        self.groupings = list(range(len(self.shadows) - len(groupings), len(self.shadows)))  # shadow indices
        self.start_tenants = active_tenants(env.backend.observe())
        self.retired = []
        self.leader = 0
        # The planners the node runs when it follows one (their shadows plan for the shadows' state).
        self.planners = [rule() for _, rule in self.planner_rules]
        for planner in self.planners:
            planner.reset(env)
        self.switch_costs: list[float] = []  # measured on this node, request-equivalents
        self.report = {"leader_changes": 0, "planner_led_steps": 0, "steps": 0, "switch_costs": self.switch_costs,
                       "profiled_groupings": [self.shadows[k].name for k in self.groupings]}
        self._transition: list[float] | None = None  # the shortfalls since the last switch
        if profile:
            self._profile(env, profile)
            self._follow_leader()
            # Not a switch of the node: nothing runs yet, and nothing is to be measured.
            self._transition = None
            self.report["leader_changes"] = 0
            self.report["profiled_leader"] = self.shadows[self.leader].name

    def _profiled_groupings(self, env: GpuShareEnv, intervals: int) -> list[Configuration]:
        """The :attr:`profiled_groupings` other groupings of the tenants (beyond the usual fixed
        layouts) that earned most on the ``intervals`` of traffic before the episode (the
        profile's, :meth:`_profile`; :func:`~rlsched.agents.baselines.hindsight.grouping_rollouts`)."""
        private, seed = profile_episode(env, intervals)
        return [c for _, c, _ in grouping_rollouts(private, seed) if self._runs_here(env, c)][:self.profiled_groupings]

    def _runs_here(self, env: GpuShareEnv, configuration: Configuration) -> bool:
        """Whether a fixed expert may hold ``configuration``: any, or only one without
        priority fill where the node has no priority-fill scheduler (``fixed_priority_fill``
        off, or the scenario's ``priority_fill_scheduler``)."""
        return (self.fixed_priority_fill and env.scenario.priority_fill_scheduler) or not configuration.uses_priority_fill()

    def _profile(self, env: GpuShareEnv, intervals: int) -> None:
        """Start every shadow's history with what its rule earned on the ``intervals`` of
        traffic just before the episode (:func:`~rlsched.agents.baselines.hindsight.preceding_scenario`,
        other random arrivals): the evidence an operator's request log of the previous day
        gives, so the first decisions need not be the planner's, and the day the seasonal
        forecast reads."""
        private, seed = profile_episode(env, intervals)
        for k, s in enumerate(self.shadows):
            policy = fresh_rule(s.policy)
            observation, _ = private.reset(seed=0, options={"configuration": env.current, "backend_seed": seed})
            policy.reset(private)
            truncated = False
            while not truncated:
                observation, reward, _, truncated, _ = apply(private, policy.act(observation, private))
                s.rewards.append(reward)
                if k == 0:  # the arrivals, hence the loads, are every shadow's
                    self._record_load(private.backend.observe())
        if self.load_bandwidth > 0:
            self.load_choice.replay(np.array([s.rewards for s in self.shadows]), np.array(self.loads), self.history)

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> Decision:
        if env.last_step is not None:  # an interval has passed: replay it in every shadow
            self.replay_last_interval(env)
            self._measure_switch_cost(env.last_step.reward)
            self._follow_leader()
        self.report["steps"] += 1
        for k, planner in enumerate(self.planners):
            if k != self.leader:  # a planner's own forecast state must not go stale while it waits
                planner.observe(env)
        if self.leader < len(self.planners):
            self.report["planner_led_steps"] += self.leader == 0
            return self.planners[self.leader].act(observation, env)
        policy = self.shadows[self.leader].policy
        assert isinstance(policy, FixedConfiguration)
        return policy.configuration

    def replay_last_interval(self, env: GpuShareEnv) -> None:
        """Run every shadow on the interval the node has just run (its logged arrivals, else
        its measured rates)."""
        measured = env.backend.observe()
        logged = env.backend.arrival_times_s()
        for name, arrivals in self.measured.items():
            arrivals.record(float(measured.get(name, {}).get("arrival_rate_rps", 0.0)), None if logged is None else logged.get(name))
        self._record_load(measured)
        self.replayed += 1
        if self.groupings and not self.retired and active_tenants(measured) != self.start_tenants:
            self.retired = self.groupings
            self.report["groupings_retired_at"] = self.replayed
        for s in self.shadows:
            s.step()
        if self.day is not None or self.load_bandwidth > 0:  # the default hedge on a node without traces needs neither
            kept = np.array([s.rewards for s in self.shadows])
            if self.day is not None:
                self.season_check.update(kept, self.day)
            if self.load_bandwidth > 0:
                self.load_choice.update(kept[:, -self.history:], np.array(self.loads)[-self.history:])
        for arrivals in self.measured.values():
            arrivals.forget(len(arrivals.rates_rps))

    def _record_load(self, measured: dict[str, dict[str, float]]) -> None:
        """Append an interval's load (see :data:`LOAD_BANDWIDTH`) from the backend's observation."""
        load = [float(measured.get(name, {}).get("arrival_rate_rps", 0.0)) / scale if scale is not None
                else float(measured.get(name, {}).get("active", 1.0)) for name, scale in self.load_scales.items()]
        self.loads.append(np.array(load))

    def evidence(self) -> LeaderEvidence:
        """What the shadows' rewards say against the leader, each interval weighed by its
        recency and, while that forecasts better (:class:`LoadEvidenceChoice`), by how alike
        its load was to the last interval's; with the seasonal forecast while that forecasts
        better (:class:`SeasonalCheck`)."""
        kept = np.array([s.rewards for s in self.shadows])
        rewards = kept[:, -self.history:]
        similarity = None
        # Intervals without a recorded load (only where a test writes rewards) weigh by recency alone.
        if self.load_choice.use_load and len(self.loads) == kept.shape[1]:
            similarity = evidence_similarity(np.array(self.loads)[-self.history:], self.load_bandwidth, True, self.replayed, self.min_evidence_intervals)
        forecast = None
        if self.day is not None and self.season_check.use_season(self.replayed, self.min_evidence_intervals):
            forecast = seasonal_forecast(kept, self.day, self.season_horizon_intervals)
        return leader_evidence(rewards, self.leader, self.decay, similarity, forecast)

    def _simulated_switch_cost(self, challenger: int) -> float:
        """What switching to ``challenger`` would cost, simulated: the leader's shadow (the
        node's state, as near as a shadow has it) switched to the challenger's rule, against
        the challenger's own shadow, over :data:`TRANSITION_INTERVALS` intervals on the same
        arrivals (the last measured rates; both shadows' streams are in the same state)."""
        target = self.shadows[challenger]
        switched = self.shadows[self.leader].what_if(fresh_rule(target.policy), TRANSITION_INTERVALS)
        staying = target.what_if(fresh_rule(target.policy), len(switched))
        return max(0.0, float(sum(staying) - sum(switched)))

    def _measure_switch_cost(self, node_reward: float) -> None:
        """Count the node's shortfall against its leader's shadow in the intervals after a
        switch: what the switch really cost (restarts, and the backlog they leave), which
        no shadow sees because each runs its rule all along."""
        if self._transition is None:
            return
        self._transition.append(self.shadows[self.leader].rewards[-1] - node_reward)
        if len(self._transition) == TRANSITION_INTERVALS:
            self.switch_costs.append(max(0.0, float(sum(self._transition))))
            self._transition = None

    def _follow_leader(self) -> None:
        """Hand the node to the shadow whose advantage over the leader is largest, if it is
        large (the margin) and clear (the z-test) on enough evidence, and covers what the
        switch would cost as simulated; a leader that can no longer lead hands the node to
        the best other expert at once."""
        if self.leader in self.retired:
            self.switch_to(int(np.argmax(self._lower_bounds(self.evidence()))))
            return
        if len(self.shadows[self.leader].rewards) < self.min_evidence_intervals:
            return
        evidence = self.evidence()
        best = self.challenger(evidence)
        if best is None:
            return
        if self.simulate_switch_cost and evidence.gain(best) <= self._simulated_switch_cost(best):  # the costly check last
            return
        self.switch_to(best)

    def challenger(self, evidence: LeaderEvidence) -> int | None:
        """The shadow the rule would hand the node to before the simulated cost (None: keep)."""
        if evidence.intervals < self.min_evidence_intervals:
            return None
        lower = self._lower_bounds(evidence)
        best = int(np.argmax(lower))
        # A switch must pay for itself: the margin, and what switches have cost on this node so far.
        margin = max(self.switch_margin_intervals * evidence.leader_mean, float(np.mean(self.switch_costs)) if self.switch_costs else 0.0)
        if best == evidence.leader or lower[best] <= 0.0 or evidence.gain(best) <= margin:
            return None
        return best

    def _lower_bounds(self, evidence: LeaderEvidence) -> np.ndarray:
        """Per expert, its mean advantage less ``switch_z`` standard errors; -inf for the
        shadows that can no longer lead."""
        lower = evidence.mean - self.switch_z * evidence.spread
        lower[self.retired] = -np.inf
        return lower

    def switch_to(self, expert: int) -> None:
        """Hand the node to shadow ``expert`` and start measuring what the switch costs."""
        if self._transition:  # switched again before the last switch's cost was in: count what is
            self.switch_costs.append(max(0.0, float(sum(self._transition))))
        self.leader = expert
        self.report["leader_changes"] += 1
        self._transition = []


def active_tenants(measured: dict[str, dict[str, float]]) -> frozenset[str]:
    """The tenants a backend's observation reports active (deployed, or a job running)."""
    return frozenset(name for name, m in measured.items() if m.get("active", 1.0))


def profile_episode(env: GpuShareEnv, intervals: int) -> tuple[GpuShareEnv, int | None]:
    """A private environment of the ``intervals`` of traffic just before ``env``'s episode
    (:func:`~rlsched.agents.baselines.hindsight.preceding_scenario`) and the backend seed that
    replays its other random arrivals: the hedge's profile."""
    profile = preceding_scenario(env.scenario, intervals * env.scenario.decision_interval_s)
    seed = None if env.backend_seed is None else env.backend_seed + PROFILING_SEED_OFFSET
    return GpuShareEnv(profile, backend="sim", perf_model=env.backend.perf_model, repair_weights=env.repair_weights), seed


def fresh_rule(policy: Policy) -> Policy:
    """A rule to run from another state: a new planner of the same kind (a planner keeps a
    forecast of the node it plans for), or the fixed layout itself."""
    return type(policy)() if isinstance(policy, MigratorIlp) else policy


class MigratorHedgeMps(MigratorHedge):
    """``migrator-hedge`` for a node without a priority-fill scheduler: its fixed experts are
    the MPS-only layouts (``fixed_priority_fill`` off), and its planner, ``migrator-ilp``,
    plans MPS only. What the daemon's ``auto`` runs on a real node, where rlsched starts no
    priority-fill scheduler (docs/hardware-probes/README.md, 2026-11-27).

    Measured at stop 49 against ``migrator-ilp`` (docs/planner-bursts.md): on ``default``
    (seeds 0-5) 1.031-1.082x, 6 of 6 better, holding the best MPS-only fixed configuration;
    on the held-out suite (seeds 0-1) equal to the unit on four scenarios, and 0.981-0.992x on
    heldout-eight-tenants (seeds 0-3, 4 of 4 worse); on ten bursty traces on ``default``'s
    resnet (seed 0) equal on eight, 1.036x on one and worse on one (DeepSeek-R1 chunk 41,
    where both end below zero).

    Departs from MIGRator as ``migrator-hedge`` does."""

    name = "migrator-hedge-mps"
    fixed_priority_fill = False


class MigratorHedgeQueue(MigratorHedge):
    """``migrator-hedge`` with a second planner among its experts: ``migrator-queue``, whose
    value model is right near capacity (docs/planner-bursts.md). Opt-in.

    Measured at stop 37, closed loop, seed 0 per trace, real bursty or day/night traffic on
    ``default``'s resnet:
    - 1.018x the best fixed layout on seven repo traces;
    - 1.037x on seven traces no choice was tuned on (per trace 0.973x-1.186x); on DeepSeek
      chunk22 it follows the priority-fill 7g's shadow where ``migrator-queue`` alone
      abandons resnet;
    - 1.002x on ``default`` (seeds 0-2).

    Against ``migrator-queue`` alone (seeds 0-1): 1.048x on ``default``, 1.020x on the
    training suite, 0.965x on the held-out suite (heldout-deploy 0.91x, heldout-bursty-high
    0.94x with high-priority SLO 0.933). Each interval runs one more planner shadow.

    Departs from MIGRator as ``migrator-hedge`` does."""

    name = "migrator-hedge-queue"
    planner_rules = (("planner", MigratorIlp), ("planner-queue", MigratorQueue))


class MigratorHedgeGroupings(MigratorHedgeQueue):
    """``migrator-hedge-queue`` whose fixed experts also hold the :data:`PROFILED_GROUPINGS`
    groupings of the tenants that earned most on the profile (``profiled_groupings``). Opt-in.

    The reset pays one profile rollout per grouping (410 on ``default``, about a minute).
    Measured at stop 38, closed loop, seed 0, against ``migrator-hedge-queue``: on real traffic
    on ``default``'s resnet 1.215x on DeepSeek-R1 chunk1, 1.109x on c30, 1.046x on c62, 1.031x
    on c18, 0.993x on ``default``; but 0.89x on heldout-retrain, whose retraining jobs come
    and go while the profile holds them as they are at the start. On heldout-deploy it was
    0.80x until the groupings stopped leading once the active tenants change (stop 39:
    1.03x). On all 37 episodes of stop 39: 1.03x on the fourteen traces, 1.18x on the
    training suite (train-two-gpus 2.0x), 0.98x on the held-out suite, 1.00x on ``default``
    (docs/planner-bursts.md).

    Departs from MIGRator as ``migrator-hedge`` does."""

    name = "migrator-hedge-groupings"

    def __init__(self, **options: Any) -> None:
        super().__init__(**{"profiled_groupings": PROFILED_GROUPINGS, **options})


class MigratorHedgeLoad(MigratorHedge):
    """``migrator-hedge`` whose evidence is also weighed by load similarity where that forecasts
    better (:data:`LOAD_BANDWIDTH`, :class:`LoadEvidenceChoice`). Opt-in: closed loop it gained
    0.6% on average over 82 episodes, between -5% and +9% per episode, over the hedge before its
    seasonal forecast (docs/planner-bursts.md).

    Departs from MIGRator as ``migrator-hedge`` does; the load weighting is rlsched's own (no
    paper)."""

    name = "migrator-hedge-load"

    def __init__(self, **options: Any) -> None:
        super().__init__(**{"load_bandwidth": LOAD_BANDWIDTH, **options})


@dataclasses.dataclass(frozen=True)
class LeaderEvidence:
    """What the shadows' recent rewards say about every expert against the leader.

    :param leader: index of the leader
    :param mean: per expert, its mean advantage per interval over the leader, weighted by the memory
    :param spread: the standard error of ``mean``
    :param recent: per expert, its mean advantage over the last :data:`TRANSITION_INTERVALS` intervals
    :param weight_sum: the memory's weights summed (how many intervals the evidence is worth)
    :param leader_mean: the leader's weighted mean reward per interval, absolute
    :param intervals: intervals of evidence
    """

    leader: int
    mean: np.ndarray
    spread: np.ndarray
    recent: np.ndarray
    weight_sum: float
    leader_mean: float
    intervals: int

    def gain(self, expert: int) -> float:
        """The expert's advantage over the leader summed with the memory's weights."""
        return float(self.mean[expert]) * self.weight_sum


class LoadEvidenceChoice:
    """Which evidence the node trusts: weighed by recency alone, or also by load similarity.

    After every interval each weighting forecasts what every expert will earn, relative to the
    experts' mean, over the next :data:`LOAD_FORECAST_INTERVALS` intervals (its weighted mean
    of the past); once those intervals have come, its squared miss is added to its error,
    faded by ``decay`` per interval. The load-weighted evidence is used while its error is
    below :data:`LOAD_ERROR_RATIO` times the recency-only one's: on nodes where the load
    explains who earns more (day/night traffic, tenants coming and going), not where the
    similarity only leaves fewer intervals to judge by.

    :param decay: the memory's fade per interval
    :param bandwidth: :data:`LOAD_BANDWIDTH` (0: never use the load)
    :param error_ratio: :data:`LOAD_ERROR_RATIO`
    """

    def __init__(self, decay: float, bandwidth: float, error_ratio: float = LOAD_ERROR_RATIO) -> None:
        self.decay, self.bandwidth, self.error_ratio = decay, bandwidth, error_ratio
        self.errors = np.zeros(2)  # recency only, load-weighted
        self.forecasts: deque[np.ndarray] = deque(maxlen=LOAD_FORECAST_INTERVALS)
        self.use_load = False

    def update(self, rewards: np.ndarray, loads: np.ndarray) -> None:
        """Score and make the forecasts after a new interval: ``rewards`` (experts x intervals)
        and ``loads`` (intervals x tenants), oldest first, ending with it."""
        if self.bandwidth <= 0 or rewards.shape[1] != len(loads):
            return
        relative = rewards - rewards.mean(axis=0)
        self.errors *= self.decay
        if len(self.forecasts) == self.forecasts.maxlen:  # the oldest forecast's intervals have all come
            came = relative[:, -len(self.forecasts):].mean(axis=1)
            self.errors += ((self.forecasts[0] - came) ** 2).sum(axis=1)
        faded = self.decay ** np.arange(rewards.shape[1] - 1, -1, -1)
        alike = faded * load_similarity(loads, self.bandwidth)
        self.forecasts.append(np.stack([relative @ (faded / faded.sum()), relative @ (alike / alike.sum())]))
        self.use_load = bool(self.errors[1] < self.error_ratio * self.errors[0])

    def replay(self, rewards: np.ndarray, loads: np.ndarray, history: int) -> list[bool]:
        """:meth:`update` after each recorded interval of ``rewards`` (experts x intervals) and
        ``loads``, each time on the last ``history`` of them (what the hedge keeps); returns
        :attr:`use_load` after each."""
        used = []
        for end in range(1, rewards.shape[1] + 1):
            start = max(0, end - history)
            self.update(rewards[:, start:end], loads[start:end])
            used.append(self.use_load)
        return used


def evidence_similarity(loads: np.ndarray, bandwidth: float, use_load: bool, own_intervals: int, min_intervals: int) -> np.ndarray | None:
    """The load similarity that weighs the evidence now (:func:`load_similarity`), or None
    (recency alone): also None before the node has replayed ``min_intervals`` intervals of its
    own traffic (the first ones' loads match the profile's, whose day may want another rule: a
    retraining node lost a quarter of its episode switching on them) and while fewer than
    ``min_intervals`` intervals' worth were alike (a load the node has hardly seen, as after a
    tenant is deployed, would be judged on a handful of intervals).

    :param use_load: :attr:`LoadEvidenceChoice.use_load`
    :param own_intervals: intervals of the node's own traffic replayed so far
    """
    if not use_load or own_intervals < min_intervals:
        return None
    similarity = load_similarity(loads, bandwidth)
    return None if similarity is None or similarity.sum() < min_intervals else similarity


def load_similarity(loads: np.ndarray, bandwidth: float) -> np.ndarray | None:
    """Per interval of ``loads`` (intervals x tenants, oldest first), how alike its load is to
    the last interval's: exp(-d^2 / 2 bandwidth^2), d their Euclidean distance (None: no
    bandwidth, or no load)."""
    if bandwidth <= 0 or not len(loads):
        return None
    return np.exp(-0.5 * ((loads - loads[-1]) ** 2).sum(axis=1) / bandwidth**2)


def leader_evidence(rewards: np.ndarray, leader: int, decay: float, similarity: np.ndarray | None = None,
                    forecast: np.ndarray | None = None) -> LeaderEvidence:
    """:class:`LeaderEvidence` from ``rewards`` (experts x intervals, oldest first), the
    memory fading each older interval by ``decay`` and, if given, weighing each interval by
    its ``similarity`` (in [0, 1]) to the present; the ``forecast``'s intervals (experts x
    intervals, :func:`seasonal_forecast`) join them, each weighing :data:`SEASON_WEIGHT`."""
    n = rewards.shape[1]
    recent = (rewards - rewards[leader])[:, -TRANSITION_INTERVALS:].mean(axis=1) if n else np.zeros(len(rewards))
    faded = decay ** np.arange(n - 1, -1, -1)  # the memory's weight of each interval
    if similarity is not None:
        faded = faded * similarity
    if forecast is not None and forecast.shape[1]:
        rewards = np.concatenate([rewards, forecast], axis=1)
        faded = np.concatenate([faded, np.full(forecast.shape[1], SEASON_WEIGHT)])
    weights = faded / faded.sum() if len(faded) else faded
    advantage = rewards - rewards[leader]
    mean = advantage @ weights
    spread = np.sqrt(((advantage - mean[:, None]) ** 2) @ weights**2)
    return LeaderEvidence(leader, mean, spread, recent, float(faded.sum()), abs(float(rewards[leader] @ weights)) if len(faded) else 0.0, n)


def kept_intervals(history: int, day: int | None) -> int:
    """Intervals of rewards the hedge keeps: its evidence's ``history``, or the ``day`` the
    seasonal forecast reads, and the interval before them (:class:`SeasonalCheck` scores the
    last interval against its predecessors and the day before it)."""
    return max(history, day or 0) + 1


def seasonal_forecast(rewards: np.ndarray, day: int, horizon: int) -> np.ndarray:
    """What each expert earned one ``day`` (intervals) before each of the next ``horizon``
    intervals: the columns of ``rewards`` (experts x intervals, oldest first, ending with the
    last interval) that are there (none before a day of them is kept)."""
    kept = rewards.shape[1]
    return rewards[:, max(kept - day, 0):max(min(kept - day + horizon, kept), 0)]


class SeasonalCheck:
    """Whether yesterday's rewards at the same time of day forecast the experts' better than
    the recent past does (:data:`SEASON_ERROR_RATIO`).

    After every replayed interval each forecast of its rewards relative to the experts' mean
    is scored: the rewards one day before it, and the mean of the ``history`` intervals before
    it faded by ``decay`` (what the evidence weighs). The squared misses are summed, faded
    by ``decay``."""

    def __init__(self, decay: float, history: int) -> None:
        self.decay, self.history = decay, history
        self.errors = np.zeros(2)  # recent past, a day before

    def update(self, rewards: np.ndarray, day: int) -> None:
        """Score the forecasts of the last interval of ``rewards`` (experts x intervals, oldest
        first); nothing while the day before it is not kept."""
        if rewards.shape[1] <= day:
            return
        relative = rewards - rewards.mean(axis=0)
        past = relative[:, -1 - min(self.history, rewards.shape[1] - 1):-1]
        faded = self.decay ** np.arange(past.shape[1] - 1, -1, -1)
        misses = [past @ (faded / faded.sum()) - relative[:, -1], relative[:, -1 - day] - relative[:, -1]]
        self.errors = self.errors * self.decay + np.array([(m**2).sum() for m in misses])

    def use_season(self, own_intervals: int, min_intervals: int) -> bool:
        """Whether the forecast joins the evidence now: after ``min_intervals`` scored
        intervals of the node's own traffic, while its error is the smaller by the ratio."""
        return own_intervals >= min_intervals and bool(self.errors[1] < SEASON_ERROR_RATIO * self.errors[0])

    def replay(self, rewards: np.ndarray, day: int, first: int) -> list[bool]:
        """:meth:`update` after each interval of ``rewards`` from column ``first`` on (the
        episode's, after its profile), each time on the columns the hedge keeps
        (:func:`kept_intervals`); returns :meth:`use_season` before each column from ``first``
        on and after the last."""
        kept = kept_intervals(self.history, day)
        used = [False]  # nothing of the node's own traffic scored yet
        for end in range(first + 1, rewards.shape[1] + 1):
            self.update(rewards[:, max(0, end - kept):end], day)
            used.append(self.use_season(end - first, MIN_EVIDENCE_INTERVALS))
        return used
