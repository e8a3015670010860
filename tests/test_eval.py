"""rlsched eval: the table, the JSON metrics and the plot."""

from __future__ import annotations

import json
from pathlib import Path

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
    # The paired comparison: against the best non-oracle policy, from the per-episode Goodputs.
    paired = result["paired"]
    rows = {name: m for name, m in result["policies"].items() if name != "oracle"}
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
    assert "give --scenario or --family" in capsys.readouterr().err
    assert main(["eval", "--policies", "static-equal", "--no-progress"]) == 2
