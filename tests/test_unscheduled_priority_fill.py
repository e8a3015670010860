"""scripts/eval_unscheduled_priority_fill.py: a simulated node without a priority-fill scheduler."""

import importlib.util
import subprocess
import sys
from pathlib import Path

from rlsched.agents.evaluation import run_episode
from rlsched.decision import SharingMode
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.workloads.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "eval_unscheduled_priority_fill.py"
TINY = ROOT / "tests" / "data" / "env_tiny.yaml"
_spec = importlib.util.spec_from_file_location("eval_unscheduled_priority_fill", SCRIPT)
unscheduled = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(unscheduled)


def test_priority_fill_instances_run_as_time_slicing_and_the_high_priority_tenant_pays():
    scenario = load_scenario(TINY)
    normal, sliced = GpuShareEnv(scenario), unscheduled.unscheduled_env(scenario)
    fikit_normal, fikit_sliced = run_episode(normal, "fikit", 0), run_episode(sliced, "fikit", 0)
    decided = fikit_sliced.configurations[-1]
    assert SharingMode.PRIORITY_FILL in {m for gpu in decided.modes for m in gpu}  # the policy still plans priority fill
    assert SharingMode.PRIORITY_FILL not in {m for gpu in unscheduled.time_sliced(decided).modes for m in gpu}
    assert fikit_sliced.goodput < fikit_normal.goodput
    # An MPS-only policy is not affected.
    assert run_episode(unscheduled.unscheduled_env(scenario), "migrator-ilp", 0).goodput == run_episode(GpuShareEnv(scenario), "migrator-ilp", 0).goodput


def test_cli_prints_one_line_per_policy_and_names_a_bad_scenario():
    out = subprocess.run([sys.executable, str(SCRIPT), "--scenario", str(TINY), "--policies", "fikit,migrator-ilp"],
                         capture_output=True, text=True, timeout=300, check=True).stdout.splitlines()
    assert [line.split()[0] for line in out] == ["fikit", "migrator-ilp"]
    bad = subprocess.run([sys.executable, str(SCRIPT), "--scenario", "no-such-scenario"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no-such-scenario" in bad.stderr


def test_static_best_on_a_node_without_a_scheduler_keeps_an_mps_best():
    # On the tiny node the best fixed configuration is MPS only: time-sliced priority fill
    # cannot beat it, so the reference is unchanged.
    from rlsched.agents.baselines.hindsight import best_fixed_configuration

    scenario = load_scenario(TINY)
    env = GpuShareEnv(scenario)
    env.reset(seed=0)
    objective, configuration = best_fixed_configuration([(GpuShareEnv(scenario), env.backend_seed)])
    assert SharingMode.PRIORITY_FILL not in {m for gpu in configuration.modes for m in gpu}
    assert unscheduled.static_best(scenario, 0) == objective
