"""The candidate-choice environment: pick one of K whole configurations, on any node.

:class:`CandidateChoiceEnv` wraps ``rlsched/GpuShare-v0``. Every decision interval it builds
the candidates of :class:`~rlsched.agents.candidates.CandidateLibrary` (the running
configuration and the planner's own solutions), keeps the :data:`CANDIDATES` most promising
under two forecasts (the planner's EWMA and the recent burst), and describes each by what the
planner's model predicts for it (:data:`CANDIDATE_FEATURES`, a third forecast among them: the
last interval's rates), relative to keeping the running one. The action is the index of
the candidate to apply (``Discrete(CANDIDATES)``, padded slots masked for MaskablePPO).

:class:`DaemonObserver` offers instead the slots the daemon planner's objective weighs
(``queue-slo-offered``'s), described by that objective (:data:`DAEMON_CANDIDATE_FEATURES`).

Every feature is a ratio or a fraction (Goodput terms are divided by the node's requests
per lookahead at its mean rates), so one network can serve any number of GPUs and tenants
and any GPU type: the node's shape never enters the observation's size.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlsched.agents.baselines.base import observed_load
from rlsched.agents.baselines.planners import MIGRATOR_LOOKAHEAD
from rlsched.agents.candidates import CANDIDATES, BurstForecast, CandidateLibrary, ScoredCandidates, offer_slots
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.solver.planner import Planner, Terms
from rlsched.workloads.tenants import BestEffortJob, ContinualLearningJob, Priority, Tenant

#: Per candidate, in order. ``gain_*``: predicted objective minus keeping's, at the EWMA
#: forecast (the planner's), at the last interval's rates and at the burst rates (the largest
#: of the last :data:`~rlsched.agents.candidates.BURST_WINDOW` intervals); ``cost``: the predicted cost of the move;
#: ``value``: predicted Goodput at the EWMA forecast; ``rank``: by ``gain_ewma`` (0 best);
#: ``moved``: fraction of tenants whose placement changes.
CANDIDATE_FEATURES: tuple[str, ...] = ("keep", "gain_ewma", "gain_last", "gain_burst", "cost", "value", "rank", "moved")
#: Once per observation: intervals since the last change (/ :data:`SINCE_CHANGE_SCALE`, capped
#: at 1), the largest burst-to-EWMA rate ratio minus 1 (capped at :data:`FEATURE_LIMIT`), and the
#: high-priority tenants' SLO attainment last interval. Nothing says how far an episode has
#: run: a deployed node runs on, so the policy must not learn the end of a training episode.
GLOBAL_FEATURES: tuple[str, ...] = ("since_change", "burst_ratio", "slo_attainment_high")
#: Per candidate for :class:`DaemonObserver`, in order: ``keep``; ``gain``: the daemon planner's
#: objective (``queue-slo-offered``'s: queue model, SLO guards, the move's cost and payback
#: hurdle) minus keeping's; ``gain_ewma``, ``gain_burst``: the plain model's, by which the slots
#: were offered; ``cost``, ``hurdle``: the daemon objective's move cost and payback hurdle;
#: ``rank``: by ``gain`` (0 best); ``moved``. Goodput terms are over the daemon planner's lookahead.
DAEMON_CANDIDATE_FEATURES: tuple[str, ...] = ("keep", "gain", "gain_ewma", "gain_burst", "cost", "hurdle", "rank", "moved")
#: The kinds of tenant a slot is described for, apart (:func:`tenant_kind`): high-priority
#: inference, other inference, retraining (continual learning) and best-effort jobs.
TENANT_KINDS: tuple[str, ...] = ("high", "inference", "retraining", "best_effort")
#: Per candidate, after :data:`DAEMON_CANDIDATE_FEATURES`, for the ``daemon-tenants`` observer:
#: per tenant kind, the daemon objective's gain over keeping summed over that kind's tenants
#: (``gain_KIND``: their value, SLO guards' charges included, less their move's cost and hurdle;
#: the kinds' gains sum to ``gain``), then the fraction of that kind's tenants the slot moves
#: (``moved_KIND``; 0 where the node has none). Why: a whole-configuration gain says nothing of
#: whom a move serves. On heldout-retrain (seed 2) a file trained without these and one trained
#: with them held the same GPU layouts and differed in where the high-priority tenant sat:
#: 0.79x and 1.05x the warm start. Held out, the second added 3.0% over its warm start at every
#: seed; at eight seeds of heldout-retrain the two files were not distinguishable (one training
#: run each; docs/history-candidate-policy.md, stops 88-89).
TENANT_KIND_FEATURES: tuple[str, ...] = (*(f"gain_{k}" for k in TENANT_KINDS), *(f"moved_{k}" for k in TENANT_KINDS))
#: What a candidate-choice policy observes through, and the per-candidate features it sees:
#: ``plain`` (:class:`CandidateObserver`, the library planner's model), ``daemon``
#: (:class:`DaemonObserver`) or ``daemon-tenants`` (:class:`DaemonObserver` describing each slot
#: per tenant kind too); a policy file names its own in its ``observer`` metadata (none: ``plain``).
OBSERVER_FEATURES: dict[str, tuple[str, ...]] = {"plain": CANDIDATE_FEATURES, "daemon": DAEMON_CANDIDATE_FEATURES,
                                                 "daemon-tenants": DAEMON_CANDIDATE_FEATURES + TENANT_KIND_FEATURES}
#: The observers that choose among the daemon planner's slots (:class:`DaemonObserver`).
DAEMON_OBSERVERS: tuple[str, ...] = ("daemon", "daemon-tenants")
OBSERVERS: tuple[str, ...] = tuple(OBSERVER_FEATURES)
#: Where a candidate-choice policy chooses: at every decision, or only where the observer's
#: planner moves (where it keeps, the mask holds its slot alone, so the policy keeps too).
#: Why the second: at every decision almost all of PPO's departures are moves the planner did
#: not make, which mostly lose; one scorer generalised that into a bonus for keeping that
#: overturned the planner's own moves (docs/history-candidate-policy.md, stop 83).
CHOOSE_AT: tuple[str, ...] = ("every-decision", "planner-moves")
#: Each step's info key holding every action's paired advantage (an array, one per slot), what
#: :class:`~rlsched.agents.ppo.expected_ppo.ExpectedPPO` learns from.
ACTION_ADVANTAGES_KEY = "action_advantages"
#: A policy's deterministic choice: (observation, masks) -> slot.
SlotChooser = Callable[[np.ndarray, np.ndarray], int]
#: What a training branch follows after its first configuration: the observer's planner, or
#: the policy being trained (:meth:`CandidateChoiceEnv.set_branch_policy`). Why the second: a
#: branch followed by the planner prices one interval of a departure, and a policy that keeps
#: against the planner's move keeps again at the next interval. On heldout-bursty-high keeping
#: once cost -0.23 over 60 intervals where keeping throughout cost -5.68
#: (docs/history-candidate-policy.md, stop 87).
BRANCH_FOLLOW: tuple[str, ...] = ("planner", "policy")


def tenant_kind(tenant: Tenant) -> str:
    """``tenant``'s kind (:data:`TENANT_KINDS`)."""
    if isinstance(tenant, ContinualLearningJob):
        return "retraining"
    if isinstance(tenant, BestEffortJob):
        return "best_effort"
    return "high" if tenant.priority == Priority.HIGH else "inference"


