"""Real-device latency profiler: torch models (built in, or torchvision/transformers ones),
CUDA events (wall clock on CPU), optionally on fewer SMs (CUDA green contexts).

Writes ``full_gpu_profile.csv`` (the documented full-GPU profile format, one process per row;
see :data:`rlsched.perfmodel.data.FULL_GPU_COLUMNS`) and, for reference, ``latency.csv`` in the
MIGProfiler column format (P99 and spread), so ``rlsched calibrate fit --source profile
--data DIR --gpu NAME`` can fit it.
"""

from __future__ import annotations

import csv
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from rlsched.errors import ConfigError
from rlsched.fileio import write_text_atomically
from rlsched.perfmodel.data import FULL_GPU_COLUMNS, FULL_GPU_PROFILE_FILE
from rlsched.perfmodel.sources import PROFILE_FILE

WARMUP_ITERATIONS = 5


#: Models built from torchvision or transformers when installed (neither is a dependency of
#: rlsched), named as in ParvaGPU's full-GPU profile (``../shared/data/SOURCES.md``) so that a
#: profile taken on another GPU compares with it row by row: name -> (library, constructor,
#: per-sample input shape): (channels, height, width) for an image, (128,) for BERT's token ids.
LIBRARY_MODELS: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "alexnet": ("torchvision", "alexnet", (3, 224, 224)),
    "resnet101": ("torchvision", "resnet101", (3, 224, 224)),
    "resnet152": ("torchvision", "resnet152", (3, 224, 224)),
    "vgg16": ("torchvision", "vgg16", (3, 224, 224)),
    "vgg19": ("torchvision", "vgg19", (3, 224, 224)),
    "densenet121": ("torchvision", "densenet121", (3, 224, 224)),
    "densenet169": ("torchvision", "densenet169", (3, 224, 224)),
    "densenet201": ("torchvision", "densenet201", (3, 224, 224)),
    "inceptionv3": ("torchvision", "inception_v3", (3, 299, 299)),
    "mobilenetv2": ("torchvision", "mobilenet_v2", (3, 224, 224)),
    "vit": ("torchvision", "vit_b_16", (3, 224, 224)),
    "bert-base": ("transformers", "bert-base", (128,)),
    "bert-large": ("transformers", "bert-large", (128,)),
}
BUILTIN_MODELS = ("tiny-mlp", "tiny-cnn", "resnet50")
#: BERT's vocabulary size: the token ids of a random input are drawn below it.
BERT_VOCABULARY = 30522


def build_model(name: str):
    """A model by name (random weights, nothing downloaded) and its per-sample input shape.

    The built-in definitions need torch alone; :data:`LIBRARY_MODELS` need torchvision or
    transformers installed. An input shape of one dimension means token ids, else an image.
    """
    import torch
    from torch import nn
    if name == "tiny-mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10)), (3, 32, 32)
    if name == "tiny-cnn":
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)), (3, 32, 32)
    if name == "resnet50":
        return _resnet50(torch, nn), (3, 224, 224)
    if name not in LIBRARY_MODELS:
        raise ConfigError("--models", "models", name, f"unknown model (allowed: {', '.join((*BUILTIN_MODELS, *LIBRARY_MODELS))})")
    library, constructor, shape = LIBRARY_MODELS[name]
    try:
        if library == "torchvision":
            import torchvision
            extra = {"aux_logits": False, "init_weights": False} if constructor == "inception_v3" else {}
            return torchvision.models.get_model(constructor, weights=None, **extra), shape
        import transformers
        large = constructor == "bert-large"
        config = transformers.BertConfig(hidden_size=1024 if large else 768, num_hidden_layers=24 if large else 12,
                                         num_attention_heads=16 if large else 12, intermediate_size=4096 if large else 3072)

        class LastHiddenState(nn.Module):
            """BERT returning a tensor, as the other models do."""

            def __init__(self, bert: nn.Module) -> None:
                super().__init__()
                self.bert = bert

            def forward(self, input_ids):
                return self.bert(input_ids=input_ids).last_hidden_state

        return LastHiddenState(transformers.BertModel(config)), shape
    except ImportError as exc:
        raise ConfigError("--models", "models", name, f"needs the {library} package, which is not installed ({exc})") from exc


def make_input(shape: tuple[int, ...], batch: int, device):
    """A random input batch: token ids for a one-dimensional shape, else an image tensor."""
    import torch
    if len(shape) == 1:
        return torch.randint(0, BERT_VOCABULARY, (batch, *shape), device=device)
    return torch.randn((batch, *shape), device=device)


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


def measure_ms(model, shape: tuple[int, ...], batch: int, device, iterations: int, host_input: bool = False) -> np.ndarray:
    """Per-batch latencies, ms: CUDA events on a GPU, wall clock otherwise.

    :param host_input: the batch starts in host memory and its copy to the device is timed,
        as a server's would be; else it is already on the device
    """
    import torch
    x = make_input(shape, batch, "cpu" if host_input else device)
    times = []
    with torch.inference_mode():
        for _ in range(WARMUP_ITERATIONS):
            model(x.to(device))
        for _ in range(iterations):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(x.to(device))
                end.record()
                torch.cuda.synchronize(device)
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                model(x.to(device))
                times.append(1000.0 * (time.perf_counter() - t0))
    return np.array(times)


