"""Per-source calibration: turn one source's raw data into a calibration document.

Sources (never pooled, per ../shared/data/SOURCES.md):

* ``migprofiler``: MLSysOps/MIGProfiler, A100-80GB, PyTorch: vision inference (P99),
  bert-base inference (mean), resnet50 training; cross-validated leave-one-slice-out.
* ``igniter``: icloud-ecnu/igniter, V100, TensorRT, MPS: solo latency cross-validated
  leave-one-share-out; L2 interference cross-validated on held-back model pairs.
* ``miso``: boringlee24/socc22-miso, A100-40GB training step times; leave-one-slice-out.
* ``parvagpu``: MunQ-Lee/ParvaGPU_SC24, A100-80GB, PyTorch (TF32 convolutions): 11 models
  profiled on the full GPU only, 1-5 MPS processes; slices are inferred (see
  :func:`fit_full_gpu_profile`), cross-validated leave-one-process-count-out.
* ``profile``: what ``rlsched calibrate profile`` measured on the user's own device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from rlsched.errors import ConfigError
from rlsched.hardware.catalog import GpuSpec, load_gpu
from rlsched.perfmodel import data as raw
from rlsched.perfmodel.fitting import (FitSpec, Observations, cross_validate, curve_fitter, fit_params, mape_pct,
                                       physical_fitter)
from rlsched.perfmodel.physics import LatencyParams, Resources, gpu_time_ms, latency_ms

SOURCE_NAMES = ("migprofiler", "igniter", "miso", "parvagpu", "profile")
# A normal tail: P99 = mean + 2.326 sigma. Used only to convert between the two metrics.
Z_P99 = 2.326
WHOLE_GPU = "whole"
# MIGProfiler calls ViT "vision_transformer"; rlsched's name is the short one.
MODEL_ALIASES = {"vision_transformer": "vit"}

_WIDE = (0.0, 1e4)
# PyTorch eager on one host: the launch floor and its sharpness are shared by the models of
# a source; the memory-bound fraction gets a weak pull to 0 (compute-bound), because with
# one slice held out the others may all have the same SM-to-memory ratio (1g, 2g).
EAGER_SPEC = FitSpec(
    per_model=("base_work_ms", "work_ms_per_sample", "work_ms_per_sqrt_sample", "memory_bound_fraction"),
    shared=("host_floor_ms", "host_softmax_exponent"),
    fixed={"fixed_gpu_ms": 0.0, "parallel_sms_per_sample": None, "io_ms_per_sample": 0.0},
    start={"host_floor_ms": 4.0, "host_softmax_exponent": 4.0, "base_work_ms": 0.2, "work_ms_per_sample": 0.3,
           "work_ms_per_sqrt_sample": 0.1, "memory_bound_fraction": 0.0},
    bounds={"host_floor_ms": (0.0, 100.0), "host_softmax_exponent": (1.5, 20.0), "memory_bound_fraction": (0.0, 1.0),
            "base_work_ms": _WIDE, "work_ms_per_sample": _WIDE, "work_ms_per_sqrt_sample": _WIDE},
    priors={"memory_bound_fraction": (0.0, 0.1)},
)
# TensorRT under MPS (trtexec): no host floor; wave under-fill and PCIe transfers instead.
# The V100 shares one DRAM among MPS clients, so the memory-bound fraction is not
# identifiable from solo runs: held at 0.
TENSORRT_MPS_SPEC = FitSpec(
    per_model=("fixed_gpu_ms", "work_ms_per_sample", "work_ms_per_sqrt_sample", "parallel_sms_per_sample", "io_ms_per_sample"),
    fixed={"host_floor_ms": 0.0, "base_work_ms": 0.0, "memory_bound_fraction": 0.0},
    start={"fixed_gpu_ms": 0.5, "work_ms_per_sample": 0.2, "work_ms_per_sqrt_sample": 0.1,
           "parallel_sms_per_sample": 16.0, "io_ms_per_sample": 0.05},
    bounds={"fixed_gpu_ms": (0.0, 50.0), "work_ms_per_sample": _WIDE, "work_ms_per_sqrt_sample": _WIDE,
            "parallel_sms_per_sample": (0.8, 8000.0), "io_ms_per_sample": (0.0, 1.0)},
)
# Training loops (MISO): each job has its own host loop (data loading, optimizer), so the
# floor is per model; wave under-fill matters at the small per-slice batches.
TRAINING_SPEC = FitSpec(
    per_model=("host_floor_ms", "host_softmax_exponent", "fixed_gpu_ms", "work_ms_per_sample", "work_ms_per_sqrt_sample",
               "parallel_sms_per_sample", "memory_bound_fraction"),
    fixed={"base_work_ms": 0.0, "io_ms_per_sample": 0.0},
    start={"host_floor_ms": 4.0, "host_softmax_exponent": 4.0, "fixed_gpu_ms": 0.5, "work_ms_per_sample": 0.1,
           "work_ms_per_sqrt_sample": 0.5, "parallel_sms_per_sample": 5.0, "memory_bound_fraction": 0.0},
    bounds={"host_floor_ms": (0.0, 1e5), "host_softmax_exponent": (1.5, 20.0), "fixed_gpu_ms": (0.0, 1e5),
            "work_ms_per_sample": _WIDE, "work_ms_per_sqrt_sample": _WIDE, "parallel_sms_per_sample": (0.1, 1e4),
            "memory_bound_fraction": (0.0, 1.0)},
    priors={"memory_bound_fraction": (0.0, 0.1)},
)


# A full-GPU profile (one instance, 1..k identical MPS processes). Assumptions, stated once:
# * k processes under MPS share the instance's SMs and DRAM bandwidth equally (share 1/k
#   each), so the multi-process rows separate what contends for the GPU (the work terms,
#   which also scale with a slice's SMs) from what does not: the per-model host launch
#   floor, fixed_gpu_ms (latency-bound kernels that overlap across processes) and
#   io_ms_per_sample (host/PCIe time per sample). Wave under-fill (parallel_sms_per_sample)
#   is what lets small batches of several processes run side by side.
# * The memory-bound fraction is NOT identifiable (k processes divide SMs and bandwidth
#   alike): held at 0, so a slice's slowdown follows its SMs (1g = 14/98 of 7g on an A100);
#   MIGProfiler's measured 1g/7g ratios at batch 256 are 7.06 (vit) and 7.30 (resnet50)
#   against 7.0 for SMs and 8.0 for bandwidth, so this errs fast by up to ~4%.
FULL_GPU_MULTI_SPEC = FitSpec(
    per_model=("host_floor_ms", "host_softmax_exponent", "fixed_gpu_ms", "base_work_ms", "work_ms_per_sample",
               "work_ms_per_sqrt_sample", "parallel_sms_per_sample", "io_ms_per_sample"),
    fixed={"memory_bound_fraction": 0.0},
    start={"host_floor_ms": 4.0, "host_softmax_exponent": 4.0, "fixed_gpu_ms": 0.5, "base_work_ms": 0.2,
           "work_ms_per_sample": 0.3, "work_ms_per_sqrt_sample": 0.1, "parallel_sms_per_sample": 5.0, "io_ms_per_sample": 0.0},
    bounds={"host_floor_ms": (0.0, 100.0), "host_softmax_exponent": (1.5, 20.0), "fixed_gpu_ms": (0.0, 100.0),
            "base_work_ms": _WIDE, "work_ms_per_sample": _WIDE, "work_ms_per_sqrt_sample": _WIDE,
            "parallel_sms_per_sample": (0.05, 1e4), "io_ms_per_sample": (0.0, 100.0)},
)
# One process only (e.g. MIGProfiler's 7g rows, or ``calibrate profile`` output): nothing
# separates host from GPU time except the sweep's shape, so the floor is shared by the models
# (one framework on one host), host/PCIe per-sample time is held at 0 and the rest is the
# sweep's work split. Chosen by leave-all-slices-out on MIGProfiler (fit on 7g only, predict
# 1g/2g: vision, bert-base and training; see ``rlsched calibrate report``).
FULL_GPU_SINGLE_SPEC = FitSpec(
    per_model=("fixed_gpu_ms", "base_work_ms", "work_ms_per_sample", "work_ms_per_sqrt_sample", "parallel_sms_per_sample"),
    shared=("host_floor_ms", "host_softmax_exponent"),
    fixed={"memory_bound_fraction": 0.0, "io_ms_per_sample": 0.0},
    start={"host_floor_ms": 4.0, "host_softmax_exponent": 4.0, "fixed_gpu_ms": 1.0, "base_work_ms": 0.2,
           "work_ms_per_sample": 0.3, "work_ms_per_sqrt_sample": 0.1, "parallel_sms_per_sample": 5.0},
    bounds={"host_floor_ms": (0.0, 100.0), "host_softmax_exponent": (1.5, 20.0), "fixed_gpu_ms": (0.0, 100.0),
            "base_work_ms": _WIDE, "work_ms_per_sample": _WIDE, "work_ms_per_sqrt_sample": _WIDE,
            "parallel_sms_per_sample": (0.05, 1e4)},
)
# Fewest distinct single-process batch sizes per model a full-GPU profile must have: fewer
# cannot separate the host floor from the per-batch and per-sample work (the bounds and the
# other models' shared floor regularise the remaining parameters).
MIN_PROFILE_BATCHES = 4


def instance_resources(gpu: GpuSpec, instance: np.ndarray) -> Resources:
    """Resources of MIG instances (or the whole GPU) of the calibration GPU itself."""
    sms, bw = [], []
    for name in instance:
        if name == WHOLE_GPU:
            sms.append(gpu.sm_count)
            bw.append(1.0)
            continue
        if name not in gpu.profiles:
            raise ConfigError(f"configs/hardware/{gpu.name}.yaml", "gi_profiles", name, "profile not in the catalog")
        prof = gpu.profiles[name]
        sms.append(prof.sm_count)
        bw.append(prof.memory_slices / gpu.memory_slices)
    return Resources(np.array(sms, float), float(gpu.sm_count), 1.0, np.array(bw, float))


def slice_observations(points: list[raw.SliceMeasurement], gpu: GpuSpec) -> dict[str, Observations]:
    by_model: dict[str, list[raw.SliceMeasurement]] = {}
    for p in points:
        by_model.setdefault(MODEL_ALIASES.get(p.model, p.model), []).append(p)
    out = {}
    for model, pts in by_model.items():
        inst = np.array([p.instance for p in pts])
        out[model] = Observations(np.array([p.batch for p in pts], float), instance_resources(gpu, inst),
                                  np.array([p.latency_ms for p in pts]), inst)
    return out


def mps_observations(points: list[raw.MpsSoloMeasurement], gpu: GpuSpec) -> dict[str, Observations]:
    out = {}
    for model in sorted({p.model for p in points}):
        pts = [p for p in points if p.model == model]
        pct = np.array([p.mps_pct for p in pts])
        out[model] = Observations(np.array([p.batch for p in pts], float),
                                  Resources(pct / 100.0 * gpu.sm_count, float(gpu.sm_count), 1.0, np.ones_like(pct)),
                                  np.array([p.latency_ms for p in pts]), pct)
    return out


# ---- reference baselines (per model closed forms) -------------------------------------

def _mig_power_law(theta: np.ndarray, o: Observations) -> np.ndarray:
    """L0 + w*b/s^a; s = the slice's SMs (proportional to compute slices; the scale goes into w)."""
    return theta[0] + theta[1] * o.batch / np.asarray(o.resources.sm_count) ** theta[2]


