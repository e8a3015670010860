"""``candidate-ppo``: a trained network chooses the node's configuration among candidates.

Every interval the node's :class:`~rlsched.agents.ppo.candidate_env.CandidateObserver` values
the running configuration and the candidate library (the planner's own solutions, at most
:data:`~rlsched.agents.candidates.MAX_LIBRARY_ENTRIES`) under two forecasts and offers up to
:data:`~rlsched.agents.ppo.candidate_env.CANDIDATES` of them; the network of a
candidate-choice policy file (``rlsched train --config configs/train/candidate_ppo.yaml``)
scores the offered slots with shared weights and the node applies the best-scored one. The
observation holds only ratios and fractions, so one file runs on any node: any number of GPUs
and tenants, any MIG-capable GPU type.

A file whose ``observer`` metadata is ``daemon`` observes through
:class:`~rlsched.agents.ppo.candidate_env.DaemonObserver` instead: it chooses among the slots
``queue-slo-offered`` weighs, described by the daemon planner's objective (a first decision on
a node already running is that planner's MILP). A file whose ``choose_at`` metadata is
``planner-moves`` chooses only where the observer's planner moves; where it keeps, so does
the file. A daemon-observer file whose ``high_priority_guard`` metadata is ``true`` chooses
only among the slots the daemon objective rates as good for the high-priority tenants as the
planner's choice. A file whose ``min_departure_probability`` metadata is p > 0 departs
from the planner's slot only where its network gives its own slot a probability of at least
p; elsewhere the planner takes over (``report["planner_takeovers"]``).

No simulation and no MILP solve runs on the decision path: a load the library has no solution
for asks the planner for one, which joins the library at a later decision. In ``rlsched
eval`` the solve runs at once, so that episodes replay (the report counts it apart:
``library_solves``, ``library_solve_ms``); in the daemon (:attr:`CandidatePpo.background_solves`)
on a worker thread, and the decision never waits for it.

Spec: ``candidate-ppo`` (the shipped file, :data:`SHIPPED_CANDIDATE_POLICY`) or
``candidate-ppo:PATH`` (an .onnx file, or a training run folder's ``policy.onnx``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from rlsched.agents.baselines.base import Policy
from rlsched.agents.candidates import CandidateLibrary
from rlsched.agents.onnx_policy import open_choice_policy
from rlsched.agents.ppo.candidate_env import CANDIDATE_FEATURES, CANDIDATES, CHOOSE_AT, DAEMON_OBSERVERS, GLOBAL_FEATURES, OBSERVER_FEATURES, OBSERVERS, make_observer
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError

#: A candidate-choice policy file's kind (its ``kind`` metadata; written by :mod:`rlsched.agents.ppo.candidate_train`).
CANDIDATE_CHOICE_KIND = "candidate-ppo"
#: Metadata key of the PPO steps the file's network was trained for (0: the warm start).
STEPS_KEY = "num_timesteps"
#: Metadata key of what the file's network observes through (:data:`~rlsched.agents.ppo.candidate_env.OBSERVERS`; none: ``plain``).
OBSERVER_KEY = "observer"
#: Metadata key of where the file's network chooses (:data:`~rlsched.agents.ppo.candidate_env.CHOOSE_AT`; none: every decision).
CHOOSE_AT_KEY = "choose_at"
#: Metadata key of whether a daemon-observer file chooses under the high-priority guard
#: (:class:`~rlsched.agents.ppo.candidate_env.DaemonObserver`; JSON ``true``/``false``, none: ``false``).
GUARD_KEY = "high_priority_guard"
#: Metadata key of the least probability the file's network must give its slot to depart from the
#: observer's planner (a number in [0, 1); none: 0, the network's best slot always applied).
#: Below it the planner's slot is applied: the planner takes over where the network is unsure.
MIN_DEPARTURE_KEY = "min_departure_probability"
#: The shipped candidate-choice policy (``candidate-ppo`` alone; its model card is the README beside it).
SHIPPED_CANDIDATE_POLICY = Path(__file__).parent / "policies" / "candidate" / "policy.onnx"


def observation_width(meta: dict[str, str]) -> int:
    """The observation width this rlsched builds for a file with metadata ``meta`` (its observer's
    features; an unknown observer is refused after, by name)."""
    features = OBSERVER_FEATURES.get(meta.get(OBSERVER_KEY, "plain"), CANDIDATE_FEATURES)
    return CANDIDATES * len(features) + len(GLOBAL_FEATURES)


class CandidatePpo(Policy):
    """A candidate-choice network deciding every interval (see the module docstring).

    ``report`` counts ``planner_disagreements`` (decisions where the network chose other than
    the library planner would have), the library's solves and their time, and the file's PPO steps.
    """

    name = CANDIDATE_CHOICE_KIND
    #: Solve new loads beside the decision loop (the daemon sets it; see the module docstring).
    background_solves = False

    def __init__(self, spec: str) -> None:
        self.path, self.session, meta = open_choice_policy(spec, CANDIDATE_CHOICE_KIND, observation_width,
                                                           "rlsched train --config configs/train/candidate_ppo.yaml --out runs/NAME makes one",
                                                           shipped=SHIPPED_CANDIDATE_POLICY)
        try:
            self.num_timesteps = int(json.loads(meta.get(STEPS_KEY, "")))
        except (ValueError, TypeError):
            raise ConfigError(self.path, STEPS_KEY, meta.get(STEPS_KEY), "missing or not an integer") from None
        self.observer_kind = meta.get(OBSERVER_KEY, "plain")
        if self.observer_kind not in OBSERVERS:
            raise ConfigError(self.path, OBSERVER_KEY, self.observer_kind, f"expected one of {', '.join(OBSERVERS)}")
        self.choose_at = meta.get(CHOOSE_AT_KEY, "every-decision")
        if self.choose_at not in CHOOSE_AT:
            raise ConfigError(self.path, CHOOSE_AT_KEY, self.choose_at, f"expected one of {', '.join(CHOOSE_AT)}")
        guard = meta.get(GUARD_KEY, "false")
        if guard not in ("true", "false") or (guard == "true" and self.observer_kind not in DAEMON_OBSERVERS):
            raise ConfigError(self.path, GUARD_KEY, guard, f"expected true or false (true only with observer {' or '.join(DAEMON_OBSERVERS)})")
        self.high_priority_guard = guard == "true"
        try:
            self.min_departure_probability = float(json.loads(meta.get(MIN_DEPARTURE_KEY, "0")))
        except (ValueError, TypeError):
            self.min_departure_probability = math.nan
        if not 0.0 <= self.min_departure_probability < 1.0:
            raise ConfigError(self.path, MIN_DEPARTURE_KEY, meta.get(MIN_DEPARTURE_KEY), "expected a number in [0, 1)")

    def reset(self, env: GpuShareEnv) -> None:
        self.observer = make_observer(self.observer_kind, env, background_solves=self.background_solves, choose_at=self.choose_at,
                                     high_priority_guard=self.high_priority_guard)
        self.report = {"planner_disagreements": 0, "planner_takeovers": 0, "library_solves": self.observer.library.solves,
                       "library_solve_ms": self.observer.library.solve_ms, "ppo_steps": self.num_timesteps}

    @property
    def library(self) -> CandidateLibrary:
        """The node's candidate library (its solves are counted apart from the decision)."""
        return self.observer.library

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> Configuration:
        try:
            return self._choose(env)
        finally:
            self.observer.library.start_solves()  # the decision is made (see CandidateLibrary.start_solves)

    def _choose(self, env: GpuShareEnv) -> Configuration:
        if env.current is None:
            return self.observer.first_configuration()
        observed = self.observer.observe()
        mask = self.observer.action_masks()[None, :]
        action, scores = self.session.run(["action", "scores"], {"observation": observed[None, :], "action_mask": mask})
        slot, planner = int(action[0]), self.observer.planner_choice()
        if slot != planner and self.min_departure_probability > 0.0:
            logits = np.where(mask[0], scores[0].astype(float), -np.inf)
            probability = 1.0 / np.exp(logits - logits[slot]).sum()  # the slot's softmax probability among the open slots
            if probability < self.min_departure_probability:
                slot = planner
                self.report["planner_takeovers"] += 1
        self.report["planner_disagreements"] += slot != planner
        self.report["library_solves"] = self.observer.library.solves
        self.report["library_solve_ms"] = self.observer.library.solve_ms
        chosen = self.observer.configuration(slot)
        self.observer.commit(chosen)
        return chosen

