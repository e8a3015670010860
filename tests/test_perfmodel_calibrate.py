"""Fitting from raw data and the real-device profiler (CPU, tiny plain-torch model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.cli.main import main
from rlsched.perfmodel import PerformanceModel
from rlsched.perfmodel import calibration as cal
from rlsched.perfmodel.data import default_data_dir

HAS_DATA = (default_data_dir() / "igniter-v100-mps").is_dir()


def test_profile_on_cpu_then_fit_then_predict(tmp_path: Path) -> None:
    out = tmp_path / "prof"
    assert main(["calibrate", "profile", "--models", "tiny-mlp", "--batches", "1,2,4,8", "--device", "cpu",
                 "--iterations", "5", "--out", str(out)]) == 0
    assert (out / "latency.csv").is_file()
    calib = tmp_path / "calib"
    calib.mkdir()
    # The interference fit comes from the packaged iGniter file; the profile adds tiny-mlp.
    (calib / "igniter-v100-16gb.yaml").write_text((cal.packaged_calibration_dir() / "igniter-v100-16gb.yaml").read_text())
    assert main(["calibrate", "fit", "--source", "profile", "--gpu", "a100-80gb", "--data", str(out),
                 "--out", str(calib / "profile-a100-80gb.yaml")]) == 0
    pred = PerformanceModel.load(calib).predict("a100-80gb", "tiny-mlp", 4)
    assert pred.latency_ms_mean > 0


def test_fit_bad_data_dir_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "fit", "--source", "igniter", "--data", str(tmp_path), "--out", str(tmp_path / "x.yaml")]) == 2
    assert "v100_mps_solo_profile_flat.csv" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_DATA, reason="raw data (../shared/data/calibration) not present")
def test_refit_migprofiler_meets_acceptance(tmp_path: Path) -> None:
    from rlsched.perfmodel.sources import fit_source
    doc = fit_source("migprofiler", default_data_dir())
    vision = doc["fit_error"]["vision"]
    assert vision["cv_mape_pct"] <= 8.0 and vision["cv_mape_pct"] < vision["baseline"]["cv_mape_pct"]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_DATA, reason="raw data not present")
def test_report_meets_all_acceptance_targets() -> None:
    from rlsched.perfmodel.commands import report_rows
    rows = {(r["source"], r["data"]): r for r in report_rows(default_data_dir())}
    assert rows[("migprofiler", "vision")]["model_cv_mape_pct"] <= 8.0
    assert rows[("igniter", "solo")]["model_cv_mape_pct"] <= 5.0
    assert rows[("igniter", "pairs")]["model_cv_mape_pct"] <= 12.0
    for key in [("migprofiler", "vision"), ("igniter", "solo"), ("igniter", "pairs")]:
        assert rows[key]["model_cv_mape_pct"] < rows[key]["baseline_cv_mape_pct"]
