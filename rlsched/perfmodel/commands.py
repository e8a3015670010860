"""The ``predict`` and ``calibrate {fit,report,profile,compare}`` subcommands of the rlsched CLI."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlsched.errors import ConfigError

REPORT_SOURCES = ("migprofiler", "igniter", "miso", "parvagpu")


def model_key(model: str, source: str) -> str:
    """The model name the performance model resolves: ``MODEL@SOURCE`` (see model.py)."""
    from rlsched.perfmodel.model import SOURCE_SEPARATOR
    return model if SOURCE_SEPARATOR in model else f"{model}{SOURCE_SEPARATOR}{source}"


def _colocated(values: list[str], source: str = "auto") -> list:
    from rlsched.perfmodel.model import CoRunner
    out = []
    for text in values:
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            out.append(CoRunner(model_key(parts[0], source), int(parts[1]), float(parts[2]) if len(parts) == 3 else 100.0))
        except ValueError as exc:
            raise ConfigError("--colocated", "colocated", text, "expected MODEL:BATCH[:PCT], e.g. vgg19:8:50") from exc
    return out


def cmd_predict(args: argparse.Namespace) -> int:
    from rlsched.perfmodel.model import PerformanceModel, SharingMode
    model = PerformanceModel.load(args.calibration)
    key = model_key(args.model, args.source)
    pred = model.predict(args.gpu, key, args.batch, args.profile, args.mps_pct, SharingMode(args.mode),
                         _colocated(args.colocated, args.source), args.compute_slices, high_priority=not args.low_priority)
    used = model.calibration_for(args.gpu, key)
    doc = {"latency_ms_p99": round(pred.latency_ms_p99, 4), "latency_ms_mean": round(pred.latency_ms_mean, 4),
           "throughput_per_s": round(pred.throughput_per_s, 3), "memory_gib": round(pred.memory_gib, 4), "fits": pred.fits,
           "source": used.file_name, "calibrated_on": used.gpu, "slices": "measured" if used.slices_measured else "inferred"}
    if args.json:
        print(json.dumps(doc))
    else:
        for k, v in doc.items():
            print(f"{k:18s} {v}")
    return 0


def _data_dir(args: argparse.Namespace) -> Path:
    from rlsched.perfmodel.data import default_data_dir
    path = Path(args.data) if args.data else default_data_dir()
    if not path.is_dir():
        raise ConfigError("--data", "data", str(path), "raw data directory not found")
    return path


def cmd_calibrate_fit(args: argparse.Namespace) -> int:
    from rlsched.perfmodel import calibration
    from rlsched.perfmodel.sources import fit_source
    doc = fit_source(args.source, _data_dir(args), args.gpu)
    calibration.save(doc, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def report_rows(data_dir: Path) -> list[dict]:
    """Cross-validated MAPE of each source and its reference baseline (refits from raw data)."""
    from rlsched.perfmodel.sources import fit_source
    rows = []
    for source in REPORT_SOURCES:
        doc = fit_source(source, data_dir)
        for part, err in doc["fit_error"].items():
            baseline = err.get("baseline", {})
            rows.append({"source": source, "gpu": doc["gpu"], "data": part, "cv_scheme": err["cv_scheme"],
                         "model_cv_mape_pct": err["cv_mape_pct"], "baseline": baseline.get("name", ""),
                         "baseline_cv_mape_pct": baseline.get("cv_mape_pct"),
                         "no_interference_mape_pct": err.get("baseline_no_interference_mape_pct"),
                         "per_model_mape_pct": err.get("cv_per_model_mape_pct", {}),
                         "per_held_out_group_mape_pct": err.get("cv_per_held_out_group_mape_pct", {})})
    return rows


def cmd_calibrate_report(args: argparse.Namespace) -> int:
    rows = report_rows(_data_dir(args))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'source':12s} {'gpu':10s} {'data':7s} {'cv scheme':45s} {'model %':>8s} {'baseline %':>10s}  baseline")
    for r in rows:
        base = "" if r["baseline_cv_mape_pct"] is None else f"{r['baseline_cv_mape_pct']:.2f}"
        extra = f" (no interference: {r['no_interference_mape_pct']:.2f}%)" if r["no_interference_mape_pct"] is not None else ""
        print(f"{r['source']:12s} {r['gpu']:10s} {r['data']:7s} {r['cv_scheme']:45s} {r['model_cv_mape_pct']:8.2f} {base:>10s}  {r['baseline']}{extra}")
        for label, values in (("models", r["per_model_mape_pct"]), ("held out", r["per_held_out_group_mape_pct"])):
            if values:
                print(f"{'':12s}   {label}: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items()))
    return 0


def cmd_calibrate_profile(args: argparse.Namespace) -> int:
    from rlsched.perfmodel.profiler import profile_models
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError as exc:
        raise ConfigError("--batches", "batches", args.batches, "expected comma-separated integers, e.g. 1,2,4") from exc
    try:
        sm_limits = [int(n) for n in args.sm_limits.split(",")] if args.sm_limits else None
    except ValueError as exc:
        raise ConfigError("--sm-limits", "sm_limits", args.sm_limits, "expected comma-separated integers, e.g. 16,32,64") from exc
    path = profile_models(args.models.split(","), batches, args.device, Path(args.out), args.instance, args.iterations,
                          args.host_input, sm_limits)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def compare_rows(profile_csv: Path, gpu: str, source: str, calibration_dir: str | None = None) -> list[dict]:
    """Each row of a measured profile (``calibrate profile``'s ``latency.csv``) beside the
    model's prediction of its mean latency on ``gpu`` from ``source``: the check of a
    calibration's transfer to a GPU or stack it was not fitted on. Rows of a model that
    ``source`` does not calibrate are left out."""
    import csv

    from rlsched.hardware.catalog import load_gpu
    from rlsched.perfmodel.model import PerformanceModel
    model, spec = PerformanceModel.load(calibration_dir), load_gpu(gpu)
    try:
        with profile_csv.open(newline="") as handle:
            measured = list(csv.DictReader(handle))
    except OSError as exc:
        raise ConfigError(str(profile_csv), "profile", str(profile_csv), f"cannot read the measured profile: {exc}") from exc
    rows = []
    for row in measured:
        try:
            name, batch, mean_ms = row["model_name"], int(row["batch_size"]), float(row["latency_mean"])
            instance = None if row["mig_profile"] == "whole" else row["mig_profile"]
            sm_limit = int(row.get("sm_limit") or 0)
            instance_sms = spec.profiles[instance].sm_count if instance else spec.sm_count
        except (KeyError, ValueError) as exc:
            raise ConfigError(str(profile_csv), "latency_mean", row, f"not a calibrate profile row of {gpu}: {exc}") from exc
        # An SM-limited row (a green context) is an MPS share of its instance with no co-runner.
        mps_pct = 100.0 * min(sm_limit, instance_sms) / instance_sms if sm_limit else 100.0
        try:
            used = model.calibration_for(gpu, model_key(name, source))
        except ConfigError:
            continue  # a model this source has no calibration of: the caller names it
        predicted = model.predict(gpu, model_key(name, source), batch, instance, mps_pct)
        rows.append({"model": name, "batch": batch, "instance": instance or "whole", "sm_limit": sm_limit or None, "measured_ms": mean_ms,
                     "predicted_ms": round(predicted.latency_ms_mean, 4), "source": used.file_name,
                     "error_pct": round(100.0 * (predicted.latency_ms_mean - mean_ms) / mean_ms, 2)})
    return rows


def cmd_calibrate_compare(args: argparse.Namespace) -> int:
    import numpy as np
    rows = compare_rows(Path(args.profile), args.gpu, args.source, args.calibration)
    if not rows:
        raise ConfigError(args.profile, "source", args.source, "calibrates none of the profile's models")
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'model':12s} {'batches':>7s} {'MAPE %':>7s} {'median error %':>15s} {'error at largest batch %':>25s}  source")
    for name in dict.fromkeys(r["model"] for r in rows):
        own = [r for r in rows if r["model"] == name]
        errors = np.array([r["error_pct"] for r in own])
        largest = max(own, key=lambda r: r["batch"])
        print(f"{name:12s} {len(own):7d} {np.abs(errors).mean():7.2f} {np.median(errors):15.2f} {largest['error_pct']:25.2f}  {own[0]['source']}")
    print(f"{'all':12s} {len(rows):7d} {np.mean([abs(r['error_pct']) for r in rows]):7.2f}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``predict`` and ``calibrate`` to the rlsched parser."""
    p = sub.add_parser("predict", help="predict latency, throughput and memory of a tenant")
    p.add_argument("--gpu", required=True, help="catalog GPU name, e.g. a100-80gb")
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--profile", default=None, help="MIG GI profile, e.g. 3g.40gb (omit: whole GPU)")
    p.add_argument("--compute-slices", type=int, default=None, help="compute-instance size inside the GI")
    p.add_argument("--mps-pct", type=float, default=100.0)
    p.add_argument("--mode", default="mps", choices=["mps", "time-slice", "priority-fill"])
    p.add_argument("--low-priority", action="store_true", help="priority-fill: this tenant fills the others' gaps")
    p.add_argument("--colocated", nargs="*", default=[], metavar="MODEL:BATCH:PCT")
    p.add_argument("--calibration", default=None, help="calibration directory (default: packaged)")
    p.add_argument("--source", default="auto",
                   help="calibration source (file stem, e.g. parvagpu-a100-80gb); default auto: the best source for this model on this GPU")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_predict)

    cal = sub.add_parser("calibrate", help="fit, report or measure performance-model calibrations")
    csub = cal.add_subparsers(dest="calibrate_command", required=True)
    p = csub.add_parser("fit", help="rebuild one calibration file from raw data")
    p.add_argument("--source", required=True, choices=["migprofiler", "igniter", "miso", "parvagpu", "profile"])
    p.add_argument("--data", default=None, help="raw data dir (default: $RLSCHED_CALIBRATION_DATA or ../shared/data/calibration)")
    p.add_argument("--gpu", default=None, help="catalog GPU the profile ran on (--source profile)")
    # --data for parvagpu: the folder holding full_gpu_profile.csv, or the calibration data root
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_calibrate_fit)
    p = csub.add_parser("report", help="cross-validated MAPE per source with reference baselines")
    p.add_argument("--data", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate_report)
    p = csub.add_parser("profile", help="measure latency of models on a device")
    p.add_argument("--models", required=True,
                   help="comma-separated, e.g. resnet50,tiny-mlp; ParvaGPU's names (vgg19, bert-large, ...) need torchvision or transformers")
    p.add_argument("--batches", required=True, help="comma-separated, e.g. 1,2,4,8")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--instance", default="whole", help="MIG profile name of the device, or 'whole'")
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--host-input", action="store_true",
                   help="each batch starts in host memory and its copy to the device is timed, as a server's is")
    p.add_argument("--sm-limits", default=None,
                   help="also measure on these SM counts (CUDA green contexts, no MIG or MPS change), e.g. 16,32,64: "
                        "such rows let the fit identify each model's memory-bound share")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_calibrate_profile)
    p = csub.add_parser("compare", help="a measured profile beside the model's prediction (a calibration's transfer error)")
    p.add_argument("--profile", required=True, help="latency.csv written by calibrate profile")
    p.add_argument("--gpu", required=True, help="catalog GPU the profile ran on, e.g. h100-80gb")
    p.add_argument("--source", default="auto", help="calibration source to predict from, e.g. parvagpu-a100-80gb")
    p.add_argument("--calibration", default=None, help="calibration directory (default: packaged)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate_compare)
