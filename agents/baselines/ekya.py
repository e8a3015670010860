"""Ekya's thief scheduler for retraining and inference (Bhardwaj et al., NSDI 2022)."""

from __future__ import annotations

import math

import numpy as np

from rlsched.agents.baselines.base import CapacityModel, Policy, arrival_rates_rps, equal_shares, one_gi_per_gpu, reference_batch, whole_device_profile
from rlsched.decision import Configuration, SharingMode
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.goodput import goodput_terms
from rlsched.simulator.perf import CoRunner
from rlsched.workloads.tenants import ContinualLearningJob

#: Ekya's thief moves 10% of the GPU at a time, percent of the GPU.
THIEF_STEP_PCT = 10.0
#: Least share a tenant keeps, percent.
MIN_SHARE_PCT = 5.0
#: Retraining window when the scenario has no retraining job, seconds (Ekya: 100-200 s).
DEFAULT_WINDOW_S = 120.0


class Ekya(Policy):
    """Fair split, then at every retraining window the thief moves 10% of a GPU from one
    tenant to another while the predicted mean inference accuracy over the window rises.

    Follows Ekya (Bhardwaj et al., "Ekya: Continuous Learning of Video Analytics Models on
    Edge Compute Servers", NSDI 2022): retraining and inference jobs share a GPU; at each
    retraining window the thief scheduler starts from a fair allocation and repeatedly
    "steals" 10% of the GPU from one job for another, keeping a move when the window's
    predicted accuracy improves. Accuracy after retraining follows Ekya's curve
    ``acc(x) = 1 - (1/(b0 x + b1) + b2)`` (the scenario's coefficients); training speed and
    inference capacity come from the performance model.

    Departs: Ekya also picks each job's retraining and inference configurations (epochs,
    frame sampling); here only the GPU split is chosen, as MPS shares of one GI per GPU,
    with the scenario reference's batch sizes.
    The predicted objective is the priority-weighted rate served within half the SLO times
    the serving model's accuracy (mid-window), so that, without retraining jobs, the thief
    still trades shares between inference tenants. The starting split of each window is
    the running one (Ekya restarts from fair), which avoids restarts when nothing improves.
    """

    name = "ekya"

    def reset(self, env: GpuShareEnv) -> None:
        self.model = CapacityModel(env)
        self.profile = whole_device_profile(env.scenario.gpu)
        windows = [t.drift_window_s for t in env.scenario.tenants if isinstance(t, ContinualLearningJob)]
        self.window_steps = max(1, round(min(windows, default=DEFAULT_WINDOW_S) / env.scenario.decision_interval_s))
        self.groups: list[list[str]] = [[] for _ in range(env.scenario.gpu_count)]
        for i, t in enumerate(env.scenario.tenants):
            self.groups[i % len(self.groups)].append(t.name)
        self.shares = {n: equal_shares(len(group)) for group in self.groups for n in group}
        self.steps = 0
        self.configuration = self._configuration(env)

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> Configuration:
        if self.steps % self.window_steps == 0:
            shares = self.thief(env, arrival_rates_rps(env))
            if shares != self.shares:
                self.shares = shares
                self.configuration = self._configuration(env)
        self.steps += 1
        return self.configuration

    def _configuration(self, env: GpuShareEnv) -> Configuration:
        groups = []
        for group in self.groups:
            members = []
            for name in group:
                members.append((name, self.shares[name], reference_batch(env, env.scenario.tenant(name))))
            groups.append(members)
        return one_gi_per_gpu(env, groups, SharingMode.MPS)

    # ------------------------------------------------------------------ the thief
    def objective(self, env: GpuShareEnv, shares: dict[str, float], rates: dict[str, float]) -> float:
        """Predicted accuracy-weighted on-time rate over the next window."""
        measured = env.backend.observe()
        window_s = self.window_steps * env.scenario.decision_interval_s
        accuracy = {}
        for job in env.scenario.tenants:
            if isinstance(job, ContinualLearningJob) and job.name in shares:
                now = float(measured.get(job.name, {}).get("accuracy", 0.0))
                step_s = env.backend.perf_model.train_step_s(env.scenario.gpu, job.model, reference_batch(env, job), self.profile, shares[job.name])
                samples = reference_batch(env, job) / step_s * window_s if step_s > 0 else 0.0
                accuracy[job.serves] = job.curve.accuracy(_units_at(job, now) + samples / job.samples_per_unit / 2.0)
        total = 0.0
        for t in env.scenario.inference_tenants():
            group = next(g for g in self.groups if t.name in g)
            others = tuple(CoRunner(env.scenario.tenant(o).model, reference_batch(env, env.scenario.tenant(o)), shares[o]) for o in group if o != t.name)
            served = min(rates[t.name], self.model.capacity(t, self.profile, shares[t.name], SharingMode.MPS, others)[0])
            total += goodput_terms(env.scenario.weights, t.priority.value, served, accuracy.get(t.name, t.accuracy)).goodput
        return total

    def thief(self, env: GpuShareEnv, rates: dict[str, float]) -> dict[str, float]:
        """Greedy 10% moves between tenants of the same GPU while the objective rises."""
        shares = dict(self.shares)
        best = self.objective(env, shares, rates)
        improved = True
        while improved:
            improved = False
            for group in self.groups:
                for thief in group:
                    for victim in group:
                        if thief == victim or shares[victim] - THIEF_STEP_PCT < MIN_SHARE_PCT:
                            continue
                        trial = dict(shares)
                        trial[victim] = round(trial[victim] - THIEF_STEP_PCT, 2)
                        trial[thief] = round(trial[thief] + THIEF_STEP_PCT, 2)
                        value = self.objective(env, trial, rates)
                        if value > best + 1e-9:
                            shares, best, improved = trial, value, True
        return shares


def _units_at(job: ContinualLearningJob, accuracy: float) -> float:
    """Retraining units that give ``accuracy`` on the job's curve (inverse of Ekya's curve)."""
    b0, b1, b2 = job.curve.b0, job.curve.b1, job.curve.b2
    gap = 1.0 - b2 - accuracy
    if gap <= 0:
        return math.inf
    return max(0.0, (1.0 / gap - b1) / b0)
