"""scripts/probe_restart.py: a CPU smoke run (the figures that matter need a GPU)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "probe_restart.py"


def test_cpu_smoke_run_times_every_phase_of_a_fresh_process(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--models", "tiny-cnn", "--tries", "2", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "restart-probe.json").read_text())
    tiny = report["models"]["tiny-cnn"]
    assert len(tiny["runs"]) == 2 and tiny["weights_mib"] > 0
    for run in tiny["runs"]:
        phases = sum(run[k] for k in ("startup_s", "import_s", "cuda_init_s", "load_s", "to_device_s", "first_batch_s"))
        assert all(run[k] >= 0 for k in ("import_s", "load_s", "first_batch_s"))
        assert abs(run["ready_s"] - phases) < 1e-6  # the phases add up to the downtime
        assert run["page_cache_dropped"] is False  # only with --drop-page-cache
    assert tiny["ready_s_median"] <= tiny["ready_s_max"]


def test_bad_counts_exit_2() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tries", "0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--tries" in out.stderr