def tenant_kind_columns(tenants: list[Tenant], candidates: list[Configuration], by_tenant: list[Mapping[str, Terms]],
                        current: Configuration) -> np.ndarray:
    """The :data:`TENANT_KIND_FEATURES` columns (one row per feature, one column per
    candidate, the first the running configuration), Goodput terms unscaled: per kind the
    objective's gain over keeping (a move's value less its cost and hurdle; keeping's value
    alone, as :func:`~rlsched.agents.baselines.planners.move_objective` counts it), then the
    fraction of the kind's tenants each candidate moves."""
    kinds = {t.name: TENANT_KINDS.index(tenant_kind(t)) for t in tenants}
    objective = np.zeros((len(TENANT_KINDS), len(candidates)))
    for i, terms in enumerate(by_tenant):
        for name, (value, cost, hurdle) in terms.items():
            objective[kinds[name], i] += value if i == 0 else value - cost - hurdle
    moved = np.zeros((len(TENANT_KINDS), len(candidates)))
    counts = np.bincount(list(kinds.values()), minlength=len(TENANT_KINDS))
    for i, config in enumerate(candidates):
        for name, k in kinds.items():
            moved[k, i] += tenant_moves(config, current, name)
    return np.vstack([objective - objective[:, :1], moved / np.maximum(counts, 1)[:, None]])


def planner_keeps(observer: CandidateObserver | DaemonObserver) -> bool:
    """Whether ``observer``'s planner chose the configuration the node runs."""
    return observer.configuration(observer.planner_choice()) == observer.env.current


#: How far below the planner's choice a slot's ``gain_high`` (in the observation's units: the
#: node's requests over the daemon planner's lookahead) may fall under the high-priority guard:
#: float rounding only.
HIGH_PRIORITY_GUARD_TOLERANCE = 1e-9


def choice_masks(observer: CandidateObserver | DaemonObserver, offered: int) -> np.ndarray:
    """The slots ``observer``'s policy may choose: the ``offered`` ones, or, where it chooses
    only at the planner's moves (:data:`CHOOSE_AT`) and the planner keeps, the planner's alone.
    With a daemon observer's high-priority guard (:attr:`DaemonObserver.high_priority_guard`),
    only the offered slots that the daemon objective rates as good for the high-priority
    tenants as the planner's choice."""
    planner = observer.planner_choice()
    if observer.choose_at == "planner-moves" and planner_keeps(observer):
        return np.arange(CANDIDATES) == planner
    masks = np.arange(CANDIDATES) < offered
    if isinstance(observer, DaemonObserver) and observer.high_priority_guard and observer.gain_high is not None:
        gain_high = observer.gain_high
        masks[: len(gain_high)] &= gain_high >= gain_high[planner] - HIGH_PRIORITY_GUARD_TOLERANCE
    return masks