def _igniter_form(theta: np.ndarray, o: Observations) -> np.ndarray:
    """iGniter: (k1 b^2 + k2 b + k3) / (r + k4) + k5, r = MPS share fraction."""
    r = np.asarray(o.resources.sm_count) / o.resources.reference_sm_count
    k1, k2, k3, k4, k5 = theta
    return (k1 * o.batch**2 + k2 * o.batch + k3) / (r + k4) + k5


# ---- helpers shared by the sources -----------------------------------------------------

def _fit_with_cv(obs: Mapping[str, Observations], spec: FitSpec, baseline: tuple[str, Any] | None) -> tuple[dict[str, LatencyParams], dict[str, Any]]:
    params = fit_params(obs, spec)
    cv = cross_validate(obs, physical_fitter(spec))
    error: dict[str, Any] = {
        "in_sample_mape_pct": round(mape_pct(np.concatenate([latency_ms(params[m], o.batch, o.resources) for m, o in obs.items()]),
                                             np.concatenate([o.latency_ms for o in obs.values()])), 2),
        "cv_mape_pct": round(cv.pooled_pct, 2),
        "cv_per_model_mape_pct": {m: round(v, 2) for m, v in cv.per_model_pct.items()},
        "cv_per_held_out_group_mape_pct": {k: round(v, 2) for k, v in cv.per_fold_pct.items()},
        "cv_points": cv.n_points,
    }
    if baseline is not None:
        name, fitter = baseline
        b = cross_validate(obs, fitter)
        error["baseline"] = {"name": name, "cv_mape_pct": round(b.pooled_pct, 2),
                             "cv_per_model_mape_pct": {m: round(v, 2) for m, v in b.per_model_pct.items()}}
    return params, error


