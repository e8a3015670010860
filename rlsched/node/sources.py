"""Observation sources of the daemon on real GPUs: inference servers' Prometheus endpoints and NVML telemetry.

On the simulator the simulator itself is the source. On a node, each tenant is an inference
server (Triton's metric names: ``nv_inference_request_success``, ``..._failure``,
``nv_inference_queue_duration_us``, ``nv_inference_compute_infer_duration_us``,
``nv_inference_exec_count``, ``nv_inference_pending_request_count``, optionally the
``nv_inference_request_summary_us`` quantiles) whose cumulative counters are scraped once
per decision interval; rates come from counter deltas. :class:`PrometheusSource` turns them
into the same per-tenant measurements the simulator reports
(``NodeSimulator.observation``), so the environment's observation encoder and the policies
cannot tell the difference. :class:`RequestLog` reads the arrival times the serving frontend
logs, for policies that replay the node's traffic. :class:`NvmlTelemetry` reads per-instance memory and, where the
GPU supports GPM, graphics-engine activity; it never changes anything.
"""

from __future__ import annotations

import logging
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prometheus_client.parser import text_string_to_metric_families

from rlsched.errors import ConfigError, RlschedError
from rlsched.simulator.node import RATE_EWMA_WEIGHT
from rlsched.workloads.scenario import Scenario

LOG = logging.getLogger("rlsched.daemon")

#: Triton's cumulative counters this source reads (per model; summed over versions and GPUs).
TRITON_COUNTERS: tuple[str, ...] = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_exec_count",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)
#: Triton's gauge of requests waiting or executing.
TRITON_PENDING = "nv_inference_pending_request_count"
#: Triton's latency summary (present when Triton runs with ``--metrics-config summary_latencies=true``).
TRITON_SUMMARY = "nv_inference_request_summary_us"


class SourceError(RlschedError):
    """An observation source could not be read this interval."""


@dataclass(frozen=True)
class Endpoint:
    """One Prometheus text endpoint and the tenants it serves.

    :param url: e.g. ``http://127.0.0.1:8002/metrics`` (Triton's metrics port)
    :param models: tenant name -> the ``model`` label its server reports
    """

    url: str
    models: Mapping[str, str]


@dataclass
class _TenantCounters:
    totals: dict[str, float] = field(default_factory=dict)
    at_s: float | None = None
    rate_ewma_rps: float | None = None


def parse_triton(text: str) -> dict[str, dict[str, float]]:
    """Triton metrics per model: the counters of :data:`TRITON_COUNTERS`, the pending gauge, and
    ``p99_us`` when the latency summary is present.

    Counters are summed over the other labels (versions, GPUs). Parsed with prometheus_client's
    text parser, which drops a ``_total`` suffix from counter family names; sample names are
    matched with and without it.
    """
    per_model: dict[str, dict[str, float]] = {}
    wanted = set(TRITON_COUNTERS) | {TRITON_PENDING}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            model = sample.labels.get("model")
            if model is None:
                continue
            name = sample.name.removesuffix("_total")
            entry = per_model.setdefault(model, {})
            if name in wanted:
                entry[name] = entry.get(name, 0.0) + float(sample.value)
            elif name == TRITON_SUMMARY and sample.labels.get("quantile") == "0.99" and math.isfinite(sample.value):
                entry["p99_us"] = max(entry.get("p99_us", 0.0), float(sample.value))
    return per_model


