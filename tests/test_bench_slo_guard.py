"""scripts/bench_slo_guard.py: the SLO guard's predicted late answers against the simulator's, on a tiny node."""

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.agents.baselines.base import high_priority_on_time
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.workloads.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_slo_guard.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_slo_guard", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def env():
    # Long enough for intervals after the guard's prior (SLO_HOLD_S, 30 intervals of 10 s).
    return GpuShareEnv(dataclasses.replace(load_scenario(str(ROOT / "tests" / "data" / "env_tiny.yaml")), duration_s=450))


def test_the_planners_own_run_is_measured_as_the_episode_served_it(bench, env):
    report = bench.measure(env, seed=0)
    assert list(report) == ["resnet"]  # the high-priority service only
    on_time, answered = high_priority_on_time(env)
    assert report["resnet"]["slo_attainment"] == pytest.approx(on_time / answered)
    assert 0.0 <= report["resnet"]["predicted_late_share"] <= 1.0


def test_a_placement_too_small_is_predicted_late_and_is_late(bench, env):
    reference = env.scenario.reference
    roomy = bench.measure(env, 0, reference)["resnet"]
    assert roomy["windows_predicted_beyond_allowance"] == roomy["windows_measured_beyond_allowance"] == 0.0
    resnet = reference.placements["resnet"]
    squeezed = dataclasses.replace(reference, placements={**reference.placements, "resnet": dataclasses.replace(resnet, mps_pct=5.0)})
    starved = bench.measure(env, 0, squeezed)["resnet"]
    assert starved["predicted_late_share"] > 0.5 and starved["measured_late_share"] > 0.5
    assert starved["windows_predicted_beyond_allowance"] == starved["windows_measured_beyond_allowance"] == starved["agreement"] == 1.0
    assert starved["windows_without_restart"] == 1.0  # held: nothing restarts after the first interval
    assert starved["measured_late_share_without_restart"] == starved["measured_late_share"]


def test_an_unknown_policy_in_the_eval_json_is_refused_by_name(tmp_path):
    result = tmp_path / "eval.json"
    result.write_text(json.dumps({"trajectories": {"configurations": [], "episodes": {"static-best-slo": []}}}))
    run = subprocess.run([sys.executable, str(SCRIPT), "--scenario", str(ROOT / "tests" / "data" / "env_tiny.yaml"),
                          "--fixed-from", str(result), "nope"], capture_output=True, text=True)
    assert run.returncode == 2
    assert "trajectories.episodes" in run.stderr and "nope" in run.stderr
