"""Evaluation of policies on a scenario (``rlsched eval``): the metrics table, JSON and plot.

Every policy runs the same episodes (seeds ``seed, seed + 1, ...``) of the environment;
per policy the metrics are means over episodes:

- ``goodput``: the episode objective (:mod:`rlsched.goodput`, the sum of rewards)
- ``goodput_vs_hindsight`` / ``goodput_vs_static_best``: goodput / that of ``hindsight`` (the
  best configuration sequence found in hindsight) / of ``static-best`` (the best fixed
  configuration in hindsight); None when that policy did not run
- ``slo_attainment`` / ``slo_attainment_high``: on-time requests / (completed + dropped),
  over all inference tenants / over high-priority ones (None when there are none)
- ``latency_ms_p99``: the worst inference tenant's whole-episode p99 latency, ms
- ``reconfigurations``: decision steps whose applied configuration differs from the one
  running before
- ``repair_rate``: fraction of steps whose decision the ILP had to change
- ``decision_ms_p50`` / ``decision_ms_p99``: policy + repair wall time per step, ms
- ``planner_milps`` / ``planner_milps_time_limited``: planner MILPs the policy solved over its
  episodes, and how many of them stopped at the planner's wall-clock time limit
  (``planner_time_limit_s``, s). Where that count is above 0, the policy's figures depend on
  this machine's speed and load (the table says so)

A policy that cannot run the scenario (a network made for another node shape) gets a row
``{"n/a": reason}`` and the evaluation goes on. With both ``hindsight`` and ``static-best``
the result states the scenario's ``headroom`` = hindsight / static-best: what dynamic
decisions could earn over the best fixed configuration. Every episode's applied
configurations are recorded, so :func:`replay` can re-simulate them and confirm each Goodput.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.agents.baselines import POLICIES, apply, make_policy
from rlsched.agents.baselines.base import high_priority_on_time
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.simulator.perf import PerformanceModelLike
from rlsched.solver.planner import PLANNER_SOLVER_OPTIONS, PLANNER_SOLVES
from rlsched.workloads.scenario import Scenario

METRICS = ("goodput", "goodput_vs_hindsight", "goodput_vs_static_best", "goodput_vs_static_best_rankings",
           "goodput_vs_static_best_slo", "slo_attainment", "slo_attainment_high", "latency_ms_p99",
           "reconfigurations", "repair_rate", "decision_ms_p50", "decision_ms_p99", "planner_milps", "planner_milps_time_limited",
           "planner_time_limit_s", "goodput_per_episode")
#: Policies that search the whole episode in hindsight, seeded with the other policies'
#: trajectories: they run last, and are never the reference of the paired comparison.
HINDSIGHT_POLICIES = ("hindsight",)


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
    planner_milps: int = 0  # planner MILPs solved in the episode
    planner_milps_time_limited: int = 0  # of them, stopped at the planner's time limit
    report: dict[str, Any] | None = None  # what a policy says about its episode (hindsight: which plan won)
    configurations: list[Configuration] = field(default_factory=list)  # applied, one per step


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


def run_episode(env: GpuShareEnv, policy_name: str, seed: int, progress: Any = None,
                seed_trajectories: dict[str, list[Configuration]] | None = None) -> Episode:
    """Run one episode of ``policy_name`` on ``env`` from ``seed``.

    :param seed_trajectories: for a hindsight policy, the configurations other policies
        applied on this episode (it starts its search from them)
    """
    policy = make_policy(policy_name)
    if seed_trajectories is not None and hasattr(policy, "seed_trajectories"):
        policy.seed_trajectories = dict(seed_trajectories)
    observation, _ = env.reset(seed=seed)
    policy.reset(env)
    episode = Episode(seed)
    solves_before = PLANNER_SOLVES.snapshot()
    truncated = False
    while not truncated:
        started = time.perf_counter()
        decision = policy.act(observation, env)
        act_ms = (time.perf_counter() - started) * 1e3
        observation, reward, _, truncated, info = apply(env, decision)
        episode.rewards.append(reward)
        episode.layouts.append(" | ".join(f"{spec} [{','.join(modes)}]" for spec, modes in zip(info["layout"], info["modes"], strict=True)))
        episode.decision_ms.append(act_ms + env.last_repair_ms)
        episode.configurations.append(info["configuration"])
        episode.reconfigurations += bool(info["reconfigured"])
        episode.repaired += bool(info["repaired"])
        if progress is not None:
            progress.update(1)
    episode.goodput = env.objective
    solves_after = PLANNER_SOLVES.snapshot()
    episode.planner_milps = solves_after[0] - solves_before[0]
    episode.planner_milps_time_limited = solves_after[1] - solves_before[1]
    episode.report = getattr(policy, "report", None)
    summary = env.backend.summary()
    p99s = []
    for t in env.scenario.inference_tenants():
        s = summary[t.name]
        decided = int(s["completed"]) + int(s["dropped"])
        episode.on_time += int(s["on_time"])
        episode.decided += decided
        if math.isfinite(float(s["latency_ms_p99"])):
            p99s.append(float(s["latency_ms_p99"]))
    episode.latency_ms_p99 = max(p99s, default=math.nan)
    episode.on_time_high, episode.decided_high = high_priority_on_time(env)
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
        "goodput_vs_hindsight": None,
        "goodput_vs_static_best": None,
        "goodput_vs_static_best_rankings": None,
        "goodput_vs_static_best_slo": None,
        "slo_attainment": _mean([e.on_time / e.decided if e.decided else math.nan for e in episodes]),
        "slo_attainment_high": _mean([e.on_time_high / e.decided_high if e.decided_high else math.nan for e in episodes]),
        "latency_ms_p99": _mean([e.latency_ms_p99 for e in episodes]),
        "reconfigurations": _mean([float(e.reconfigurations) for e in episodes]),
        "repair_rate": sum(e.repaired for e in episodes) / steps if steps else None,
        "decision_ms_p50": float(np.percentile(decision, 50)),
        "decision_ms_p99": float(np.percentile(decision, 99)),
        "planner_milps": sum(e.planner_milps for e in episodes),
        "planner_milps_time_limited": sum(e.planner_milps_time_limited for e in episodes),
        "planner_time_limit_s": float(PLANNER_SOLVER_OPTIONS["time_limit"]),
        "goodput_per_episode": [float(e.goodput) for e in episodes],
    }


def paired_comparison(table: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Every policy's Goodput against the best policy's that is not a hindsight search,
    episode by episode.

    The policies ran on the same seeds (the same arrivals: common random numbers), so the
    per-episode differences carry far less noise than the two means: their mean, its
    standard error, and how many episodes were better, equal, worse. None with fewer than
    two episodes or no second policy.
    """
    table = {name: row for name, row in table.items() if "n/a" not in row}
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