#: Intervals after which "since the last change" reads 1.
SINCE_CHANGE_SCALE = 30.0
#: Every feature is clipped to [-FEATURE_LIMIT, FEATURE_LIMIT].
FEATURE_LIMIT = 10.0


def node_reward_scale(env: GpuShareEnv) -> float:
    """Requests per decision interval at the node's mean rates (at least 1): the unit of the
    candidate-choice rewards and Goodput features, so that they compare across nodes."""
    requests = sum(t.arrivals.mean_rate_rps() for t in env.scenario.inference_tenants()) * env.scenario.decision_interval_s
    return max(requests, 1.0)


def read_node(env: GpuShareEnv) -> tuple[dict[str, float], dict[str, float], dict[str, float], dict[str, float], float]:
    """What the observer reads from the node at a decision: per inference tenant the smoothed
    arrival rate, the backlog and the accuracy (:func:`observed_load`) and the last interval's
    measured arrival rate, requests/s; and the high-priority tenants' lowest SLO attainment
    last interval."""
    rates, backlog, accuracy = observed_load(env)
    measured = env.backend.observe()
    last = {n: float(measured.get(n, {}).get("arrival_rate_rps", r)) for n, r in rates.items()}
    high = [t.name for t in env.scenario.inference_tenants() if t.priority == Priority.HIGH]
    attainment = min((float(measured.get(n, {}).get("slo_attainment", 1.0)) for n in high), default=1.0)
    return rates, backlog, accuracy, last, attainment


def tenant_moves(config: Configuration, current: Configuration, name: str) -> bool:
    """Whether ``config`` changes tenant ``name``'s GPU, GI, share or batch, or its GPU's layout, from ``current``."""
    placement = current.placements[name]
    return config.placements.get(name) != placement or config.layouts[placement.gpu_index] != current.layouts[placement.gpu_index]


def moved_fraction(config: Configuration, current: Configuration) -> float:
    """Fraction of tenants :func:`tenant_moves` counts (the ``moved`` feature)."""
    return sum(tenant_moves(config, current, n) for n in current.placements) / max(len(current.placements), 1)


def candidate_observation(offered: list[int], gain_ewma: np.ndarray, gain_burst: np.ndarray, gain_last: np.ndarray, cost: np.ndarray,
                          value: np.ndarray, moved: list[float], reward_scale: float, since_change: int, burst_ratio: float,
                          attainment: float) -> np.ndarray:
    """The observation (see the module docstring) from the planner model's valuing: per
    candidate (index 0: keep) ``gain_ewma``, ``gain_burst``, ``cost`` and ``value``; per offered
    slot, in slot order, ``gain_last`` and ``moved``. The one place the features are computed,
    for the request-level environment and its surrogate alike."""
    scale = reward_scale * MIGRATOR_LOOKAHEAD
    index = np.asarray(offered)
    slots = np.column_stack([index == 0, gain_ewma[index] / scale, np.asarray(gain_last) / scale, gain_burst[index] / scale,
                             cost[index] / scale, value[index] / scale, slot_rank(gain_ewma[index]), moved])
    return pack_observation(slots, since_change, burst_ratio, attainment)


def slot_rank(gain: np.ndarray) -> np.ndarray:
    """The ``rank`` feature of each offered slot: its place by ``gain`` (0 best, ties in slot
    order), as a fraction of the last slot's."""
    rank = np.empty(len(gain))
    rank[np.argsort(-gain, kind="stable")] = np.arange(len(gain)) / max(CANDIDATES - 1, 1)
    return rank


def pack_observation(slots: np.ndarray, since_change: int, burst_ratio: float, attainment: float) -> np.ndarray:
    """An observation from the offered slots' feature rows (padded with zero rows to
    :data:`CANDIDATES`) and the :data:`GLOBAL_FEATURES`, clipped to :data:`FEATURE_LIMIT`."""
    rows = np.zeros((CANDIDATES, slots.shape[1]))
    rows[: len(slots)] = slots
    glob = np.array([min(since_change / SINCE_CHANGE_SCALE, 1.0), burst_ratio, attainment])
    observation = np.concatenate([rows.ravel(), glob])
    return np.clip(np.nan_to_num(observation), -FEATURE_LIMIT, FEATURE_LIMIT).astype(np.float32)


def burst_ratio_feature(burst: Mapping[str, float], rates: Mapping[str, float]) -> float:
    """The ``burst_ratio`` global feature: the largest burst-to-EWMA rate ratio minus 1."""
    return max((burst[n] / max(rates[n], 1e-9) - 1.0 for n in rates), default=0.0)


