"""Bundled scenarios, scenario-file errors, --trace overrides and `rlsched simulate`."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rlsched.cli.main import main
from rlsched.errors import ConfigError
from rlsched.perfmodel import PerformanceModel
from rlsched.simulator.node import NodeSimulator
from rlsched.simulator.run import run_fixed
from rlsched.workloads.scenario import load_scenario, scenarios_dir, with_trace_overrides
from rlsched.workloads.tenants import ContinualLearningJob, InferenceTenant

BUNDLED = sorted(p.stem for p in scenarios_dir().glob("*.yaml"))
TRACES = Path(__file__).resolve().parents[1] / "configs" / "traces"


@pytest.fixture(scope="module")
def perf():
    return PerformanceModel.load()


def test_the_six_kinds_and_the_default_are_bundled():
    assert {"default", "steady", "bursty", "diurnal", "cl-drift", "mixed-priorities", "best-effort-tuning"} <= set(BUNDLED)


def test_default_scenario_meets_its_specification():
    s = load_scenario("default")
    assert (s.gpu, s.gpu_count, s.decision_interval_s) == ("a100-40gb", 1, 10)
    assert len(s.inference_tenants()) == 4
    assert s.total_mean_rate_rps() >= 1000


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_scenario_runs_on_the_calibrated_model_and_conserves(name, perf):
    s = load_scenario(name)
    assert s.reference is not None and not s.reference.problems([t.name for t in s.inference_tenants()])
    result = run_fixed(s, perf, s.reference, seed=0, duration_s=60)
    for tenant, entry in result["tenants"].items():
        if entry["kind"] == "inference":
            assert entry["conservation_ok"], tenant
            # Requests arrive wherever the arrivals have a rate (a trace may start idle).
            assert (entry["arrived"] > 0) == (s.tenant(tenant).arrivals.window_rate_rps(0.0, 60.0) > 0), tenant
    if any(isinstance(t, ContinualLearningJob) for t in s.tenants):
        assert any(e.get("training_samples", 0) > 0 for e in result["tenants"].values())


def test_trace_override_replaces_the_arrivals():
    s = load_scenario("steady")
    replaced = with_trace_overrides(s, [f"bert={TRACES / 'azure_llm_conv_timestamps.csv'}:10"])
    bert = replaced.tenant("bert")
    assert isinstance(bert, InferenceTenant) and bert.arrivals.mean_rate_rps() == pytest.approx(54, rel=0.05)
    assert s.tenant("bert").arrivals.mean_rate_rps() == 150  # the original is untouched
    with pytest.raises(ConfigError, match="not an inference tenant"):
        with_trace_overrides(s, [f"nobody={TRACES / 'azure_llm_conv_timestamps.csv'}"])
    with pytest.raises(ConfigError, match="rate scale"):
        with_trace_overrides(s, [f"bert={TRACES / 'azure_llm_conv_timestamps.csv'}:-2"])


def test_trace_override_time_warp_compresses_a_rate_series():
    # FILE:SCALE:WARP: 48 trace seconds per simulated second put two days of 10-minute
    # windows into the hour; without WARP the hour replays the first six windows.
    s = load_scenario("steady")
    file = TRACES / "servegen_m_large_rate_10min.csv"
    plain = with_trace_overrides(s, [f"bert={file}:2"]).tenant("bert").arrivals
    warped = with_trace_overrides(s, [f"bert={file}:2:48"]).tenant("bert").arrivals
    assert plain.time_warp == 1.0 and warped.time_warp == 48.0 and warped.rate_scale == plain.rate_scale == 2.0
    rng = np.random.default_rng(0)
    hourly = [len(warped.sample(t, t + 60.0, rng)) for t in range(0, 3600, 60)]
    assert max(hourly) > 2 * min(hourly)  # day and night within the hour
    with pytest.raises(ConfigError, match="time warp"):
        with_trace_overrides(s, [f"bert={file}:2:0"])


GOOD = """
name: t
gpu: a100-40gb
duration_s: 60
decision_interval_s: 10
tenants:
  - {name: a, model: resnet50, slo_ms: 50, arrivals: {kind: poisson, rate_rps: 100}}