#: The references every policy's Goodput is divided by, when the table holds them: the hindsight
#: search (what dynamics could earn), the best fixed configuration in hindsight, the best
#: fixed configuration over every grouping of the busiest tenants (the fixed reference where
#: which tenants share an instance decides much of the Goodput), and the best of those that
#: meets the high-priority SLO target (the reference of a planner held to it).
REFERENCES = (("hindsight", "goodput_vs_hindsight"), ("static-best", "goodput_vs_static_best"),
              ("static-best-rankings", "goodput_vs_static_best_rankings"), ("static-best-slo", "goodput_vs_static_best_slo"))
#: The references that are a table column only where they ran (they are slow).
OPTIONAL_REFERENCES = REFERENCES[2:]


def set_ratios(result: dict[str, Any]) -> None:
    """Fill every row's ratios to the references present (:data:`REFERENCES`) and the headroom."""
    table = result["policies"]
    for reference, column in REFERENCES:
        base = table.get(reference, {}).get("goodput")
        for row in table.values():
            if "n/a" not in row:
                row[column] = row["goodput"] / base if base and row.get("goodput") is not None else None
    if table.get("hindsight", {}).get("goodput_vs_static_best") is not None:
        result["headroom"] = table["hindsight"]["goodput_vs_static_best"]


