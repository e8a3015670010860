"""Expert streams: what every rule of ``migrator-hedge`` earned, interval by interval, on one episode.

The hedge's shadows (:mod:`rlsched.agents.baselines.hedge`) replay the node's observed
arrivals, so what each shadow earns does not depend on which shadow the node follows. An
episode's shadow rewards can therefore be recorded once (:func:`record_streams`) and the
choice of *whom to follow, and when* replayed on them thousands of times a second
(:class:`~rlsched.agents.ppo.expert_env.ExpertChoiceEnv`). What the recording cannot give
is what a switch costs the node (a restart, and the backlog it leaves): that is
:func:`switch_cost_estimate`, the requests that arrive at the restarted tenants while they
restart, times one factor fitted to the simulator's own switch costs
(:func:`fit_switch_cost_factor`, on :attr:`ExpertStreams.calibration` samples).
"""

from __future__ import annotations

import dataclasses
import pickle
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rlsched.agents.baselines.base import apply
from rlsched.agents.baselines.hedge import MIN_EVIDENCE_INTERVALS, TRANSITION_INTERVALS, MigratorHedge
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.fileio import write_bytes_atomically
from rlsched.solver.planner import Planner
from rlsched.workloads.scenario import Scenario, load_scenario, with_trace_overrides

#: Calibration switches are drawn among this many experts that earned most lately.
CALIBRATION_EXPERTS = 6
#: Version of the stream file format (a file of another version is refused).
STREAM_FORMAT = 3


@dataclasses.dataclass
class ExpertStreams:
    """The recorded rewards of every expert on one episode, and what switching between them needs.

    :param source: what was recorded (scenario, trace overrides, seed), for error messages
    :param names: expert names; index 0 is the planner
    :param rewards: experts x (profile + episode) intervals, the objective each earned per interval
    :param profile_intervals: how many leading columns of ``rewards`` are the profile (the traffic
        before the episode), not the episode
    :param rates_rps: episode intervals x tenants, each interval's measured arrival rate
    :param downtime_s: experts x experts x tenants, the restart seconds a switch from one
        fixed expert's configuration to another's costs each tenant (the planner's row and
        column are unused: its configuration changes, see ``planner_downtime_s``)
    :param planner_downtime_s: episode intervals x 2 x experts x tenants: the restart seconds
        a switch from the planner's configuration of that interval to each expert's (index 0)
        and from each expert's to the planner's (index 1) costs each tenant
    :param reward_scale: the node's requests per interval at its mean rates (>= 1)
    :param calibration: (step, from, to, simulated switch cost) samples, request-equivalents
    :param node_rewards: what the node earned per interval following the recording's own rule
    :param loads: (profile + episode) intervals x tenants (all of them), the node's load as the
        hedge weighs evidence by it (:data:`~rlsched.agents.baselines.hedge.LOAD_BANDWIDTH`)
    :param day_intervals: the node's day as the hedge's seasonal forecast reads it
        (:attr:`~rlsched.agents.baselines.hedge.MigratorHedge.day`; None: no forecast)
    """

    source: str
    names: list[str]
    rewards: np.ndarray
    profile_intervals: int
    rates_rps: np.ndarray
    downtime_s: np.ndarray
    planner_downtime_s: np.ndarray
    reward_scale: float
    calibration: list[tuple[int, int, int, float]]
    node_rewards: np.ndarray
    loads: np.ndarray
    day_intervals: int | None = None
    format: int = STREAM_FORMAT

    @property
    def steps(self) -> int:
        """Episode intervals."""
        return self.rates_rps.shape[0]

    def restart_requests(self, step: int, source: int, target: int) -> float:
        """Requests arriving at the restarted tenants while they restart, for a switch from
        expert ``source`` to ``target`` at episode interval ``step``."""
        if source == 0:
            downtime = self.planner_downtime_s[step, 0, target]
        elif target == 0:
            downtime = self.planner_downtime_s[step, 1, source]
        else:
            downtime = self.downtime_s[source, target]
        return float(downtime @ self.rates_rps[step])

    def save(self, path: str | Path) -> None:
        write_bytes_atomically(Path(path), pickle.dumps(dataclasses.asdict(self)))

    @classmethod
    def load(cls, path: str | Path) -> ExpertStreams:
        try:
            fields = pickle.loads(Path(path).read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError) as error:
            raise ValueError(f"{path}: not an expert stream file ({error})") from error
        if not isinstance(fields, dict) or fields.get("format") != STREAM_FORMAT:
            raise ValueError(f"{path}: field 'format' is {fields.get('format') if isinstance(fields, dict) else None!r}, expected {STREAM_FORMAT} "
                             "(recorded by another rlsched version: delete it, and training records it again)")
        return cls(**fields)


