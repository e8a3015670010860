"""Least-squares fitting of :mod:`physics` parameters and honest cross-validation.

A :class:`FitSpec` says, per calibration source, which parameters each model fits on its
own, which all models of the source share (e.g. the host launch floor of one framework on
one host) and which are held fixed because the source cannot identify them. Residuals are
relative, so the fit minimises percentage error, the figure the report prints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import least_squares

from rlsched.perfmodel.physics import LatencyParams, Resources, latency_ms

NO_LIMIT = None


@dataclass(frozen=True)
class FitSpec:
    """Which parameters a source fits and how.

    :param per_model: parameter names each model fits on its own
    :param shared: parameter names all models of the source fit together
    :param fixed: parameter values held fixed (the source cannot identify them)
    :param start: starting values of the free parameters
    :param bounds: (low, high) of each free parameter
    :param priors: name -> (target, weight): a weak pull used where a held-out slice leaves
        a parameter unidentified (e.g. memory-bound fraction when every training slice has
        the same SM-to-memory-slice ratio)
    """

    per_model: tuple[str, ...]
    shared: tuple[str, ...] = ()
    fixed: Mapping[str, float | None] = field(default_factory=dict)
    start: Mapping[str, float] = field(default_factory=dict)
    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    priors: Mapping[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Observations:
    """Measurements of one model: batch sizes, the resources of each, measured latency (ms)."""

    batch: np.ndarray
    resources: Resources
    latency_ms: np.ndarray
    group: np.ndarray  # the cross-validation fold label of each point (slice or share)

    def subset(self, mask: np.ndarray) -> "Observations":
        r = self.resources
        res = Resources(np.asarray(r.sm_count)[mask], r.reference_sm_count, r.sm_speed_ratio,
                        np.broadcast_to(r.bandwidth_fraction, mask.shape)[mask])
        return Observations(self.batch[mask], res, self.latency_ms[mask], self.group[mask])


def fit_params(data: Mapping[str, Observations], spec: FitSpec) -> dict[str, LatencyParams]:
    """Fit every model of ``data`` jointly (shared parameters couple them)."""
    models = list(data)
    names: list[tuple[str | None, str]] = [(None, n) for n in spec.shared]
    names += [(m, n) for m in models for n in spec.per_model]
    x0 = np.array([spec.start.get(n, 1.0) for _, n in names], dtype=float)
    lo = np.array([spec.bounds.get(n, (0.0, np.inf))[0] for _, n in names])
    hi = np.array([spec.bounds.get(n, (0.0, np.inf))[1] for _, n in names])
    x0 = np.clip(x0, lo, np.where(np.isfinite(hi), hi, x0))

    def params_of(x: np.ndarray) -> dict[str, LatencyParams]:
        values: dict[str, dict[str, float | None]] = {m: dict(spec.fixed) for m in models}
        for (m, n), v in zip(names, x):
            for target in (models if m is None else [m]):
                values[target][n] = float(v)
        return {m: LatencyParams(**values[m]) for m in models}

    def residuals(x: np.ndarray) -> np.ndarray:
        out = []
        for m, p in params_of(x).items():
            obs = data[m]
            out.append(latency_ms(p, obs.batch, obs.resources) / obs.latency_ms - 1.0)
        for (m, n), v in zip(names, x):
            if n in spec.priors:
                target, weight = spec.priors[n]
                out.append(np.array([weight * (v - target)]))
        return np.concatenate(out)

    result = least_squares(residuals, x0, bounds=(lo, hi), max_nfev=4000)
    return params_of(result.x)


def mape_pct(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error, %."""
    return float(100.0 * np.mean(np.abs(np.asarray(predicted) - measured) / measured))


@dataclass(frozen=True)
class CvResult:
    """Cross-validated errors: per model and pooled over every held-out point, %."""

    per_model_pct: dict[str, float]
    pooled_pct: float
    per_fold_pct: dict[str, float]
    n_points: int


def cross_validate(data: Mapping[str, Observations],
                   fit: Callable[[Mapping[str, Observations]], Mapping[str, Callable[[Observations], np.ndarray]]]) -> CvResult:
    """Leave one group (slice or share) out: fit on the rest, predict the held-out points.

    ``fit`` maps training observations to one predictor per model, so the same routine
    scores the physical model and the reference baselines.
    """
    groups = sorted({g for o in data.values() for g in o.group}, key=str)
    errors: dict[str, list[np.ndarray]] = {m: [] for m in data}
    per_fold: dict[str, float] = {}
    for held in groups:
        train = {m: o.subset(o.group != held) for m, o in data.items()}
        predictors = fit(train)
        fold = []
        for m, o in data.items():
            test = o.subset(o.group == held)
            if len(test.batch) == 0:
                continue
            e = np.abs(predictors[m](test) - test.latency_ms) / test.latency_ms
            errors[m].append(e)
            fold.append(e)
        if fold:
            per_fold[str(held)] = float(100 * np.concatenate(fold).mean())
    all_errors = [np.concatenate(v) for v in errors.values() if v]
    pooled = np.concatenate(all_errors)
    return CvResult({m: float(100 * np.concatenate(v).mean()) for m, v in errors.items() if v},
                    float(100 * pooled.mean()), per_fold, int(pooled.size))


def physical_fitter(spec: FitSpec) -> Callable[[Mapping[str, Observations]], dict[str, Callable[[Observations], np.ndarray]]]:
    """Adapter: fit the physical model, return predictors for :func:`cross_validate`."""
    def fit(train: Mapping[str, Observations]) -> dict[str, Callable[[Observations], np.ndarray]]:
        params = fit_params(train, spec)
        return {m: (lambda o, p=p: latency_ms(p, o.batch, o.resources)) for m, p in params.items()}
    return fit


def curve_fitter(form: Callable[[np.ndarray, Observations], np.ndarray], n_params: int,
                 start: Sequence[float]) -> Callable[[Mapping[str, Observations]], dict[str, Callable[[Observations], np.ndarray]]]:
    """Adapter for a per-model closed-form baseline ``form(theta, obs) -> latency_ms``."""
    def fit(train: Mapping[str, Observations]) -> dict[str, Callable[[Observations], np.ndarray]]:
        out = {}
        for m, o in train.items():
            theta = least_squares(lambda t: form(t, o) / o.latency_ms - 1.0, np.asarray(start, float), max_nfev=4000).x
            out[m] = (lambda obs, t=theta: form(t, obs))
        return out
    assert len(start) == n_params
    return fit


def with_fixed(params: LatencyParams, **changes: float | None) -> LatencyParams:
    return replace(params, **changes)