def _memory_fit(points: list[raw.SliceMeasurement]) -> dict[str, dict[str, Any]]:
    """memory_gib = base + per_sample * batch per model, from measured framebuffer use."""
    out: dict[str, dict[str, Any]] = {}
    for model in sorted({p.model for p in points}):
        pts = [p for p in points if p.model == model and p.memory_gib is not None]
        if len(pts) < 2:
            continue
        a = np.stack([np.ones(len(pts)), [p.batch for p in pts]], 1)
        coef, _ = nnls(a, np.array([p.memory_gib for p in pts]))
        out[MODEL_ALIASES.get(model, model)] = {"base_gib": round(float(coef[0]), 4), "gib_per_sample": round(float(coef[1]), 6),
                                                "source": "least squares on the measured fb_used_mean (MiB) of every slice"}
    return out


def _tail_ratio(points: list[raw.SliceMeasurement], metric: str) -> float:
    """P99 / mean ratio from the reported standard deviations (normal tail assumed)."""
    rel = np.array([p.latency_std_ms / p.latency_ms for p in points if p.latency_std_ms is not None and p.latency_ms > 0])
    if rel.size == 0:
        return 1.0
    r = float(np.median(rel))
    return (1.0 / (1.0 - Z_P99 * r)) if metric == "p99" else (1.0 + Z_P99 * r)


def _models_doc(params: Mapping[str, LatencyParams], kind: str, metric: str, memory: Mapping[str, Any], error: Mapping[str, Any]) -> dict[str, Any]:
    doc = {}
    for m, p in params.items():
        entry: dict[str, Any] = {"kind": kind, "latency_metric": metric, "params": {k: (None if v is None else round(v, 6)) for k, v in p.to_dict().items()}}
        if m in memory:
            entry["memory"] = dict(memory[m])
        if m in error.get("cv_per_model_mape_pct", {}):
            entry["cv_mape_pct"] = error["cv_per_model_mape_pct"][m]
        doc[m] = entry
    return doc


TRANSFER_NOTE = (
    "To another GPU or instance: compute-bound work scales with SMs (catalog sm_count of the profile, times the "
    "compute-instance fraction, times the MPS share) and with per-SM speed (fp32 TFLOP/s per SM ratio, "
    "gpu-throughput.yaml); memory-bound work scales with the DRAM bandwidth share (memory slices / GPU memory "
    "slices, times the bandwidth ratio in gpu-throughput.yaml). host_floor_ms, fixed_gpu_ms and io_ms_per_sample "
    "are carried over unchanged (host- and PCIe-bound)."
)