"""


@pytest.mark.parametrize(
    ("old", "new", "field", "value"),
    [
        ("rate_rps: 100", "rate_rps: -5", "tenants[0].arrivals.rate_rps", -5.0),
        ("kind: poisson", "kind: fractal", "tenants[0].arrivals.kind", "fractal"),
        ("slo_ms: 50", "slo_ms: fast", "tenants[0].slo_ms", "fast"),
        ("gpu: a100-40gb", "gpu: a100-41gb", "gpu", "a100-41gb"),
        ("duration_s: 60", "duration_s: 60\nbogus: 1", "bogus", 1),
        ("{kind: poisson, rate_rps: 100}", "{kind: trace, file: missing.csv}", "tenants[0].arrivals.file", "missing.csv"),
        ("slo_ms: 50,", "slo_ms: 50, priority: urgent,", "tenants[0].priority", "urgent"),
        ("slo_ms: 50,", "slo_ms: 50, queue_timeout_ms: 0,", "tenants[0].queue_timeout_ms", 0),
    ],
)
def test_bad_scenario_names_file_field_and_value(tmp_path, old, new, field, value):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace(old, new))
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert (info.value.field, info.value.value) == (field, value)
    assert str(path) in str(info.value)


def test_make_before_break_is_off_by_default_and_switchable(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(GOOD)
    assert load_scenario(path).make_before_break is False
    path.write_text(GOOD + "reconfiguration: {make_before_break: true}\n")
    assert load_scenario(path).make_before_break is True
    path.write_text(GOOD + "reconfiguration: {make_before_break: maybe}\n")
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert (info.value.field, info.value.value) == ("reconfiguration.make_before_break", "maybe")


def test_bad_reference_layout_is_reported(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD + 'reference: {layouts: ["2g@6"], placements: {a: {instance: 0}}}\n')
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert info.value.field == "reference.placements" and "start slot 6" in str(info.value)


def test_bad_trace_file_in_scenario_reports_the_trace(tmp_path):
    (tmp_path / "rates.csv").write_text("time_s,rate_rps\n0,5\n10,lots\n")
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("{kind: poisson, rate_rps: 100}", "{kind: trace, file: rates.csv}"))
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert info.value.field == "rate_rps[line 3]" and info.value.value == "lots" and "rates.csv" in info.value.source


def test_cli_simulate_json_reports_every_tenant(capsys):
    code = main(["simulate", "--scenario", "default", "--duration-s", "30", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["tenants"]) == {"resnet", "vgg", "bert", "alexnet"}
    for entry in result["tenants"].values():
        assert {"arrived", "completed", "dropped", "queued_at_end", "slo_attainment", "latency_ms_p50", "latency_ms_p99", "goodput"} <= set(entry)
        assert entry["arrived"] == entry["completed"] + entry["dropped"] + entry["queued_at_end"]


def test_cli_simulate_with_layout_assign_and_trace(capsys):
    code = main(["simulate", "--scenario", "default", "--layout", "3g@0,2g@4,1g@6", "--assign", "resnet=0", "--assign", "vgg=0",
                 "--assign", "bert=1", "--assign", "alexnet=2", "--mps", "resnet=60", "--mps", "vgg=40", "--batch", "bert=8",
                 "--trace", f"alexnet={TRACES / 'servegen_m_large_rate_10min.csv'}:0.5", "--duration-s", "20", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["layouts"] == ["3g.20gb@0,2g.10gb@4,1g.5gb@6"]


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--scenario", "no-such-scenario"],
        ["simulate", "--scenario", "default", "--layout", "3g@0", "--assign", "resnet=5"],
        ["simulate", "--scenario", "default", "--layout", "9g@0", "--assign", "resnet=0"],
        ["simulate", "--scenario", "default", "--trace", "resnet=/no/such/file.csv"],
        ["simulate", "--scenario", "default", "--assign", "resnet=0"],
    ],
)
def test_cli_simulate_bad_input_exits_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlsched simulate:") and err.count("\n") == 1


def test_observation_is_ready_for_a_policy(perf):
    s = load_scenario("cl-drift")
    sim = NodeSimulator(s, perf, seed=0)
    sim.step(s.reference)
    obs = sim.observation()
    assert obs["resnet"]["queue_length"] >= 0 and 0 <= obs["resnet"]["accuracy"] <= 1
    assert "progress" in obs["retrain-resnet"]


def test_cli_bad_scenario_file_exits_2_naming_file_field_and_value(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("rate_rps: 100", "rate_rps: many"))
    assert main(["simulate", "--scenario", str(path), "--layout", "7g@0", "--assign", "a=0"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "tenants[0].arrivals.rate_rps" in err and "'many'" in err


WINDOWED = GOOD + """  - {name: cl, kind: continual-learning, serves: a, model: resnet50, ekya: {b0: 0.1, b1: 2, b2: 0.05}, samples_per_unit: 100,
     drift_window_s: 30, active: [{from_s: 50}]}
  - {name: be, kind: best-effort, model: resnet50, active: [{from_s: 0, until_s: 10}, {from_s: 10, until_s: 20.5}, {from_s: 40, until_s: 70}]}