class CandidateObserver:
    """What a candidate-choice policy sees and can choose, one decision at a time: the
    candidate library of a node, its valuing (the whole library under two forecasts, the
    offered slots under a third), the offered slots and their features. The training
    environment (:class:`CandidateChoiceEnv`) and the deployed policy
    (:class:`~rlsched.agents.candidate_ppo.CandidatePpo`) both observe through it, so a trained
    network meets in deployment exactly the features it was trained on.

    :param env: the node (any scenario, node shape and GPU type), already reset
    :param library: a library to go on with (training keeps one across episodes of one node);
        None seeds a new one
    :param background_solves: a new library solves new loads on a worker thread (the daemon)
    """

    #: Where the policy chooses (:data:`CHOOSE_AT`; :func:`make_observer` sets it).
    choose_at = "every-decision"

    def __init__(self, env: GpuShareEnv, library: CandidateLibrary | None = None, background_solves: bool = False) -> None:
        self.env = env
        if library is None:
            planner = Planner(env.scenario, env.backend.perf_model, env.backend.memory_gib)
            library = CandidateLibrary(env, planner, background=background_solves)
            library.seed(MIGRATOR_LOOKAHEAD)
        self.library = library
        self.planner = library.planner
        #: Requests per interval at the mean rates (>= 1): the unit of rewards and Goodput features.
        self.reward_scale = node_reward_scale(env)
        self.bursts = BurstForecast()
        self.since_change = 0
        self.last_configuration: Configuration | None = env.current
        self.scored: ScoredCandidates | None = None
        self.offered: list[int] = []

    def first_configuration(self) -> Configuration:
        """The planner's configuration for the node's first interval (nothing is deployed yet);
        its load joins the library as ``planner-library``'s first decision does."""
        rates, backlog, accuracy = observed_load(self.env)
        windows = self.planner.forecast([rates] * MIGRATOR_LOOKAHEAD, backlog)
        self.library.request(windows)
        return self.planner.plan(windows, None, accuracy).configuration

    def action_masks(self) -> np.ndarray:
        """True for the slots the policy may choose (:func:`choice_masks`)."""
        return choice_masks(self, len(self.offered))

    def configuration(self, slot: int) -> Configuration:
        """The configuration in ``slot``; a masked or unknown slot keeps the running one."""
        assert self.scored is not None
        index = self.offered[slot] if 0 <= slot < len(self.offered) else 0
        return self.scored.configurations[index]

    def planner_choice(self) -> int:
        """The slot the library planner would choose (the largest objective at the EWMA forecast)."""
        assert self.scored is not None
        objective = self.scored.objective
        return int(np.argmax([objective[i] for i in self.offered]))

    def commit(self, configuration: Configuration) -> None:
        """What the node runs for the interval just observed (the plain observer keeps no state of it)."""

    def branch(self, first: Configuration) -> Callable[[], Configuration]:
        """A chooser that goes on as the library planner from the node's current state, after
        ``first`` is applied (a training branch, :meth:`CandidateChoiceEnv.paired_advantage`):
        the library as it is now, asking for no solves and marking no use."""
        def library_choice() -> Configuration:
            assert self.env.current is not None
            rates, backlog, accuracy = observed_load(self.env)
            windows = self.planner.forecast([rates] * MIGRATOR_LOOKAHEAD, backlog)
            scored = self.library.score(windows, self.env.current, accuracy, record_use=False)
            return scored.configurations[scored.best()]
        return library_choice

    def observe(self) -> np.ndarray:
        """Value the candidates at the node's current state; the observation (see the module docstring)."""
        env = self.env
        assert env.current is not None, "nothing deployed yet: apply first_configuration() first"
        self.since_change = 0 if env.current != self.last_configuration else self.since_change + 1
        self.last_configuration = env.current
        self.library.refresh()
        rates, backlog, accuracy, last, attainment = read_node(env)
        burst = self.bursts.record(last)
        windows = self.planner.forecast([rates] * MIGRATOR_LOOKAHEAD, backlog)
        self.library.request(windows)
        at_burst_rates = self.planner.forecast([burst] * MIGRATOR_LOOKAHEAD, backlog)
        self.scored, at_burst = self.library.score_forecasts([windows, at_burst_rates], env.current, accuracy)
        gain_ewma, gain_burst = (s.objective - s.objective[0] for s in (self.scored, at_burst))
        self.offered = offer_slots([gain_ewma, gain_burst])
        # The last interval's rates only describe the offered slots: valuing the whole library
        # a third time would cost a third of the decision for features of candidates never offered.
        offered = [self.scored.configurations[i] for i in self.offered]
        at_last = self.library.value(offered, self.planner.forecast([last] * MIGRATOR_LOOKAHEAD, backlog), accuracy)
        gain_last = at_last.objective - at_last.objective[0]
        return candidate_observation(self.offered, gain_ewma, gain_burst, gain_last, self.scored.cost, self.scored.value,
                                     [moved_fraction(c, env.current) for c in offered], self.reward_scale,
                                     self.since_change, burst_ratio_feature(burst, rates), attainment)