class PrometheusSource:
    """Per-tenant measurements from inference servers' Prometheus endpoints.

    :param scenario: the tenants (their SLOs decide on-time requests)
    :param endpoints: where each tenant's server publishes its metrics
    :param timeout_s: per scrape, seconds
    :param clock: monotonic clock for the interval between scrapes, seconds
    :param fetch: ``url -> text`` (default: HTTP GET); tests may inject one

    Without the latency summary there is no p99: the mean latency (queue + compute per
    request) stands in for it, and a request counts as on time when that estimate is within
    the SLO. With the summary, its 0.99 quantile decides. Failed requests count as dropped.
    """

    def __init__(
        self,
        scenario: Scenario,
        endpoints: Sequence[Endpoint],
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        fetch: Callable[[str], str] | None = None,
    ) -> None:
        self.tenants = {t.name: t for t in scenario.inference_tenants()}
        served = {name for e in endpoints for name in e.models}
        unknown = sorted(served - self.tenants.keys())
        if unknown:
            raise ConfigError("observations.endpoints", "models", unknown[0], f"not an inference tenant of scenario {scenario.name} ({', '.join(self.tenants)})")
        self.endpoints = list(endpoints)
        self.timeout_s, self.clock = timeout_s, clock
        self.fetch = fetch or self._http_get
        self._counters = {name: _TenantCounters() for name in served}
        self.scrape_errors = 0

    def _http_get(self, url: str) -> str:
        with urllib.request.urlopen(url, timeout=self.timeout_s) as response:  # noqa: S310 (operator-configured URL)
            return response.read().decode("utf-8", errors="replace")

    def measure(self) -> dict[str, dict[str, float]]:
        """Scrape every endpoint; per tenant the measurements since the previous scrape.

        Keys: those of ``NodeSimulator.observation`` (``arrival_rate_rps``,
        ``arrival_rate_ewma_rps``, ``queue_length``, ``p99_over_slo``, ``slo_attainment``,
        ``utilization``, ``accuracy``) plus the interval's counts (``completed``, ``dropped``,
        ``on_time``, ``violated``) and ``latency_ms_mean`` / ``latency_ms_p99``. The first
        scrape only sets the baseline (rates 0). An endpoint that cannot be read raises
        :class:`SourceError` after the others were read (their baselines move on).
        """
        now = self.clock()
        out: dict[str, dict[str, float]] = {}
        failed: list[str] = []
        for endpoint in self.endpoints:
            try:
                per_model = parse_triton(self.fetch(endpoint.url))
            except (OSError, urllib.error.URLError, ValueError) as exc:
                failed.append(f"{endpoint.url}: {exc}")
                continue
            for tenant, model in endpoint.models.items():
                out[tenant] = self._tenant(tenant, per_model.get(model, {}), now)
        if failed:
            self.scrape_errors += len(failed)
            raise SourceError("; ".join(failed))
        return out

    def _tenant(self, name: str, current: dict[str, float], now: float) -> dict[str, float]:
        t = self.tenants[name]
        state = self._counters[name]
        previous, since = state.totals, state.at_s
        delta = {}
        for key in TRITON_COUNTERS:
            value = current.get(key, 0.0)
            before = previous.get(key, value)
            # A counter that went down means the server restarted: count from zero.
            delta[key] = value - before if value >= before else value
        state.totals = {k: current.get(k, 0.0) for k in TRITON_COUNTERS}
        state.at_s = now
        interval_s = (now - since) if since is not None else 0.0
        success, failure = delta["nv_inference_request_success"], delta["nv_inference_request_failure"]
        executions = delta["nv_inference_exec_count"]
        mean_ms = (delta["nv_inference_queue_duration_us"] + delta["nv_inference_compute_infer_duration_us"]) / success / 1e3 if success else math.nan
        p99_ms = current["p99_us"] / 1e3 if "p99_us" in current else mean_ms
        rate = (success + failure) / interval_s if interval_s > 0 else 0.0
        state.rate_ewma_rps = rate if state.rate_ewma_rps is None else state.rate_ewma_rps + RATE_EWMA_WEIGHT * (rate - state.rate_ewma_rps)
        on_time = success if math.isfinite(p99_ms) and p99_ms <= t.slo_ms else 0.0
        decided = success + failure
        # Triton sums compute time over the requests of a batch; per execution it is the
        # per-request mean times the batch, so busy time ~ mean compute per request x requests / batch.
        busy_us = delta["nv_inference_compute_infer_duration_us"] / success * executions if success else 0.0
        return {
            "arrival_rate_rps": rate,
            "arrival_rate_ewma_rps": state.rate_ewma_rps,
            "queue_length": current.get(TRITON_PENDING, 0.0),
            "p99_over_slo": p99_ms / t.slo_ms if math.isfinite(p99_ms) else 0.0,
            "slo_attainment": on_time / decided if decided else 1.0,
            "utilization": min(1.0, busy_us / (interval_s * 1e6)) if interval_s > 0 else 0.0,
            "accuracy": 1.0,
            "completed": success,
            "dropped": failure,
            "on_time": on_time,
            "violated": success - on_time,
            "latency_ms_mean": mean_ms,
            "latency_ms_p99": p99_ms,
        }


