"""Behaviour of the calibrated performance model (packaged calibration, no raw data needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.cli.main import main
from rlsched.errors import ConfigError
from rlsched.hardware.catalog import load_gpu
from rlsched.perfmodel import CoRunner, PerformanceModel, SharingMode
from rlsched.perfmodel import calibration as cal

MODEL = PerformanceModel.load()
GPUS = ["a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "a30-24gb", "v100-16gb"]
INFERENCE = ["resnet50", "vit", "bert-base", "alexnet", "vgg19", "ssd"]


def _profiles(gpu: str) -> list[str | None]:
    spec = load_gpu(gpu)
    standard = sorted((p for p in spec.profiles.values() if p.variant == "standard"), key=lambda p: p.sm_count)
    return [p.name for p in standard] + [None]


def test_models_cover_the_issue_list() -> None:
    assert set(INFERENCE) <= set(MODEL.models())
    assert {"resnet", "transformer", "gnn", "bert"} <= set(MODEL.models())


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("model", INFERENCE)
def test_every_model_predicts_on_every_gpu_and_profile(gpu: str, model: str) -> None:
    for profile in _profiles(gpu):
        p = MODEL.predict(gpu, model, 8, profile)
        assert math.isfinite(p.latency_ms_p99) and 0.1 < p.latency_ms_mean <= p.latency_ms_p99 < 10_000
        assert p.throughput_per_s == pytest.approx(8000 / p.latency_ms_mean)


def test_unmeasured_profile_is_plausible() -> None:
    # 3g.40gb on the A100-80GB was never measured: it must fall between 2g and 7g.
    lat = {prof: MODEL.predict("a100-80gb", "resnet50", 8, prof).latency_ms_p99 for prof in ("2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")}
    assert lat["7g.80gb"] < lat["4g.40gb"] <= lat["3g.40gb"] < lat["2g.20gb"]


def test_matches_a_measurement() -> None:
    # MIGProfiler: resnet50 batch 32 P99 on 1g.10gb = 83.66 ms.
    assert MODEL.predict("a100-80gb", "resnet50", 32, "1g.10gb").latency_ms_p99 == pytest.approx(83.66, rel=0.08)


@settings(max_examples=60, deadline=None)
@given(gpu=st.sampled_from(GPUS), model=st.sampled_from(INFERENCE), batch=st.integers(1, 64),
       pct=st.floats(5, 95), more=st.floats(1, 50))
def test_more_mps_share_is_never_slower(gpu: str, model: str, batch: int, pct: float, more: float) -> None:
    low = MODEL.predict(gpu, model, batch, None, pct).latency_ms_p99
    high = MODEL.predict(gpu, model, batch, None, min(100.0, pct + more)).latency_ms_p99
    assert high <= low * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(gpu=st.sampled_from([g for g in GPUS if load_gpu(g).mig_supported]), model=st.sampled_from(INFERENCE), batch=st.integers(1, 64))
def test_more_slices_are_never_slower(gpu: str, model: str, batch: int) -> None:
    spec = load_gpu(gpu)
    profiles = [p for p in spec.profiles.values() if p.variant == "standard"]
    for a in profiles:
        for b in profiles:
            if b.sm_count >= a.sm_count and b.memory_slices >= a.memory_slices:
                assert MODEL.predict(gpu, model, batch, b.name).latency_ms_p99 <= MODEL.predict(gpu, model, batch, a.name).latency_ms_p99 * (1 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(gpu=st.sampled_from(GPUS), model=st.sampled_from(INFERENCE), pct=st.floats(5, 100),
       mode=st.sampled_from(list(SharingMode)), co=st.sampled_from(INFERENCE), co_batch=st.integers(1, 32))
def test_bigger_batch_is_never_faster(gpu: str, model: str, pct: float, mode: SharingMode, co: str, co_batch: int) -> None:
    mean, p99 = MODEL.latency_curve_ms(gpu, model, 64, None, pct, mode, (CoRunner(co, co_batch, 50.0),))
    assert np.all(np.diff(mean) >= 0) and np.all(np.diff(p99) >= 0)


def test_colocation_slows_and_modes_order() -> None:
    solo = MODEL.predict("v100-16gb", "vgg19", 8, None, 50).latency_ms_mean
    shared = MODEL.predict("v100-16gb", "vgg19", 8, None, 50, colocated=[CoRunner("resnet50", 8, 50)]).latency_ms_mean
    assert 1.0 < shared / solo < 1.3  # iGniter pairs: 3-20% slowdown
    full = MODEL.predict("v100-16gb", "vgg19", 8).latency_ms_mean
    high = MODEL.predict("v100-16gb", "vgg19", 8, mode=SharingMode.PRIORITY_FILL, colocated=[CoRunner("ssd", 8)]).latency_ms_mean
    low = MODEL.predict("v100-16gb", "vgg19", 8, mode=SharingMode.PRIORITY_FILL, colocated=[CoRunner("ssd", 8)], high_priority=False).latency_ms_mean
    sliced = MODEL.predict("v100-16gb", "vgg19", 8, mode=SharingMode.TIME_SLICE, colocated=[CoRunner("ssd", 8)]).latency_ms_mean
    assert full < high <= full * 1.05 + 1e-9 < low and full < sliced


def test_memory_and_fits() -> None:
    assert MODEL.memory_gib("a100-80gb", "resnet50", 64) > MODEL.memory_gib("a100-80gb", "resnet50", 1)
    assert not MODEL.predict("a100-40gb", "vit", 512, "1g.5gb").fits
    assert MODEL.predict("a100-40gb", "vit", 1, "7g.40gb").fits


def test_train_step_and_compute_instances() -> None:
    assert 0 < MODEL.train_step_s("a100-40gb", "resnet", 128, "7g.40gb") < MODEL.train_step_s("a100-40gb", "resnet", 128, "1g.5gb")
    whole = MODEL.predict("a100-80gb", "vit", 8, "7g.80gb").latency_ms_mean
    part = MODEL.predict("a100-80gb", "vit", 8, "7g.80gb", compute_slices=3).latency_ms_mean
    assert part > whole


def test_curve_is_cached_and_fast() -> None:
    import time
    MODEL.latency_curve_ms("a100-80gb", "vit", 64, "2g.20gb")
    start = time.perf_counter()
    for _ in range(200):
        MODEL.latency_curve_ms("a100-80gb", "vit", 64, "2g.20gb")
    assert (time.perf_counter() - start) / 200 < 1e-3


def test_bad_calibration_file_names_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    text = (cal.packaged_calibration_dir() / "igniter-v100-16gb.yaml").read_text()
    bad.write_text(text.replace("io_ms_per_sample:", "io_ms_per_sample: -1 #", 1))
    with pytest.raises(ConfigError, match=r"bad.yaml.*io_ms_per_sample"):
        cal.load(bad)


def test_cli_predict_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "--gpu", "a100-80gb", "--model", "resnet50", "--profile", "3g.40gb", "--batch", "8", "--json",
                 "--colocated", "vit:4:50"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"latency_ms_p99", "latency_ms_mean", "throughput_per_s", "memory_gib", "fits", "source", "calibrated_on",
                        "slices"} and doc["fits"] is True
    assert doc["source"] == "migprofiler-a100-80gb"


@pytest.mark.parametrize("argv", [["--profile", "9g.99gb"], ["--mps-pct", "0"], ["--colocated", "vgg19"], ["--model", "nope"]])
def test_cli_bad_values_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    base = {"--gpu": "a100-80gb", "--model": "resnet50", "--batch": "4"}
    for k, v in zip(argv[::2], argv[1::2]):
        base[k] = v
    args = ["predict"] + [x for kv in base.items() for x in kv]
    assert main(args) == 2
    assert capsys.readouterr().err.startswith("rlsched predict:")


@pytest.mark.parametrize("mode", list(SharingMode))
def test_co_runner_with_only_a_training_calibration(mode: SharingMode) -> None:
    # A retraining job (model "bert": training calibration only) sharing a GI with an
    # inference tenant slows it down instead of failing the lookup.
    alone, _ = MODEL.latency_curve_ms("a100-40gb", "resnet50", 8, "3g.20gb", 50.0, mode)
    shared, _ = MODEL.latency_curve_ms("a100-40gb", "resnet50", 8, "3g.20gb", 50.0, mode, (CoRunner("bert", 8, 50.0),))
    assert np.all(shared >= alone)
