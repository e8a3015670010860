"""Smoke test of the simulator benchmark (tiny budget); the speed figure itself is a slow check."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_sim.py"


def bench(steps: int) -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), "--steps", str(steps), "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def test_bench_reports_the_figures():
    figures = bench(20)
    assert {"perf/steps_per_s", "perf/simulated_s_per_wall_s", "baseline/arrival_generation_steps_per_s"} <= set(figures)
    assert figures["requests_per_step"] > 5000  # request level: ~10,000 requests per 10 s step


@pytest.mark.slow
def test_default_scenario_reaches_1000_steps_per_s():
    assert bench(3000)["perf/steps_per_s"] >= 1000
