"""Arrival processes and trace readers: rates, burstiness, replay, scaling, seeding, bad files."""

from pathlib import Path

import numpy as np
import pytest

from rlsched.errors import ConfigError
from rlsched.workloads.arrivals import (
    MmppArrivals,
    PoissonArrivals,
    RateSeriesArrivals,
    TimestampArrivals,
    diurnal_arrivals,
    piecewise_poisson,
)
from rlsched.workloads.traces import detect_format, load_trace

TRACES = Path(__file__).resolve().parents[1] / "configs" / "traces"


def run(process, seconds=600.0, step_s=10.0, seed=0):
    """All arrivals of ``seconds``, drawn step by step, checking order and bounds."""
    rng = np.random.default_rng(seed)
    process.reset(rng)
    parts = []
    for k in range(int(seconds / step_s)):
        a, b = k * step_s, (k + 1) * step_s
        times = process.sample(a, b, rng)
        assert np.all(np.diff(times) >= 0), "arrivals must be sorted"
        assert times.size == 0 or (times[0] >= a and times[-1] < b), "arrivals must fall in the interval"
        parts.append(times)
    return np.concatenate(parts)


def test_poisson_rate_and_exponential_gaps():
    times = run(PoissonArrivals(200.0), seconds=500)
    assert times.size / 500 == pytest.approx(200, rel=0.02)
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)  # exponential: CV 1


def test_same_seed_same_arrivals_other_seed_differs():
    a = run(MmppArrivals([50, 300], [20, 5]), seconds=200, seed=3)
    b = run(MmppArrivals([50, 300], [20, 5]), seconds=200, seed=3)
    c = run(MmppArrivals([50, 300], [20, 5]), seconds=200, seed=4)
    assert np.array_equal(a, b)
    assert a.size != c.size or not np.array_equal(a, c)


def test_piecewise_rates_are_respected():
    rng = np.random.default_rng(1)
    times = piecewise_poisson(np.array([0.0, 100.0, 200.0]), np.array([10.0, 100.0]), rng)
    assert np.sum(times < 100) == pytest.approx(1000, rel=0.1)
    assert np.sum(times >= 100) == pytest.approx(10000, rel=0.05)


def test_mmpp_is_bursty_with_the_stated_mean():
    process = MmppArrivals([50.0, 500.0], [40.0, 10.0])
    times = run(process, seconds=20000)
    assert times.size / 20000 == pytest.approx(process.mean_rate_rps(), rel=0.1)
    counts = np.histogram(times, bins=np.arange(0, 20001, 1.0))[0]
    assert counts.var() / counts.mean() > 5  # a Poisson process would give 1


def test_diurnal_peak_and_trough():
    process = diurnal_arrivals(100.0, amplitude=0.8, period_s=1000.0, resolution_s=10.0)
    times = run(process, seconds=1000)
    peak = np.sum((times >= 200) & (times < 300))  # sin peaks at t = 250
    trough = np.sum((times >= 700) & (times < 800))
    assert peak > 4 * trough
    assert times.size / 1000 == pytest.approx(100, rel=0.05)


def test_rate_series_loops_warps_and_scales():
    series = RateSeriesArrivals(np.array([0.0, 50.0]), np.array([10.0, 30.0]), period_s=100.0, rate_scale=2.0, time_warp=10.0)
    assert series.mean_rate_rps() == pytest.approx(40.0)
    times = run(series, seconds=100, step_s=3.0)  # 10 periods of 10 simulated seconds
    assert times.size / 99 == pytest.approx(40, rel=0.05)
    in_first_half = np.sum((times % 10.0) < 5.0)
    assert in_first_half / times.size == pytest.approx(0.25, abs=0.03)


def test_timestamps_replayed_exactly_at_scale_one():
    recorded = np.array([0.0, 0.5, 1.2, 3.0, 7.5])
    process = TimestampArrivals(recorded, period_s=10.0)
    times = run(process, seconds=20, step_s=1.0)
    assert np.allclose(times, np.concatenate([recorded, recorded + 10]))