class DaemonObserver:
    """What a candidate-choice policy sees when it chooses among the candidates the daemon
    planner's objective weighs: ``queue-slo-offered``'s (:class:`~rlsched.agents.baselines.planners.QueueSloOffered`)
    offered slots, each described by that objective (:data:`DAEMON_CANDIDATE_FEATURES`), the
    same interface as :class:`CandidateObserver`. The network's prior is that objective's gain
    over keeping, so before any update the policy chooses what ``queue-slo-offered`` chooses.

    Why: on the twelve held-out traces the daemon planner's objective on these slots earned
    1.009x ``migrator-queue-slo`` and the plain model's on the same candidates 0.817x
    (docs/history-candidate-policy.md, stop 79): a network whose prior is the plain model's
    starts 16-17% behind on bursty traffic. The cost is the daemon objective's decision time.

    The observer runs ``queue-slo-offered`` itself every interval (its measurements, its
    library, its decision) and tells it what the node then runs (:meth:`commit`).

    :param env: the node, already reset
    :param background_solves: the library solves new loads on a worker thread (the daemon)
    :param by_tenant_kind: describe each slot per tenant kind too (:data:`TENANT_KIND_FEATURES`;
        the ``daemon-tenants`` observer)
    :param high_priority_guard: offer the policy only the slots whose gain for the
        high-priority tenants (``gain_high``) is at least the planner's choice's
        (:func:`choice_masks`): a policy may trade the other tenants' Goodput among themselves,
        never the high-priority tenants' predicted value (SLO guard's charges included) for it
    """

    #: Where the policy chooses (:data:`CHOOSE_AT`; :func:`make_observer` sets it).
    choose_at = "every-decision"

    def __init__(self, env: GpuShareEnv, background_solves: bool = False, by_tenant_kind: bool = False,
                 high_priority_guard: bool = False) -> None:
        from rlsched.agents.baselines.planners import QueueSloOffered

        self.env = env
        self.by_tenant_kind = by_tenant_kind
        self.high_priority_guard = high_priority_guard
        #: Per weighed slot, the high-priority tenants' share of ``gain`` (``gain_high``), in the
        #: observation's units; None where the MILP decided or no slot has been weighed.
        self.gain_high: np.ndarray | None = None
        self.features = DAEMON_CANDIDATE_FEATURES + (TENANT_KIND_FEATURES if by_tenant_kind else ())
        self.policy = QueueSloOffered()
        self.policy.background_solves = background_solves
        self.policy.reset(env)
        #: Requests per interval at the mean rates (>= 1): the unit of rewards and Goodput features.
        self.reward_scale = node_reward_scale(env)
        self.bursts = BurstForecast()
        self.since_change = 0
        self.last_configuration: Configuration | None = env.current
        self.candidates: list[Configuration] = []
        self.choice = 0

    @property
    def library(self) -> CandidateLibrary:
        """The daemon planner's library (its solves are counted apart from the decision)."""
        return self.policy.library

    def first_configuration(self) -> Configuration:
        """The node's first configuration: the queue planner's MILP (``queue-slo-offered``'s first decision)."""
        return self.policy.act(np.zeros(0), self.env)

    def action_masks(self) -> np.ndarray:
        """True for the slots the policy may choose (:func:`choice_masks`)."""
        return choice_masks(self, len(self.candidates))

    def configuration(self, slot: int) -> Configuration:
        """The configuration in ``slot``; a masked or unknown slot is slot 0's (keeping the
        running one, except at a MILP's decision, whose answer is the only slot)."""
        return self.candidates[slot if 0 <= slot < len(self.candidates) else 0]

    def planner_choice(self) -> int:
        """The slot ``queue-slo-offered`` chose."""
        return self.choice

    def commit(self, configuration: Configuration) -> None:
        """What the node runs for the interval just observed: the daemon planner measures its
        value model's error on the intervals that keep, and holds what was applied."""
        self.policy.applied(configuration)

    def branch(self, first: Configuration, choose: SlotChooser | None = None) -> Callable[[], Configuration]:
        """A chooser that goes on from the node's current state after ``first`` is applied (a
        training branch): as ``queue-slo-offered``, or, given ``choose``, as that policy
        choosing where this observer's policy would (:func:`choice_masks`; elsewhere the only
        open slot). Either runs on a copy of this observer as it stands (:meth:`fork`)."""
        fork = self.fork(first)
        if choose is None:
            return lambda: fork.policy.act(np.zeros(0), fork.env)

        def policy_choice() -> Configuration:
            observation = fork.observe()
            masks = fork.action_masks()
            slot = int(np.argmax(masks)) if masks.sum() <= 1 else int(choose(observation, masks))
            configuration = fork.configuration(slot)
            fork.commit(configuration)
            return configuration
        return policy_choice

    def fork(self, first: Configuration) -> DaemonObserver:
        """A copy of this observer that goes on after ``first`` is applied: its policy copied as
        it stands, sharing its planners' caches (each entry a function of its key), its library
        asking for no solves; the node itself shared (a branch restores it afterwards)."""
        policy = self.policy
        shared = {id(self.env): self.env, id(policy.planner): policy.planner.snapshot(),
                  id(policy.ranking_planner): policy.ranking_planner.snapshot()}
        fork = copy.deepcopy(self, shared)
        fork.policy.library.frozen = True
        fork.commit(first)
        return fork

    def observe(self) -> np.ndarray:
        """Run ``queue-slo-offered``'s decision at the node's current state; the observation of
        the slots it weighed (:data:`DAEMON_CANDIDATE_FEATURES`, with ``by_tenant_kind``
        :data:`TENANT_KIND_FEATURES`, then :data:`GLOBAL_FEATURES`)."""
        env = self.env
        current = env.current
        assert current is not None, "nothing deployed yet: apply first_configuration() first"
        self.since_change = 0 if current != self.last_configuration else self.since_change + 1
        self.last_configuration = current
        rates, _, _, last, attainment = read_node(env)
        burst = self.bursts.record(last)
        answer = self.policy.act(np.zeros(0), env)
        weighed = self.policy.weighed
        columns = np.zeros((len(self.features), 1))
        self.gain_high = None
        if weighed is None:  # the MILP decided (a node already running when rlsched took it): its answer alone
            self.candidates = [answer]
            columns[0, 0] = answer == current
        else:
            self.candidates, objective, assessed, by_tenant = weighed
            gain = objective - objective[0]
            cost, hurdle = (np.array([0.0] + [a[k] for a in assessed[1:]]) for k in (1, 2))  # keeping moves nothing
            ewma, burst_gain = self.policy.offered_plain_gains
            moved = [moved_fraction(c, current) for c in self.candidates]
            columns = np.vstack([np.arange(len(gain)) == 0, gain, ewma, burst_gain, cost, hurdle, slot_rank(gain), moved])
            columns[1:6] /= self.reward_scale * self.policy.lookahead
            if self.by_tenant_kind or self.high_priority_guard:
                kinds = tenant_kind_columns(env.scenario.tenants, self.candidates, by_tenant, current)
                kinds[: len(TENANT_KINDS)] /= self.reward_scale * self.policy.lookahead
                self.gain_high = kinds[TENANT_KINDS.index("high")]
                if self.by_tenant_kind:
                    columns = np.vstack([columns, kinds])
        self.choice = self.candidates.index(answer)
        return pack_observation(columns.T, self.since_change, burst_ratio_feature(burst, rates), attainment)


