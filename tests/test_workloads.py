"""Tenant models: Ekya's accuracy curve, SLICE-TUNE's share-mismatch penalty, priority classes."""

import math

import pytest

from rlsched.workloads.arrivals import PoissonArrivals
from rlsched.workloads.tenants import BestEffortJob, EkyaCurve, InferenceTenant, Priority


def test_ekya_curve_rises_with_retraining_and_saturates():
    curve = EkyaCurve(b0=0.5, b1=2.0, b2=0.05)
    assert curve.accuracy(0) == pytest.approx(1 - (1 / 2.0 + 0.05))
    values = [curve.accuracy(x) for x in (0, 1, 4, 16, 1e6)]
    assert values == sorted(values)
    assert values[-1] == pytest.approx(0.95, abs=1e-4)


def test_ekya_curve_is_clipped_to_probabilities():
    assert EkyaCurve(1.0, 0.5, 0.0).accuracy(0) == 0.0
    assert EkyaCurve(1.0, 1.0, -0.5).accuracy(100) == 1.0


def test_tuning_mismatch_costs_latency_and_throughput():
    tenant = InferenceTenant("a", "resnet50", 50, PoissonArrivals(1), tuned_at_mps_pct=50, tuning_mismatch_penalty=0.4)
    assert tenant.tuning_latency_factor(50) == 1.0
    assert tenant.tuning_latency_factor(100) == pytest.approx(1.2)
    job = BestEffortJob("t", "vgg19", tuned_at_mps_pct=40, tuning_mismatch_penalty=0.5)
    assert job.tuning_throughput_factor(40) == 1.0
    assert job.tuning_throughput_factor(80) == pytest.approx(1 / 1.2)
    untuned = InferenceTenant("b", "resnet50", 50, PoissonArrivals(1))
    assert untuned.tuning_latency_factor(10) == 1.0


def test_priority_ranks():
    assert [p.rank for p in (Priority.HIGH, Priority.NORMAL, Priority.LOW)] == [0, 1, 2]


def test_ekya_curve_inverse():
    curve = EkyaCurve(0.5, 2.0, 0.05)
    assert curve.units_for(curve.accuracy(3.0)) == pytest.approx(3.0)
    assert curve.units_for(0.0) == 0.0  # below the curve's start
    assert curve.units_for(0.95) == math.inf  # its ceiling 1 - b2 is never reached
