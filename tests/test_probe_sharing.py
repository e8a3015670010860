"""The sharing probe (scripts/probe_sharing.py): a CPU smoke run, its errors, and what the
recorded H100 run says about the sharing-mode model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "probe_sharing.py"
H100_RUN = ROOT / "docs" / "hardware-probes" / "h100-80gb-2026-11-27-sharing-probe.json"


def test_cpu_smoke_run_reports_every_mode_with_the_models_prediction(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--pairs", "tiny-mlp:4/tiny-mlp:16", "--seconds", "0.2",
                    "--out", str(tmp_path)], check=True, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "sharing-probe.json").read_text())
    ts, pf = report["sharing_modes"]["time_slice"], report["sharing_modes"]["priority_fill"]
    (pair,) = report["pairs"]
    assert [(r["mode"], r["load"]) for r in pair["runs"]] == [(m, load) for load in (0.25, 0.5)
                                                             for m in ("time-slice", "priority-fill", "same-priority-streams")]
    solo_ms = pair["solo"]["high_priority"]["latency_ms_mean"]
    for run in pair["runs"]:
        assert run["high_priority"]["batches"] > 0 and run["filler_rps"] > 0
        if run["mode"] == "time-slice":
            assert run["model_latency_ms"] == pytest.approx(solo_ms * 2 * (1 + ts["switch_ms"] / ts["quantum_ms"]), rel=1e-3, abs=1e-3)
        if run["mode"] == "priority-fill":
            assert run["model_latency_ms"] == pytest.approx(solo_ms * (1 + pf["overhead_frac"]), rel=1e-3, abs=1e-3)
            assert run["model_filler_rps"] == pytest.approx(pair["solo"]["filler_rps"] * (1 - run["load"]), rel=1e-3, abs=0.01)


def test_a_malformed_pair_is_named_and_exits_2(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--pairs", "resnet50:8", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "pairs" in out.stderr and "resnet50:8" in out.stderr
    assert not (tmp_path / "sharing-probe.json").exists()


def test_on_a_real_h100_time_slicing_matches_the_model_and_stream_priorities_are_not_fikit() -> None:
    """What docs/hardware-probes/README.md (2026-11-27) concludes from the recorded run."""
    report = json.loads(H100_RUN.read_text())
    assert report["device"].startswith("NVIDIA H100")
    runs = [r for pair in report["pairs"] for r in pair["runs"]]
    sliced = [r for r in runs if r["mode"] == "time-slice"]
    assert len(sliced) == 4
    assert all(0.7 <= r["latency_measured_over_model"] <= 1.2 and 0.85 <= r["filler_measured_over_model"] <= 1.0 for r in sliced)
    # The high-priority server on the highest-priority stream still waits for the filler's
    # kernels: 1.28x-2.0x its solo latency, not FIKIT's 1.05x.
    assert all(r["latency_vs_solo"] >= 1.25 for r in runs if r["mode"] == "priority-fill")
