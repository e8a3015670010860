"""Who decides in the daemon: the policy, guarded, with the planner as the fallback.

The policy (the shipped PPO policy, or any baseline) is trusted only inside what it was
trained on: when an observation feature leaves the observation Box (before clipping), when
the policy raises, or when its output is not a valid decision (NaN, wrong shape, a level out
of range, unknown or missing tenants), the fallback planner
(:data:`~rlsched.daemon.config.FALLBACK_POLICY`) decides that cycle instead, and the reason is
reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rlsched.agents.baselines import Decision, Policy, make_policy
from rlsched.daemon.config import REAL_BACKENDS
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError, RlschedError
from rlsched.solver import TenantRequest

#: Why a cycle was decided by the fallback planner.
FALLBACK_REASONS = ("out-of-range", "policy-error", "invalid-output", "apply-failed")


@dataclass(frozen=True)
class Verdict:
    """A cycle's decision and who took it.

    :param decision: what to apply
    :param policy: name of the policy that decided
    :param reason: one of :data:`FALLBACK_REASONS` when the fallback decided, else None
    :param detail: what exactly was wrong (one line), else ""
    """

    decision: Decision
    policy: str
    reason: str | None = None
    detail: str = ""


#: Baselines that replay the whole episode before acting: they exist only in evaluation.
HINDSIGHT_ONLY = ("static-best", "hindsight")


#: What ``auto`` runs on the simulator backend: the decision method that measured best on
#: traffic and node shapes it was not tuned on (docs/planner-bursts.md, stop 48). On the
#: held-out suite (seeds 0-1) it earns 1.31x ``static-best`` against 1.21x for
#: ``migrator-hedge``; on ten DeepSeek-R1 / ServeGen traces on the default node's
#: high-priority tenant, at least 0.96x ``static-best`` on each, where the shipped PPO policy
#: ended below zero on 4 of 10. Its gains come from priority fill as the simulator models it:
#: FIKIT's kernel scheduler.
AUTO_POLICY = "migrator-pf-held"
#: What ``auto`` runs on a real node (``nvml``, ``mig-parted``) that keeps a request log
#: (``observations.request_log``): a method that plans MPS only. rlsched starts no
#: priority-fill scheduler there, so the tenants of a priority-fill instance time-slice, and a
#: real H100 gave the high-priority one 1.55-2.39x its solo latency, not FIKIT's 1.05x
#: (docs/hardware-probes/README.md, 2026-11-27). Simulated that way (``rlsched eval
#: --no-priority-fill-scheduler``; docs/planner-bursts.md, stop 51), ``migrator-queue`` earned
#: 1.048x ``migrator-ilp`` on the held-out suite (seeds 0-1; 1.052x
#: :data:`AUTO_POLICY_RATES_ONLY`), 1.011x :data:`AUTO_POLICY_RATES_ONLY` on the training suite
#: (seeds 0-1) and 0.995x on ``default`` (seeds 0-2), and more than ``migrator-ilp`` on 9 of 10
#: bursty traces. Its queueing tail is right near capacity, where ``migrator-ilp``'s linear
#: overload loss starved a tenant for most of heldout-deploy. It reads each tenant's arrival
#: variability from the request log.
AUTO_POLICY_REAL_NODE = "migrator-queue"
#: What ``auto`` runs on a real node that measures rates only (no request log). There
#: ``migrator-queue`` takes every tenant's arrivals for Poisson, and measured 0.98x
#: ``migrator-ilp`` on the training suite (train-bursty-high 0.93x) and 0.95x this hedge on
#: ``default``; this hedge plans MPS only and follows ``migrator-ilp`` or the best MPS-only
#: fixed layout on its shadows, which replay the measured rates (docs/planner-bursts.md, stops
#: 49 and 51).
AUTO_POLICY_RATES_ONLY = "migrator-hedge-mps"


def auto_policy(backend: str, request_log: bool = False) -> str:
    """What ``auto`` runs on ``backend``: :data:`AUTO_POLICY` on the simulator; on a real node
    :data:`AUTO_POLICY_REAL_NODE` where it keeps a request log, else :data:`AUTO_POLICY_RATES_ONLY`."""
    if backend not in REAL_BACKENDS:
        return AUTO_POLICY
    return AUTO_POLICY_REAL_NODE if request_log else AUTO_POLICY_RATES_ONLY


def build_policy(name: str, path: str | None = None, backend: str = "sim", request_log: bool = False) -> Policy:
    """``auto`` (:func:`auto_policy` of ``backend`` and whether the node keeps a
    ``request_log``), ``ppo`` (the shipped policy, or the
    exported policy / training run at ``path``; ``ppo@P`` with the planner-takeover
    probability P), or a baseline by name."""
    if name == "auto":
        name = auto_policy(backend, request_log)
    if name == "ppo" or name.startswith("ppo@"):
        from rlsched.agents.onnx_policy import PpoPolicy

        takeover = name[len("ppo"):]  # "" or "@P"
        return PpoPolicy(f"ppo:{path}{takeover}" if path else name)
    if name in HINDSIGHT_ONLY:
        raise ConfigError("daemon config", "policy", name, "knows the episode in hindsight (an evaluation reference, not a deployable policy); "
                          "static-profiled holds a configuration chosen on past traffic")
    policy = make_policy(name)
    if hasattr(policy, "background_solves"):  # a candidate library: the daemon solves new loads beside its loop
        policy.background_solves = True
    return policy


def decision_problem(decision: object, env: GpuShareEnv) -> str | None:
    """What makes a policy output unusable (one line), or None when the env can execute it."""
    try:
        if isinstance(decision, Configuration):
            unknown = sorted(set(decision.placements) - set(env.tenant_names))
            problems = ([f"unknown tenant {unknown[0]}"] if unknown else []) + decision.problems(env.tenant_names)
            return "; ".join(problems) or None
        if isinstance(decision, Mapping):
            missing = [n for n in env.tenant_names if n not in decision]
            if missing:
                return f"no request for tenant {missing[0]}"
            for name, request in decision.items():
                if not isinstance(request, TenantRequest):
                    return f"tenant {name}: expected a TenantRequest, got {type(request).__name__}"
                numbers = (request.compute_slices, request.memory_gib, request.mps_pct, request.batch_size)
                if not all(isinstance(x, int | float) and math.isfinite(x) for x in numbers) or request.compute_slices <= 0:
                    return f"tenant {name}: non-finite or non-positive request {request}"
            return None
        env.codec.check(decision)
    except (RlschedError, TypeError, ValueError) as exc:
        return str(exc)
    return None


class GuardedPolicy:
    """The policy, with ``fallback`` deciding whenever the policy cannot be trusted.

    :param policy: the primary decision rule
    :param fallback: the planner (:data:`~rlsched.daemon.config.FALLBACK_POLICY`); it observes
        every cycle the policy decides, so its forecasts and burst history are current when it takes over
    :param tolerance: how far a normalized feature may leave [low, high] of the observation Box
    """

    def __init__(self, policy: Policy, fallback: Policy, tolerance: float = 0.0) -> None:
        self.policy, self.fallback, self.tolerance = policy, fallback, tolerance

    def reset(self, env: GpuShareEnv) -> None:
        self.policy.reset(env)
        self.fallback.reset(env)

    def out_of_range(self, env: GpuShareEnv) -> str | None:
        """The first feature outside the training range, as ``name=value``, or None.

        Saturating features (e.g. p99 / SLO, whose top reads "four times over or worse") are
        inside the trained domain at any value; non-finite values never are.
        """
        raw = env.raw_observation
        if raw is None:
            return None
        space = env.observation_space
        outside = (raw < space.low - self.tolerance) | (raw > space.high + self.tolerance)
        bad = np.flatnonzero(~np.isfinite(raw) | (outside & env.encoder.range_checked()))
        if not len(bad):
            return None
        i = int(bad[0])
        return f"{env.encoder.names()[i]}={float(raw[i]):.3g} outside [{float(space.low[i]):g}, {float(space.high[i]):g}] ({len(bad)} features)"

    def decide(self, observation: np.ndarray, env: GpuShareEnv) -> Verdict:
        """The decision for the next interval."""
        outside = self.out_of_range(env)
        if outside is not None:
            return self._fallback(observation, env, "out-of-range", outside)
        try:
            decision = self.policy.act(observation, env)
        except Exception as exc:  # the policy is a model or third-party code: anything may escape
            return self._fallback(observation, env, "policy-error", f"{type(exc).__name__}: {exc}")
        problem = decision_problem(decision, env)
        if problem is not None:
            return self._fallback(observation, env, "invalid-output", problem)
        self.fallback.observe(env)
        # A PPO policy may hand an unsure step to its planner: name who decided.
        return Verdict(decision, getattr(self.policy, "decider", self.policy.name))

    def decide_fallback(self, observation: np.ndarray, env: GpuShareEnv, reason: str, detail: str) -> Verdict:
        """The fallback's decision, for a reason found outside :meth:`decide` (e.g. the env refused it)."""
        return self._fallback(observation, env, reason, detail)

    def _fallback(self, observation: np.ndarray, env: GpuShareEnv, reason: str, detail: str) -> Verdict:
        return Verdict(self.fallback.act(observation, env), self.fallback.name, reason, detail)