def evaluate(
    scenario: str | Path | Scenario | None,
    policies: Sequence[str],
    episodes: int = 1,
    seed: int = 0,
    perf_model: str | PerformanceModelLike = "calibrated",
    progress: bool | Any = True,
    family: Any = None,
) -> tuple[dict[str, Any], dict[str, list[Episode]]]:
    """Run every policy for ``episodes`` episodes; returns (the JSON result, the episodes).

    Hindsight searches run after the other policies and start from their trajectories.

    :param progress: show a progress bar (True), not (False), or a tqdm bar to advance
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
    steps = min(env.scenario.steps, env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else env.scenario.steps)
    ordered = [n for n in policies if n not in HINDSIGHT_POLICIES] + [n for n in policies if n in HINDSIGHT_POLICIES]
    from tqdm import tqdm

    own_bar = isinstance(progress, bool)
    bar = tqdm(total=len(ordered) * episodes * steps, desc="eval", unit="step", disable=not progress, mininterval=1.0) if own_bar else progress
    runs: dict[str, list[Episode]] = {}
    unavailable: dict[str, str] = {}
    for name in ordered:
        bar.set_postfix_str(f"{scenario_name}: {name}")
        done: list[Episode] = []
        started_at = bar.n
        try:
            for k in range(episodes):
                seeds = {other: eps[k].configurations for other, eps in runs.items()} if name in HINDSIGHT_POLICIES else None
                done.append(run_episode(envs[k], name, seed + k, bar, seeds))
        except ConfigError as exc:  # e.g. a network made for another node shape
            unavailable[name] = str(exc)
            bar.update(started_at + episodes * steps - bar.n)
            continue
        runs[name] = done
    if own_bar:
        bar.close()
    table: dict[str, dict[str, Any]] = {}
    for name in policies:
        table[name] = metrics(runs[name]) if name in runs else {"n/a": unavailable[name]}
    result: dict[str, Any] = {"scenario": scenario_name, "seed": seed, "episodes": episodes, "policies": table}
    if family is None:
        result.update(scenario_identity(env.scenario), perf_model=perf_model if isinstance(perf_model, str) else type(perf_model).__name__,
                      priority_fill_scheduler=env.scenario.priority_fill_scheduler)
    set_ratios(result)
    paired = paired_comparison(table)
    if paired is not None:
        result["paired"] = paired
    reports = {name: [e.report for e in eps] for name, eps in runs.items() if any(e.report for e in eps)}
    if reports:
        result["reports"] = reports
    result["trajectories"] = trajectories_json(runs)
    return result, runs


def evaluate_suite(
    suite: Any,
    policies: Sequence[str],
    episodes: int = 1,
    seed: int = 0,
    perf_model: str | PerformanceModelLike = "calibrated",
    progress: bool = True,
    plot_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Every scenario of a :class:`~rlsched.workloads.suite.Suite` under every policy (same
    seeds everywhere), one result per scenario plus a summary per policy (see
    :func:`suite_summary`); with ``plot_dir``, one plot per scenario (``<scenario>.png``)."""
    from tqdm import tqdm

    total = sum(len(policies) * episodes * s.steps for s in suite.scenarios)
    bar = tqdm(total=total, desc=f"suite {suite.name}", unit="step", disable=not progress, mininterval=1.0)
    results: dict[str, dict[str, Any]] = {}
    for scenario in suite.scenarios:
        result, runs = evaluate(scenario, policies, episodes, seed, perf_model, progress=bar)
        results[scenario.name] = result
        if plot_dir is not None and runs:
            plot(runs, scenario.decision_interval_s, Path(plot_dir) / f"{scenario.name}.png", scenario.name)
    bar.close()
    return {"suite": suite.name, "suite_source": suite.source, "seed": seed, "episodes": episodes, "scenarios": results,
            "summary": suite_summary(results, policies)}


