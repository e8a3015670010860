"""PerformanceModel: latency, throughput and memory of a tenant on any MIG/MPS share.

Every number comes from a calibration file under ``configs/calibration`` (or the directory
given to :meth:`PerformanceModel.load`); the hardware (SMs, slices, memory) comes from the
catalog in ``configs/hardware``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlsched.decision import SharingMode
from rlsched.errors import ConfigError
from rlsched.hardware.catalog import GpuSpec, gpu_names, load_gpu
from rlsched.perfmodel import calibration as cal
from rlsched.perfmodel.physics import Resources, gpu_time_ms, latency_ms

MAX_BATCH = 4096
# A model name may carry the calibration source to use: ``vgg19@parvagpu-a100-80gb`` (a
# calibration file's stem or its ``source`` field) or ``vgg19@auto`` (the best source for the
# model on the asked GPU). A bare name keeps the original rule, which never picks a source
# whose slices are inferred from one instance (so existing scenarios simulate unchanged).
SOURCE_SEPARATOR = "@"
AUTO_SOURCE = "auto"


def split_model_key(key: str) -> tuple[str, str | None]:
    """``"vgg19@auto"`` -> ``("vgg19", "auto")``; ``"vgg19"`` -> ``("vgg19", None)``."""
    name, sep, source = key.partition(SOURCE_SEPARATOR)
    return name, (source if sep else None)


@dataclass(frozen=True)
class CoRunner:
    """A tenant sharing the same GPU instance.

    :param model: model name (see :meth:`PerformanceModel.models`)
    :param batch: its batch size
    :param mps_pct: its MPS active-thread percentage, (0, 100]
    """

    model: str
    batch: int
    mps_pct: float = 100.0


@dataclass(frozen=True)
class Prediction:
    """Predicted behaviour of one tenant.

    :param latency_ms_mean: mean per-batch latency, ms
    :param latency_ms_p99: 99th-percentile per-batch latency, ms
    :param throughput_per_s: samples per second when batches run back to back
    :param memory_gib: device memory of this tenant, GiB
    :param fits: False when this tenant plus its co-runners exceed the instance's memory
    """

    latency_ms_mean: float
    latency_ms_p99: float
    throughput_per_s: float
    memory_gib: float
    fits: bool


class PerformanceModel:
    """Calibrated performance model (see :mod:`rlsched.perfmodel.physics` for the law)."""

    def __init__(self, files: Sequence[cal.CalibrationFile], throughput: dict, sharing: dict, memory_estimates: dict,
                 directory: Path) -> None:
        self._files = list(files)
        self._directory = directory
        self._throughput = throughput
        self._sharing = sharing
        self._memory_estimates = memory_estimates
        self._by_name: dict[tuple[str, str], list[cal.ModelCalibration]] = {}
        for f in self._files:
            for key, mc in f.models.items():
                self._by_name.setdefault(key, []).append(mc)
        interference = [f.interference for f in self._files if "l2_sensitivity" in f.interference]
        if not interference:
            raise ConfigError(directory, "interference.l2_sensitivity", None, "no calibration file provides the MPS interference fit (run calibrate fit --source igniter)")
        self._interference = interference[0]
        self._curve = functools.lru_cache(maxsize=65536)(self._curve_uncached)

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def load(cls, calibration_dir: str | Path | None = None) -> "PerformanceModel":
        """Load every calibration file of a directory (default: the packaged one)."""
        directory = Path(calibration_dir) if calibration_dir is not None else cal.packaged_calibration_dir()
        if not directory.is_dir():
            raise ConfigError(directory, "<dir>", str(directory), "calibration directory not found")
        paths = sorted(p for p in directory.glob("*.yaml") if p.name not in cal.SUPPORT_FILES)
        if not paths:
            raise ConfigError(directory, "<dir>", str(directory), "no calibration files (*.yaml) in it")
        throughput = cal.load_support(directory, "gpu-throughput.yaml").get("gpus", {})
        sharing = cal.load_support(directory, "sharing-modes.yaml")
        memory = cal.load_support(directory, "model-memory.yaml").get("models", {})
        return cls([cal.load(p) for p in paths], throughput, sharing, memory, directory)

    def models(self) -> list[str]:
        """Every model name with a calibration (inference models and training jobs)."""
        return sorted({name for _, name in self._by_name})

    # ---- resolution ---------------------------------------------------------------------
    def _calibration(self, kind: str, model: str, gpu: GpuSpec) -> cal.ModelCalibration:
        name, source = split_model_key(model)
        candidates = self._by_name.get((kind, name))
        if not candidates:
            known = sorted(n for k, n in self._by_name if k == kind)
            raise ConfigError("--model", "model", name, f"no {kind} calibration (known: {', '.join(known)})")
        if source is None:
            # The original rule: only sources that measured slices or shares.
            candidates = [mc for mc in candidates if mc.slices_measured] or candidates
        elif source != AUTO_SOURCE:
            named = [mc for mc in candidates if source in (mc.file_name, mc.source)]
            if not named:
                have = sorted({mc.file_name for mc in candidates})
                raise ConfigError("--source", "source", source, f"no {kind} calibration of {name} from it (sources with {name}: {', '.join(have)}; or auto)")
            candidates = named

        def score(mc: cal.ModelCalibration) -> tuple[int, ...]:
            ref = load_gpu(mc.gpu)
            # Same GPU, then same architecture, then a calibration GPU shared the same way;
            # (auto) then measured slices beat slices inferred from one instance.
            rank = (mc.gpu == gpu.name, ref.architecture == gpu.architecture, ref.mig_supported == gpu.mig_supported)
            return rank + ((mc.slices_measured,) if source is not None else ())
        return max(candidates, key=score)

    def calibration_for(self, gpu: str, model: str, kind: str = "inference") -> cal.ModelCalibration:
        """The calibration a prediction of ``model`` (a name or ``NAME@SOURCE``) on ``gpu`` uses."""
        return self._calibration(kind, model, load_gpu(gpu))

    def _gpu_rates(self, name: str) -> tuple[float, float]:
        entry = self._throughput.get(name)
        if not isinstance(entry, dict):
            raise ConfigError(self._directory / "gpu-throughput.yaml", f"gpus.{name}", entry, "GPU missing: add fp32_tflops and memory_bandwidth_gbps")
        return float(entry["fp32_tflops"]), float(entry["memory_bandwidth_gbps"])

    def _resources(self, gpu: GpuSpec, ref_gpu_name: str, profile: str | None, compute_slices: int | None, share: float) -> Resources:
        """Resources of a tenant relative to the whole calibration GPU."""
        if profile is None:
            sms, bw_frac = float(gpu.sm_count), 1.0
            if compute_slices is not None:
                raise ConfigError("--compute-slices", "compute_slices", compute_slices, "needs a MIG profile")
        else:
            if profile not in gpu.profiles:
                raise ConfigError("--profile", "profile", profile, f"not a profile of {gpu.name} (known: {', '.join(gpu.profiles)})")
            prof = gpu.profiles[profile]
            sms, bw_frac = float(prof.sm_count), prof.memory_slices / gpu.memory_slices
            if compute_slices is not None:
                if not 1 <= compute_slices <= prof.compute_slices:
                    raise ConfigError("--compute-slices", "compute_slices", compute_slices, f"must be 1..{prof.compute_slices} for {profile}")
                # A compute instance splits the GI's SMs but not its memory bandwidth.
                sms *= compute_slices / prof.compute_slices
        ref = load_gpu(ref_gpu_name)
        tflops, bw = self._gpu_rates(gpu.name)
        ref_tflops, ref_bw = self._gpu_rates(ref.name)
        speed = (tflops / gpu.sm_count) / (ref_tflops / ref.sm_count)
        return Resources(sms * share, float(ref.sm_count), speed, bw_frac * bw / ref_bw)

    # ---- core ---------------------------------------------------------------------------
    def _solo(self, kind: str, gpu: GpuSpec, model: str, batch: np.ndarray, profile: str | None, compute_slices: int | None,
              share: float) -> tuple[np.ndarray, np.ndarray, cal.ModelCalibration]:
        """(latency ms in the source metric, GPU busy ms) of the tenant alone at this share."""
        mc = self._calibration(kind, model, gpu)
        res = self._resources(gpu, mc.gpu, profile, compute_slices, share)
        return latency_ms(mc.params, batch, res), gpu_time_ms(mc.params, batch, res), mc

    def _runner_kind(self, kind: str, model: str) -> str:
        """The calibration kind to read a co-runner from: the asking tenant's kind when that
        model has one, else whichever kind does (a retraining job's model, e.g. ``bert``,
        may have only a training calibration while it shares a GI with inference)."""
        name = split_model_key(model)[0]
        if (kind, name) in self._by_name:
            return kind
        return "inference" if ("inference", name) in self._by_name else "training"

    def _l2_util(self, kind: str, gpu: GpuSpec, runner: CoRunner, profile: str | None, compute_slices: int | None, share: float) -> float:
        lat, busy, mc = self._solo(kind, gpu, runner.model, np.array([float(runner.batch)]), profile, compute_slices, share)
        if mc.l2_intensity is not None:
            used = mc.l2_intensity["l2_busy_ms_per_batch"] + mc.l2_intensity["l2_busy_ms_per_sample"] * runner.batch
            return float(min(1.0, used / lat[0]))
        return float(self._interference["default_l2_util_when_busy"] * busy[0] / lat[0])

    def _under_pressure(self, latency_ms: np.ndarray, busy_ms: np.ndarray, l2_pressure: float) -> np.ndarray:
        """MPS interference (iGniter's L2 form): the victim's latency grows with its GPU busy
        time times the summed L2 utilisation of its co-runners."""
        return latency_ms + float(self._interference["l2_sensitivity"]) * busy_ms * l2_pressure

    def _busy_fraction(self, kind: str, gpu: GpuSpec, runner: CoRunner, profile: str | None, compute_slices: int | None) -> float:
        lat, busy, _ = self._solo(kind, gpu, runner.model, np.array([float(runner.batch)]), profile, compute_slices, 1.0)
        return float(min(1.0, busy[0] / lat[0]))

    def _curve_uncached(self, kind: str, gpu_name: str, model: str, max_batch: int, profile: str | None, mps_pct: float,
                        mode: SharingMode, colocated: tuple[CoRunner, ...], compute_slices: int | None,
                        high_priority: bool) -> tuple[np.ndarray, np.ndarray]:
        gpu = load_gpu(gpu_name)
        if not 1 <= max_batch <= MAX_BATCH:
            raise ConfigError("--batch", "batch", max_batch, f"must be 1..{MAX_BATCH}")
        if not 0 < mps_pct <= 100:
            raise ConfigError("--mps-pct", "mps_pct", mps_pct, "must be in (0, 100]")
        for r in colocated:
            if not 0 < r.mps_pct <= 100 or r.batch < 1:
                raise ConfigError("--colocated", r.model, f"{r.batch}:{r.mps_pct}", "batch must be >= 1 and share in (0, 100]")
        batch = np.arange(1, max_batch + 1, dtype=float)
        if mode == SharingMode.MPS:
            # Shares summing above 100% are scaled down proportionally (sharing-modes.yaml).
            scale = min(1.0, 100.0 / (mps_pct + sum(r.mps_pct for r in colocated)))
            lat, busy, mc = self._solo(kind, gpu, model, batch, profile, compute_slices, mps_pct / 100 * scale)
            pressure = sum(self._l2_util(self._runner_kind(kind, r.model), gpu, r, profile, compute_slices,
                                         r.mps_pct / 100 * scale) for r in colocated)
            lat = self._under_pressure(lat, busy, pressure)
        elif mode == SharingMode.TIME_SLICE:
            lat, busy, mc = self._solo(kind, gpu, model, batch, profile, compute_slices, 1.0)
            ts = self._sharing["time_slice"]
            others = sum(self._busy_fraction(self._runner_kind(kind, r.model), gpu, r, profile, compute_slices) for r in colocated)
            lat = lat * (1.0 + others) * (1.0 + (float(ts["switch_ms"]) / float(ts["quantum_ms"]) if colocated else 0.0))
        else:
            lat, busy, mc = self._solo(kind, gpu, model, batch, profile, compute_slices, 1.0)
            pf = self._sharing["priority_fill"]
            if high_priority:
                lat = lat * (1.0 + (float(pf["overhead_frac"]) if colocated else 0.0))
            else:
                others = sum(self._busy_fraction(self._runner_kind(kind, r.model), gpu, r, profile, compute_slices) for r in colocated)
                lat = lat / max(float(pf["min_idle_frac"]), 1.0 - others)
        return self._mean_and_p99(lat, mc)

    @staticmethod
    def _mean_and_p99(lat: np.ndarray, mc: cal.ModelCalibration) -> tuple[np.ndarray, np.ndarray]:
        """(mean, p99) read-only curves from a latency curve in the source's metric."""
        # Work grows with batch; where the smooth fitted form dips at tiny batches (wave
        # under-fill), a batch is never reported faster than a smaller one.
        lat = np.maximum.accumulate(lat)
        if mc.latency_metric == "p99":
            p99, mean = lat, lat / mc.p99_over_mean
        else:
            mean, p99 = lat, lat * mc.p99_over_mean
        mean.setflags(write=False)
        p99.setflags(write=False)
        return mean, p99

    # ---- public API ---------------------------------------------------------------------
    def latency_curve_ms(self, gpu: str, model: str, max_batch: int, profile: str | None = None, mps_pct: float = 100.0,
                         mode: SharingMode = SharingMode.MPS, colocated: Sequence[CoRunner] = (), compute_slices: int | None = None,
                         *, high_priority: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(mean_ms, p99_ms) for batch sizes 1..max_batch (read-only arrays, cached)."""
        return self._curve("inference", gpu, model, int(max_batch), profile, float(mps_pct), SharingMode(mode), tuple(colocated),
                           compute_slices, high_priority)

    def predict(self, gpu: str, model: str, batch: int, profile: str | None = None, mps_pct: float = 100.0,
                mode: SharingMode = SharingMode.MPS, colocated: Sequence[CoRunner] = (), compute_slices: int | None = None,
                *, high_priority: bool = True) -> Prediction:
        """Latency, throughput and memory of one tenant.

        :param gpu: catalog GPU name, e.g. ``"a100-80gb"``
        :param profile: MIG GI profile, None = the whole GPU (no MIG)
        :param mps_pct: MPS active-thread percentage of this tenant (MPS mode only)
        :param colocated: the other tenants of the same instance
        :param compute_slices: compute-instance size inside the GI (None = the whole GI)
        :param high_priority: priority-fill mode only: is this tenant the high-priority one
            (its co-runners fill its idle gaps) or a low-priority filler
        """
        mean, p99 = self.latency_curve_ms(gpu, model, batch, profile, mps_pct, mode, colocated, compute_slices, high_priority=high_priority)
        memory = self.memory_gib(gpu, model, batch)
        spec = load_gpu(gpu)
        capacity = spec.profiles[profile].memory_gib if profile is not None else spec.memory_gib
        total = memory + sum(self.memory_gib(gpu, r.model, r.batch) for r in colocated)
        return Prediction(float(mean[-1]), float(p99[-1]), float(batch * 1000.0 / mean[-1]), memory, bool(total <= capacity))

    def inference_models(self) -> list[str]:
        """The model names with an inference calibration (what a service can run)."""
        return sorted(name for kind, name in self._by_name if kind == "inference")

    def l2_pressure(self, gpu: str, model: str, batch: int, profile: str | None = None, mps_pct: float = 100.0,
                    compute_slices: int | None = None) -> float:
        """The L2 utilisation an inference tenant puts on its MPS co-runners (what
        :meth:`latency_curve_ms` sums over ``colocated``), for shares summing to <= 100%."""
        if not 0 < mps_pct <= 100:
            raise ConfigError("--mps-pct", "mps_pct", mps_pct, "must be in (0, 100]")
        return self._l2_util("inference", load_gpu(gpu), CoRunner(model, int(batch), float(mps_pct)), profile, compute_slices, mps_pct / 100)

    def latency_curve_ms_under_pressure(self, gpu: str, model: str, max_batch: int, profile: str | None, mps_pct: float,
                                        l2_pressure: float, compute_slices: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean_ms, p99_ms) for batch sizes 1..max_batch of an inference tenant under MPS
        whose co-runners put ``l2_pressure`` (the sum of their :meth:`l2_pressure`) on it:
        equal to :meth:`latency_curve_ms` with those co-runners when the shares sum to <= 100%."""
        if not 0 < mps_pct <= 100:
            raise ConfigError("--mps-pct", "mps_pct", mps_pct, "must be in (0, 100]")
        spec = load_gpu(gpu)
        batch = np.arange(1, int(max_batch) + 1, dtype=float)
        lat, busy, mc = self._solo("inference", spec, model, batch, profile, compute_slices, mps_pct / 100)
        return self._mean_and_p99(self._under_pressure(lat, busy, float(l2_pressure)), mc)

    def memory_gib(self, gpu: str, model: str, batch: int, kind: str = "inference") -> float:
        """Device memory of the model at this batch, GiB (framework + weights + activations)."""
        spec = load_gpu(gpu)
        kind = kind if (kind, split_model_key(model)[0]) in self._by_name else "training"
        memory = self._calibration(kind, model, spec).memory or self._memory_estimates.get(split_model_key(model)[0])
        if memory is None:
            raise ConfigError(self._directory, f"{model}.memory", None, "no memory calibration or estimate for this model")
        return float(memory["base_gib"]) + float(memory["gib_per_sample"]) * batch

    def train_step_s(self, gpu: str, model: str, batch: int, profile: str | None = None, mps_pct: float = 100.0,
                     colocated: Sequence[CoRunner] = ()) -> float:
        """Seconds per training step (continual-learning retraining) under MPS sharing."""
        mean, _ = self._curve("training", gpu, model, int(batch), profile, float(mps_pct), SharingMode.MPS, tuple(colocated), None, True)
        return float(mean[-1]) / 1000.0


__all__ = ["AUTO_SOURCE", "SOURCE_SEPARATOR", "CoRunner", "PerformanceModel", "Prediction", "SharingMode", "gpu_names", "split_model_key"]