def stream_name(spec: str, seed: int) -> str:
    """The file name (without suffix) of the episode of ``spec`` (a scenario with its trace
    overrides, see :func:`scenario_of`) from ``seed``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.replace("configs/traces/", "").replace(".csv", "")).strip("_") + f"-seed{seed}"


def scenario_of(spec: str, source: str = "scenario") -> Scenario:
    """The scenario ``NAME_OR_YAML[@TENANT=TRACE[:SCALE[:WARP]]...]`` names (as ``rlsched eval --trace``)."""
    name, *overrides = spec.split("@")
    return with_trace_overrides(load_scenario(name), overrides, source=source)


def switch_cost_estimate(restart_requests: float, factor: float) -> float:
    """Predicted cost of a switch, request-equivalents: ``factor`` times the requests that
    arrive at the restarted tenants during their restarts (the factor carries the backlog
    they leave and what make-before-break saves; :func:`fit_switch_cost_factor`)."""
    return factor * restart_requests


def fit_switch_cost_factor(streams: Sequence[ExpertStreams]) -> tuple[float, float]:
    """(factor, relative error): the least-squares factor of :func:`switch_cost_estimate` on
    every stream's calibration samples, and the estimate's mean absolute error over the mean
    simulated cost."""
    x, y = [], []
    for s in streams:
        for step, source, target, cost in s.calibration:
            x.append(s.restart_requests(step, source, target))
            y.append(cost)
    x_arr, y_arr = np.array(x), np.array(y)
    if not len(x_arr) or float(x_arr @ x_arr) <= 0.0:
        raise ValueError("no calibration samples with a restart to fit the switch cost factor on")
    factor = float(x_arr @ y_arr / (x_arr @ x_arr))
    error = float(np.mean(np.abs(factor * x_arr - y_arr)) / max(np.mean(np.abs(y_arr)), 1e-9))
    return factor, error


def node_reward_scale(scenario: Scenario) -> float:
    """The node's requests per interval at its inference tenants' mean rates (>= 1): the unit
    the expert-choice features and rewards are given in."""
    requests = sum(t.arrivals.mean_rate_rps() for t in scenario.inference_tenants()) * scenario.decision_interval_s
    return max(requests, 1.0)


def restart_seconds(planner: Planner, source: Configuration, target: Configuration) -> np.ndarray:
    """Per inference tenant (scenario order), the restart seconds a switch from ``source`` to
    ``target`` costs it (0 for the tenants it does not restart)."""
    restarted = set(planner.restarted(target, source))
    return np.array([float(t.restart_s) if t.name in restarted else 0.0 for t in planner.scenario.inference_tenants()])


def record_streams(env: GpuShareEnv, seed: int, source: str, calibration_samples: int = 24,
                   rng: np.random.Generator | None = None) -> ExpertStreams:
    """Run one episode of ``env`` from ``seed`` under ``migrator-hedge`` and record every
    shadow's rewards, the measured rates, the restart seconds between the experts'
    configurations and ``calibration_samples`` simulated switch costs (random pairs among
    the experts, at random intervals after the first :data:`~rlsched.agents.baselines.hedge.MIN_EVIDENCE_INTERVALS`)."""
    rng = rng or np.random.default_rng(seed)
    hedge = MigratorHedge()
    observation, _ = env.reset(seed=seed)
    hedge.reset(env)
    scenario = env.scenario
    tenants = [t.name for t in scenario.inference_tenants()]
    planner = Planner(scenario, env.backend.perf_model, env.backend.memory_gib)
    shadows = hedge.shadows
    experts = len(shadows)
    fixed = [getattr(s.policy, "configuration", None) for s in shadows]
    downtime = np.zeros((experts, experts, len(tenants)))
    for i in range(1, experts):
        for j in range(1, experts):
            if i != j:
                downtime[i, j] = restart_seconds(planner, fixed[i], fixed[j])
    history = [list(s.rewards) for s in shadows]
    loads = list(hedge.loads)
    profile = len(history[0])
    steps = int(round(scenario.duration_s / scenario.decision_interval_s))
    # Not the first intervals, whose rewards are the initial restarts'; not the last, which has no next.
    eligible = np.arange(min(MIN_EVIDENCE_INTERVALS, steps // 2), steps - 1)
    sample_steps = set(rng.choice(eligible, size=min(calibration_samples, len(eligible)), replace=False).tolist())
    rates, planner_downtime, calibration, node_rewards = [], [], [], []

    def shadows_ran(step: int) -> None:
        """The shadows have run episode interval ``step``: record it."""
        for k, s in enumerate(shadows):
            history[k].append(s.rewards[-1])
        loads.append(hedge.loads[-1])
        planned = shadows[0].env.current
        planner_downtime.append([[restart_seconds(planner, planned, fixed[j]) if j else np.zeros(len(tenants)) for j in range(experts)],
                                 [restart_seconds(planner, fixed[j], planned) if j else np.zeros(len(tenants)) for j in range(experts)]])
        if step in sample_steps:
            calibration.append(_calibrate(hedge, step, rng))

    truncated = False
    while not truncated:
        decision = hedge.act(observation, env)
        if env.last_step is not None:
            shadows_ran(len(node_rewards) - 1)
        observation, reward, _, truncated, _ = apply(env, decision)
        node_rewards.append(reward)
        measured = env.backend.observe()
        rates.append([float(measured.get(n, {}).get("arrival_rate_rps", 0.0)) for n in tenants])
    hedge.replay_last_interval(env)  # the shadows run the last interval only at the next act
    shadows_ran(len(node_rewards) - 1)
    return ExpertStreams(source=source, names=[s.name for s in shadows], rewards=np.array(history), profile_intervals=profile,
                         rates_rps=np.array(rates), downtime_s=downtime, planner_downtime_s=np.array(planner_downtime),
                         reward_scale=node_reward_scale(scenario), calibration=calibration, node_rewards=np.array(node_rewards),
                         loads=np.array(loads), day_intervals=hedge.day)


def _calibrate(hedge: MigratorHedge, step: int, rng: np.random.Generator) -> tuple[int, int, int, float]:
    """One simulated switch cost between two random experts among the
    :data:`CALIBRATION_EXPERTS` that earned most over the last intervals (the switches a
    rule would consider; a switch away from a starving layout costs its backlog too) at ``step``."""
    recent = [float(np.mean(list(s.rewards)[-TRANSITION_INTERVALS:])) for s in hedge.shadows]
    top = np.argsort(recent)[::-1][:CALIBRATION_EXPERTS]
    source, target = (int(k) for k in rng.choice(top, size=2, replace=False))
    leader = hedge.leader
    hedge.leader = source
    try:
        return step, source, target, hedge._simulated_switch_cost(target)
    finally:
        hedge.leader = leader
