"""Soak of the daemon against the simulator: cycles/s and memory (RSS) growth over many cycles.

``python scripts/bench_daemon.py --cycles 10000`` runs ``rlsched serve --backend sim`` in this
process (state file, TensorBoard and /metrics on), and prints RSS after a warm-up and at the
end, their ratio (the soak passes below 1.10), and decision cycles per second.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

from rlsched.daemon.config import DaemonConfig
from rlsched.daemon.loop import Daemon

#: RSS growth the soak tolerates (end / after warm-up).
MAX_RSS_RATIO = 1.10


def rss_mib() -> float:
    """Resident set size of this process now, MiB (from /proc; ru_maxrss is only the peak)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def soak(cycles: int, warmup: int, scenario: str = "default", policy: str = "auto") -> dict[str, float]:
    """Run ``warmup`` then ``cycles`` more cycles; RSS (MiB) after warm-up and at the end, cycles/s."""
    with tempfile.TemporaryDirectory() as tmp:
        marks: dict[str, float] = {}

        def mark(daemon: Daemon) -> None:
            if daemon.cycle == warmup:
                marks["rss_start_mib"], marks["t0"] = rss_mib(), time.perf_counter()

        config = DaemonConfig(scenario=scenario, backend="sim", policy=policy, cycles=warmup + cycles, metrics_addr="127.0.0.1:0",
                              logdir=f"{tmp}/tb", state=f"{tmp}/state.json", log_level="warning")
        Daemon(config, on_cycle=mark).run()
        elapsed = time.perf_counter() - marks["t0"]
        end = rss_mib()
        return {"rss_start_mib": marks["rss_start_mib"], "rss_end_mib": end, "rss_ratio": end / marks["rss_start_mib"], "cycles_per_s": cycles / elapsed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=500, help="cycles before the start RSS is taken (caches fill)")
    parser.add_argument("--scenario", default="default")
    parser.add_argument("--policy", default="auto")
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("rlsched.daemon").setLevel(logging.ERROR)  # fallback lines would flood the terminal
    result = soak(args.cycles, args.warmup, args.scenario, args.policy)
    print(f"cycles: {args.cycles} (after {args.warmup} warm-up)  cycles/s: {result['cycles_per_s']:.0f}")
    print(f"RSS start: {result['rss_start_mib']:.1f} MiB  end: {result['rss_end_mib']:.1f} MiB  ratio: {result['rss_ratio']:.3f} (limit {MAX_RSS_RATIO})")
    return 0 if result["rss_ratio"] < MAX_RSS_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
