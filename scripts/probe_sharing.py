"""Measure on a real GPU how two inference servers share it, against the sharing-mode model.

The performance model's time-slice and priority-fill factors (``configs/calibration/
sharing-modes.yaml``) are assumptions no shared measurement confirms. This probe measures
them on a whole GPU without touching MIG or MPS:

- **time slicing**: the filler runs in a second process (a second CUDA context, which the
  driver time-slices against the first);
- **priority fill** (FIKIT's mechanism, approximated): both in one process, the
  high-priority server on the highest-priority CUDA stream and the filler on the lowest,
  so the filler's kernels run only where the high-priority ones leave the GPU free
  (no preemption of a running kernel);
- **same-priority streams** (a control): both in one process on streams of equal priority,
  spatial sharing without limits.

The high-priority server takes one batch every ``period`` (open loop, from a CUDA graph
replayed on its stream) and its latency is measured launch to completion; the filler runs
back to back. Solo runs of each give the reference. Per mode and load, the model's
prediction from the solo figures is printed beside the measurement:

- time slice: latency x (1 + co-runner busy fraction) x (1 + switch_ms / quantum_ms);
- priority fill: the first tenant's latency x (1 + overhead_frac); the filler's throughput
  x max(min_idle_frac, 1 - the first tenant's busy fraction).

Read-only for the GPU's configuration; run it on a GPU nobody else is using:

    python scripts/probe_sharing.py --out DIR            # writes DIR/sharing-probe.json
    python scripts/probe_sharing.py --device cpu --pairs tiny-cnn:8/tiny-mlp:64 --seconds 1   # a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlsched.errors import ConfigError  # noqa: E402
from rlsched.fileio import emit_json  # noqa: E402
from rlsched.perfmodel.calibration import load_support  # noqa: E402
from rlsched.perfmodel.profiler import build_model, make_input, precision_settings  # noqa: E402

#: High-priority busy fractions the probe loads the GPU at (period = solo latency / load).
LOADS = (0.25, 0.5)


class Server:
    """One model at one batch, whose forward pass is one CUDA graph replay on its stream."""

    def __init__(self, name: str, batch: int, device, priority: int | None = None) -> None:
        import torch
        self.name, self.batch, self.device = name, batch, device
        model, shape = build_model(name)
        self.model = model.to(device).eval()
        self.x = make_input(shape, batch, device)
        self.stream = torch.cuda.Stream(device, priority=priority or 0) if device.type == "cuda" else None
        self.graph = None
        with torch.inference_mode():
            if self.stream is not None:
                # Warm up on the server's own stream, then capture there (PyTorch's recipe).
                self.stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(self.stream):
                    for _ in range(3):
                        self.model(self.x)
                self.stream.synchronize()
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph, stream=self.stream):
                    self.model(self.x)
                self.stream.synchronize()
            else:
                self.model(self.x)

    def run_once(self) -> float:
        """One batch, launched and waited for: wall-clock ms."""
        started = time.perf_counter()
        if self.graph is not None:
            with self._on_stream():
                self.graph.replay()
            self.stream.synchronize()
        else:
            import torch
            with torch.inference_mode():
                self.model(self.x)
        return (time.perf_counter() - started) * 1e3

    def _on_stream(self):
        import torch
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def back_to_back(self, seconds: float, stop: threading.Event | None = None) -> float:
        """Run batches back to back for ``seconds``: requests per second."""
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds and not (stop is not None and stop.is_set()):
            self.run_once()
            done += 1
        return done * self.batch / (time.perf_counter() - started)

    def periodic(self, period_ms: float, seconds: float) -> dict[str, float]:
        """One batch every ``period_ms`` (open loop; late batches start at once): latency
        statistics and the busy fraction it measured."""
        latencies, started = [], time.perf_counter()
        next_s = started
        while time.perf_counter() - started < seconds:
            wait = next_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            latencies.append(self.run_once())
            next_s += period_ms / 1e3
        lat = np.asarray(latencies)
        return {"batches": int(lat.size), "latency_ms_mean": float(lat.mean()), "latency_ms_p50": float(np.percentile(lat, 50)),
                "latency_ms_p99": float(np.percentile(lat, 99)), "busy_fraction": float(lat.sum() / 1e3 / (time.perf_counter() - started))}


def filler_process(name: str, batch: int, device_name: str, seconds: float) -> subprocess.Popen:
    """The filler in a second process (its own CUDA context): it builds its server, prints
    ``ready``, waits for a line on stdin, runs back to back and prints its requests/s."""
    code = ("import sys, torch; sys.path.insert(0, %r); sys.argv = ['probe']; "
            "from scripts.probe_sharing import Server; "
            "s = Server(%r, %d, torch.device(%r)); print('ready', flush=True); sys.stdin.readline(); "
            "print(s.back_to_back(%f), flush=True)") % (str(REPO), name, batch, device_name, seconds)
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)


def _ratio(measured: float, predicted: float) -> float:
    return round(measured / predicted, 4) if predicted else float("nan")


def probe_pair(first: tuple[str, int], filler: tuple[str, int], device, seconds: float, sharing: dict) -> dict:
    """Every mode and load for one (high-priority server, filler) pair."""
    import torch
    device_name = str(device)
    low, high = torch.cuda.Stream.priority_range() if device.type == "cuda" else (0, 0)
    ts, pf = sharing["time_slice"], sharing["priority_fill"]
    ts_factor = 1.0 + float(ts["switch_ms"]) / float(ts["quantum_ms"])
    a = Server(*first, device, priority=high)
    b = Server(*filler, device, priority=low)
    solo_a = a.periodic(0.0, seconds)  # back to back: its solo latency
    solo_b = b.back_to_back(seconds)
    out = {"high_priority": {"model": first[0], "batch": first[1]}, "filler": {"model": filler[0], "batch": filler[1]},
           "stream_priorities": {"high": high, "low": low},
           "solo": {"high_priority": solo_a, "filler_rps": solo_b}, "runs": []}
    for load in LOADS:
        period_ms = solo_a["latency_ms_mean"] / load
        # Time slicing: the filler in a second process, back to back.
        proc = filler_process(*filler, device_name, seconds + 1.0)
        try:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the filler process did not start: {proc.communicate(timeout=60)}")
            proc.stdin.write("go\n")
            proc.stdin.flush()
            time.sleep(0.3)
            measured = a.periodic(period_ms, seconds)
            filler_rps = float(proc.communicate(timeout=seconds + 120)[0].split()[-1])
        finally:
            if proc.poll() is None:
                proc.kill()
        out["runs"].append(_run("time-slice", load, period_ms, measured, filler_rps, solo_a, solo_b,
                                predicted_latency=solo_a["latency_ms_mean"] * 2.0 * ts_factor,
                                predicted_filler=solo_b / ((1.0 + load) * ts_factor)))
        # Priority fill and the equal-priority control: the filler in a thread of this process.
        for mode, filler_server in (("priority-fill", b), ("same-priority-streams", Server(*filler, device, priority=high))):
            stop = threading.Event()
            result: dict[str, float] = {}
            thread = threading.Thread(target=lambda s=filler_server: result.__setitem__("rps", s.back_to_back(seconds + 5.0, stop)))
            thread.start()
            time.sleep(0.3)
            measured = a.periodic(period_ms, seconds)
            stop.set()
            thread.join()
            overhead = 1.0 + float(pf["overhead_frac"])
            out["runs"].append(_run(mode, load, period_ms, measured, result["rps"], solo_a, solo_b,
                                    predicted_latency=solo_a["latency_ms_mean"] * overhead if mode == "priority-fill" else float("nan"),
                                    predicted_filler=solo_b * max(float(pf["min_idle_frac"]), 1.0 - load) if mode == "priority-fill" else float("nan")))
    return out


def _run(mode: str, load: float, period_ms: float, measured: dict, filler_rps: float, solo_a: dict, solo_b: float,
         predicted_latency: float, predicted_filler: float) -> dict:
    row = {"mode": mode, "load": load, "period_ms": round(period_ms, 3), "high_priority": measured,
           "latency_vs_solo": round(measured["latency_ms_mean"] / solo_a["latency_ms_mean"], 4),
           "filler_rps": round(filler_rps, 2), "filler_vs_solo": round(filler_rps / solo_b, 4),
           "model_latency_ms": round(predicted_latency, 3), "model_filler_rps": round(predicted_filler, 2),
           "latency_measured_over_model": _ratio(measured["latency_ms_mean"], predicted_latency),
           "filler_measured_over_model": _ratio(filler_rps, predicted_filler)}
    print(f"  {mode:<22} load {load:.2f}: high-priority latency x{row['latency_vs_solo']:.3f} solo "
          f"(model x{predicted_latency / solo_a['latency_ms_mean']:.3f}), filler x{row['filler_vs_solo']:.3f} solo "
          f"(model x{predicted_filler / solo_b:.3f})", flush=True)
    return row


def parse_pair(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    try:
        first, filler = text.split("/")
        (m1, b1), (m2, b2) = first.split(":"), filler.split(":")
        return (m1, int(b1)), (m2, int(b2))
    except ValueError as exc:
        raise ConfigError("--pairs", "pairs", text, "expected MODEL:BATCH/MODEL:BATCH, e.g. resnet50:8/vgg19:16") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", default="resnet50:8/vgg19:16,vgg19:8/resnet50:32",
                        help="high-priority MODEL:BATCH/filler MODEL:BATCH, comma-separated")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each measurement")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out", type=Path, default=None, help="folder for sharing-probe.json")
    args = parser.parse_args(argv)
    import torch
    device = torch.device(args.device)
    sharing = load_support(REPO / "configs" / "calibration", "sharing-modes.yaml")
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "precision": precision_settings(), "seconds": args.seconds,
              "sharing_modes": {k: sharing[k] for k in ("time_slice", "priority_fill")}, "pairs": []}
    try:
        pairs = [parse_pair(text) for text in args.pairs.split(",")]
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for first, filler in pairs:
        print(f"{first[0]} batch {first[1]} (high priority) with {filler[0]} batch {filler[1]} (filler)", flush=True)
        report["pairs"].append(probe_pair(first, filler, device, args.seconds, sharing))
    emit_json(report, args.out, "sharing-probe.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