def suite_summary(results: dict[str, dict[str, Any]], policies: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per policy over a suite's scenarios: the geometric means of its Goodput over
    static-best's and over hindsight's (None when a ratio is not positive: a geometric mean
    of a loss is meaningless; ``scenarios_at_or_below_zero`` counts them), its worst
    high-priority SLO attainment, its worst decision p99 (ms), and where it could not run."""
    summary: dict[str, dict[str, Any]] = {}
    for name in policies:
        rows = {scenario: r["policies"][name] for scenario, r in results.items()}
        ran = {scenario: row for scenario, row in rows.items() if "n/a" not in row}
        entry: dict[str, Any] = {"scenarios": len(ran), "n/a": {s: row["n/a"] for s, row in rows.items() if "n/a" in row}}
        for _, column in REFERENCES:
            ratios = [row[column] for row in ran.values() if row.get(column) is not None]
            bad = sum(r <= 0 for r in ratios)
            entry[f"{column}_geomean"] = float(np.exp(np.mean(np.log(ratios)))) if ratios and not bad else None
            entry[f"{column}_scenarios_at_or_below_zero"] = bad
        highs = [row["slo_attainment_high"] for row in ran.values() if row.get("slo_attainment_high") is not None]
        entry["slo_attainment_high_worst"] = min(highs) if highs else None
        entry["decision_ms_p99_worst"] = max((row["decision_ms_p99"] for row in ran.values()), default=None)
        summary[name] = entry
    return summary


def format_suite(result: dict[str, Any]) -> str:
    """A suite's results as Markdown: one table per scenario, the headroom of each, and the
    summary per policy."""
    lines = []
    for name, res in result["scenarios"].items():
        lines += [f"### {name}", "", format_table(res), ""]
    lines += ["### Headroom per scenario (hindsight / static-best)", "", "| scenario | headroom | static-best | hindsight |", "|---|---:|---:|---:|"]
    for name, res in result["scenarios"].items():
        table = res["policies"]
        value = res.get("headroom")
        goodput = {p: table.get(p, {}).get("goodput") for p in ("static-best", "hindsight")}
        lines.append(f"| {name} | {'-' if value is None else format(value, '.3f')} | "
                     + " | ".join("-" if goodput[p] is None else format(goodput[p], ",.0f") for p in ("static-best", "hindsight")) + " |")
    optional = [(reference, column) for reference, column in OPTIONAL_REFERENCES if reference in result["summary"]]
    lines += ["", f"### Summary over {len(result['scenarios'])} scenarios", "",
              "| policy | vs static-best (geomean) " + "".join(f"| vs {reference} (geomean) " for reference, _ in optional)
              + "| vs hindsight (geomean) | worst SLO att. (high) | worst decision ms p99 | n/a |",
              "|---|---:|---:|---:|---:|" + "---:|" * len(optional) + "---|"]

    def ratio(entry: dict[str, Any], column: str) -> str:
        value = entry.get(f"{column}_geomean")
        if value is not None:
            return f"{value:.3f}"
        bad = entry.get(f"{column}_scenarios_at_or_below_zero")
        return f"<= 0 on {bad}" if bad else "-"

    for name, entry in result["summary"].items():
        worst = entry["slo_attainment_high_worst"]
        p99 = entry["decision_ms_p99_worst"]
        optional_cells = "".join(f"| {ratio(entry, column)} " for _, column in optional)
        lines.append(f"| {name} | {ratio(entry, 'goodput_vs_static_best')} {optional_cells}| {ratio(entry, 'goodput_vs_hindsight')} "
                     f"| {'-' if worst is None else format(worst, '.3f')} | {'-' if p99 is None else format(p99, '.1f')} | {len(entry['n/a']) or ''} |")
    return "\n".join(lines)


def scenario_identity(scenario: Scenario) -> dict[str, str]:
    """The scenario's file and content hash (:func:`scenario_content_hash`; what a replay checks)."""
    source = Path(scenario.source)
    if not source.is_file():
        return {"scenario_source": str(source), "scenario_sha256": ""}
    # Relative to the working directory when inside it, so a result replays in another checkout.
    shown = os.path.relpath(source) if source.resolve().is_relative_to(Path.cwd().resolve()) else str(source)
    return {"scenario_source": shown, "scenario_sha256": scenario_content_hash(source)}


def scenario_content_hash(path: Path) -> str:
    """SHA-256 of a scenario file's content: its YAML data as canonical JSON, so that editing
    a comment (e.g. the measured headroom) keeps a result replayable."""
    import yaml

    return hashlib.sha256(json.dumps(yaml.safe_load(path.read_text()), sort_keys=True).encode()).hexdigest()


def trajectories_json(runs: dict[str, list[Episode]]) -> dict[str, Any]:
    """Every episode's applied configurations, as indices into one table of distinct ones."""
    distinct: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    episodes: dict[str, list[dict[str, Any]]] = {}
    for name, eps in runs.items():
        episodes[name] = []
        for e in eps:
            steps = []
            for c in e.configurations:
                key = json.dumps(c.to_dict(), sort_keys=True)
                if key not in index:
                    index[key] = len(distinct)
                    distinct.append(c.to_dict())
                steps.append(index[key])
            episodes[name].append({"seed": e.seed, "goodput": float(e.goodput), "steps": steps})
    return {"configurations": distinct, "episodes": episodes}


def _recorded(result: dict[str, Any], source: str) -> list[tuple[dict[str, Any], GpuShareEnv, dict[str, list[Episode]]]]:
    """Per scenario result of an evaluation (one scenario's or a suite's): the result, an
    environment of its unchanged scenario file, and every policy's recorded episodes (seed,
    Goodput, configurations applied). A changed scenario file (SHA-256) is a ConfigError naming it."""
    from rlsched.workloads.scenario import _Reader, load_scenario, parse_configuration, without_priority_fill_scheduler

    results = list(result["scenarios"].values()) if "scenarios" in result else [result]
    recorded = []
    for res in results:
        where = f"scenarios.{res.get('scenario')}" if "scenarios" in result else "(top level)"
        if "trajectories" not in res or not res.get("scenario_sha256"):
            raise ConfigError(source, where, res.get("scenario"), "no recorded trajectories of an unchanged scenario file "
                              "(family draws and --trace overrides cannot be replayed)")
        path = Path(res["scenario_source"])
        if not path.is_file():
            raise ConfigError(source, f"{where}.scenario_source", str(path), "no such scenario file")
        if scenario_content_hash(path) != res["scenario_sha256"]:
            raise ConfigError(source, f"{where}.scenario_sha256", res["scenario_sha256"], f"{path} changed since the evaluation")
        scenario = load_scenario(path)
        if not res.get("priority_fill_scheduler", True):
            scenario = without_priority_fill_scheduler(scenario)
        env = GpuShareEnv(scenario, perf_model=res.get("perf_model", "calibrated"))
        names = [t.name for t in env.scenario.tenants]
        table = res["trajectories"]["configurations"]
        configs = [parse_configuration(_Reader(source, c, f"{where}.trajectories.configurations[{i}]"), env.scenario.gpu, env.scenario.gpu_count, names)
                   for i, c in enumerate(table)]
        runs = {policy: [Episode(int(e["seed"]), float(e["goodput"]), configurations=[configs[i] for i in e["steps"]]) for e in eps]
                for policy, eps in res["trajectories"]["episodes"].items()}
        recorded.append((res, env, runs))
    return recorded


def replay(result: dict[str, Any], source: str = "eval JSON", progress: bool = True) -> list[dict[str, Any]]:
    """Re-simulate every recorded episode of an evaluation result and compare its Goodput.

    Works on one scenario's result or a suite's (``{"suites": ..., "scenarios": {...}}``).
    Returns one row per episode: scenario, policy, seed, recorded and replayed Goodput, ``ok``.
    A changed scenario file (SHA-256) is a ConfigError naming it.
    """
    rows: list[dict[str, Any]] = []
    for res, env, runs in _recorded(result, source):
        for policy, eps in runs.items():
            for e in eps:
                env.reset(seed=e.seed)
                for c in e.configurations:
                    env.step_configuration(c)
                replayed = env.objective
                ok = math.isclose(replayed, e.goodput, rel_tol=1e-9, abs_tol=1e-6)
                rows.append({"scenario": res["scenario"], "policy": policy, "seed": e.seed, "recorded": e.goodput, "replayed": replayed, "ok": ok})
    return rows


def rerun_hindsight(result: dict[str, Any], source: str = "eval JSON", progress: bool = True) -> dict[str, Any]:
    """An evaluation result whose ``hindsight`` reference is searched again (after the search
    has changed), seeded as ``rlsched eval`` seeds it: with every other policy's recorded
    configurations on the same episode, which are not run again. The hindsight row, every
    ratio to it, the headroom, the hindsight reports and trajectories, and a suite's summary
    are replaced; everything else is kept. The earlier search's trajectory is a seed too, so
    the reference never falls (a rolling-horizon search given more options can end lower). The
    input is not changed."""
    from tqdm import tqdm

    result = json.loads(json.dumps(result))  # a copy
    recorded = _recorded(result, source)
    if any("hindsight" not in runs for _, _, runs in recorded):
        raise ConfigError(source, "trajectories.episodes", "hindsight", "the result has no hindsight episodes to search again")
    bar = tqdm(total=sum(env.scenario.steps * len(runs["hindsight"]) for _, env, runs in recorded),
               desc="hindsight", unit="step", disable=not progress, mininterval=1.0)
    for res, env, runs in recorded:
        bar.set_postfix_str(res["scenario"])
        seeds = [e.seed for e in runs["hindsight"]]
        others = {name: eps for name, eps in runs.items() if name not in HINDSIGHT_POLICIES}
        others["hindsight (earlier search)"] = runs["hindsight"]
        runs["hindsight"] = [run_episode(env, "hindsight", seed, bar, {name: eps[k].configurations for name, eps in others.items()})
                             for k, seed in enumerate(seeds)]
        res["policies"]["hindsight"] = metrics(runs["hindsight"])
        set_ratios(res)
        res.setdefault("reports", {})["hindsight"] = [e.report for e in runs["hindsight"]]
        res["trajectories"] = trajectories_json(runs)
    bar.close()
    if "scenarios" in result and "summary" in result:
        result["summary"] = suite_summary(result["scenarios"], list(result["summary"]))
    return result


def add_policies(result: dict[str, Any], policies: Sequence[str], source: str = "eval JSON", progress: bool = True,
                 replace: bool = False) -> dict[str, Any]:
    """An evaluation result with more policies: each runs on every recorded episode (same
    scenario file, same seeds), and its rows, ratios, reports and trajectories join the
    others'; the paired comparison and a suite's summary are recomputed. The recorded
    policies are not run again, and the input is not changed. A hindsight search cannot be
    added this way (it is seeded by the others: ``rerun_hindsight``), nor a policy already
    there, unless ``replace``: then a policy already there is run again (after it changed)
    and its new rows, reports and trajectories replace the recorded ones."""
    from tqdm import tqdm

    option = "--rerun-policies" if replace else "--add-policies"
    result = json.loads(json.dumps(result))  # a copy
    for name in policies:
        if name in HINDSIGHT_POLICIES:
            raise ConfigError(source, option, name, "a hindsight search is searched again with --rerun-hindsight, not added")
        for res in (list(result["scenarios"].values()) if "scenarios" in result else [result]):
            if name in res["policies"] and not replace:
                raise ConfigError(source, option, name, "the result already has this policy")
            res["policies"].pop(name, None)
            res.get("reports", {}).pop(name, None)
            res.get("trajectories", {}).get("episodes", {}).pop(name, None)
    recorded = _recorded(result, source)
    seeds = {id(res): sorted({e.seed for eps in runs.values() for e in eps}) for res, _, runs in recorded}
    bar = tqdm(total=sum(env.scenario.steps * len(seeds[id(res)]) * len(policies) for res, env, _ in recorded),
               desc="add", unit="step", disable=not progress, mininterval=1.0)
    for res, env, runs in recorded:
        for name in policies:
            bar.set_postfix_str(f"{res['scenario']}: {name}")
            runs[name] = [run_episode(env, name, seed, bar) for seed in seeds[id(res)]]
            res["policies"][name] = metrics(runs[name])
            reports = [e.report for e in runs[name]]
            if any(reports):
                res.setdefault("reports", {})[name] = reports
        set_ratios(res)
        paired = paired_comparison(res["policies"])
        if paired is not None:
            res["paired"] = paired
        res["trajectories"] = trajectories_json(runs)
    bar.close()
    if "scenarios" in result and "summary" in result:
        result["summary"] = suite_summary(result["scenarios"], list(dict.fromkeys([*result["summary"], *policies])))
    return result


def format_table(result: dict[str, Any]) -> str:
    """The metrics as a Markdown table (the README shows one)."""
    optional = [(reference, column) for reference, column in OPTIONAL_REFERENCES if reference in result["policies"]]
    header = ("| policy | Goodput | vs hindsight | vs static-best " + "".join(f"| vs {reference} " for reference, _ in optional)
              + "| SLO att. | SLO att. (high) | p99 ms | reconfigs | repair rate | decision ms p50 | p99 |")
    lines = [header, "|---|" + "---:|" * (10 + len(optional))]

    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    for name, m in result["policies"].items():
        if "n/a" in m:
            lines.append(f"| {name} | n/a: {m['n/a']} |" + " |" * (9 + len(optional)))
            continue
        optional_cells = "".join(f"| {cell(m.get(column), '.3f')} " for _, column in optional)
        lines.append(
            f"| {name} | {cell(m['goodput'], ',.0f')} | {cell(m['goodput_vs_hindsight'], '.3f')} | {cell(m['goodput_vs_static_best'], '.3f')} "
            f"{optional_cells}| {cell(m['slo_attainment'], '.3f')} | {cell(m['slo_attainment_high'], '.3f')} | {cell(m['latency_ms_p99'], '.1f')} "
            f"| {cell(m['reconfigurations'], '.1f')} | {cell(m['repair_rate'], '.2f')} | {cell(m['decision_ms_p50'], '.2f')} | {cell(m['decision_ms_p99'], '.2f')} |"
        )
    if result.get("headroom") is not None:
        lines.append(f"\nheadroom (hindsight / static-best): {result['headroom']:.3f}")
    for name, m in result["policies"].items():
        if m.get("planner_milps_time_limited"):
            lines.append(f"\n{name}: {m['planner_milps_time_limited']:,} of its {m['planner_milps']:,} planner MILPs stopped at their "
                         f"{m['planner_time_limit_s']:g}-s wall-clock limit: its figures depend on this machine's speed and load")
    for name, reports in result.get("reports", {}).items():
        if reports and all(r and "planner_steps" in r for r in reports):
            share = sum(r["planner_steps"] for r in reports) / max(1, sum(r["steps"] for r in reports))
            lines.append(f"\n{name}: the planner (migrator-ilp) decided {share:.0%} of the steps, those whose action the policy "
                         f"gave a probability below {reports[0]['planner_takeover_probability']:g}")
        if reports and all(r and "checked_changes" in r for r in reports):
            checked, kept = sum(r["checked_changes"] for r in reports), sum(r["kept_by_check"] for r in reports)
            lines.append(f"{name}: the reconfiguration check kept {kept:,} of {checked:,} proposed changes out (the simulator "
                         "predicted no gain over keeping the running configuration)")
        if reports and all(r and "best_seed" in r for r in reports):
            won = sum(r["search_won"] for r in reports)
            lines.append(f"{name}: the search beat its best seed in {won} of {len(reports)} episode(s); best seeds: "
                         + ", ".join(sorted({r['best_seed'] for r in reports})))
    paired = result.get("paired")
    if paired:
        lines.append(f"\nGoodput minus {paired['reference']}'s (the best policy that is not a hindsight search), episode by episode on the same seeds: "
                     "mean +- standard error (episodes better / equal / worse)")
        for name, d in paired["policies"].items():
            lines.append(f"- {name}: {d['mean']:+,.0f} +- {d['stderr']:,.0f} ({d['better']} / {d['equal']} / {d['worse']})")
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: str | Path) -> None:
    """Write the result as JSON, atomically (a temporary file renamed over the target)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    partial.replace(path)  # a reader never sees half a file, and an old result survives a crash


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
