"""A node without a priority-fill scheduler (``Scenario.priority_fill_scheduler`` off), as a
real rlsched node is: its priority-fill instances time-slice, and the planners are told."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.agents.evaluation import run_episode
from rlsched.decision import SharingMode
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.simulator.node import NodeSimulator
from rlsched.envs.backends import performance_model
from rlsched.workloads.scenario import load_scenario, without_priority_fill_scheduler

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "env_tiny.yaml"


def _one_gi_priority_fill(scenario):
    """Both tenants in one 7g GI, resnet (high priority) first, in priority fill."""
    fikit = GpuShareEnv(scenario)
    fikit.reset(seed=0)
    from rlsched.agents.baselines.fikit import Fikit

    policy = Fikit()
    policy.reset(fikit)
    return policy.configuration


def _episode(scenario, configuration, seed=0):
    node = NodeSimulator(scenario, performance_model("calibrated"), seed=seed)
    node.reset(seed, configuration)
    results = [node.step(configuration) for _ in range(scenario.steps)]
    return node.totals.total, results


def test_a_priority_fill_instance_time_slices_on_a_node_without_a_scheduler(tmp_path):
    # At 800 and 300 req/s, one GI serves both only if resnet keeps its solo latency.
    busy = tmp_path / "busy.yaml"
    busy.write_text(TINY.read_text().replace("rate_rps: 200", "rate_rps: 800").replace("rate_rps: 100", "rate_rps: 300"))
    scenario = load_scenario(busy)
    unscheduled = without_priority_fill_scheduler(scenario)
    filled = _one_gi_priority_fill(scenario)
    assert filled.uses_priority_fill()
    sliced = filled.priority_fill_time_sliced()
    assert not sliced.uses_priority_fill() and SharingMode.TIME_SLICE in sliced.modes[0]
    assert sliced.placements == filled.placements and sliced.layouts == filled.layouts
    with_scheduler, _ = _episode(scenario, filled)
    without, _ = _episode(unscheduled, filled)
    time_slicing, _ = _episode(scenario, sliced)
    assert without == time_slicing  # exactly what time slicing earns, same requests
    assert without < with_scheduler  # the high-priority tenant loses its solo latency


def test_planners_are_told_and_an_mps_only_policy_is_not_affected():
    scenario = load_scenario(TINY)
    unscheduled = without_priority_fill_scheduler(scenario)
    pf = run_episode(GpuShareEnv(unscheduled), "migrator-pf", 0)
    assert not any(c.uses_priority_fill() for c in pf.configurations)
    assert run_episode(GpuShareEnv(unscheduled), "migrator-ilp", 0).goodput == run_episode(GpuShareEnv(scenario), "migrator-ilp", 0).goodput


def test_the_scenario_file_declares_it_and_a_bad_value_names_the_field(tmp_path):
    text = TINY.read_text()
    good = tmp_path / "node.yaml"
    good.write_text(text + "priority_fill_scheduler: false\n")
    assert load_scenario(TINY).priority_fill_scheduler and not load_scenario(good).priority_fill_scheduler
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "priority_fill_scheduler: maybe\n")
    with pytest.raises(ConfigError, match="priority_fill_scheduler"):
        load_scenario(bad)


def test_eval_records_the_node_and_its_replay_reproduces(tmp_path):
    out = tmp_path / "eval.json"
    rlsched = [sys.executable, "-m", "rlsched.cli.main"]
    subprocess.run([*rlsched, "eval", "--scenario", str(TINY), "--policies", "fikit,static-best", "--no-priority-fill-scheduler",
                    "--json", str(out), "--no-progress"], check=True, capture_output=True, text=True, timeout=600, cwd=ROOT)
    result = json.loads(out.read_text())
    assert result["priority_fill_scheduler"] is False
    # fikit's recorded Goodput is what its configurations earn time-sliced, so the replay
    # reproduces it only on the recorded node.
    fikit_there = run_episode(GpuShareEnv(without_priority_fill_scheduler(load_scenario(TINY))), "fikit", 0).goodput
    assert result["policies"]["fikit"]["goodput"] == pytest.approx(fikit_there)
    assert run_episode(GpuShareEnv(load_scenario(TINY)), "fikit", 0).goodput > fikit_there
    replay = subprocess.run([*rlsched, "eval", "--replay", str(out), "--no-progress"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    family = subprocess.run([*rlsched, "eval", "--family", "configs/train/ppo_default.yaml", "--no-priority-fill-scheduler"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert family.returncode != 0 and "--no-priority-fill-scheduler" in family.stderr
