"""rlsched plan: the JSON contract, verification-driven repair, bad input, mig-parted export."""

from __future__ import annotations

import json

import pytest
import yaml

from rlsched.cli.main import EXIT_BAD_INPUT, main
from rlsched.hardware import parse_layout, validate_layout
from rlsched.perfmodel import PerformanceModel
from rlsched.solver import capacity_verify
from rlsched.solver.capacity import OptionTable, ServiceSpec, pattern_feasible, plan_capacity, plan_igniter, request_p99_ms

TENANTS = ["--tenant", "web:resnet50:40:800", "--tenant", "img:vgg19:60:300", "--tenant", "tag:alexnet:15:1500"]


@pytest.fixture(scope="module")
def perf() -> PerformanceModel:
    return PerformanceModel.load()


def test_json_contract_and_export(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["plan", "--gpu", "a100-40gb", *TENANTS, "--json", "-o", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpu_type"] == "a100-40gb" and doc["gpus"] == len(doc["gpu_plans"]) >= 1
    names = []
    for g, gpu_plan in enumerate(doc["gpu_plans"]):
        layout = parse_layout(gpu_plan["layout"], "a100-40gb")
        validate_layout(layout)
        for t in gpu_plan["tenants"]:
            assert set(t) == {"name", "model", "instance", "mps_pct", "batch", "predicted_latency_ms_p99", "throughput_rps"}
            assert t["instance"] in gpu_plan["layout"].split(",")
            names.append(t["name"])
        shares = {}
        for t in gpu_plan["tenants"]:
            shares[t["instance"]] = shares.get(t["instance"], 0.0) + t["mps_pct"]
        assert all(s <= 100.0 + 1e-9 for s in shares.values())
        # One mig-parted config per GPU, with that GPU's profile counts.
        cfg = yaml.safe_load((out / f"mig-parted-gpu{g}.yaml").read_text())
        entry = cfg["mig-configs"][f"rlsched-plan-gpu{g}"][0]
        assert entry["devices"] == [g] and entry["mig-devices"] == dict(layout.profile_counts())
    assert sorted(names) == ["img", "tag", "web"]
    slo = {"web": 40, "img": 60, "tag": 15}
    assert all(t["predicted_latency_ms_p99"] <= slo[t["name"]] for g in doc["gpu_plans"] for t in g["tenants"])
    # The scenario file is one `rlsched simulate` accepts.
    assert main(["simulate", "--scenario", str(out / "scenario.yaml"), "--duration-s", "10", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["gpu_count"] == doc["gpus"] and set(sim["tenants"]) == {"web", "img", "tag"}


def test_verify_reports_attainment(capsys):
    assert main(["plan", "--gpu", "v100-16gb", "--tenant", "a:alexnet:20:500", "--tenant", "b:resnet50:60:200", "--verify",
                 "--verify-duration-s", "20", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpu_plans"][0]["layout"] == ""
    assert set(doc["verified"]["slo_attainment"]) == {"a", "b"} and doc["verified"]["passed"]
    assert all(v >= 0.99 for v in doc["verified"]["slo_attainment"].values())


def test_gpu_any_compares_types(capsys):
    assert main(["plan", "--gpu", "any", "--tenant", "a:alexnet:20:500", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    types = {c["gpu_type"] for c in doc["comparison"]}
    assert {"a100-40gb", "h100-80gb", "v100-16gb"} <= types
    priced = [c for c in doc["comparison"] if c["usd_per_hour"] is not None]
    assert doc["usd_per_hour"] == min(c["usd_per_hour"] for c in priced)


@pytest.mark.parametrize("tenant, words", [
    ("x:nosuchmodel:50:10", ["x.model", "nosuchmodel"]),
    ("x:resnet50:0:10", ["x.slo_ms", "0.0"]),
    ("x:resnet50:50:-3", ["x.rate_rps", "-3.0"]),
    ("x:resnet50:1:10", ["x.slo_ms", "least latency"]),
    ("x:resnet50:50", ["NAME:MODEL:SLO_MS:RATE_RPS"]),
])
def test_bad_tenant_exits_2(tenant, words, capsys):
    assert main(["plan", "--gpu", "a100-40gb", "--tenant", tenant]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_unknown_gpu_and_bad_file_exit_2(tmp_path, capsys):
    assert main(["plan", "--gpu", "nosuchgpu", "--tenant", "a:alexnet:20:5"]) == EXIT_BAD_INPUT
    assert "nosuchgpu" in capsys.readouterr().err
    bad = tmp_path / "t.yaml"
    bad.write_text("tenants:\n  - {name: a, model: alexnet, slo_ms: fast, rate_rps: 5}\n")
    assert main(["plan", "--gpu", "a100-40gb", "--tenants", str(bad)]) == EXIT_BAD_INPUT
    assert "tenants[0].slo_ms" in capsys.readouterr().err


def test_plan_respects_patterns_and_beats_no_sharing(perf):
    services = [ServiceSpec(f"s{i}", m, slo, rate) for i, (m, slo, rate) in
                enumerate([("alexnet", 15, 300), ("resnet50", 40, 100), ("vgg19", 60, 50), ("bert-base", 80, 60), ("alexnet", 20, 200)])]
    table = OptionTable("a100-40gb", perf)
    plan = plan_capacity(services, "a100-40gb", perf, table)
    assert plan.gpus == 1 and plan.lower_bound_gpus in (None, 1)  # light services share one GPU (bound: None if the budget ran out)
    assert all(s.predicted_latency_ms_p99 <= spec.slo_ms for s, spec in zip(plan.services, services))
    greedy = plan_igniter(services, "a100-40gb", perf, table)
    assert greedy.method == "igniter" and all(len(layout) == 1 for layout in greedy.layouts)


def test_request_p99_grows_with_rate_and_overflows():
    mean = [2.0 + b for b in range(8)]
    p99 = [1.1 * m for m in mean]
    low, high = request_p99_ms(mean, p99, 10.0), request_p99_ms(mean, p99, 200.0)
    assert low < high < float("inf")
    assert request_p99_ms(mean, p99, 5000.0) == float("inf")


def test_pattern_feasibility_checks_interference(perf):
    table = OptionTable("v100-16gb", perf)
    a = table.options(0, ServiceSpec("a", "vgg19", 30, 100))
    b = table.options(1, ServiceSpec("b", "alexnet", 10, 500))
    least_a, least_b = min(a, key=lambda o: o.mps_pct), min(b, key=lambda o: o.mps_pct)
    assert pattern_feasible([least_a], table.gi_memory_gib(None))
    tight = [o for o in a if o.max_pressure < least_b.pressure]
    if tight:
        assert not pattern_feasible([tight[0], least_b], table.gi_memory_gib(None))


def test_failed_verification_is_repaired(perf, monkeypatch):
    """A replay that misses the target makes the planner give share, then plan for more."""
    services = [ServiceSpec("a", "alexnet", 20, 400), ServiceSpec("b", "resnet50", 60, 150)]
    table = OptionTable("v100-16gb", perf)
    calls = []
    real = capacity_verify.verify

    def strict_first(plan, *args, **kwargs):
        check = real(plan, *args, **kwargs)
        calls.append(plan.gpus)
        if len(calls) <= 2:  # pretend the first two replays failed for "a"
            check.slo_attainment["a"] = 0.5
            check.passed = False
        return check

    monkeypatch.setattr(capacity_verify, "verify", strict_first)
    planned = []

    def planner(s):
        planned.append({x.name: x.rate_rps for x in s})
        return plan_capacity(s, "v100-16gb", perf, table)

    plan, check, repairs = capacity_verify.plan_verified(services, planner, table, perf, duration_s=10.0)
    assert check.passed and len(repairs) == 2
    assert repairs[1]["action"].startswith("re-planned") and planned[-1]["a"] > 400 and planned[-1]["b"] == 150
    assert any("repair" in n for n in plan.notes)


def test_json_on_standard_output_is_not_preceded_by_the_solver_banner():
    """HiGHS prints a banner on the process's standard output (file descriptor 1) when the
    first solver is created; a subprocess sees exactly what a user's pipe would."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "rlsched.cli.main", "plan", "--gpu", "a100-40gb", "--tenant", "web:resnet50:40:300", "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["gpus"] == 1