def make_observer(kind: str, env: GpuShareEnv, library: CandidateLibrary | None = None,
                  background_solves: bool = False, choose_at: str = "every-decision",
                  high_priority_guard: bool = False) -> CandidateObserver | DaemonObserver:
    """The observer named ``kind`` (:data:`OBSERVERS`) for ``env``; ``library``: a plain
    observer's library to go on with (the daemon observer's belongs to its planner);
    ``choose_at``: where its policy chooses (:data:`CHOOSE_AT`); ``high_priority_guard``: a
    daemon observer's guard (:class:`DaemonObserver`; the plain observer has none)."""
    if kind in DAEMON_OBSERVERS:
        observer: CandidateObserver | DaemonObserver = DaemonObserver(env, background_solves, by_tenant_kind=kind == "daemon-tenants",
                                                                      high_priority_guard=high_priority_guard)
    else:
        if high_priority_guard:
            raise ValueError(f"the high-priority guard needs a daemon observer ({', '.join(DAEMON_OBSERVERS)}), not {kind!r}")
        observer = CandidateObserver(env, library, background_solves)
    observer.choose_at = choose_at
    return observer


class CandidateChoiceEnv(gym.Env[np.ndarray, np.int64]):
    """``rlsched/GpuShare-v0`` with a choice among whole configurations as its action.

    The reward is the interval's Goodput objective divided by the node's requests per
    interval at its mean rates (:attr:`reward_scale`), so returns are comparable across nodes.

    :param env: the environment to decide for (any scenario, node shape and GPU type)
    :param keep_library: keep the candidate library (and the planner's caches) from one
        episode to the next, as training does; False starts each episode from the seed library,
        so that an episode does not depend on the ones before it (evaluation)
    :param paired_horizon: > 0: every step whose action departs from the observer planner's
        choice also measures what the departure is worth (:meth:`paired_advantage`, in the
        step's ``info``), over this many intervals; 0: no measurement
    :param observer: what the policy observes through (:data:`OBSERVERS`): the library
        planner's model, or the daemon planner's objective (its library is not kept across
        episodes: it belongs to the planner, made anew at each reset)
    :param choose_at: where the policy chooses (:data:`CHOOSE_AT`)
    :param choices_only: a step runs on to the next decision where the mask leaves more than
        one slot; the intervals between apply their only slot inside the step, whose reward
        sums theirs (so that, choosing at the planner's moves, every PPO sample is a choice:
        about 4% of intervals)
    :param action_advantages: every step also measures every offered slot's paired advantage
        over the observer planner's choice (:meth:`slot_advantages`, in
        ``info[ACTION_ADVANTAGES_KEY]``); needs ``paired_horizon`` > 0
    :param high_priority_guard: the daemon observer's high-priority guard (:class:`DaemonObserver`)
    """

    metadata = {"render_modes": []}

    def __init__(self, env: GpuShareEnv, keep_library: bool = False, paired_horizon: int = 0, observer: str = "plain",
                 choose_at: str = "every-decision", choices_only: bool = False, action_advantages: bool = False,
                 high_priority_guard: bool = False) -> None:
        if observer not in OBSERVERS:
            raise ValueError(f"observer {observer!r}: expected one of {OBSERVERS}")
        if choose_at not in CHOOSE_AT:
            raise ValueError(f"choose_at {choose_at!r}: expected one of {CHOOSE_AT}")
        if action_advantages and paired_horizon <= 0:
            raise ValueError(f"action_advantages needs paired_horizon > 0, not {paired_horizon}")
        self.env = env
        self.choose_at = choose_at
        self.choices_only = choices_only
        #: What training branches follow after their first configuration: None the observer's
        #: planner, else this choice (:meth:`set_branch_policy`).
        self.branch_choose: SlotChooser | None = None
        self.action_advantages = action_advantages
        self.keep_library = keep_library
        self.paired_horizon = paired_horizon
        self.observer_kind = observer
        self.high_priority_guard = high_priority_guard
        self.observer: CandidateObserver | DaemonObserver | None = None
        #: (terminated, truncated) where the episode ended before its first choice (``choices_only``)
        self.ended_before_a_choice = (False, False)
        size = CANDIDATES * len(OBSERVER_FEATURES[observer]) + len(GLOBAL_FEATURES)
        self.observation_space = gym.spaces.Box(-FEATURE_LIMIT, FEATURE_LIMIT, shape=(size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(CANDIDATES)

    @property
    def library(self) -> CandidateLibrary | None:
        """The candidate library of the running episode (None before the first reset)."""
        return self.observer.library if self.observer else None

    @property
    def offered(self) -> list[int]:
        """Library indices of the offered slots."""
        return self.observer.offered if self.observer else []

    @property
    def reward_scale(self) -> float:
        """Requests per interval at the node's mean rates: the unit of rewards."""
        assert self.observer is not None
        return self.observer.reward_scale

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.env.reset(seed=seed, options=options)
        self.observer = make_observer(self.observer_kind, self.env, self.library if self.keep_library else None, choose_at=self.choose_at,
                                      high_priority_guard=self.high_priority_guard)
        if self.env.current is None:  # nothing deployed yet: the planner's first configuration
            self.env.step_configuration(self.observer.first_configuration())
        observation = self.observer.observe()
        self.ended_before_a_choice = (False, False)
        if self.choices_only:  # the intervals before the first choice are the planner's (their reward is no step's)
            observation, _, *self.ended_before_a_choice = self._run_to_a_choice(observation)
        return observation, {}

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        assert self.observer is not None
        if any(self.ended_before_a_choice):  # no choice in the whole episode: one empty step ends it
            info = {"paired_advantage": 0.0, "planner_keeps": True} | ({ACTION_ADVANTAGES_KEY: np.zeros(CANDIDATES)} if self.action_advantages else {})
            return np.zeros(self.observation_space.shape, np.float32), 0.0, *self.ended_before_a_choice, info
        chosen = self.observer.configuration(int(action))
        planned = self.observer.configuration(self.observer.planner_choice())
        advantages = self.slot_advantages() if self.action_advantages else None
        if advantages is not None:  # the chosen slot's is among them (0 where it holds the planner's configuration)
            advantage = float(advantages[int(action)])
        else:
            advantage = self.paired_advantage(chosen, planned) if self.paired_horizon and chosen != planned else 0.0
        keeps = planner_keeps(self.observer)
        self.observer.commit(chosen)
        # a masked slot keeps the running configuration (MaskablePPO never picks one; a plain policy may)
        _, reward, terminated, truncated, info = self.env.step_configuration(chosen)
        observation = self.observer.observe()
        reward = float(reward) / self.reward_scale
        if self.choices_only and not (terminated or truncated):
            observation, skipped, terminated, truncated = self._run_to_a_choice(observation)
            reward += skipped
        info["paired_advantage"], info["planner_keeps"] = advantage, keeps
        if advantages is not None:
            info[ACTION_ADVANTAGES_KEY] = advantages
        return observation, reward, terminated, truncated, info

    def _run_to_a_choice(self, observation: np.ndarray) -> tuple[np.ndarray, float, bool, bool]:
        """Apply the only unmasked slot until a decision leaves more than one (or the episode
        ends): the observation there, the scaled reward summed on the way, and the episode's flags."""
        assert self.observer is not None
        total, terminated, truncated = 0.0, False, False
        while self.action_masks().sum() <= 1 and not (terminated or truncated):
            only = self.observer.configuration(int(np.argmax(self.action_masks())))
            self.observer.commit(only)
            _, reward, terminated, truncated, _ = self.env.step_configuration(only)
            total += float(reward) / self.reward_scale
            observation = self.observer.observe()
        return observation, total, terminated, truncated

    def set_branch_policy(self, policy: Any) -> None:
        """Training branches follow ``policy`` (an SB3 policy with ``predict``; its deterministic
        choice, where the observer's policy chooses) after their first configuration, instead of
        the observer's planner (:data:`BRANCH_FOLLOW`); None: the planner again. A slot's
        advantage is then the policy's own: what applying it earns over the planner's move, both
        followed by the policy as it stands. Daemon observer only (its state can be copied)."""
        if policy is None:
            self.branch_choose = None
            return
        if self.observer_kind not in DAEMON_OBSERVERS:
            raise ValueError(f"branches that follow the policy need the daemon observer, not {self.observer_kind!r}")

        def choose(observation: np.ndarray, masks: np.ndarray) -> int:
            action, _ = policy.predict(observation, deterministic=True, action_masks=masks)
            return int(action)
        self.branch_choose = choose

    def slot_advantages(self, horizon: int | None = None) -> np.ndarray:
        """Every unmasked slot's paired advantage over the observer planner's choice
        (:meth:`paired_advantage`; the planner's own slot and masked ones: 0), over ``horizon``
        intervals (None: :attr:`paired_horizon`), in the node's requests per interval: every
        action's advantage at once, all branches on the same arrivals. Slots holding the same
        configuration share one branch."""
        assert self.observer is not None
        planned = self.observer.configuration(self.observer.planner_choice())
        slots = [int(k) for k in np.flatnonzero(self.action_masks())]
        configurations = [self.observer.configuration(k) for k in slots]
        unique = [c for i, c in enumerate(configurations) if c != planned and c not in configurations[:i]]
        earned = self._branch_returns([*unique, planned], horizon)
        advantages = np.zeros(CANDIDATES)
        for slot, configuration in zip(slots, configurations, strict=True):
            if configuration != planned:
                advantages[slot] = earned[unique.index(configuration)] - earned[-1]
        return advantages

    def paired_advantage(self, chosen: Configuration, rule: Configuration, horizon: int | None = None) -> float:
        """What applying ``chosen`` instead of ``rule`` (the observer planner's choice) earns, in
        the node's requests per interval: from the current state, one branch applies each, then
        both follow the observer's planner (:meth:`CandidateObserver.branch`,
        :meth:`DaemonObserver.branch`: its library as it is now), or the branch policy where
        one is set (:meth:`set_branch_policy`), for the rest of ``horizon``
        intervals (None: :attr:`paired_horizon`), on the same arrivals and service draws (the
        simulator's state, Generators included, is copied). The episode goes on from the state
        it was in. This is the paired baseline for input-driven environments: the traffic's
        noise cancels between the branches."""
        earned = self._branch_returns([chosen, rule], horizon)
        return float(earned[0] - earned[1])

    def _branch_returns(self, firsts: list[Configuration], horizon: int | None) -> np.ndarray:
        """Scaled reward over ``horizon`` intervals (None: :attr:`paired_horizon`) of each branch
        that applies ``firsts[b]`` from the current state and then follows the observer's
        planner (or the branch policy), all on the same arrivals and service draws; the
        episode's state is restored."""
        assert self.observer is not None
        state = self.env.snapshot()
        earned = []
        for first in firsts:
            self.env.restore(state)
            follow = self.observer.branch(first) if self.branch_choose is None else self.observer.branch(first, self.branch_choose)
            _, total, terminated, truncated, _ = self.env.step_configuration(first)
            for _ in range((self.paired_horizon if horizon is None else horizon) - 1):
                if terminated or truncated:
                    break
                _, reward, terminated, truncated, _ = self.env.step_configuration(follow())
                total += reward
            earned.append(float(total))
        self.env.restore(state)
        return np.array(earned) / self.reward_scale

    def action_masks(self) -> np.ndarray:
        """True for the slots the policy may choose (:func:`choice_masks`)."""
        assert self.observer is not None
        return self.observer.action_masks()

    def planner_choice(self) -> int:
        """The slot the library planner would choose (the largest objective at the EWMA forecast)."""
        assert self.observer is not None
        return self.observer.planner_choice()
