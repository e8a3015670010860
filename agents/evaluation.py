"""Evaluation of policies on a scenario (``rlsched eval``): the metrics table, JSON and plot.

Every policy runs the same episodes (seeds ``seed, seed + 1, ...``) of the environment;
per policy the metrics are means over episodes:

- ``goodput``: the episode objective (:mod:`rlsched.goodput`, the sum of rewards)
- ``goodput_vs_oracle``: goodput / the oracle's goodput (None when the oracle did not run)
- ``slo_attainment`` / ``slo_attainment_high``: on-time requests / (completed + dropped),
  over all inference tenants / over high-priority ones (None when there are none)
- ``latency_ms_p99``: the worst inference tenant's whole-episode p99 latency, ms
- ``reconfigurations``: decision steps whose applied configuration differs from the one
  running before
- ``repair_rate``: fraction of steps whose decision the ILP had to change
- ``decision_ms_p50`` / ``decision_ms_p99``: policy + repair wall time per step, ms
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.agents.baselines import POLICIES, apply, make_policy
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.simulator.perf import PerformanceModelLike
from rlsched.workloads.scenario import Scenario
from rlsched.workloads.tenants import Priority

METRICS = ("goodput", "goodput_vs_oracle", "slo_attainment", "slo_attainment_high", "latency_ms_p99",
           "reconfigurations", "repair_rate", "decision_ms_p50", "decision_ms_p99", "goodput_per_episode")
#: Policies that know the future (never the reference of the paired comparison).
HINDSIGHT_POLICIES = ("oracle",)


@dataclass
class Episode:
    """One policy's run of one episode."""

    seed: int
    goodput: float = 0.0
    rewards: list[float] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)
    decision_ms: list[float] = field(default_factory=list)
    reconfigurations: int = 0
    repaired: int = 0
    on_time: int = 0
    decided: int = 0
    on_time_high: int = 0
    decided_high: int = 0
    latency_ms_p99: float = math.nan
    report: dict[str, Any] | None = None  # what a policy says about its episode (the oracle: which plan won)


def policy_names(text: str) -> list[str]:
    """``NAME,NAME,...`` -> policy names, ``all`` standing for every baseline (unknown ones
    are a clear error; duplicates are dropped)."""
    names: list[str] = []
    for item in (n.strip() for n in text.split(",")):
        for name in (list(POLICIES) if item == "all" else [item] if item else []):
            if name not in names:
                names.append(name)
    if not names:
        raise ConfigError("--policies", "--policies", text, f"give NAME,NAME,... or all (allowed: {', '.join(POLICIES)})")
    for name in names:
        make_policy(name)  # raises on an unknown name
    return names


def run_episode(env: GpuShareEnv, policy_name: str, seed: int, progress: Any = None) -> Episode:
    """Run one episode of ``policy_name`` on ``env`` from ``seed``."""
    policy = make_policy(policy_name)
    observation, _ = env.reset(seed=seed)
    policy.reset(env)
    episode = Episode(seed)
    truncated = False
    while not truncated:
        started = time.perf_counter()
        decision = policy.act(observation, env)
        act_ms = (time.perf_counter() - started) * 1e3
        observation, reward, _, truncated, info = apply(env, decision)
        episode.rewards.append(reward)
        episode.layouts.append(" | ".join(f"{spec} [{','.join(modes)}]" for spec, modes in zip(info["layout"], info["modes"], strict=True)))
        episode.decision_ms.append(act_ms + env.last_repair_ms)
        episode.reconfigurations += bool(info["reconfigured"])
        episode.repaired += bool(info["repaired"])
        if progress is not None:
            progress.update(1)
    episode.goodput = env.objective
    episode.report = getattr(policy, "report", None)
    summary = env.backend.summary()
    p99s = []
    for t in env.scenario.inference_tenants():
        s = summary[t.name]
        decided = int(s["completed"]) + int(s["dropped"])
        episode.on_time += int(s["on_time"])
        episode.decided += decided
        if t.priority == Priority.HIGH:
            episode.on_time_high += int(s["on_time"])
            episode.decided_high += decided
        if math.isfinite(float(s["latency_ms_p99"])):
            p99s.append(float(s["latency_ms_p99"]))
    episode.latency_ms_p99 = max(p99s, default=math.nan)
    return episode