def fit_migprofiler(data_dir: Path) -> dict[str, Any]:
    gpu = load_gpu("a100-80gb")
    files = raw.migprofiler_files(data_dir)
    sets = raw.read_migprofiler(data_dir)
    doc: dict[str, Any] = {"source": "migprofiler", "gpu": gpu.name,
                           "citation": "MLSysOps/MIGProfiler commit e377b46 (MIT), data/A100-80g; PyTorch, fp32 presumed",
                           "raw_files": {k: str(Path(v).relative_to(data_dir)) for k, v in files.items()},
                           "transfer": TRANSFER_NOTE, "inference": {}, "training": {}, "fit_error": {}}
    specs = {"vision": ("inference", "p99"), "nlp": ("inference", "mean"), "train": ("training", "step")}
    for kind_key, (kind, metric) in specs.items():
        pts = sets[kind_key]
        if kind_key == "nlp":
            # bsz sweep at sequence length 64 only; bert-base is the one model.
            pts = [p for p in pts if p.model == "bert-base"]
        obs = slice_observations(pts, gpu)
        params, error = _fit_with_cv(obs, EAGER_SPEC, ("L0 + w*b/s^a per model (4 parameters)", curve_fitter(_mig_power_law, 3, [3.0, 20.0, 1.0])))
        error.update({"cv_scheme": "leave-one-slice-out", "latency_metric": metric,
                      "p99_over_mean": round(_tail_ratio(pts, metric), 4)})
        doc["fit_error"][kind_key] = error
        models = _models_doc(params, kind, metric, _memory_fit(pts), error)
        for entry in models.values():
            entry["p99_over_mean"] = error["p99_over_mean"]
        doc[kind].update(models)
    doc["fit_error"]["vision_full_gpu_only"] = leave_all_slices_out(data_dir)
    return doc


def _l2_intensity(solo: list[raw.MpsSoloMeasurement], params: Mapping[str, LatencyParams], gpu: GpuSpec) -> dict[str, dict[str, float]]:
    """L2 traffic per batch: l2_util * latency = a + c*b (ms of L2-busy time), non-negative LS.

    Utilization = traffic / time is then predicted for any batch, share or GPU.
    """
    out = {}
    for model, p in params.items():
        pts = [s for s in solo if s.model == model and s.l2_util is not None]
        b = np.array([s.batch for s in pts], float)
        pct = np.array([s.mps_pct for s in pts])
        t = latency_ms(p, b, Resources(pct / 100 * gpu.sm_count, float(gpu.sm_count)))
        coef, _ = nnls(np.stack([1 / t, b / t], 1), np.array([s.l2_util for s in pts]))
        out[model] = {"l2_busy_ms_per_batch": round(float(coef[0]), 6), "l2_busy_ms_per_sample": round(float(coef[1]), 6)}
    return out


def l2_utilization(intensity: Mapping[str, float], batch: np.ndarray | float, latency: np.ndarray | float) -> np.ndarray:
    """Predicted L2 utilization (fraction, capped at 1) of a tenant running back-to-back batches."""
    busy = intensity["l2_busy_ms_per_batch"] + intensity["l2_busy_ms_per_sample"] * np.asarray(batch, float)
    return np.minimum(busy / np.asarray(latency, float), 1.0)


def _pair_errors(pairs: list[raw.MpsPairMeasurement], params: Mapping[str, LatencyParams], intensity: Mapping[str, Mapping[str, float]],
                 gpu: GpuSpec) -> tuple[float, dict[str, Any]]:
    """Fit the L2 sensitivity on all pairs; cross-validate it leaving one model pair out."""
    def solo(m: str, b: np.ndarray, pct: np.ndarray, part: str) -> np.ndarray:
        res = Resources(pct / 100 * gpu.sm_count, float(gpu.sm_count))
        return gpu_time_ms(params[m], b, res) if part == "gpu" else latency_ms(params[m], b, res)

    victim = np.array([p.model for p in pairs])
    pair_key = np.array(["+".join(sorted((p.model, p.co_model))) for p in pairs])
    b = np.array([p.batch for p in pairs], float)
    pct = np.array([p.mps_pct for p in pairs], float)
    y = np.array([p.latency_ms for p in pairs])
    base = np.empty_like(y)
    gpu_part = np.empty_like(y)
    pressure = np.empty_like(y)
    for m in set(victim):
        k = victim == m
        base[k] = solo(m, b[k], pct[k], "all")
        gpu_part[k] = solo(m, b[k], pct[k], "gpu")
    for m in {p.co_model for p in pairs}:
        k = np.array([p.co_model == m for p in pairs])
        cb = np.array([p.co_batch for p in pairs], float)[k]
        cpct = np.array([p.co_mps_pct for p in pairs], float)[k]
        pressure[k] = l2_utilization(intensity[m], cb, solo(m, cb, cpct, "all"))

    def fit(mask: np.ndarray) -> float:
        # Slowdown of the victim's GPU time is linear in the co-runner's L2 use (iGniter).
        x = gpu_part[mask] * pressure[mask] / y[mask]
        r = 1.0 - base[mask] / y[mask]
        return float(max(0.0, np.dot(x, r) / np.dot(x, x)))

    def predict(kappa: float, mask: np.ndarray) -> np.ndarray:
        return base[mask] + kappa * gpu_part[mask] * pressure[mask]

    errs, none_errs = [], []
    for key in sorted(set(pair_key)):
        test = pair_key == key
        kappa = fit(~test)
        errs.append(np.abs(predict(kappa, test) - y[test]) / y[test])
        none_errs.append(np.abs(base[test] - y[test]) / y[test])
    kappa = fit(np.ones_like(y, bool))
    return kappa, {"cv_scheme": "leave-one-model-pair-out (6 pairs, 1500 tenant latencies)",
                   "cv_mape_pct": round(float(100 * np.concatenate(errs).mean()), 2),
                   "in_sample_mape_pct": round(mape_pct(predict(kappa, np.ones_like(y, bool)), y), 2),
                   "baseline_no_interference_mape_pct": round(float(100 * np.concatenate(none_errs).mean()), 2)}


