"""``rlsched train`` and ``rlsched export-policy``: the PPO subcommands (registered by
:mod:`rlsched.cli.main`; torch and SB3 are imported only when one runs)."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_train(args: argparse.Namespace) -> int:
    """Train (or resume) a run, then export its best policy to ``<run>/policy.onnx``."""
    if args.engine == "rllib":
        # Imports no ray: train_rllib checks the config, then names the extra if ray is missing.
        from rlsched.agents.rllib.train import POLICY_FILE, train_rllib

        run_dir = train_rllib(args.config, args.out, resume=args.resume, address=args.address, verbose=args.verbose)
        print(f"run folder: {run_dir}\nexported policy: {run_dir / POLICY_FILE}")
        return 0
    if args.address is not None:
        from rlsched.errors import ConfigError

        raise ConfigError("--address", "--address", args.address, "only the RLlib engine runs on a Ray cluster (--engine rllib)")
    from rlsched.agents.ppo.candidate_train import is_candidate_config, train_candidate_choice
    from rlsched.agents.ppo.expert_train import POLICY_FILE, is_expert_config, train_expert_choice

    # Choice policies (one network for any node): candidate-ppo chooses the configuration,
    # hedge-ppo whom migrator-hedge follows. Each kind of config is told by its section; a
    # resumed run's by the config stored in its folder.
    stored = Path(args.out) / "config.yaml"
    config = args.config if args.config is not None or not args.resume else (stored if stored.exists() else None)
    if config is not None and is_candidate_config(config):
        run_dir = train_candidate_choice(args.config, args.out, resume=args.resume)
        print(f"run folder: {run_dir}\nexported policy: {run_dir / POLICY_FILE} (use it as --policies candidate-ppo:{run_dir})")
        return 0
    if config is not None and is_expert_config(config):
        if args.resume:
            from rlsched.errors import ConfigError

            raise ConfigError("--resume", "--resume", True, "a hedge-ppo run is not resumable: start it again (recorded expert streams are reused)")
        run_dir = train_expert_choice(args.config, args.out)
        print(f"run folder: {run_dir}\nexported policy: {run_dir / POLICY_FILE} (use it as --policies hedge-ppo:{run_dir})")
        return 0
    from rlsched.agents.ppo.export import export_run
    from rlsched.agents.ppo.train import train

    run_dir = train(args.config, args.out, resume=args.resume, verbose=args.verbose)
    exported = export_run(run_dir)
    print(f"run folder: {run_dir}\nexported policy: {exported}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export a run folder's policy to ONNX (SB3 or RLlib run)."""
    from rlsched.agents.rllib.export import export_rllib_run, is_rllib_run

    if is_rllib_run(args.run):
        print(export_rllib_run(args.run, args.out, args.which, args.planner_takeover_probability, args.reconfiguration_check_samples))
        return 0
    from rlsched.agents.ppo.export import export_run

    print(export_run(args.run, args.out, args.which, args.planner_takeover_probability, args.reconfiguration_check_samples))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the PPO subcommands to the ``rlsched`` parser."""
    p = sub.add_parser("train", help="train a PPO policy: MaskablePPO (SB3) or RLlib (run folder: config, model, TensorBoard, policy.onnx)")
    p.add_argument("--config", default=None, help="training config YAML (configs/train/*.yaml); optional with --resume")
    p.add_argument("--out", required=True, help="the run folder, e.g. runs/NAME")
    p.add_argument("--resume", action="store_true", help="continue from the run folder's newest checkpoint")
    p.add_argument("--engine", default="sb3", choices=["sb3", "rllib"],
                   help="sb3: MaskablePPO in this process (default); rllib: PPO on Ray RLlib (extra 'distributed', configs/train/rllib_*.yaml)")
    p.add_argument("--address", default=None, help="rllib: Ray cluster to join (default: rllib.address of the config, RAY_ADDRESS, else a local Ray)")
    p.add_argument("--verbose", type=int, default=0, choices=[0, 1], help="1: print SB3's table every rollout (rllib: the Ray workers' logs)")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("export-policy", help="export a training run's policy (with its normalization) to ONNX")
    p.add_argument("--run", required=True, help="the run folder")
    p.add_argument("--out", default=None, help="the .onnx file (default: RUN/policy.onnx)")
    p.add_argument("--which", default="best", help="best (the best evaluated model), final, or the step count of a checkpoint")
    p.add_argument("--planner-takeover-probability", type=float, default=None,
                   help="the planner decides the steps whose chosen action the policy gives a lower probability (default: the run config's; 0: never)")
    p.add_argument("--reconfiguration-check-samples", type=int, default=None,
                   help="random streams of the simulated check of every reconfiguration (default: the run config's; 0: no check)")
    p.set_defaults(func=cmd_export)
