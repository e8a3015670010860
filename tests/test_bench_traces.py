"""scripts/bench_traces.py: policies on replayed traces against a reference, on a tiny node."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_traces.py"
TINY = ROOT / "tests" / "data" / "env_tiny.yaml"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_traces", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


def write_sets(tmp_path: Path, traces: str) -> Path:
    (tmp_path / "rates.csv").write_text("time_s,rate_rps\n0,100\n30,300\n")  # mean 200 req/s over its minute
    sets = tmp_path / "sets.yaml"
    sets.write_text(f"sets:\n  tiny:\n    scenario: {TINY}\n    tenant: resnet\n    traces:\n{traces}")
    return sets


def test_each_policy_is_scored_against_the_reference_on_every_trace_and_episodes_are_cached(bench, tmp_path):
    sets = write_sets(tmp_path, "      - {name: doubled, file: rates.csv, scale: 2}\n"
                                "      - {name: at-150, file: rates.csv, mean_rps: 150}\n")
    trace_set = bench.load_set(sets, "tiny", tmp_path)
    assert [t.scale for t in trace_set.traces] == [2.0, pytest.approx(0.75)]
    out, table = tmp_path / "runs", tmp_path / "table.json"
    args = ["--set", "tiny", "--sets-file", str(sets), "--policies", "static-equal", "--reference", "static-best",
            "--jobs", "2", "--out", str(out), "--json", str(table)]
    assert bench.main(args) == 0
    result = json.loads(table.read_text())
    assert [row["trace"] for row in result["traces"]] == ["doubled", "at-150"]
    for row in result["traces"]:
        policy = json.loads((out / "static-equal" / f"{row['trace']}-seed0.json").read_text())["policies"]["static-equal"]
        reference = json.loads((out / "static-best" / f"{row['trace']}-seed0.json").read_text())["policies"]["static-best"]
        assert row["static-equal"]["ratio"] == pytest.approx(policy["goodput"] / reference["goodput"])
        assert row["static-equal"]["met"] == (row["static-equal"]["ratio"] >= 0.98 and policy["slo_attainment_high"] >= 0.99)
        assert row["reference"]["reconfigurations"] == reference["reconfigurations"]
    # Reconfigurations are summed over the set, the policy's and the reference's.
    assert result["policies"]["static-equal"]["reconfigurations"] == sum(r["static-equal"]["reconfigurations"] for r in result["traces"])
    assert result["reference_reconfigurations"] == sum(r["reference"]["reconfigurations"] for r in result["traces"])
    # A second run takes every episode from the cache: the files are not rewritten.
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.json")}
    assert len(stamps) == 4
    assert bench.main(args) == 0
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.json")} == stamps


@pytest.mark.parametrize("entry, field", [
    ("{name: a, file: rates.csv, scale: 2, mean_rps: 100}", "sets.tiny.traces[0].scale"),
    ("{name: a, file: missing.csv, scale: 2}", "sets.tiny.traces[0].file"),
    ("{name: a, file: rates.csv, scale: -1}", "sets.tiny.traces[0].scale"),
])
def test_a_bad_trace_entry_is_refused_with_file_and_field(tmp_path, entry, field):
    sets = write_sets(tmp_path, f"      - {entry}\n")
    run = subprocess.run([sys.executable, str(SCRIPT), "--set", "tiny", "--sets-file", str(sets), "--policies", "static-equal",
                          "--out", str(tmp_path / "runs")], capture_output=True, text=True)
    assert run.returncode == 2
    assert str(sets) in run.stderr and field in run.stderr
    assert not (tmp_path / "runs").exists()


def test_the_geometric_mean_leaves_out_ratios_without_a_logarithm(bench):
    # None: the reference lost Goodput; -1: the policy did. Neither has a logarithm.
    mean, se = bench.summary([2.0, None, -1.0, 0.5])
    assert mean == pytest.approx(1.0)
    assert se == pytest.approx(math.log(2.0))  # sample SD of (ln 2, -ln 2) is sqrt(2) ln 2, over sqrt(2)