def _igniter_pair_baseline(solo: list[raw.MpsSoloMeasurement], pairs: list[raw.MpsPairMeasurement]) -> float:
    """iGniter's own pair model: 5-parameter solo fit x (1 + alpha_victim * measured co-runner L2)."""
    gpu = load_gpu("v100-16gb")
    obs = mps_observations(solo, gpu)
    fits = curve_fitter(_igniter_form, 5, [0.0, 1.0, 1.0, 0.0, 0.1])(obs)
    l2 = {(s.model, s.batch, s.mps_pct): s.l2_util for s in solo}
    victim = np.array([p.model for p in pairs])
    pair_key = np.array(["+".join(sorted((p.model, p.co_model))) for p in pairs])
    y = np.array([p.latency_ms for p in pairs])
    base = np.empty_like(y)
    for i, p in enumerate(pairs):
        o = Observations(np.array([p.batch], float), Resources(np.array([p.mps_pct / 100 * gpu.sm_count]), float(gpu.sm_count)), y[i:i + 1], np.array([0]))
        base[i] = fits[p.model](o)[0]
    c = np.array([l2.get((p.co_model, p.co_batch, p.co_mps_pct)) or 0.0 for p in pairs])
    errs = []
    for key in sorted(set(pair_key)):
        test = pair_key == key
        pred = base[test].copy()
        for m in set(victim[test]):
            tr = (~test) & (victim == m)
            x, r = base[tr] * c[tr], y[tr] - base[tr]
            alpha = float(np.dot(x, r) / np.dot(x, x)) if np.dot(x, x) > 0 else 0.0
            k = victim[test] == m
            pred[k] = base[test][k] * (1 + alpha * c[test][k])
        errs.append(np.abs(pred - y[test]) / y[test])
    return round(float(100 * np.concatenate(errs).mean()), 2)


def fit_igniter(data_dir: Path) -> dict[str, Any]:
    gpu = load_gpu("v100-16gb")
    solo = raw.read_igniter_solo(data_dir)
    pairs = raw.read_igniter_pairs(data_dir)
    obs = mps_observations(solo, gpu)
    params, error = _fit_with_cv(obs, TENSORRT_MPS_SPEC, ("iGniter (k1 b^2 + k2 b + k3)/(r + k4) + k5 per model (5 parameters)",
                                                          curve_fitter(_igniter_form, 5, [0.0, 1.0, 1.0, 0.0, 0.1])))
    error.update({"cv_scheme": "leave-one-share-out", "latency_metric": "mean"})
    intensity = _l2_intensity(solo, params, gpu)
    kappa, pair_error = _pair_errors(pairs, params, intensity, gpu)
    pair_error["baseline"] = {"name": "iGniter: 5-parameter solo x (1 + alpha_victim * measured co-runner L2 use)",
                              "cv_mape_pct": _igniter_pair_baseline(solo, pairs)}
    rel_std = float(np.median([p.latency_std_ms / p.latency_ms for p in pairs]))
    tail = 1.0 + Z_P99 * rel_std
    models = _models_doc(params, "inference", "mean", {}, error)
    for m, entry in models.items():
        entry["l2_intensity"] = intensity[m]
        entry["p99_over_mean"] = round(tail, 4)
    return {"source": "igniter", "gpu": gpu.name,
            "citation": "icloud-ecnu/igniter (TPDS 2023), V100 16GB, TensorRT 8.0 FP32, MPS; no license file: measured facts with attribution",
            "raw_files": {"solo": "igniter-v100-mps/v100_mps_solo_profile_flat.csv", "pairs": "igniter-v100-mps/v100_mps_pair_interference_flat.csv"},
            "transfer": TRANSFER_NOTE,
            "interference": {"l2_sensitivity": round(kappa, 6),
                             "default_l2_util_when_busy": round(float(np.median([s.l2_util for s in solo if s.l2_util is not None])), 4),
                             "default_l2_util_when_busy_source": "median measured L2 utilization of the solo profile; used for co-runners without l2_intensity",
                             "form": "t_gpu_victim * (1 + l2_sensitivity * sum_j l2_util_j), l2_util_j from l2_intensity of co-runner j",
                             "p99_over_mean": round(tail, 4),
                             "p99_over_mean_source": "median std/mean of the pair measurements, normal tail (P99 = mean + 2.326 sd)"},
            "inference": models, "training": {},
            "fit_error": {"solo": error, "pairs": pair_error}}


