"""``hedge-ppo``: ``migrator-hedge`` whose choice of whom to follow is a trained network's.

The shadows, the profile and the measured switch costs are the hedge's
(:class:`~rlsched.agents.baselines.hedge.MigratorHedge`); every interval the network of an
expert-choice policy file (``rlsched train --config configs/train/hedge_ppo.yaml``) scores
keeping the leader against the strongest challengers, from the same observation it was
trained on (:func:`~rlsched.agents.ppo.expert_env.expert_observation`), and the node follows
the best-scored one. The switch cost the network sees is the trained estimate
(:func:`~rlsched.agents.experts.switch_cost_estimate`, the file's factor); no switch is
simulated on the decision path.

Spec: ``hedge-ppo:PATH`` (an .onnx file, or a run folder's ``policy.onnx``). No policy is
shipped: the trained ones lost to their own warm start on the held-out suite
(docs/history-hedge-ppo.md).
"""

from __future__ import annotations

import json

import numpy as np

from rlsched.agents.baselines.hedge import MigratorHedge
from rlsched.agents.experts import node_reward_scale, restart_seconds, switch_cost_estimate
from rlsched.agents.onnx_policy import open_choice_policy
from rlsched.agents.ppo.expert_env import EXPERT_FEATURES, EXPERT_GLOBALS, SLOTS, expert_observation, offered_experts
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.solver.planner import Planner

#: Metadata key of an expert-choice policy file (written by :mod:`rlsched.agents.ppo.expert_train`) besides its kind.
FACTOR_KEY = "switch_cost_factor"
EXPERT_CHOICE_KIND = "hedge-ppo"


class HedgePpo(MigratorHedge):
    """The hedge with a trained network choosing whom the node follows (see the module docstring).

    ``report`` adds ``rule_disagreements``: the decisions where the network chose other than
    the hand-built rule (without its simulated check) would have.
    """

    name = "hedge-ppo"

    def __init__(self, spec: str) -> None:
        super().__init__(simulate_switch_cost=False)
        self.path, self.session, meta = open_choice_policy(spec, EXPERT_CHOICE_KIND, SLOTS * len(EXPERT_FEATURES) + len(EXPERT_GLOBALS),
                                                           "no hedge-ppo policy is shipped: rlsched train --config configs/train/hedge_ppo.yaml "
                                                           "--out runs/NAME makes one")
        try:
            self.factor = float(json.loads(meta[FACTOR_KEY]))
        except (KeyError, ValueError, TypeError):
            raise ConfigError(self.path, FACTOR_KEY, meta.get(FACTOR_KEY), "missing or not a number") from None

    def reset(self, env: GpuShareEnv) -> None:
        self.cost_planner = Planner(env.scenario, env.backend.perf_model, env.backend.memory_gib)
        self.scale = node_reward_scale(env.scenario)
        self.tenants = [t.name for t in env.scenario.inference_tenants()]
        self.last_rates = np.array([t.arrivals.mean_rate_rps() for t in env.scenario.inference_tenants()])
        self.since_switch = 0
        self.rule_disagreements = 0
        super().reset(env)
        self.report["rule_disagreements"] = self.rule_disagreements

    def replay_last_interval(self, env: GpuShareEnv) -> None:
        super().replay_last_interval(env)
        measured = env.backend.observe()
        self.last_rates = np.array([float(measured.get(n, {}).get("arrival_rate_rps", 0.0)) for n in self.tenants])

    def _configuration(self, expert: int) -> Configuration | None:
        shadow = self.shadows[expert]
        return shadow.env.current if expert == 0 else shadow.policy.configuration  # type: ignore[attr-defined]

    def _switch_cost(self, target: int) -> float:
        source, goal = self._configuration(self.leader), self._configuration(target)
        if source is None or goal is None:
            return 0.0
        return switch_cost_estimate(float(restart_seconds(self.cost_planner, source, goal) @ self.last_rates), self.factor)

    def _follow_leader(self) -> None:
        evidence = self.evidence()
        rule = self.challenger(evidence)
        offered = offered_experts(evidence, self.switch_z)
        measured = float(np.mean(self.switch_costs)) if self.switch_costs else 0.0
        observation = expert_observation(evidence, offered, rule, self._switch_cost, self.scale, self.since_switch, measured)
        mask = (np.arange(SLOTS) < len(offered))[None, :]
        action = int(self.session.run(["action"], {"observation": observation[None, :], "action_mask": mask})[0][0])
        target = offered[action] if action < len(offered) else self.leader
        self.rule_disagreements += target != (self.leader if rule is None else rule)
        self.report["rule_disagreements"] = self.rule_disagreements
        if target == self.leader:
            self.since_switch += 1
            return
        self.since_switch = 0
        self.switch_to(target)