def endpoints_from_config(data: Any, source: str) -> list[Endpoint]:
    """``[{url: ..., models: {tenant: model}}]`` from a daemon config; errors name the field."""
    if not isinstance(data, list) or not data:
        raise ConfigError(source, "observations.endpoints", data, "expected a non-empty list of {url, models}")
    endpoints = []
    for i, item in enumerate(data):
        where = f"observations.endpoints[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("url"), str) or not item["url"].startswith(("http://", "https://")):
            raise ConfigError(source, f"{where}.url", item.get("url") if isinstance(item, dict) else item, "expected an http(s) URL")
        models = item.get("models")
        if not isinstance(models, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in models.items()):
            raise ConfigError(source, f"{where}.models", models, "expected a mapping tenant -> Triton model name")
        endpoints.append(Endpoint(item["url"], dict(models)))
    return endpoints


# ---------------------------------------------------------------------------- NVML telemetry


@dataclass(frozen=True)
class InstanceTelemetry:
    """What NVML reports about one MIG device (or a whole GPU without MIG).

    :param gpu: GPU index
    :param gi_id: NVML GPU-instance id (-1 for a whole GPU)
    :param memory_used_bytes: device memory in use, bytes (None if NVML does not say)
    :param memory_total_bytes: device memory of the instance, bytes (None if unknown)
    :param gr_engine_active: graphics-engine active ratio in [0, 1] from GPM (None without GPM)
    """

    gpu: int
    gi_id: int
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    gr_engine_active: float | None = None