def _miso_memory(points: list[raw.SliceMeasurement], gpu: GpuSpec) -> dict[str, dict[str, Any]]:
    """Memory bracketed by out-of-memory: MISO omits a (slice, model, batch) that did not fit."""
    sizes = sorted({p.instance for p in points}, key=lambda n: gpu.profiles[n].memory_gib)
    out = {}
    for model in sorted({p.model for p in points}):
        ran = {(p.instance, p.batch) for p in points if p.model == model}
        rows = []
        for b in sorted({bb for _, bb in ran}):
            fits = [gpu.profiles[s].memory_gib for s in sizes if (s, b) in ran]
            oom = [gpu.profiles[s].memory_gib for s in sizes if (s, b) not in ran and gpu.profiles[s].memory_gib < min(fits)]
            # Between the largest slice that failed and the smallest that ran.
            rows.append((b, (max(oom) + min(fits)) / 2 if oom else 0.5 * min(fits)))
        a = np.stack([np.ones(len(rows)), [r[0] for r in rows]], 1)
        coef, _ = nnls(a, np.array([r[1] for r in rows]))
        out[model] = {"base_gib": round(float(coef[0]), 4), "gib_per_sample": round(float(coef[1]), 6),
                      "source": "midpoint between the largest slice that ran out of memory and the smallest that ran (half of it when none failed)"}
    return out


def fit_slices(points: list[raw.SliceMeasurement], gpu: GpuSpec, spec: FitSpec, kind: str, metric: str) -> tuple[dict[str, Any], dict[str, Any]]:
    obs = slice_observations(points, gpu)
    params, error = _fit_with_cv(obs, spec, ("L0 + w*b/s^a per model (4 parameters)", curve_fitter(_mig_power_law, 3, [3.0, 20.0, 1.0])))
    error.update({"cv_scheme": "leave-one-slice-out", "latency_metric": metric})
    return params, error


def fit_miso(data_dir: Path) -> dict[str, Any]:
    gpu = load_gpu("a100-40gb")
    points = raw.read_miso(data_dir)
    params, error = fit_slices(points, gpu, TRAINING_SPEC, "training", "step")
    error["note"] = "deepspeech2 step times vary 4x within one run (min/max columns): its error is noise, not the model"
    return {"source": "miso", "gpu": gpu.name, "citation": "boringlee24/socc22-miso (SoCC 2022, MIT), mig_train_iter_time_summary.csv",
            "raw_files": {"train": "miso-a100-40gb-mig-train/mig_train_iter_time_summary.csv"}, "transfer": TRANSFER_NOTE,
            "inference": {}, "training": _models_doc(params, "training", "step", _miso_memory(points, gpu), error),
            "fit_error": {"train": error}}


# ---- a full-GPU profile: one instance, 1..k MPS processes --------------------------------

def _profiled_instance(gpu: GpuSpec, gpcs: int, path: Path, model: str) -> tuple[float, float]:
    """(SMs, bandwidth fraction) of the instance a profile row ran on (0 GPCs = whole GPU)."""
    if gpcs == 0:
        return float(gpu.sm_count), 1.0
    sizes = [p for p in gpu.profiles.values() if p.variant == "standard" and p.compute_slices == gpcs]
    if not sizes:
        raise ConfigError(path, f"{model}.mig_gpcs", gpcs, f"{gpu.name} has no standard MIG profile with that many compute slices")
    prof = max(sizes, key=lambda p: p.memory_slices)
    return float(prof.sm_count), prof.memory_slices / gpu.memory_slices


def _profile_group(point: raw.FullGpuMeasurement, limited: bool) -> int | str:
    """A profile row's cross-validation group: its process count, and its SM limit if any row has one."""
    if not limited:
        return point.processes
    sms = f"{point.sm_limit} SMs" if point.sm_limit else "all SMs"
    return sms if point.processes == 1 else f"{point.processes} processes, {sms}"


def full_gpu_observations(points: list[raw.FullGpuMeasurement], gpu: GpuSpec, path: Path) -> dict[str, Observations]:
    """Observations of a full-GPU profile; k processes get a 1/k share of SMs and bandwidth, and
    an SM-limited row its SMs with the instance's whole bandwidth.

    The cross-validation group of a row is its process count (and its SM limit where the
    profile has SM-limited rows). Raises :class:`ConfigError` when a model's single-process
    batch sweep is too short to fit.
    """
    limited = any(p.sm_limit for p in points)
    out = {}
    for model in sorted({p.model for p in points}):
        pts = [p for p in points if p.model == model]
        batches = sorted({p.batch for p in pts if p.processes == 1 and not p.sm_limit})
        if len(batches) < MIN_PROFILE_BATCHES:
            raise ConfigError(path, f"{model}.batch", batches,
                              f"single-process batch sweep too short to fit: needs >= {MIN_PROFILE_BATCHES} distinct batch sizes")
        inst = [_profiled_instance(gpu, p.mig_gpcs, path, model) for p in pts]
        sms = np.array([min(i[0], p.sm_limit or i[0]) for i, p in zip(inst, pts)])
        k = np.array([p.processes for p in pts], float)
        out[model] = Observations(np.array([p.batch for p in pts], float),
                                  Resources(sms / k, float(gpu.sm_count), 1.0, np.array([i[1] for i in inst]) / k),
                                  np.array([p.latency_ms for p in pts]), np.array([_profile_group(p, limited) for p in pts]))
    return out


def _memory_bound_fitted(spec: FitSpec) -> FitSpec:
    """``spec`` with the memory-bound fraction fitted per model: SM-limited rows (fewer SMs, the
    same bandwidth) separate the work that scales with SMs from the work that scales with
    bandwidth, which the process counts cannot (they divide both alike)."""
    fixed = {k: v for k, v in spec.fixed.items() if k != "memory_bound_fraction"}
    return replace(spec, per_model=(*spec.per_model, "memory_bound_fraction"), fixed=fixed,
                   start={**spec.start, "memory_bound_fraction": 0.2}, bounds={**spec.bounds, "memory_bound_fraction": (0.0, 1.0)})


