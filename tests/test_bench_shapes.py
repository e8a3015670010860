"""scripts/bench_shapes.py: random node shapes outside the repository, every policy scored on each."""

import importlib.util
import random
import sys
from pathlib import Path

import pytest

from rlsched.workloads.scenario import load_scenario

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_shapes.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_shapes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_drawn_shape_is_a_valid_scenario_and_the_draw_covers_the_family(bench, tmp_path):
    import yaml

    rng = random.Random(0)
    gpus, counts = set(), set()
    for index in range(40):
        path = tmp_path / f"shape-{index}.yaml"
        path.write_text(yaml.safe_dump(bench.draw_shape(index, rng, 4, 120.0)))
        scenario = load_scenario(path)
        gpus.add(scenario.gpu)
        counts.add(scenario.gpu_count)
        assert 1 <= len(scenario.inference_tenants()) <= 4 * scenario.gpu_count + 2
    assert gpus == set(bench.GPUS) and counts == {1, 2, 3, 4}


def test_a_failing_policy_is_reported_and_the_exit_status_says_so(bench, tmp_path, capsys):
    args = ["--shapes", "1", "--max-gpus", "1", "--duration-s", "20", "--policies", "static-equal,no-such-policy", "--out", str(tmp_path)]
    assert bench.main(args) == 1
    out = capsys.readouterr().out
    assert "| shape-0.yaml | a30-24gb x1 |" in out and "failed" in out
    assert "FAILED shape-0.yaml no-such-policy" in out
    assert (tmp_path / "shape-0.yaml").is_file()
    assert bench.relative(-50.0, -100.0) == pytest.approx(1.5) and bench.relative(50.0, 100.0) == pytest.approx(0.5)


def test_a_policy_losing_goodput_is_counted_apart_from_the_geometric_mean(bench, tmp_path, capsys, monkeypatch):
    from types import SimpleNamespace

    goodput = {"static-equal": 100.0, "static-best": -20.0, "migrator-ilp": 50.0}

    def episode(env, name, seed):
        return SimpleNamespace(goodput=goodput[name], on_time_high=0, decided_high=0, decision_ms=[1.0])

    monkeypatch.setattr(bench, "run_episode", episode)
    args = ["--shapes", "2", "--max-gpus", "1", "--duration-s", "20", "--reference", "static-equal",
            "--policies", "static-best,migrator-ilp", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "static-best: geomean x static-equal none over 0 shapes" in out and "2 at or below 0; worst -0.200" in out
    assert "migrator-ilp: geomean x static-equal 0.500 over 2 shapes" in out and "0 at or below 0; worst 0.500" in out
