"""rlsched eval: the table, the JSON metrics and the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlsched.agents.baselines import POLICIES
from rlsched.agents.evaluation import METRICS
from rlsched.cli.main import main

TINY = str(Path(__file__).parent / "data" / "env_tiny.yaml")


def test_eval_writes_json_with_every_metric_and_a_plot(tmp_path, capsys):
    out, png = tmp_path / "eval.json", tmp_path / "eval.png"
    code = main(["eval", "--scenario", TINY, "--policies", "all", "--episodes", "2", "--seed", "3",
                 "--json", str(out), "--plot", str(png), "--no-progress"])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["scenario"] == "env-tiny" and list(result["policies"]) == list(POLICIES)
    for metrics in result["policies"].values():
        assert set(metrics) == set(METRICS)
        assert 0.0 <= metrics["slo_attainment"] <= 1.0 and metrics["decision_ms_p99"] >= metrics["decision_ms_p50"] >= 0.0
    assert png.stat().st_size > 10_000
    table = capsys.readouterr().out
    assert all(f"| {name} |" in table for name in POLICIES)
    # The paired comparison: against the best policy that is not a hindsight search, from the per-episode Goodputs.
    paired = result["paired"]
    rows = {name: m for name, m in result["policies"].items() if name != "hindsight"}
    reference = max(rows, key=lambda name: rows[name]["goodput"])
    assert paired["reference"] == reference and set(paired["policies"]) == set(POLICIES) - {reference}
    for name, d in paired["policies"].items():
        diffs = [a - b for a, b in zip(result["policies"][name]["goodput_per_episode"], result["policies"][reference]["goodput_per_episode"], strict=True)]
        assert len(diffs) == 2 and abs(d["mean"] - sum(diffs) / 2) < 1e-6
        assert abs(d["stderr"] - abs(diffs[0] - diffs[1]) / 2) < 1e-6  # sd(ddof=1) / sqrt(2) of two values
        assert d["better"] + d["equal"] + d["worse"] == 2
    assert f"Goodput minus {reference}'s" in table


def test_one_episode_has_no_paired_comparison(tmp_path):
    out = tmp_path / "one.json"
    assert main(["eval", "--scenario", TINY, "--policies", "static-equal,paris-elsa", "--json", str(out), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert "paired" not in result and len(result["policies"]["paris-elsa"]["goodput_per_episode"]) == 1


def test_eval_same_seed_same_goodput(tmp_path):
    results = []
    for k in range(2):
        out = tmp_path / f"{k}.json"
        assert main(["eval", "--scenario", TINY, "--policies", "static-equal", "--seed", "5", "--json", str(out), "--no-progress"]) == 0
        results.append(json.loads(out.read_text())["policies"]["static-equal"]["goodput"])
    assert results[0] == results[1]


def test_eval_unknown_policy_exits_2(capsys):
    assert main(["eval", "--scenario", TINY, "--policies", "static-equal,nope", "--no-progress"]) == 2
    assert "'nope'" in capsys.readouterr().err


def test_eval_trace_override_changes_the_load(tmp_path):
    trace = Path(__file__).resolve().parents[1] / "configs" / "traces" / "azure_llm_conv_timestamps.csv"
    goodput = []
    for extra in ([], ["--trace", f"resnet={trace}:2"]):
        out = tmp_path / "eval.json"
        assert main(["eval", "--scenario", TINY, *extra, "--policies", "static-equal", "--json", str(out), "--no-progress"]) == 0
        goodput.append(json.loads(out.read_text())["policies"]["static-equal"]["goodput"])
    assert goodput[0] != goodput[1]


def test_eval_on_draws_of_a_training_family(tmp_path, capsys):
    import yaml

    config = tmp_path / "family.yaml"
    config.write_text(yaml.safe_dump({"scenario": TINY, "eval_scenario": TINY, "randomization": {"rate_scale": [0.5, 2.0]}}))
    runs = {}
    for policies in ("static-equal,paris-elsa", "paris-elsa"):
        out = tmp_path / f"{policies}.json"
        assert main(["eval", "--family", str(config), "--policies", policies, "--episodes", "2", "--seed", "7", "--json", str(out),
                     "--no-progress", "--perf-model", "toy"]) == 0
        runs[policies] = json.loads(out.read_text())
    assert runs["paris-elsa"]["scenario"] == "draws of the env-tiny family"
    # Every policy meets the same draws, whatever the other policies: episode k is the draw seeded 7 + k.
    family_goodput = runs["paris-elsa"]["policies"]["paris-elsa"]["goodput_per_episode"]
    assert runs["static-equal,paris-elsa"]["policies"]["paris-elsa"]["goodput_per_episode"] == family_goodput
    plain = tmp_path / "plain.json"
    assert main(["eval", "--scenario", TINY, "--policies", "paris-elsa", "--episodes", "2", "--seed", "7", "--json", str(plain), "--no-progress", "--perf-model", "toy"]) == 0
    assert json.loads(plain.read_text())["policies"]["paris-elsa"]["goodput_per_episode"] != family_goodput  # the draws change the load
    capsys.readouterr()
    assert main(["eval", "--family", str(config), "--scenario", TINY, "--no-progress"]) == 2
    assert "give one of --scenario, --family, --suite or --replay" in capsys.readouterr().err
    assert main(["eval", "--policies", "static-equal", "--no-progress"]) == 2


def _tiny_variant(tmp_path: Path, name: str, rate_rps: float) -> Path:
    """A copy of the tiny scenario under another name and resnet rate (trace paths stay valid)."""
    text = Path(TINY).read_text().replace("name: env-tiny", f"name: {name}").replace("rate_rps: 200", f"rate_rps: {rate_rps}")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_a_policy_that_cannot_run_a_scenario_gets_an_na_row_and_the_run_goes_on(tmp_path, capsys):
    out = tmp_path / "eval.json"
    # The shipped network is made for the default node (four tenants); the tiny node has two.
    assert main(["eval", "--scenario", TINY, "--policies", "ppo,static-equal", "--json", str(out), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert "action space does not match" in result["policies"]["ppo"]["n/a"]
    assert result["policies"]["static-equal"]["goodput"] is not None
    assert "| ppo | n/a: " in capsys.readouterr().out


def test_replay_confirms_every_recorded_goodput_and_catches_a_changed_one(tmp_path, capsys):
    scenario = _tiny_variant(tmp_path, "replayed", 300)
    out = tmp_path / "eval.json"
    assert main(["eval", "--scenario", str(scenario), "--policies", "static-equal,migrator-ilp,hindsight", "--episodes", "2",
                 "--json", str(out), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    recorded = result["trajectories"]["episodes"]
    assert set(recorded) == {"static-equal", "migrator-ilp", "hindsight"} and all(len(eps) == 2 for eps in recorded.values())
    assert len(recorded["migrator-ilp"][0]["steps"]) == 6 and result["scenario_sha256"]
    capsys.readouterr()
    assert main(["eval", "--replay", str(out)]) == 0
    assert "6 of 6 episodes reproduce their recorded Goodput" in capsys.readouterr().out
    # A wrong Goodput is a mismatch (exit 1) ...
    result["trajectories"]["episodes"]["hindsight"][1]["goodput"] += 1.0
    (tmp_path / "wrong.json").write_text(json.dumps(result))
    assert main(["eval", "--replay", str(tmp_path / "wrong.json")]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    # ... and a changed scenario file is bad input (exit 2), named with the field.
    scenario.write_text(scenario.read_text().replace("rate_rps: 100", "rate_rps: 101"))
    assert main(["eval", "--replay", str(out)]) == 2
    assert "scenario_sha256" in capsys.readouterr().err


def test_suite_runs_every_scenario_and_summarises_each_policy(tmp_path, capsys):
    low, high = _tiny_variant(tmp_path, "tiny-low", 100), _tiny_variant(tmp_path, "tiny-high", 700)
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: tiny\ndescription: two tiny nodes\nscenarios: [{low.name}, {high}]\n")
    out, plots = tmp_path / "suite.json", tmp_path / "plots"
    assert main(["eval", "--suite", str(suite), "--policies", "ppo,static-equal,static-best,hindsight", "--json", str(out),
                 "--plot-dir", str(plots), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert list(result["scenarios"]) == ["tiny-low", "tiny-high"]
    assert sorted(p.name for p in plots.iterdir()) == ["tiny-high.png", "tiny-low.png"]
    for res in result["scenarios"].values():
        table = res["policies"]
        assert res["headroom"] == table["hindsight"]["goodput"] / table["static-best"]["goodput"] >= 1.0 - 1e-12
    ratios = [res["policies"]["static-equal"]["goodput_vs_static_best"] for res in result["scenarios"].values()]
    summary = result["summary"]["static-equal"]
    assert summary["goodput_vs_static_best_geomean"] == pytest.approx((ratios[0] * ratios[1]) ** 0.5)
    assert summary["slo_attainment_high_worst"] == min(res["policies"]["static-equal"]["slo_attainment_high"] for res in result["scenarios"].values())
    assert set(result["summary"]["ppo"]["n/a"]) == {"tiny-low", "tiny-high"}
    printed = capsys.readouterr().out
    assert "### Headroom per scenario" in printed and "### Summary over 2 scenarios" in printed
    assert main(["eval", "--replay", str(out)]) == 0


@pytest.mark.parametrize("body, field", [
    ("name: s\nscenarios: [no-such-scenario]\n", "scenarios[0]"),
    ("name: s\nscenarios: []\n", "scenarios"),
    ("name: s\nscenarios: [default, default]\n", "scenarios[1]"),
    ("name: s\nscenario: [default]\n", "scenario"),
])
def test_bad_suite_files_exit_2_naming_file_and_field(tmp_path, capsys, body, field):
    suite = tmp_path / "bad.yaml"
    suite.write_text(body)
    assert main(["eval", "--suite", str(suite), "--policies", "static-equal", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(suite) in err and f"field '{field}'" in err


def test_write_json_replaces_atomically(tmp_path):
    from rlsched.agents.evaluation import write_json

    out = tmp_path / "r.json"
    write_json({"a": 1}, out)
    with pytest.raises(ValueError):
        write_json({"a": float("nan")}, out)  # NaN is not JSON: the old file survives whole
    assert json.loads(out.read_text()) == {"a": 1}


def test_rerun_hindsight_searches_the_reference_again_from_the_recorded_policies(tmp_path, capsys, monkeypatch):
    from rlsched.agents.baselines import hindsight
    from rlsched.envs.gpushare import GpuShareEnv

    low, high = _tiny_variant(tmp_path, "tiny-low", 100), _tiny_variant(tmp_path, "tiny-high", 700)
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: tiny\ndescription: two tiny nodes\nscenarios: [{low.name}, {high}]\n")
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    with monkeypatch.context() as patch:  # the search before it held the other groupings of the tenants
        patch.setattr(hindsight, "RANKED_SEEDS", 0)
        assert main(["eval", "--suite", str(suite), "--policies", "static-equal,static-best,migrator-ilp,hindsight", "--json", str(old),
                     "--no-progress"]) == 0
    before = json.loads(old.read_text())
    # --rerun-hindsight needs the result and somewhere to write the updated one.
    assert main(["eval", "--replay", str(old), "--rerun-hindsight"]) == 2
    assert "--json OUT" in capsys.readouterr().err
    without = json.loads(old.read_text())
    for res in without["scenarios"].values():
        del res["trajectories"]["episodes"]["hindsight"]
    (tmp_path / "without.json").write_text(json.dumps(without))
    assert main(["eval", "--replay", str(tmp_path / "without.json"), "--rerun-hindsight", "--json", str(new)]) == 2
    assert "trajectories.episodes" in capsys.readouterr().err and not new.exists()
    assert main(["eval", "--replay", str(old), "--rerun-hindsight", "--json", str(new), "--no-progress"]) == 0
    assert json.loads(old.read_text()) == before  # the input is kept
    after = json.loads(new.read_text())
    for name, res in after["scenarios"].items():
        table, was = res["policies"], before["scenarios"][name]["policies"]
        # The new search holds the groupings and the earlier search's trajectory as seeds, and is
        # still a bound on every recorded policy, episode by episode.
        env = GpuShareEnv(res["scenario_source"])
        env.reset(seed=0)
        groupings = len(hindsight.best_groupings(hindsight.replay_env(env), env.backend_seed, hindsight.RANKED_SEEDS))
        assert res["reports"]["hindsight"][0]["seeds"] == before["scenarios"][name]["reports"]["hindsight"][0]["seeds"] + groupings + 1
        for policy, row in table.items():
            assert row["goodput_vs_hindsight"] == pytest.approx(row["goodput"] / table["hindsight"]["goodput"])
            assert table["hindsight"]["goodput_per_episode"][0] >= row["goodput_per_episode"][0] - 1e-6
            if policy != "hindsight":  # the other policies are not run again
                assert row["goodput_per_episode"] == was[policy]["goodput_per_episode"]
                assert res["trajectories"]["episodes"][policy][0]["goodput"] == row["goodput_per_episode"][0]
        # ... and never below the earlier search.
        assert table["hindsight"]["goodput_per_episode"][0] >= was["hindsight"]["goodput_per_episode"][0] - 1e-6
        assert res["headroom"] == pytest.approx(table["hindsight"]["goodput"] / table["static-best"]["goodput"])
    ratios = [res["policies"]["migrator-ilp"]["goodput_vs_hindsight"] for res in after["scenarios"].values()]
    assert after["summary"]["migrator-ilp"]["goodput_vs_hindsight_geomean"] == pytest.approx((ratios[0] * ratios[1]) ** 0.5)
    capsys.readouterr()
    assert main(["eval", "--replay", str(new)]) == 0  # every trajectory, the new hindsight's included, reproduces
    assert "8 of 8 episodes reproduce" in capsys.readouterr().out


def test_add_policies_runs_them_on_the_recorded_episodes_and_adds_the_best_fixed_grouping_columns(tmp_path, capsys):
    low, high = _tiny_variant(tmp_path, "tiny-low", 100), _tiny_variant(tmp_path, "tiny-high", 700)
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: tiny\ndescription: two tiny nodes\nscenarios: [{low.name}, {high}]\n")
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    assert main(["eval", "--suite", str(suite), "--policies", "static-equal,static-best", "--episodes", "2", "--json", str(old),
                 "--no-progress"]) == 0
    before = json.loads(old.read_text())
    assert "vs static-best-rankings" not in capsys.readouterr().out  # a column only where it ran
    assert main(["eval", "--replay", str(old), "--add-policies", "static-best-rankings"]) == 2  # needs --json OUT
    for bad in ("static-best", "hindsight"):  # already there; a search is searched again, not added
        assert main(["eval", "--replay", str(old), "--add-policies", bad, "--json", str(new), "--no-progress"]) == 2
        assert "--add-policies" in capsys.readouterr().err and not new.exists()
    assert main(["eval", "--replay", str(old), "--add-policies", "static-best-rankings,static-best-slo", "--json", str(new),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "vs static-best-rankings" in out and "vs static-best-slo" in out
    assert json.loads(old.read_text()) == before  # the input is kept
    after = json.loads(new.read_text())
    for name, res in after["scenarios"].items():
        table, was = res["policies"], before["scenarios"][name]["policies"]
        rankings = table["static-best-rankings"]
        assert len(rankings["goodput_per_episode"]) == 2  # seeds 0 and 1, as recorded
        assert rankings["goodput"] >= table["static-best"]["goodput"] - 1e-6  # it searches a superset of static-best
        # the same search held to the high-priority SLO target: never more
        for best, held in zip(rankings["goodput_per_episode"], table["static-best-slo"]["goodput_per_episode"], strict=True):
            assert held <= best + 1e-6
        for policy, row in table.items():
            assert row["goodput_vs_static_best_rankings"] == pytest.approx(row["goodput"] / rankings["goodput"])
            assert row["goodput_vs_static_best_slo"] == pytest.approx(row["goodput"] / table["static-best-slo"]["goodput"])
            if policy not in ("static-best-rankings", "static-best-slo"):
                assert row["goodput_per_episode"] == was[policy]["goodput_per_episode"]  # not run again
        assert "static-best-rankings" in res["paired"]["policies"] or res["paired"]["reference"] == "static-best-rankings"
    ratios = [res["policies"]["static-equal"]["goodput_vs_static_best_rankings"] for res in after["scenarios"].values()]
    summary = after["summary"]["static-equal"]
    assert summary["goodput_vs_static_best_rankings_geomean"] == pytest.approx((ratios[0] * ratios[1]) ** 0.5)
    assert main(["eval", "--replay", str(new)]) == 0  # the added trajectories reproduce too
    assert "16 of 16 episodes reproduce" in capsys.readouterr().out


def test_rerun_policies_replaces_a_changed_policys_rows_and_trajectories(tmp_path, capsys):
    low = _tiny_variant(tmp_path, "tiny-low", 100)
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: tiny\ndescription: one tiny node\nscenarios: [{low}]\n")
    old, stale, new = tmp_path / "old.json", tmp_path / "stale.json", tmp_path / "new.json"
    assert main(["eval", "--suite", str(suite), "--policies", "static-equal,static-best", "--episodes", "2", "--json", str(old),
                 "--no-progress"]) == 0
    truth = json.loads(old.read_text())
    # What a result looks like after static-equal changed: its recorded rows and steps are another policy's.
    changed = json.loads(old.read_text())
    (res,) = changed["scenarios"].values()
    res["policies"]["static-equal"] = dict(res["policies"]["static-best"])
    res["trajectories"]["episodes"]["static-equal"] = res["trajectories"]["episodes"]["static-best"]
    stale.write_text(json.dumps(changed))
    assert main(["eval", "--replay", str(stale), "--rerun-policies", "hindsight", "--json", str(new), "--no-progress"]) == 2
    assert "--rerun-policies" in capsys.readouterr().err and not new.exists()
    assert main(["eval", "--replay", str(stale), "--rerun-policies", "static-equal", "--json", str(new), "--no-progress"]) == 0
    after = json.loads(new.read_text())
    (was,), (now,) = truth["scenarios"].values(), after["scenarios"].values()
    for policy in ("static-equal", "static-best"):
        assert now["policies"][policy]["goodput_per_episode"] == was["policies"][policy]["goodput_per_episode"]
    assert list(after["summary"]) == ["static-equal", "static-best"]
    summary, true_summary = after["summary"]["static-equal"], truth["summary"]["static-equal"]
    assert summary["goodput_vs_static_best_geomean"] == pytest.approx(true_summary["goodput_vs_static_best_geomean"])
    assert summary["goodput_vs_static_best_geomean"] < 0.99  # not static-best's row any more
    capsys.readouterr()
    assert main(["eval", "--replay", str(new)]) == 0
    assert "4 of 4 episodes reproduce" in capsys.readouterr().out


def test_eval_counts_the_planner_milps_stopped_at_their_time_limit(tmp_path, capsys, monkeypatch):
    # The planner's time limit is wall-clock: where it binds, the figures depend on the machine.
    # Each row counts its planner MILPs and those stopped at the limit; the table names the
    # policies with any. A policy without a planner solves none.
    import rlsched.solver.planner as planner_module

    out = tmp_path / "eval.json"
    assert main(["eval", "--scenario", TINY, "--policies", "migrator-ilp,static-equal", "--json", str(out), "--no-progress"]) == 0
    rows = json.loads(out.read_text())["policies"]
    assert rows["migrator-ilp"]["planner_milps"] > 0 and rows["migrator-ilp"]["planner_milps_time_limited"] == 0
    assert rows["static-equal"]["planner_milps"] == 0
    assert "wall-clock limit" not in capsys.readouterr().out

    monkeypatch.setitem(planner_module.PLANNER_SOLVER_OPTIONS, "time_limit", 0.0)
    assert main(["eval", "--scenario", TINY, "--policies", "migrator-ilp", "--json", str(out), "--no-progress"]) == 0
    row = json.loads(out.read_text())["policies"]["migrator-ilp"]
    assert row["planner_milps"] > 0 and row["planner_milps_time_limited"] == row["planner_milps"]
    assert f"migrator-ilp: {row['planner_milps']:,} of its {row['planner_milps']:,} planner MILPs stopped at their 0-s wall-clock limit" in capsys.readouterr().out


def test_eval_planner_time_limit_is_recorded_and_checked(tmp_path, capsys, monkeypatch):
    import rlsched.solver.planner as planner_module

    # The flag sets the limit process-wide; restored after the test.
    monkeypatch.setitem(planner_module.PLANNER_SOLVER_OPTIONS, "time_limit", planner_module.PLANNER_SOLVER_OPTIONS["time_limit"])
    out = tmp_path / "eval.json"
    assert main(["eval", "--scenario", TINY, "--policies", "migrator-ilp", "--planner-time-limit", "60", "--json", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text())["policies"]["migrator-ilp"]["planner_time_limit_s"] == 60.0
    for bad in ("0", "-1", "nan", "inf"):
        assert main(["eval", "--scenario", TINY, "--policies", "migrator-ilp", "--planner-time-limit", bad, "--no-progress"]) == 2
        assert f"--planner-time-limit: {float(bad):g} is not a positive number of seconds" in capsys.readouterr().err
