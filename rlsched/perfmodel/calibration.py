"""Calibration files: reading (validated) and writing (atomic) of configs/calibration/*.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rlsched.errors import ConfigError
from rlsched.fileio import write_text_atomically
from rlsched.perfmodel.physics import LatencyParams

SCHEMA = "rlsched-perfmodel-calibration/1"
# Hand-written support files in the same folder (not per-source fits).
SUPPORT_FILES = ("gpu-throughput.yaml", "sharing-modes.yaml", "model-memory.yaml", "plan-latency.yaml")


def packaged_calibration_dir() -> Path:
    return Path(str(resources.files("rlsched.configs") / "calibration"))


@dataclass(frozen=True)
class ModelCalibration:
    """One model under one source.

    :param kind: ``inference`` or ``training``
    :param latency_metric: ``p99``, ``mean`` or ``step`` (what the fitted latency is)
    :param p99_over_mean: converts between P99 and mean latency
    :param memory: ``base_gib`` and ``gib_per_sample`` (None when the source has none)
    :param l2_intensity: L2-busy ms per batch and per sample (None when not measured)
    :param file_name: the calibration file's stem, the name ``--source`` picks it by
    :param slices_measured: False when the source measured one instance only and every other
        slice or share is inferred (``slice_behaviour: inferred`` in the file)
    """

    name: str
    source: str
    gpu: str
    kind: str
    latency_metric: str
    params: LatencyParams
    p99_over_mean: float = 1.0
    memory: dict[str, float] | None = None
    l2_intensity: dict[str, float] | None = None
    file_name: str = ""
    slices_measured: bool = True


@dataclass
class CalibrationFile:
    path: Path
    source: str
    gpu: str
    models: dict[tuple[str, str], ModelCalibration] = field(default_factory=dict)  # (kind, name)
    interference: dict[str, Any] = field(default_factory=dict)


def save(doc: dict[str, Any], path: str | Path) -> None:
    """Write a calibration document atomically (a reader never sees half a file)."""
    doc = {"schema": SCHEMA, **doc}
    write_text_atomically(path, yaml.safe_dump(doc, sort_keys=False, width=120))


def _num(path: Path, where: str, value: Any, minimum: float = 0.0, maximum: float = float("inf")) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (minimum <= value <= maximum):
        raise ConfigError(path, where, value, f"expected a number in [{minimum}, {maximum}]")
    return float(value)


def _params(path: Path, where: str, raw: Any) -> LatencyParams:
    if not isinstance(raw, dict):
        raise ConfigError(path, where, raw, "expected a mapping of parameter names to numbers")
    unknown = set(raw) - set(LatencyParams.names())
    if unknown:
        raise ConfigError(path, f"{where}.{sorted(unknown)[0]}", raw[sorted(unknown)[0]], f"unknown parameter (allowed: {', '.join(LatencyParams.names())})")
    values: dict[str, float | None] = {}
    for name, value in raw.items():
        if name == "parallel_sms_per_sample" and value is None:
            values[name] = None
            continue
        hi = 1.0 if name == "memory_bound_fraction" else float("inf")
        lo = 1.0 if name == "host_softmax_exponent" else (1e-9 if name == "parallel_sms_per_sample" else 0.0)
        values[name] = _num(path, f"{where}.{name}", value, lo, hi)
    return LatencyParams(**values)  # type: ignore[arg-type]


def load(path: str | Path) -> CalibrationFile:
    """Read and validate one calibration file; errors name file, field and value."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(path, "<file>", None, f"cannot read YAML: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ConfigError(path, "schema", doc.get("schema") if isinstance(doc, dict) else doc, f"expected '{SCHEMA}'")
    for key in ("source", "gpu"):
        if not isinstance(doc.get(key), str):
            raise ConfigError(path, key, doc.get(key), "expected a string")
    out = CalibrationFile(path, doc["source"], doc["gpu"], interference=dict(doc.get("interference") or {}))
    behaviour = doc.get("slice_behaviour", "measured")
    if behaviour not in ("measured", "inferred"):
        raise ConfigError(path, "slice_behaviour", behaviour, "expected measured or inferred")
    for kind in ("inference", "training"):
        section = doc.get(kind) or {}
        if not isinstance(section, dict):
            raise ConfigError(path, kind, section, "expected a mapping of model names")
        for name, entry in section.items():
            where = f"{kind}.{name}"
            if not isinstance(entry, dict):
                raise ConfigError(path, where, entry, "expected a mapping")
            metric = entry.get("latency_metric")
            if metric not in ("p99", "mean", "step"):
                raise ConfigError(path, f"{where}.latency_metric", metric, "expected p99, mean or step")
            memory = entry.get("memory")
            if memory is not None:
                memory = {k: _num(path, f"{where}.memory.{k}", memory.get(k)) for k in ("base_gib", "gib_per_sample")}
            l2 = entry.get("l2_intensity")
            if l2 is not None:
                l2 = {k: _num(path, f"{where}.l2_intensity.{k}", l2.get(k)) for k in ("l2_busy_ms_per_batch", "l2_busy_ms_per_sample")}
            out.models[(kind, name)] = ModelCalibration(
                name, out.source, out.gpu, kind, metric, _params(path, f"{where}.params", entry.get("params")),
                _num(path, f"{where}.p99_over_mean", entry.get("p99_over_mean", 1.0), 1.0, 10.0), memory, l2,
                path.stem, behaviour == "measured")
    return out


def load_support(directory: Path, name: str) -> dict[str, Any]:
    path = directory / name
    if not path.is_file():
        path = packaged_calibration_dir() / name
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(path, "<file>", None, f"cannot read YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(path, "<root>", doc, "expected a mapping")
    return doc
