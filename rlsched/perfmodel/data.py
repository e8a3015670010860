"""Readers of the raw calibration data (../shared/data/calibration, see its SOURCES.md).

Each reader returns plain measurement records; nothing here fits or interprets. Units are
converted once, here: latencies to ms, memory to GiB. Bad or missing files raise
:class:`ConfigError` naming the file, the field and the value.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from rlsched.errors import ConfigError

DATA_ENV_VAR = "RLSCHED_CALIBRATION_DATA"
MIB_PER_GIB = 1024.0


def default_data_dir() -> Path:
    """``$RLSCHED_CALIBRATION_DATA``, else ``../shared/data/calibration`` beside the repo."""
    if os.environ.get(DATA_ENV_VAR):
        return Path(os.environ[DATA_ENV_VAR])
    repo = Path(__file__).resolve().parents[2]
    return repo.parent / "shared" / "data" / "calibration"


@dataclass(frozen=True)
class SliceMeasurement:
    """One (model, instance, batch) latency measurement on a MIG slice or a whole GPU.

    :param model: model name as the source spells it
    :param instance: MIG profile name (e.g. ``"1g.10gb"``) or ``"whole"`` for no MIG
    :param batch: samples per batch
    :param latency_ms: per-batch latency (or training step time), ms
    :param latency_std_ms: its standard deviation, ms (None when not reported)
    :param memory_gib: device memory used, GiB (None when not reported)
    """

    model: str
    instance: str
    batch: int
    latency_ms: float
    latency_std_ms: float | None = None
    memory_gib: float | None = None


@dataclass(frozen=True)
class MpsSoloMeasurement:
    """One iGniter solo measurement: a model alone on the V100 at an MPS share.

    :param l2_util: L2 cache utilization, fraction 0..1 (None when not reported)
    :param dram_util: DRAM bandwidth utilization, fraction 0..1 (None when not reported)
    """

    model: str
    batch: int
    mps_pct: float
    latency_ms: float
    l2_util: float | None
    dram_util: float | None


@dataclass(frozen=True)
class MpsPairMeasurement:
    """One tenant's latency while co-located with another under MPS (iGniter pair data)."""

    model: str
    batch: int
    mps_pct: float
    co_model: str
    co_batch: int
    co_mps_pct: float
    latency_ms: float
    latency_std_ms: float


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise ConfigError(path, "<file>", None, "raw data file not found (set --data or $" + DATA_ENV_VAR + ")")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(path, missing[0], None, f"column missing (has {reader.fieldnames})")
        return list(reader)


def _number(path: Path, row_index: int, row: dict[str, str], column: str, allow_empty: bool = False) -> float | None:
    text = row.get(column, "")
    if text == "" and allow_empty:
        return None
    try:
        value = float(text)
    except ValueError as exc:
        raise ConfigError(path, f"row {row_index + 2}.{column}", text, "expected a number") from exc
    if value < 0 or value != value:
        raise ConfigError(path, f"row {row_index + 2}.{column}", text, "expected a non-negative number")
    return value


# The raw slice format: MIGProfiler's integrated_result.csv columns. The profiler writes it too.
SLICE_COLUMNS = ("model_name", "batch_size", "latency", "latency_std", "mig_profile")


def read_slice_csv(path: Path, model_column: str = "model_name") -> list[SliceMeasurement]:
    """Read a MIGProfiler-format CSV (also what ``rlsched calibrate profile`` writes)."""
    out = []
    for i, row in enumerate(_rows(path, SLICE_COLUMNS)):
        if _number(path, i, row, "latency") == 0.0:
            # MIGProfiler writes an all-zero row for a run that failed (out of memory).
            continue
        fb = _number(path, i, row, "fb_used_mean", allow_empty=True) if "fb_used_mean" in row else None
        out.append(SliceMeasurement(
            model=row[model_column], instance=row["mig_profile"], batch=int(_number(path, i, row, "batch_size")),
            latency_ms=_number(path, i, row, "latency"), latency_std_ms=_number(path, i, row, "latency_std", True),
            memory_gib=None if fb is None else fb / MIB_PER_GIB))
    return out