def precision_settings() -> dict[str, bool]:
    """PyTorch's TF32 switches, which set how fast fp32 convolutions and matmuls run on Ampere+."""
    import torch
    return {"cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32)}


@contextmanager
def sm_limited(device, sm_count: int | None):
    """Run the block's CUDA work on ``sm_count`` SMs of ``device`` with all of its DRAM bandwidth.

    A CUDA green context (CUDA 12.4+, a PyTorch built with them; on compute capability 9.0
    SM counts are multiples of 8): neither MIG nor MPS is touched, so an operator can measure
    how a model slows on fewer SMs without reconfiguring the GPU. Such rows identify the
    memory-bound fraction that a full-GPU profile alone cannot. ``None``: no limit.
    """
    if sm_count is None:
        yield
        return
    import torch
    if device.type != "cuda":
        raise ConfigError("--sm-limits", "sm_limits", sm_count, f"needs a CUDA device, not {device}")
    try:
        from torch.cuda.green_contexts import GreenContext
        context = GreenContext.create(num_sms=sm_count, device_id=device.index or 0)
        context.set_context()
    except (ImportError, RuntimeError, TypeError) as exc:
        raise ConfigError("--sm-limits", "sm_limits", sm_count, f"cannot create a CUDA green context of that many SMs: {exc}") from exc
    try:
        with torch.cuda.stream(context.Stream()):
            yield
    finally:
        context.pop_context()


def profile_models(models: list[str], batches: list[int], device_name: str, out_dir: Path, instance: str = "whole",
                   iterations: int = 50, host_input: bool = False, sm_limits: list[int] | None = None) -> Path:
    """Measure every (model, batch) and write ``out_dir/latency.csv``; returns its path.

    :param sm_limits: also measure every (model, batch) with the kernels limited to each of
        these SM counts (:func:`sm_limited`); the rows carry it in an ``sm_limit`` column

    A batch that does not fit in the device's memory is left out (and named on stderr), as
    ParvaGPU's profile leaves such rows out.
    """
    import torch
    if iterations < 2 or any(b < 1 for b in batches):
        raise ConfigError("--batches/--iterations", "batches", batches, "batches >= 1 and iterations >= 2")
    if any(limit < 1 for limit in sm_limits or []):
        raise ConfigError("--sm-limits", "sm_limits", sm_limits, "SM counts >= 1")
    gpcs = 0 if instance == "whole" else int(instance.split("g", 1)[0]) if instance.split("g", 1)[0].isdigit() else None
    if gpcs is None:
        raise ConfigError("--instance", "instance", instance, "expected 'whole' or a MIG profile name such as 7g.80gb")
    try:
        device = torch.device(device_name)
    except RuntimeError as exc:
        raise ConfigError("--device", "device", device_name, str(exc)) from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", "device", device_name, "CUDA not available on this machine")
    if sm_limits and device.type != "cuda":
        raise ConfigError("--sm-limits", "sm_limits", sm_limits, f"needs a CUDA device, not {device_name}")
    rows = []
    for limit in [None, *(sm_limits or [])]:
        with sm_limited(device, limit):
            for name in models:
                rows += _profile_model(name, batches, device, iterations, host_input, instance, limit)
    if not rows:
        raise ConfigError("--batches", "batches", batches, "no batch fitted in the device's memory")
    out_dir.mkdir(parents=True, exist_ok=True)
    full = [{"model": r["model_name"], "mig_gpcs": gpcs, "batch": r["batch_size"], "mps_processes": 1,
             "throughput_per_process": r["throughput"], "latency_s": round(r["latency_mean"] / 1000.0, 6),
             "memory_mib": r["fb_used_mean"], "sm_limit": r["sm_limit"]} for r in rows]
    _write_csv(out_dir / FULL_GPU_PROFILE_FILE, [*FULL_GPU_COLUMNS, "memory_mib", "sm_limit"], full)
    path = out_dir / PROFILE_FILE
    _write_csv(path, list(rows[0]), rows)
    return path


def _profile_model(name: str, batches: list[int], device, iterations: int, host_input: bool, instance: str,
                   sm_limit: int | None) -> list[dict]:
    """One model's rows (``latency.csv`` columns), built and measured in the current context."""
    import torch
    model, shape = build_model(name)
    model = model.to(device).eval()
    rows = []
    for batch in batches:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        try:
            ms = measure_ms(model, shape, batch, device, iterations, host_input)
        except torch.cuda.OutOfMemoryError:
            print(f"{name} batch {batch}: out of device memory, left out", file=sys.stderr)
            continue
        if device.type == "cuda":
            mem_mib = torch.cuda.max_memory_allocated(device) / 2**20
        else:
            # No allocator statistics off-GPU: weights + one input batch, a lower bound.
            weights = sum(t.numel() * t.element_size() for t in model.parameters())
            mem_mib = (weights + batch * 4 * int(np.prod(shape))) / 2**20
        p99 = float(np.percentile(ms, 99))
        rows.append({"model_name": name, "batch_size": batch, "latency": round(p99, 4), "latency_mean": round(float(ms.mean()), 4),
                     "latency_std": round(float(ms.std()), 4), "throughput": round(batch * 1000.0 / float(ms.mean()), 3),
                     "mig_profile": instance, "fb_used_mean": round(mem_mib, 3), "device": str(device),
                     "host_input": host_input, "sm_limit": sm_limit or "", **precision_settings()})
    return rows


def _write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    """Write rows as CSV atomically."""
    import io
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomically(path, buf.getvalue())
