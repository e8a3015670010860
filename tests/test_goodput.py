"""Goodput: terms reported separately, penalties per request, additivity."""

import pytest

from rlsched.goodput import GoodputTerms, GoodputWeights, goodput_terms


def test_terms_weight_accuracy_priority_and_penalties():
    weights = GoodputWeights(priority={"high": 2.0, "normal": 1.0, "low": 0.5}, slo_penalty=3.0, best_effort=10.0, reconfiguration_per_s=0.1)
    terms = goodput_terms(weights, "high", on_time=100, accuracy=0.8, violated=4, dropped=1, best_effort_progress_s=2.0, downtime_s=5.0)
    assert terms.goodput == pytest.approx(2.0 * 100 * 0.8)
    assert terms.slo_penalty == pytest.approx(2.0 * 3.0 * 5)
    assert terms.best_effort_progress == pytest.approx(20.0)
    assert terms.reconfiguration_cost == pytest.approx(0.5)
    assert terms.total == pytest.approx(160 + 20 - 30 - 0.5)


def test_terms_add_up():
    a = GoodputTerms(1, 2, 3, 4)
    b = GoodputTerms(10, 20, 30, 40)
    assert (a + b) == GoodputTerms(11, 22, 33, 44)
    assert (a + b).total == pytest.approx(a.total + b.total)
    assert set((a + b).as_dict()) == {"goodput/goodput", "goodput/slo_penalty", "goodput/best_effort_progress", "goodput/reconfiguration_cost", "goodput/total"}