def migprofiler_files(data_dir: Path) -> dict[str, Path]:
    """The MIGProfiler A100-80GB files the fitter uses, keyed by what they hold."""
    base = Path(data_dir) / "migprofiler-a100-mig" / "data" / "A100-80g"
    return {
        "vision": base / "infer" / "cv" / "integrated_result.csv",   # latency = P99 ms
        "nlp": base / "infer" / "nlp" / "integrated_result_bsz.csv",  # latency = MEAN ms
        "train": base / "train" / "cv" / "integrated_result.csv",    # step time, ms
    }


def read_migprofiler(data_dir: Path) -> dict[str, list[SliceMeasurement]]:
    """MIGProfiler A100-80GB: vision inference (P99), bert-base inference (mean), training."""
    return {kind: read_slice_csv(path) for kind, path in migprofiler_files(data_dir).items()}


def igniter_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "igniter-v100-mps"


def read_igniter_solo(data_dir: Path) -> list[MpsSoloMeasurement]:
    """iGniter V100 solo profile: latency (ms) at (batch, MPS share) with L2/DRAM use."""
    path = igniter_dir(data_dir) / "v100_mps_solo_profile_flat.csv"
    out = []
    for i, row in enumerate(_rows(path, ("model", "batch", "mps_pct", "latency_ms", "l2cache", "dram"))):
        l2 = _number(path, i, row, "l2cache", True)
        dram = _number(path, i, row, "dram", True)
        out.append(MpsSoloMeasurement(
            model=row["model"], batch=int(_number(path, i, row, "batch")), mps_pct=_number(path, i, row, "mps_pct"),
            latency_ms=_number(path, i, row, "latency_ms"),
            l2_util=None if l2 is None else l2 / 100.0, dram_util=None if dram is None else dram / 100.0))
    return out


def read_igniter_pairs(data_dir: Path) -> list[MpsPairMeasurement]:
    """iGniter pair data, one record per tenant (two per row).

    The co-runner's share is 100 - mps_pct_a: inferred by SOURCES.md, not documented.
    """
    path = igniter_dir(data_dir) / "v100_mps_pair_interference_flat.csv"
    cols = ("model_a", "model_b", "batch_a", "batch_b", "mps_pct_a", "latency_a_ms", "latency_b_ms", "std_a", "std_b")
    out = []
    for i, row in enumerate(_rows(path, cols)):
        pct_a = _number(path, i, row, "mps_pct_a")
        a = (row["model_a"], int(_number(path, i, row, "batch_a")), pct_a)
        b = (row["model_b"], int(_number(path, i, row, "batch_b")), 100.0 - pct_a)
        out.append(MpsPairMeasurement(*a, *b, _number(path, i, row, "latency_a_ms"), _number(path, i, row, "std_a")))
        out.append(MpsPairMeasurement(*b, *a, _number(path, i, row, "latency_b_ms"), _number(path, i, row, "std_b")))
    return out


def read_miso(data_dir: Path) -> list[SliceMeasurement]:
    """MISO A100-40GB training step times (median per iteration, converted to ms)."""
    path = Path(data_dir) / "miso-a100-40gb-mig-train" / "mig_train_iter_time_summary.csv"
    out = []
    for i, row in enumerate(_rows(path, ("mig_slice", "model", "batch", "median_iter_s"))):
        out.append(SliceMeasurement(model=row["model"], instance=row["mig_slice"], batch=int(_number(path, i, row, "batch")),
                                    latency_ms=1000.0 * _number(path, i, row, "median_iter_s")))
    return out