def _mean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite else None


def metrics(episodes: Sequence[Episode]) -> dict[str, float | None]:
    """The table's metrics for one policy (means over its episodes)."""
    decision = np.concatenate([e.decision_ms for e in episodes])
    steps = sum(len(e.rewards) for e in episodes)
    return {
        "goodput": _mean([e.goodput for e in episodes]),
        "goodput_vs_oracle": None,
        "slo_attainment": _mean([e.on_time / e.decided if e.decided else math.nan for e in episodes]),
        "slo_attainment_high": _mean([e.on_time_high / e.decided_high if e.decided_high else math.nan for e in episodes]),
        "latency_ms_p99": _mean([e.latency_ms_p99 for e in episodes]),
        "reconfigurations": _mean([float(e.reconfigurations) for e in episodes]),
        "repair_rate": sum(e.repaired for e in episodes) / steps if steps else None,
        "decision_ms_p50": float(np.percentile(decision, 50)),
        "decision_ms_p99": float(np.percentile(decision, 99)),
        "goodput_per_episode": [float(e.goodput) for e in episodes],
    }


def paired_comparison(table: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Every policy's Goodput against the best non-oracle policy's, episode by episode.

    The policies ran on the same seeds (the same arrivals: common random numbers), so the
    per-episode differences carry far less noise than the two means: their mean, its
    standard error, and how many episodes were better, equal, worse. None with fewer than
    two episodes or no second policy.
    """
    candidates = {name: row for name, row in table.items() if name not in HINDSIGHT_POLICIES}
    episodes = len(next(iter(table.values()))["goodput_per_episode"]) if table else 0
    if episodes < 2 or len(candidates) < 2:
        return None
    reference = max(candidates, key=lambda name: candidates[name]["goodput"])
    base = np.array(table[reference]["goodput_per_episode"])
    rows = {}
    for name, row in table.items():
        if name == reference:
            continue
        diff = np.array(row["goodput_per_episode"]) - base
        rows[name] = {"mean": float(diff.mean()), "stderr": float(diff.std(ddof=1) / math.sqrt(len(diff))),
                      "better": int((diff > 0).sum()), "equal": int((diff == 0).sum()), "worse": int((diff < 0).sum())}
    return {"reference": reference, "policies": rows}


def evaluate(
    scenario: str | Path | Scenario | None,
    policies: Sequence[str],
    episodes: int = 1,
    seed: int = 0,
    perf_model: str | PerformanceModelLike = "calibrated",
    progress: bool = True,
    family: Any = None,
) -> tuple[dict[str, Any], dict[str, list[Episode]]]:
    """Run every policy for ``episodes`` episodes; returns (the JSON result, the episodes).

    :param family: instead of ``scenario``, a :class:`~rlsched.agents.ppo.family.ScenarioFamily`:
        episode k runs on its draw from seed ``seed + k`` (the same draw for every policy), for
        scoring on the training distribution
    """
    if episodes < 1:
        raise ConfigError("--episodes", "--episodes", episodes, "must be >= 1")
    if family is None:
        env = GpuShareEnv(scenario, perf_model=perf_model)
        envs = [env] * episodes
        scenario_name = env.scenario.name
    else:
        envs = [GpuShareEnv(family.sample(np.random.default_rng(seed + k)), perf_model=perf_model) for k in range(episodes)]
        env, scenario_name = envs[0], f"draws of the {family.base.name} family"
    total_steps = len(policies) * episodes * min(env.scenario.steps, env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else env.scenario.steps)
    from tqdm import tqdm

    bar = tqdm(total=total_steps, desc="eval", unit="step", disable=not progress, mininterval=1.0)
    runs: dict[str, list[Episode]] = {}
    for name in policies:
        bar.set_postfix_str(name)
        runs[name] = [run_episode(envs[k], name, seed + k, bar) for k in range(episodes)]
    bar.close()
    table = {name: metrics(eps) for name, eps in runs.items()}
    oracle = table.get("oracle", {}).get("goodput")
    if oracle:
        for row in table.values():
            row["goodput_vs_oracle"] = row["goodput"] / oracle if row["goodput"] is not None else None
    result = {"scenario": scenario_name, "seed": seed, "episodes": episodes, "policies": table}
    paired = paired_comparison(table)
    if paired is not None:
        result["paired"] = paired
    reports = {name: [e.report for e in eps] for name, eps in runs.items() if any(e.report for e in eps)}
    if reports:
        result["reports"] = reports
    return result, runs


def format_table(result: dict[str, Any]) -> str:
    """The metrics as a Markdown table (the README shows one)."""
    header = "| policy | Goodput | vs oracle | SLO att. | SLO att. (high) | p99 ms | reconfigs | repair rate | decision ms p50 | p99 |"
    lines = [header, "|---|" + "---:|" * 9]

    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    for name, m in result["policies"].items():
        lines.append(
            f"| {name} | {cell(m['goodput'], ',.0f')} | {cell(m['goodput_vs_oracle'], '.3f')} | {cell(m['slo_attainment'], '.3f')} "
            f"| {cell(m['slo_attainment_high'], '.3f')} | {cell(m['latency_ms_p99'], '.1f')} | {cell(m['reconfigurations'], '.1f')} "
            f"| {cell(m['repair_rate'], '.2f')} | {cell(m['decision_ms_p50'], '.2f')} | {cell(m['decision_ms_p99'], '.2f')} |"
        )
    for name, reports in result.get("reports", {}).items():
        if reports and all(r and "planner_steps" in r for r in reports):
            share = sum(r["planner_steps"] for r in reports) / max(1, sum(r["steps"] for r in reports))
            lines.append(f"\n{name}: the planner (migrator-ilp) decided {share:.0%} of the steps, those whose action the policy "
                         f"gave a probability below {reports[0]['planner_takeover_probability']:g}")
        if reports and all(r and "checked_changes" in r for r in reports):
            checked, kept = sum(r["checked_changes"] for r in reports), sum(r["kept_by_check"] for r in reports)
            lines.append(f"{name}: the reconfiguration check kept {kept:,} of {checked:,} proposed changes out (the simulator "
                         "predicted no gain over keeping the running configuration)")
    paired = result.get("paired")
    if paired:
        lines.append(f"\nGoodput minus {paired['reference']}'s (the best non-oracle policy), episode by episode on the same seeds: "
                     "mean +- standard error (episodes better / equal / worse)")
        for name, d in paired["policies"].items():
            lines.append(f"- {name}: {d['mean']:+,.0f} +- {d['stderr']:,.0f} ({d['better']} / {d['equal']} / {d['worse']})")
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: str | Path) -> None:
    """Write the result (NaN as null) atomically enough for a results file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")


def plot(runs: dict[str, list[Episode]], interval_s: float, path: str | Path, title: str) -> None:
    """Each policy's layout timeline (first episode; one colour per distinct layout + modes)
    above every policy's Goodput per interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(runs)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 2.5 + 0.5 * len(names) + 3), sharex=True,
                                      gridspec_kw={"height_ratios": [max(1, len(names)) * 0.5 + 0.5, 3]})
    distinct: list[str] = []
    for episodes in runs.values():
        for layout in episodes[0].layouts:
            if layout not in distinct:
                distinct.append(layout)
    cmap = plt.get_cmap("tab20")
    for row, name in enumerate(names):
        layouts = runs[name][0].layouts
        start = 0
        for i in range(1, len(layouts) + 1):
            if i == len(layouts) or layouts[i] != layouts[start]:
                color = cmap(distinct.index(layouts[start]) % 20)
                top.broken_barh([(start * interval_s, (i - start) * interval_s)], (row - 0.4, 0.8), color=color)
                start = i
    top.set_yticks(range(len(names)), names)
    top.set_title(f"{title}: layout timeline (episode 1) and Goodput per interval")
    shown = distinct[:12]
    handles = [matplotlib.patches.Patch(color=cmap(distinct.index(d) % 20), label=d) for d in shown]
    top.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0), title=f"layouts ({len(distinct)})", title_fontsize=7)
    for name in names:
        rewards = runs[name][0].rewards
        bottom.plot(np.arange(1, len(rewards) + 1) * interval_s, rewards, label=name, linewidth=1)
    bottom.set_xlabel("simulated time, s")
    bottom.set_ylabel("Goodput per interval")
    bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legends sit outside the axes
    plt.close(fig)