def _full_gpu_memory(points: list[raw.FullGpuMeasurement]) -> dict[str, dict[str, Any]]:
    """memory_gib = base + per_sample * batch per model from a reported memory column."""
    out: dict[str, dict[str, Any]] = {}
    for model in sorted({p.model for p in points}):
        pts = [p for p in points if p.model == model and p.memory_gib is not None]
        if len({p.batch for p in pts}) < 2:
            continue
        coef, _ = nnls(np.stack([np.ones(len(pts)), [p.batch for p in pts]], 1), np.array([p.memory_gib for p in pts]))
        out[model] = {"base_gib": round(float(coef[0]), 4), "gib_per_sample": round(float(coef[1]), 6),
                      "source": "least squares on the profile's memory_mib column"}
    return out


SLICE_INFERENCE_NOTE = (
    "Measured on one instance only: every slice and MPS share is predicted by the physics law from the work split "
    "fitted on the batch sweep and the multi-process rows (k processes = a 1/k share of SMs and bandwidth). Assumed: "
    "host floor, fixed_gpu_ms and io_ms_per_sample do not contend; the memory-bound fraction is 0 (not identifiable "
    "from one instance); the p99/mean ratio of a source without a spread column is 1 (unknown). Leave-all-slices-out "
    "on MIGProfiler (the same procedure with its 7g.80gb rows only) is in rlsched calibrate report.")


SM_LIMIT_NOTE = (
    " This profile also has SM-limited rows (kernels on fewer SMs with the whole bandwidth, CUDA green contexts): "
    "they identify each model's memory-bound fraction, which is fitted instead of held at 0.")


def fit_full_gpu_profile(path: Path, gpu_name: str, source: str, citation: str, raw_file: str) -> dict[str, Any]:
    """Calibration document from a full-GPU profile CSV (format: :data:`raw.FULL_GPU_COLUMNS`).

    With rows of >= 2 processes for every model the multi-process spec is fitted and
    cross-validated leave-one-process-count-out; otherwise the single-process spec (no CV).
    """
    gpu = load_gpu(gpu_name)
    points = raw.read_full_gpu_profile(path)
    obs = full_gpu_observations(points, gpu, path)
    multi = all(len({p.processes for p in points if p.model == m}) > 1 for m in obs)
    limited = any(p.sm_limit for p in points)
    spec = FULL_GPU_MULTI_SPEC if multi else FULL_GPU_SINGLE_SPEC
    if limited:
        spec = _memory_bound_fitted(spec)
    params = _fit_each(obs, spec)
    fitted = {m: latency_ms(params[m], o.batch, o.resources) for m, o in obs.items()}
    error: dict[str, Any] = {
        "in_sample_mape_pct": round(mape_pct(np.concatenate(list(fitted.values())), np.concatenate([o.latency_ms for o in obs.values()])), 2),
        "in_sample_throughput_mape_pct": round(_throughput_mape(np.concatenate(list(fitted.values())), np.concatenate([o.latency_ms for o in obs.values()])), 2),
        "latency_metric": "mean", "spec": ("multi-process" if multi else "single-process") + (", SM-limited rows" if limited else "")}
    if multi or limited:
        cv = cross_validate(obs, lambda train: {m: (lambda o, p=p: latency_ms(p, o.batch, o.resources))
                                                for m, p in _fit_each(train, spec).items()})
        scheme = {(True, False): "leave-one-process-count-out", (False, True): "leave-one-SM-limit-out",
                  (True, True): "leave-one-(process count, SM limit)-out"}[(multi, limited)]
        error.update({"cv_scheme": scheme, "cv_mape_pct": round(cv.pooled_pct, 2),
                      "cv_per_model_mape_pct": {m: round(v, 2) for m, v in cv.per_model_pct.items()},
                      "cv_per_held_out_group_mape_pct": {k if limited else f"{k} processes": round(v, 2) for k, v in cv.per_fold_pct.items()},
                      "cv_points": cv.n_points})
    else:
        error.update({"cv_scheme": "none (one process count: in-sample only)", "cv_mape_pct": error["in_sample_mape_pct"]})
    models = _models_doc(params, "inference", "mean", _full_gpu_memory(points), error)
    note = SLICE_INFERENCE_NOTE + (SM_LIMIT_NOTE if limited else "")
    return {"source": source, "gpu": gpu.name, "citation": citation, "raw_files": {"profile": raw_file},
            "slice_behaviour": "inferred", "slice_inference": note, "transfer": TRANSFER_NOTE,
            "inference": models, "training": {}, "fit_error": {"full_gpu": error}}


def _fit_each(obs: Mapping[str, Observations], spec: FitSpec) -> dict[str, LatencyParams]:
    """Fit models one by one when the spec shares nothing (same optimum, far fewer evaluations)."""
    if spec.shared:
        return fit_params(obs, spec)
    return {m: fit_params({m: o}, spec)[m] for m, o in obs.items()}


def _throughput_mape(predicted_ms: np.ndarray, measured_ms: np.ndarray) -> float:
    """MAPE of throughput (batch / latency), %: |measured / predicted - 1|."""
    return float(100.0 * np.mean(np.abs(np.asarray(measured_ms) / np.asarray(predicted_ms) - 1.0)))


PARVAGPU_DIR = "parvagpu-a100-80gb-full"