# ---- a user's full-GPU profile -----------------------------------------------------------
# One documented format (docs/calibration-sources.md), ParvaGPU's prof_data columns: one row
# per (model, batch, process count) on ONE instance of the GPU (mig_gpcs = its compute slices,
# 0 = the whole GPU without MIG). An all-zero row means "not measured" and is skipped. An
# optional ``sm_limit`` column (empty or 0 = none) marks rows whose kernels ran on that many
# SMs of the instance with all of its DRAM bandwidth (a CUDA green context:
# ``rlsched calibrate profile --sm-limits``).
FULL_GPU_PROFILE_FILE = "full_gpu_profile.csv"
FULL_GPU_COLUMNS = ("model", "mig_gpcs", "batch", "mps_processes", "throughput_per_process", "latency_s")


@dataclass(frozen=True)
class FullGpuMeasurement:
    """One row of a full-GPU profile: ``processes`` identical copies of a model under MPS.

    :param model: model name
    :param mig_gpcs: compute slices (GPCs) of the profiled instance, 0 = whole GPU, no MIG
    :param batch: samples per batch
    :param processes: identical processes running at once in the instance (MPS, no limits)
    :param latency_ms: mean per-batch time of ONE process, ms (batch * 1000 / throughput,
        more precise than the rounded ``latency_s`` column)
    :param memory_gib: device memory of one process, GiB (None when not reported)
    :param sm_limit: SMs the process's kernels were limited to, with the instance's whole
        DRAM bandwidth (None = the instance's SMs)
    """

    model: str
    mig_gpcs: int
    batch: int
    processes: int
    latency_ms: float
    memory_gib: float | None = None
    sm_limit: int | None = None


def read_full_gpu_profile(path: Path) -> list[FullGpuMeasurement]:
    """Read and validate a full-GPU profile CSV (see :data:`FULL_GPU_COLUMNS`).

    Raises :class:`ConfigError` naming file, ``row N.column`` and value for a missing column,
    a non-number, a batch or process count below 1, or a row whose latency is set but whose
    throughput is not positive.
    """
    path = Path(path)
    out = []
    for i, row in enumerate(_rows(path, FULL_GPU_COLUMNS)):
        tput = _number(path, i, row, "throughput_per_process")
        lat_s = _number(path, i, row, "latency_s")
        if lat_s == 0.0 and tput == 0.0:
            continue  # not measured (out of memory or skipped)
        if tput <= 0.0:
            raise ConfigError(path, f"row {i + 2}.throughput_per_process", row["throughput_per_process"],
                              f"must be > 0 where latency_s is set ({row['latency_s']})")
        batch = _number(path, i, row, "batch")
        procs = _number(path, i, row, "mps_processes")
        gpcs = _number(path, i, row, "mig_gpcs")
        for column, value in (("batch", batch), ("mps_processes", procs)):
            if value < 1 or value != int(value):
                raise ConfigError(path, f"row {i + 2}.{column}", row[column], "expected an integer >= 1")
        if gpcs != int(gpcs):
            raise ConfigError(path, f"row {i + 2}.mig_gpcs", row["mig_gpcs"], "expected an integer (0 = whole GPU, no MIG)")
        mem = _number(path, i, row, "memory_mib", allow_empty=True) if "memory_mib" in row else None
        sm_limit = _number(path, i, row, "sm_limit", allow_empty=True) if "sm_limit" in row else None
        if sm_limit is not None and sm_limit != int(sm_limit):
            raise ConfigError(path, f"row {i + 2}.sm_limit", row["sm_limit"], "expected an integer (empty or 0 = no limit)")
        out.append(FullGpuMeasurement(row["model"], int(gpcs), int(batch), int(procs), 1000.0 * batch / tput,
                                      None if mem is None else mem / MIB_PER_GIB, int(sm_limit) if sm_limit else None))
    if not out:
        raise ConfigError(path, "<rows>", None, "no measured row (every row is empty or all zero)")
    return out
