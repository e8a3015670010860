"""``rlsched serve``: the command-line face of :mod:`rlsched.daemon.loop`."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from rlsched.daemon.config import SERVE_BACKENDS, load_daemon_config


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon: the config file, then the flags given on the command line on top."""
    from rlsched.daemon.loop import serve

    config = load_daemon_config(args.config).with_overrides(
        backend=args.backend, scenario=args.scenario, cycles=args.cycles, metrics_addr=args.metrics_addr,
        logdir=args.logdir, state=args.state, apply=True if args.apply else None, policy=args.policy,
        interval_s=args.interval_s, log_level=args.log_level, seed=args.seed,
    )
    if args.no_metrics:
        config = dataclasses.replace(config, metrics_addr=None)
    options: dict[str, Any] = {}
    if args.fake_nvml:
        from rlsched.node.fake_nvml import FakeNvml

        gpus, layouts = zip(*(item.partition(":")[::2] for item in args.fake_nvml))
        fake = FakeNvml(list(gpus), layouts=list(layouts))
        # The fake's virtual clock: a demo of real-time backends that runs instantly.
        options = {"nvml": fake, "sleep": fake.sleep, "clock": fake.clock}
    return serve(config, options)


def register(sub: Any) -> None:
    """Add ``serve`` to the ``rlsched`` subcommands."""
    p = sub.add_parser("serve", help="run the daemon: observe, decide, repair, apply every decision interval")
    p.add_argument("--config", default=None, help="daemon YAML (configs/daemon/NAME.yaml); flags override its fields")
    p.add_argument("--backend", choices=SERVE_BACKENDS, default=None, help="sim (as fast as possible), nvml or mig-parted (real time)")
    p.add_argument("--scenario", default=None, help="bundled scenario name or YAML path (the node's tenants)")
    p.add_argument("--cycles", type=int, default=None, help="decision cycles to run, then exit 0 (default: until SIGTERM)")
    p.add_argument("--metrics-addr", default=None, metavar="IP:PORT", help="Prometheus /metrics address (default 127.0.0.1:9400; port 0: any free)")
    p.add_argument("--no-metrics", action="store_true", help="serve no /metrics")
    p.add_argument("--logdir", default=None, help="TensorBoard event folder")
    p.add_argument("--state", default=None, help="state file, written atomically every cycle; a restart resumes from it")
    p.add_argument("--apply", action="store_true", help="change the hardware (real backends plan and log only without it)")
    p.add_argument("--policy", default=None, help="auto (migrator-pf-held on the simulator, the method that measured best on held-out traffic and nodes; on a real node, which has no priority-fill scheduler, MPS only: migrator-queue with a request log, migrator-hedge-mps without), ppo (ppo@P: the planner takes over below action probability P), or a baseline name")
    p.add_argument("--interval-s", type=float, default=None, help="decision interval of real backends, seconds (default: the scenario's)")
    p.add_argument("--seed", type=int, default=None, help="seed of the simulator's episodes")
    p.add_argument("--log-level", choices=["debug", "info", "warning"], default=None, help="debug: one JSON line per cycle")
    p.add_argument("--fake-nvml", action="append", metavar="GPU[:LAYOUT]", default=[],
                   help="drive the in-memory fake NVML (virtual clock) instead of a driver, one per GPU, e.g. a100-40gb:3g@0,3g@4")
    p.set_defaults(func=cmd_serve)
