"""Real-device latency profiler: plain-torch models, CUDA events (wall clock on CPU).

Writes ``full_gpu_profile.csv`` (the documented full-GPU profile format, one process per row;
see :data:`rlsched.perfmodel.data.FULL_GPU_COLUMNS`) and, for reference, ``latency.csv`` in the
MIGProfiler column format (P99 and spread), so ``rlsched calibrate fit --source profile
--data DIR --gpu NAME`` can fit it.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import numpy as np

from rlsched.errors import ConfigError
from rlsched.fileio import write_text_atomically
from rlsched.perfmodel.data import FULL_GPU_COLUMNS, FULL_GPU_PROFILE_FILE
from rlsched.perfmodel.sources import PROFILE_FILE

WARMUP_ITERATIONS = 5


def build_model(name: str):
    """A plain-torch model by name (no downloads): torchvision-free definitions."""
    import torch
    from torch import nn
    if name == "tiny-mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10)), (3, 32, 32)
    if name == "tiny-cnn":
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)), (3, 32, 32)
    if name == "resnet50":
        return _resnet50(torch, nn), (3, 224, 224)
    raise ConfigError("--models", "models", name, "unknown model (allowed: tiny-mlp, tiny-cnn, resnet50)")


def _resnet50(torch, nn):
    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    layers: list = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers)


def measure_ms(model, shape: tuple[int, ...], batch: int, device, iterations: int) -> np.ndarray:
    """Per-batch latencies, ms: CUDA events on a GPU, wall clock otherwise."""
    import torch
    x = torch.randn((batch, *shape), device=device)
    times = []
    with torch.inference_mode():
        for _ in range(WARMUP_ITERATIONS):
            model(x)
        for _ in range(iterations):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(x)
                end.record()
                torch.cuda.synchronize(device)
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                model(x)
                times.append(1000.0 * (time.perf_counter() - t0))
    return np.array(times)


def profile_models(models: list[str], batches: list[int], device_name: str, out_dir: Path, instance: str = "whole",
                   iterations: int = 50) -> Path:
    """Measure every (model, batch) and write ``out_dir/latency.csv``; returns its path."""
    import torch
    if iterations < 2 or any(b < 1 for b in batches):
        raise ConfigError("--batches/--iterations", "batches", batches, "batches >= 1 and iterations >= 2")
    try:
        device = torch.device(device_name)
    except RuntimeError as exc:
        raise ConfigError("--device", "device", device_name, str(exc)) from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", "device", device_name, "CUDA not available on this machine")
    rows = []
    for name in models:
        model, shape = build_model(name)
        model = model.to(device).eval()
        for batch in batches:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            ms = measure_ms(model, shape, batch, device, iterations)
            if device.type == "cuda":
                mem_mib = torch.cuda.max_memory_allocated(device) / 2**20
            else:
                # No allocator statistics off-GPU: weights + one input batch, a lower bound.
                weights = sum(t.numel() * t.element_size() for t in model.parameters())
                mem_mib = (weights + batch * 4 * int(np.prod(shape))) / 2**20
            p99 = float(np.percentile(ms, 99))
            rows.append({"model_name": name, "batch_size": batch, "latency": round(p99, 4), "latency_mean": round(float(ms.mean()), 4),
                         "latency_std": round(float(ms.std()), 4), "throughput": round(batch * 1000.0 / float(ms.mean()), 3),
                         "mig_profile": instance, "fb_used_mean": round(mem_mib, 3),
                         "device": device_name})
    out_dir.mkdir(parents=True, exist_ok=True)
    gpcs = 0 if instance == "whole" else int(instance.split("g", 1)[0]) if instance.split("g", 1)[0].isdigit() else None
    if gpcs is None:
        raise ConfigError("--instance", "instance", instance, "expected 'whole' or a MIG profile name such as 7g.80gb")
    full = [{"model": r["model_name"], "mig_gpcs": gpcs, "batch": r["batch_size"], "mps_processes": 1,
             "throughput_per_process": r["throughput"], "latency_s": round(r["latency_mean"] / 1000.0, 6),
             "memory_mib": r["fb_used_mean"]} for r in rows]
    _write_csv(out_dir / FULL_GPU_PROFILE_FILE, [*FULL_GPU_COLUMNS, "memory_mib"], full)
    path = out_dir / PROFILE_FILE
    _write_csv(path, list(rows[0]), rows)
    return path


def _write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    """Write rows as CSV atomically."""
    import io
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomically(path, buf.getvalue())