"""


def test_activity_windows_are_read_for_every_kind_of_tenant(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(WINDOWED.replace("rate_rps: 100}", "rate_rps: 100}, active: [{from_s: 20, until_s: 40}]"))
    s = load_scenario(path)
    assert s.tenant("a").active_windows_s == ((20.0, 40.0),)
    # A job may run outside its served tenant's windows; until_s defaults to the episode's end.
    assert s.tenant("cl").active_windows_s == ((50.0, math.inf),)
    be = s.tenant("be")
    assert be.active_windows_s == ((0.0, 10.0), (10.0, 20.5), (40.0, 70.0))
    assert (be.is_active(10.0), be.is_active(20.5), be.is_active(39.9), be.is_active(40.0)) == (True, False, False, True)
    assert be.active_seconds(0.0, 60.0) == 40.5 and be.active_seconds(15.0, 45.0) == 10.5
    assert be.activations_s(0.0, 60.0) == [40.0]  # 10 s continues the first window; 0 s is the start
    path.write_text(GOOD)
    assert load_scenario(path).tenant("a").active_windows_s == () and load_scenario(path).tenant("a").is_active(1e9)


@pytest.mark.parametrize(
    ("active", "field", "value", "reason"),
    [
        ("[{from_s: soon}]", "tenants[1].active[0].from_s", "soon", "expected float"),
        ("[{from_s: -5}]", "tenants[1].active[0].from_s", -5.0, ">= 0"),
        ("[{from_s: 10, until_s: 10}]", "tenants[1].active[0].until_s", 10.0, "active for zero seconds"),
        ("[{from_s: 10, until_s: 5}]", "tenants[1].active[0].until_s", 5.0, "active for zero seconds"),
        ("[{from_s: 0, until_s: 20}, {from_s: 15, until_s: 30}]", "tenants[1].active[1].from_s", 15.0, "overlapping activity windows"),
        ("[{from_s: 30, until_s: 40}, {from_s: 0, until_s: 10}]", "tenants[1].active[1].from_s", 0.0, "sorted"),
        ("[{from_s: 60}]", "tenants[1].active[0].from_s", 60.0, "never active"),
        ("[{from_s: 0, to_s: 10}]", "tenants[1].active[0].to_s", 10, "unknown field"),
        ("[]", "tenants[1].active", [], "never be active"),
        ("{from_s: 0}", "tenants[1].active", {"from_s": 0}, "expected list"),
    ],
)
def test_bad_activity_window_names_file_field_and_value(tmp_path, capsys, active, field, value, reason):
    path = tmp_path / "bad.yaml"
    path.write_text(WINDOWED.replace("active: [{from_s: 50}]", f"active: {active}"))
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert (info.value.field, info.value.value) == (field, value) and reason in str(info.value) and str(path) in str(info.value)
    assert main(["simulate", "--scenario", str(path), "--layout", "7g@0", "--assign", "a=0"]) == 2
    assert field in capsys.readouterr().err