def fit_parvagpu(data_dir: Path) -> dict[str, Any]:
    """ParvaGPU's full-GPU profile of 11 models on the A100-80GB (7g.80gb, 1-5 processes)."""
    base = Path(data_dir)
    path = base / raw.FULL_GPU_PROFILE_FILE if (base / raw.FULL_GPU_PROFILE_FILE).is_file() else base / PARVAGPU_DIR / raw.FULL_GPU_PROFILE_FILE
    return fit_full_gpu_profile(path, "a100-80gb", "parvagpu",
                                "MunQ-Lee/ParvaGPU_SC24 commit 5f3de1e (MIT), prof_data/*.csv; PyTorch fp32 in NVIDIA PyTorch 21.11 "
                                "(TF32 convolutions), mean latency, full A100-80GB only",
                                f"{PARVAGPU_DIR}/{raw.FULL_GPU_PROFILE_FILE}")


def leave_all_slices_out(data_dir: Path, full: str = "7g.80gb") -> dict[str, Any]:
    """Self-check of slice inference on MIGProfiler's vision rows: fit on ``full`` only.

    The single-process full-GPU spec is fitted on the 7g.80gb rows of resnet50 and vit and
    predicts every smaller slice; errors are against the measured rows of those slices.
    """
    gpu = load_gpu("a100-80gb")
    obs = slice_observations(raw.read_migprofiler(data_dir)["vision"], gpu)
    params = fit_params({m: o.subset(o.group == full) for m, o in obs.items()}, FULL_GPU_SINGLE_SPEC)
    per_model, per_slice, lat_err, tput_err = {}, {}, [], []
    for m, o in obs.items():
        test = o.subset(o.group != full)
        pred = latency_ms(params[m], test.batch, test.resources)
        per_model[m] = round(_throughput_mape(pred, test.latency_ms), 2)
        lat_err.append(np.abs(pred / test.latency_ms - 1.0))
        tput_err.append(np.abs(test.latency_ms / pred - 1.0))
        for g in sorted(set(test.group.tolist())):
            per_slice.setdefault(g, []).append(np.abs(test.latency_ms / pred - 1.0)[test.group == g])
    return {"cv_scheme": f"leave-all-slices-out (fit on {full} only, predict the smaller slices)",
            "cv_mape_pct": round(float(100 * np.concatenate(tput_err).mean()), 2), "metric": "throughput",
            "latency_mape_pct": round(float(100 * np.concatenate(lat_err).mean()), 2),
            "cv_per_model_mape_pct": per_model,
            "cv_per_held_out_group_mape_pct": {g: round(float(100 * np.concatenate(v).mean()), 2) for g, v in per_slice.items()},
            "cv_points": int(sum(e.size for e in tput_err))}


PROFILE_FILE = "latency.csv"


def fit_profile(data_dir: Path, gpu_name: str) -> dict[str, Any]:
    """Fit what ``rlsched calibrate profile`` measured.

    A ``full_gpu_profile.csv`` in ``data_dir`` (the documented full-GPU format) is fitted by
    :func:`fit_full_gpu_profile`; otherwise ``latency.csv`` (MIGProfiler format, P99 ms).
    """
    full = Path(data_dir) / raw.FULL_GPU_PROFILE_FILE
    if full.is_file():
        return fit_full_gpu_profile(full, gpu_name, "profile", f"rlsched calibrate profile output in {data_dir}", raw.FULL_GPU_PROFILE_FILE)
    gpu = load_gpu(gpu_name)
    points = raw.read_slice_csv(Path(data_dir) / PROFILE_FILE)
    obs = slice_observations(points, gpu)
    params = fit_params(obs, EAGER_SPEC)
    fitted = np.concatenate([latency_ms(params[m], o.batch, o.resources) for m, o in obs.items()])
    error: dict[str, Any] = {"in_sample_mape_pct": round(mape_pct(fitted, np.concatenate([o.latency_ms for o in obs.values()])), 2),
                             "latency_metric": "p99"}
    if len({p.instance for p in points}) > 1:
        cv = cross_validate(obs, physical_fitter(EAGER_SPEC))
        error.update({"cv_scheme": "leave-one-slice-out", "cv_mape_pct": round(cv.pooled_pct, 2)})
    error["p99_over_mean"] = round(_tail_ratio(points, "p99"), 4)
    models = _models_doc(params, "inference", "p99", _memory_fit(points), error)
    for entry in models.values():
        entry["p99_over_mean"] = error["p99_over_mean"]
    return {"source": "profile", "gpu": gpu.name, "citation": f"rlsched calibrate profile output in {data_dir}",
            "raw_files": {"profile": PROFILE_FILE}, "transfer": TRANSFER_NOTE, "inference": models, "training": {},
            "fit_error": {"profile": error}}


def fit_source(source: str, data_dir: Path, gpu_name: str | None = None) -> dict[str, Any]:
    """Build the calibration document of one source from its raw data."""
    if source == "migprofiler":
        return fit_migprofiler(data_dir)
    if source == "igniter":
        return fit_igniter(data_dir)
    if source == "miso":
        return fit_miso(data_dir)
    if source == "parvagpu":
        return fit_parvagpu(data_dir)
    if source == "profile":
        if gpu_name is None:
            raise ConfigError("--gpu", "gpu", None, "required with --source profile (the catalog GPU the profile ran on)")
        return fit_profile(data_dir, gpu_name)
    raise ConfigError("--source", "source", source, f"unknown source (allowed: {', '.join(SOURCE_NAMES)})")
