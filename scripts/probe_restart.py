"""Measure on a real GPU what restarting a tenant's server costs: a fresh process's time to
its first served batch.

The scenarios' ``restart_s`` (the downtime a tenant pays when its instance, share or mode
changes) are scenario parameters that no shared measurement gives. This probe starts a new
Python process per try, as a reconfiguration does, and times its phases:

- ``import_s``: importing torch and the library the model's server imports (torchvision for
  image models, resnet50 included; transformers for BERT);
- ``cuda_init_s``: creating the CUDA context;
- ``load_s``: building the model and loading its weights from a file on local disk
  (written once beforehand; with ``--drop-page-cache``, as root on Linux, read cold);
- ``to_device_s``: copying the weights to the GPU;
- ``first_batch_s``: the first batch (cuDNN picks its kernels here);
- ``ready_s``: from process start to the first batch done, the downtime a restart costs
  before the server answers; ``steady_batch_ms``: a later batch, for reference.

Read-only for the GPU's configuration (no MIG, MPS or clock change):

    python scripts/probe_restart.py --out DIR --drop-page-cache   # writes DIR/restart-probe.json
    python scripts/probe_restart.py --device cpu --models tiny-cnn --tries 1   # a smoke test
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlsched.fileio import emit_json  # noqa: E402

#: The child process: it prints one JSON line of phase times (seconds).
CHILD = r"""
import json, sys, time
started = float(sys.argv[1])
t0 = time.time()
import torch
tp = time.time()
sys.path.insert(0, sys.argv[2])
from rlsched.perfmodel.profiler import LIBRARY_MODELS, build_model, make_input
overhead = time.time() - tp  # the probe's own code, which a server does not import
# The framework a server of the model imports: resnet50 is built in here (the profiler needs
# torch alone), but a resnet50 server imports torchvision as every image server does.
library = LIBRARY_MODELS[sys.argv[3]][0] if sys.argv[3] in LIBRARY_MODELS else {"resnet50": "torchvision"}.get(sys.argv[3])
if library:
    __import__(library)
t1 = time.time()
device = torch.device(sys.argv[5])
if device.type == "cuda":
    torch.cuda.init(); torch.zeros(1, device=device); torch.cuda.synchronize(device)
t2 = time.time()
model, shape = build_model(sys.argv[3])
model.load_state_dict(torch.load(sys.argv[4], map_location="cpu"))
model.eval()
t3 = time.time()
model = model.to(device)
if device.type == "cuda":
    torch.cuda.synchronize(device)
t4 = time.time()
x = make_input(shape, int(sys.argv[6]), device)
with torch.inference_mode():
    model(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t5 = time.time()
    model(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t6 = time.time()
print(json.dumps({"startup_s": t0 - started, "import_s": t1 - t0 - overhead, "cuda_init_s": t2 - t1, "load_s": t3 - t2,
                  "to_device_s": t4 - t3, "first_batch_s": t5 - t4, "ready_s": t5 - started - overhead,
                  "steady_batch_ms": 1000 * (t6 - t5)}))
"""


def drop_page_cache() -> bool:
    """Ask the kernel to drop its page cache (root on Linux); False where it refuses."""
    try:
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def probe(models: list[str], tries: int, batch: int, device: str, folder: Path, cold: bool = False) -> dict:
    """Every model's phase times over ``tries`` fresh processes."""
    import torch

    from rlsched.perfmodel.profiler import build_model
    out: dict = {"batch": batch, "tries": tries, "models": {}}
    for name in models:
        model, _ = build_model(name)
        weights = folder / f"{name}.pt"
        torch.save(model.state_dict(), weights)
        runs = []
        for _ in range(tries):
            dropped = cold and drop_page_cache()
            started = time.time()
            child = subprocess.run([sys.executable, "-c", CHILD, repr(started), str(REPO), name, str(weights), device, str(batch)],
                                   capture_output=True, text=True, timeout=600)
            if child.returncode != 0:
                raise RuntimeError(f"{name}: the child process failed: {child.stderr[-2000:]}")
            runs.append(dict(json.loads(child.stdout.strip().splitlines()[-1]), page_cache_dropped=dropped))
        ready = np.array([r["ready_s"] for r in runs])
        out["models"][name] = {"weights_mib": round(weights.stat().st_size / 2**20, 3), "runs": runs,
                               "ready_s_median": float(np.median(ready)), "ready_s_max": float(ready.max())}
        phases = ", ".join(f"{k} {np.median([r[k] for r in runs]):.2f}" for k in ("import_s", "cuda_init_s", "load_s", "to_device_s", "first_batch_s"))
        print(f"{name:<12} ready {np.median(ready):.2f} s (max {ready.max():.2f}); {phases}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,vgg19,bert-base,vit,alexnet,mobilenetv2")
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out", type=Path, default=None, help="folder for restart-probe.json")
    parser.add_argument("--drop-page-cache", action="store_true", help="drop the OS page cache before each try (root; Linux)")
    args = parser.parse_args(argv)
    if args.tries < 1 or args.batch < 1:
        print(f"error: --tries and --batch must be >= 1 (got {args.tries}, {args.batch})", file=sys.stderr)
        return 2
    import torch
    with tempfile.TemporaryDirectory() as folder:
        report = {"device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu", "torch": torch.__version__,
                  **probe(args.models.split(","), args.tries, args.batch, args.device, Path(folder), args.drop_page_cache)}
    emit_json(report, args.out, "restart-probe.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