class NvmlTelemetry:
    """Read-only NVML telemetry per MIG device; functions a driver (or pynvml version) lacks are skipped.

    :param nvml: the pynvml module or a stand-in (:class:`~rlsched.node.fake_nvml.FakeNvml`)
    """

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._gpm_ok: dict[int, bool] = {}
        self._gpm_samples: dict[tuple[int, int], Any] = {}

    def read(self, gpu_count: int) -> list[InstanceTelemetry]:
        """Per MIG device of GPUs 0..gpu_count-1 (or per whole GPU without MIG)."""
        out: list[InstanceTelemetry] = []
        for g in range(gpu_count):
            try:
                device = self.nvml.nvmlDeviceGetHandleByIndex(g)
                mig_devices = self._mig_devices(device)
            except (self.nvml.NVMLError, AttributeError) as exc:
                LOG.debug("telemetry: GPU %d unreadable: %s", g, exc)
                continue
            if not mig_devices:
                out.append(InstanceTelemetry(g, -1, *self._memory(device), self._gpm(g, device, None)))
            for gi_id, handle in mig_devices:
                out.append(InstanceTelemetry(g, gi_id, *self._memory(handle), self._gpm(g, device, gi_id)))
        return out

    def _mig_devices(self, device: Any) -> list[tuple[int, Any]]:
        nvml = self.nvml
        try:
            current, _ = nvml.nvmlDeviceGetMigMode(device)
        except nvml.NVMLError:
            return []  # a GPU without MIG reports NOT_SUPPORTED
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        found = []
        for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(device)):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, i)
            except nvml.NVMLError:
                break  # NOT_FOUND past the last MIG device
            found.append((nvml.nvmlDeviceGetGpuInstanceId(handle), handle))
        return found

    def _memory(self, handle: Any) -> tuple[float | None, float | None]:
        try:
            info = self.nvml.nvmlDeviceGetMemoryInfo(handle)
        except (self.nvml.NVMLError, AttributeError):
            return None, None
        return float(info.used), float(info.total)

    def _gpm(self, g: int, device: Any, gi_id: int | None) -> float | None:
        """Graphics-engine activity since the previous read (GPM, Hopper and later), else None."""
        nvml = self.nvml
        try:
            if g not in self._gpm_ok:
                self._gpm_ok[g] = bool(nvml.nvmlGpmQueryDeviceSupport(device).isSupportedDevice)
            if not self._gpm_ok[g]:
                return None
            sample = nvml.nvmlGpmSampleAlloc()
            if gi_id is None:
                nvml.nvmlGpmSampleGet(device, sample)
            else:
                nvml.nvmlGpmMigSampleGet(device, gi_id, sample)
            previous = self._gpm_samples.pop((g, -1 if gi_id is None else gi_id), None)
            self._gpm_samples[(g, -1 if gi_id is None else gi_id)] = sample
            if previous is None:
                return None
            metrics = nvml.c_nvmlGpmMetricsGet_t()
            metrics.version = nvml.NVML_GPM_METRICS_GET_VERSION
            metrics.numMetrics = 1
            metrics.sample1, metrics.sample2 = previous, sample
            metrics.metrics[0].metricId = nvml.NVML_GPM_METRIC_GRAPHICS_UTIL
            nvml.nvmlGpmMetricsGet(metrics)  # pynvml passes it by reference
            nvml.nvmlGpmSampleFree(previous)
            return float(metrics.metrics[0].value) / 100.0  # NVML reports percent
        except (nvml.NVMLError, AttributeError):
            self._gpm_ok[g] = False
            return None


class RequestLog:
    """Arrival times of requests, as the serving frontend logs them: the request log that
    lets policies replay the node's own traffic (``migrator-hedge``'s shadows), where the
    Prometheus counters give only a rate per interval.

    The file is appended to by the frontend, one request per line: ``TENANT,UNIX_SECONDS``
    (the tenant's name in the scenario, the arrival's wall-clock time). Each :meth:`read`
    returns the lines added since the last one; a file that shrank (rotated) is read again
    from its start. Lines that do not parse, or name no inference tenant of the scenario,
    are skipped and counted (a telemetry glitch must not stop the daemon).

    :param path: the log file
    :param scenario: the node's tenants
    """

    def __init__(self, path: str | Path, scenario: Scenario) -> None:
        self.path = Path(path)
        self.tenants = frozenset(t.name for t in scenario.inference_tenants())
        self.offset = 0
        self.skipped_lines = 0

    def read(self) -> dict[str, np.ndarray]:
        """Per inference tenant, the sorted wall-clock arrival times logged since the last read, seconds."""
        try:
            size = self.path.stat().st_size
            if size < self.offset:  # rotated or truncated
                self.offset = 0
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read(size - self.offset)
        except OSError as exc:
            raise SourceError(f"request log {self.path}: cannot be read: {exc.strerror}") from None
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next read
        self.offset += len(complete)
        times: dict[str, list[float]] = {name: [] for name in self.tenants}
        for raw in complete.splitlines():
            name, _, stamp = raw.decode("utf-8", "replace").strip().partition(",")
            try:
                value = float(stamp)
            except ValueError:
                value = math.nan
            if name not in times or not math.isfinite(value):
                self.skipped_lines += bool(raw.strip())
                continue
            times[name].append(value)
        return {name: np.sort(np.asarray(v, dtype=float)) for name, v in times.items()}
