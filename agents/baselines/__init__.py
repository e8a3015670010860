"""Baseline policies, each following a published system (see each class's docstring).

``make_policy("igniter")`` builds one by name; :data:`POLICIES` lists them all. ``ppo``
(the shipped trained policy) and ``ppo:PATH`` (an .onnx file or a training run folder), each
optionally with ``@P`` (the planner-takeover probability), build a
:class:`~rlsched.agents.onnx_policy.PpoPolicy`.
"""

from __future__ import annotations

from rlsched.agents.baselines.base import Decision, Policy, apply
from rlsched.agents.baselines.ekya import Ekya
from rlsched.agents.baselines.fikit import Fikit
from rlsched.agents.baselines.hedge import MigratorHedge, MigratorHedgeGroupings, MigratorHedgeLoad, MigratorHedgeMps, MigratorHedgeQueue
from rlsched.agents.baselines.hindsight import Hindsight, StaticBest, StaticBestRankings, StaticBestSlo, StaticProfiled
from rlsched.agents.baselines.igniter import Igniter
from rlsched.agents.baselines.miso import Miso
from rlsched.agents.baselines.planners import MigratorBurst, MigratorIlp, MigratorPriorityFill, MigratorPriorityFillHeld, MigratorQueue, MigratorQueueSlo, MigratorQueueSloLong, ParisElsa, PlannerLibrary, PlannerLibraryHurdle, QueueSloLibrary, QueueSloOffered
from rlsched.agents.baselines.static import StaticEqual
from rlsched.errors import ConfigError

#: Name -> policy class, in the order tables list them.
POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (StaticEqual, StaticProfiled, StaticBest, StaticBestRankings, StaticBestSlo, MigratorIlp, MigratorPriorityFill, MigratorPriorityFillHeld, MigratorQueue, MigratorQueueSlo, MigratorQueueSloLong, MigratorBurst, MigratorHedge, MigratorHedgeMps, MigratorHedgeQueue, MigratorHedgeGroupings, MigratorHedgeLoad, PlannerLibrary, PlannerLibraryHurdle, QueueSloLibrary, QueueSloOffered, Igniter, Miso, ParisElsa, Ekya, Fikit, Hindsight)}


def make_policy(name: str) -> Policy:
    """A fresh policy by its name (see :data:`POLICIES`; ``ppo`` or ``ppo:PATH``)."""
    if name == "ppo" or name.startswith(("ppo:", "ppo@")):
        from rlsched.agents.onnx_policy import PpoPolicy  # onnxruntime only when asked for

        return PpoPolicy(name)
    if name == "hedge-ppo" or name.startswith("hedge-ppo:"):
        from rlsched.agents.expert_policy import HedgePpo

        return HedgePpo(name)
    if name.startswith("candidate-ppo:") or name == "candidate-ppo":
        from rlsched.agents.candidate_ppo import CandidatePpo

        return CandidatePpo(name)
    if name not in POLICIES:
        raise ConfigError("--policies", "policy", name, f"unknown policy (allowed: {', '.join(POLICIES)}, ppo, ppo:PATH, ppo@P, hedge-ppo:PATH, candidate-ppo, candidate-ppo:PATH, or all)")
    return POLICIES[name]()


__all__ = ["POLICIES", "Decision", "Policy", "apply", "make_policy"]
