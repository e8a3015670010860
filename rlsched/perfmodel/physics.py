"""The latency law every calibration source is fitted to.

One batch of ``b`` samples on an instance with ``S`` SMs (each ``speed`` times as fast as an
SM of the calibration GPU) and a share ``bw`` of the calibration GPU's DRAM bandwidth takes

    t_gpu(b) = fixed_gpu_ms + (base_work_ms + work_ms_per_sample * b
                               + work_ms_per_sqrt_sample * sqrt(b)) * R(b)
    R(b)     = (1 - memory_bound_fraction) * S_ref / speed * smax_k(1/S, 1/(q b))
               + memory_bound_fraction / bw
    latency  = smax_n(host_floor_ms, t_gpu(b)) + io_ms_per_sample * b

* ``fixed_gpu_ms``: per-kernel launch and tail costs that no extra SM shortens.
* The work terms are milliseconds on the whole calibration GPU (``S_ref`` SMs, full DRAM
  bandwidth). Compute-bound work scales with SMs, memory-bound work with bandwidth (MIG
  memory slices); the square-root term captures kernels whose efficiency improves with
  batch (larger GEMM tiles), so per-sample cost falls towards the linear slope.
* ``q`` (``parallel_sms_per_sample``): how many SMs one sample's kernels can keep busy; a
  small batch cannot fill a large instance (wave under-fill), so a larger share stops
  helping, as batch 1 saturates near 50-70% MPS on the V100. ``None`` = no limit.
* ``host_floor_ms``: a framework launching kernels eagerly (PyTorch) cannot go faster than
  its host-side launch loop; the GPU time hides under it when short (soft maximum with
  exponent ``host_softmax_exponent``).
* ``io_ms_per_sample``: PCIe transfer of inputs and outputs (iGniter's ``t_load + t_fb``).

Everything is monotone: more SMs, speed or bandwidth never increases latency, and a bigger
batch never decreases it, for any non-negative parameters (property-tested).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

# Exponent of the soft minimum between "SMs available" and "SMs a batch can fill". Fitted
# once on the iGniter V100 data (batch-1 saturation curve, sharpness between 2 and 4 gave
# equal cross-validated error); it is shape, not scale, so it transfers unchanged.
UNDERFILL_SOFTNESS = 3.0


@dataclass(frozen=True)
class LatencyParams:
    """Fitted parameters of one model under one calibration source (see module docstring).

    :param host_floor_ms: host-side launch floor of an eager framework, ms (0 = none)
    :param host_softmax_exponent: sharpness of the soft maximum with the floor (>= 1)
    :param fixed_gpu_ms: GPU time no SM or bandwidth shortens, ms
    :param base_work_ms: per-batch work on the whole calibration GPU, ms
    :param work_ms_per_sample: per-sample work on the whole calibration GPU, ms
    :param work_ms_per_sqrt_sample: work growing with sqrt(batch), ms
    :param parallel_sms_per_sample: SMs one sample can keep busy (None = unlimited)
    :param memory_bound_fraction: share of the work that scales with DRAM bandwidth, 0..1
    :param io_ms_per_sample: host<->device transfer per sample, ms
    """

    host_floor_ms: float = 0.0
    host_softmax_exponent: float = 4.0
    fixed_gpu_ms: float = 0.0
    base_work_ms: float = 0.0
    work_ms_per_sample: float = 0.0
    work_ms_per_sqrt_sample: float = 0.0
    parallel_sms_per_sample: float | None = None
    memory_bound_fraction: float = 0.0
    io_ms_per_sample: float = 0.0

    def to_dict(self) -> dict[str, float | None]:
        return {k: (None if v is None else float(v)) for k, v in asdict(self).items()}

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass(frozen=True)
class Resources:
    """What one tenant gets, relative to the calibration GPU of its parameters.

    :param sm_count: SMs the tenant's kernels may use (after MIG, CI and MPS limits)
    :param reference_sm_count: SMs of the whole calibration GPU (``S_ref``)
    :param sm_speed_ratio: per-SM throughput of this GPU over the calibration GPU's
    :param bandwidth_fraction: DRAM bandwidth available, as a fraction of the whole
        calibration GPU's bandwidth (may exceed 1 on a faster GPU)
    """

    sm_count: float
    reference_sm_count: float
    sm_speed_ratio: float = 1.0
    bandwidth_fraction: float = 1.0


def smooth_max(a: np.ndarray | float, b: np.ndarray | float, exponent: float) -> np.ndarray:
    """(a^n + b^n)^(1/n): a differentiable maximum, >= max(a, b), monotone in both."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    top = np.maximum(np.maximum(a, b), 1e-300)
    return top * ((a / top) ** exponent + (b / top) ** exponent) ** (1.0 / exponent)


def resource_time(params: LatencyParams, batch: np.ndarray, res: Resources) -> np.ndarray:
    """R(b): milliseconds per millisecond of whole-calibration-GPU work on these resources."""
    inv_sms = 1.0 / res.sm_count
    if params.parallel_sms_per_sample is not None:
        inv_sms = smooth_max(inv_sms, 1.0 / (params.parallel_sms_per_sample * batch), UNDERFILL_SOFTNESS)
    compute = (1.0 - params.memory_bound_fraction) * res.reference_sm_count / res.sm_speed_ratio * inv_sms
    return compute + params.memory_bound_fraction / res.bandwidth_fraction


def gpu_time_ms(params: LatencyParams, batch: np.ndarray, res: Resources) -> np.ndarray:
    """GPU busy time of one batch, ms (no host floor, no transfers)."""
    batch = np.asarray(batch, dtype=float)
    work = params.base_work_ms + params.work_ms_per_sample * batch + params.work_ms_per_sqrt_sample * np.sqrt(batch)
    return params.fixed_gpu_ms + work * resource_time(params, batch, res)


def combine_host_floor(params: LatencyParams, gpu_ms: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """Latency from GPU time: soft maximum with the host floor plus transfers, ms."""
    batch = np.asarray(batch, dtype=float)
    total = gpu_ms
    if params.host_floor_ms > 0:
        total = smooth_max(params.host_floor_ms, gpu_ms, params.host_softmax_exponent)
    return total + params.io_ms_per_sample * batch


def latency_ms(params: LatencyParams, batch: np.ndarray, res: Resources) -> np.ndarray:
    """Solo per-batch latency, ms, in the latency metric the source measured."""
    return combine_host_floor(params, gpu_time_ms(params, batch, res), batch)
