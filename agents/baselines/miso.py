"""MISO-style exhaustive partition search (Li et al., SoCC 2022; boringlee24/socc22-miso)."""

from __future__ import annotations

import itertools

import numpy as np

from rlsched.agents.baselines.base import CapacityModel, Policy, arrival_rates_rps, equal_shares, reference_batch
from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.hardware import Layout, enumerate_layouts, load_gpu
from rlsched.workloads.tenants import InferenceTenant

#: Search again when a tenant's rate moves by more than this fraction since the last search.
RESEARCH_RATE_CHANGE = 0.25
#: Switch to the new partition only if its predicted score beats the running one by this.
SWITCH_MARGIN = 0.05


class Miso(Policy):
    """Predict every tenant's speed on every MIG slice, then search all partitions and
    tenant-to-slice assignments exhaustively for the best predicted mean speed.

    Follows MISO (Li et al., "MISO: Exploiting Multi-Instance GPU Capability on Multi-Tenant
    GPU Clusters", SoCC 2022): for each GPU, every maximal layout (19 on an A100-40GB with
    today's driver, MISO's 18 before R510) and every assignment of its tenants to the
    layout's GIs is scored, and the best is applied; it searches again when the load
    changes (MISO: when a job arrives or completes).

    Departs: MISO predicts MIG speeds from 30 s of MPS co-location profiling; here they come
    from the calibrated performance model. MISO's score is the mean slowdown versus a whole
    GPU for training jobs; here an inference tenant scores the fraction of its measured rate
    its GI serves within half its SLO, and a retraining or best-effort job its share of the
    GPU's compute. Tenants beyond a layout's GI count share GIs in equal MPS shares (MISO
    runs one job per slice), tenants are dealt to GPUs by load before the per-GPU search,
    and a new partition replaces the running one only when it scores 5% better (every
    change restarts tenants).
    """

    name = "miso"

    def reset(self, env: GpuShareEnv) -> None:
        self.model = CapacityModel(env)
        gpu = load_gpu(env.scenario.gpu)
        self.layouts = enumerate_layouts(gpu, maximal=True) if gpu.mig_supported else [Layout(gpu.name, ())]
        self.searched_for: dict[str, float] | None = None
        self.configuration: Configuration | None = None

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> Configuration:
        rates = arrival_rates_rps(env)
        if self.searched_for is None or any(abs(rates[n] - r) > RESEARCH_RATE_CHANGE * max(r, 1.0) for n, r in self.searched_for.items()):
            self.searched_for = rates
            candidate, score = self.search(env, rates)
            if self.configuration is None or score > self.score(env, self.configuration, rates) + SWITCH_MARGIN:
                self.configuration = candidate
        return self.configuration

    # ------------------------------------------------------------------ scoring
    def _tenant_score(self, env: GpuShareEnv, name: str, profile: str | None, share: float, rates: dict[str, float]) -> float:
        t = env.scenario.tenant(name)
        if isinstance(t, InferenceTenant):
            return self.model.served_fraction(t, rates[name], profile, share)
        return self.model.slices(profile) * share / 100.0 / self.model.slices(self.model.profiles()[-1])

    def score(self, env: GpuShareEnv, config: Configuration, rates: dict[str, float]) -> float:
        """Predicted mean tenant score of a configuration."""
        total = 0.0
        for name, p in config.placements.items():
            layout = config.layouts[p.gpu_index]
            profile = layout.instances[p.instance_index].profile if len(layout) else None
            total += self._tenant_score(env, name, profile, p.mps_pct, rates)
        return total / len(config.placements)

    def search(self, env: GpuShareEnv, rates: dict[str, float]) -> tuple[Configuration, float]:
        """The best (layout, assignment) per GPU, and its mean predicted score."""
        groups = self._deal(env, rates)
        layouts, modes, placements, total = [], [], {}, 0.0
        for g, names in enumerate(groups):
            best = (-1.0, self.layouts[0], {})
            for layout in self.layouts:
                profiles = [gi.profile for gi in layout.instances] or [None]
                # One tenant per GI when they fit (MISO), otherwise every assignment.
                assignments = itertools.permutations(range(len(profiles)), len(names)) if len(names) <= len(profiles) else itertools.product(range(len(profiles)), repeat=len(names))
                for assignment in assignments:
                    counts = np.bincount(assignment, minlength=len(profiles))
                    score = sum(self._tenant_score(env, n, profiles[i], equal_shares(int(counts[i])), rates) for n, i in zip(names, assignment, strict=True))
                    if score > best[0]:
                        best = (score, layout, dict(zip(names, assignment, strict=True)))
            score, layout, chosen = best
            total += score
            counts = np.bincount(list(chosen.values()), minlength=max(1, len(layout)))
            layouts.append(layout)
            modes.append((SharingMode.MPS,) * max(1, len(layout)))
            for name, i in chosen.items():
                t = env.scenario.tenant(name)
                share = equal_shares(int(counts[i]))
                profile = layout.instances[i].profile if len(layout) else None
                batch = self.model.capacity(t, profile, share)[1] if isinstance(t, InferenceTenant) else reference_batch(env, t)
                placements[name] = TenantPlacement(g, i, share, batch)
        config = Configuration(tuple(layouts), tuple(modes), {n: placements[n] for n in env.tenant_names})
        return config, total / len(env.tenant_names)

    def _deal(self, env: GpuShareEnv, rates: dict[str, float]) -> list[list[str]]:
        """Tenants over GPUs: heaviest first, each to the GPU with the least load so far."""
        largest = self.model.profiles()[-1]

        def load(t: object) -> float:
            if not isinstance(t, InferenceTenant):
                return 0.5
            capacity = self.model.capacity(t, largest)[0]
            return rates[t.name] / capacity if capacity > 0 else 1.0

        groups: list[list[str]] = [[] for _ in range(env.scenario.gpu_count)]
        loads = [0.0] * len(groups)
        for t in sorted(env.scenario.tenants, key=load, reverse=True):
            g = int(np.argmin(loads))
            groups[g].append(t.name)
            loads[g] += load(t)
        return groups