@pytest.mark.parametrize("scale", [0.5, 3.0, 4.4])
def test_timestamp_rate_scaling_keeps_order_and_rate(scale):
    recorded = np.sort(np.random.default_rng(0).uniform(0, 1000, 2000))
    process = TimestampArrivals(recorded, period_s=1000.0, rate_scale=scale)
    times = run(process, seconds=1000)
    assert times.size == pytest.approx(2000 * scale, rel=0.05)


def test_time_warp_compresses_the_trace_but_not_the_rate():
    recorded = np.sort(np.random.default_rng(0).uniform(0, 1000, 5000))
    process = TimestampArrivals(recorded, period_s=1000.0, time_warp=10.0)  # 1000 s of trace in 100 s
    times = run(process, seconds=100)
    assert times.size == pytest.approx(500, rel=0.1)  # the rate stays rate_scale * trace rate


def test_bundled_traces_are_detected_and_replay():
    assert detect_format(TRACES / "azure_llm_conv_timestamps.csv") == "timestamps"
    assert detect_format(TRACES / "servegen_m_large_rate_10min.csv") == "rate-series"
    assert detect_format(TRACES / "servegen_mm_image_client0.csv") == "servegen"
    azure = load_trace(TRACES / "azure_llm_conv_timestamps.csv")
    assert azure.mean_rate_rps() == pytest.approx(5.4, abs=0.3)  # SOURCES.md: about 5.5 req/s
    servegen = load_trace(TRACES / "servegen_mm_image_client0.csv", rate_scale=100)
    times = run(servegen, seconds=1200)
    assert 50 < times.size / 1200 < 200  # ~0.8-0.9 req/s per window, scaled 100x


def test_servegen_gamma_gaps_have_the_named_cv(tmp_path):
    path = tmp_path / "client.csv"
    path.write_text("0,1.0,0.5,Gamma,4.0,0.25\n600,1.0,0.5,Gamma,4.0,0.25\n")
    times = run(load_trace(path, rate_scale=50), seconds=1200)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1.0 / 50, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(0.5, abs=0.05)


def test_servegen_replays_what_its_distributions_name_where_they_disagree_with_the_rate_column(tmp_path):
    path = tmp_path / "client.csv"
    # Window 1: rate column 1 req/s, but Gamma gaps of mean 0.25 s (4 req/s), as mm-image
    # clients fitted to their bursts have; window 2: no distribution (Poisson at 2 req/s).
    path.write_text("0,1.0,0.5,Gamma,4.0,0.0625\n600,2.0,1.0,,,\n")
    process = load_trace(path, rate_scale=10)
    assert process.mean_rate_rps() == pytest.approx(15.0)
    assert process.distribution_rate_rps() == pytest.approx(30.0)
    times = run(process, seconds=1200)
    assert times.size / 1200 == pytest.approx(process.distribution_rate_rps(), rel=0.05)


def test_azure_datetime_format(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    process = load_trace(path)
    assert np.allclose(process.times_s, [0.0, 4.314579])


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("time_s,rate_rps\n0,10\n60,-3\n", "rate_rps[line 3]", "-3"),
        ("time_s,rate_rps\n0,10\n0,5\n", "time_s[line 3]", "0"),
        ("timestamp_s\n0.0\nabc\n", "timestamp_s[line 3]", "abc"),
        ("TIMESTAMP\n2023-11-16 18:15:46\nyesterday\n", "TIMESTAMP[line 3]", "yesterday"),
        ("0,1.0,0.5,Lognormal,1,1\n", "distribution[line 1]", "Lognormal"),
        ("foo,bar\n1,2\n", "header", "foo,bar"),
    ],
)
def test_bad_trace_names_file_field_and_value(tmp_path, text, field, value):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_trace(path)
    assert info.value.field == field and info.value.value == value and str(path) in str(info.value)
