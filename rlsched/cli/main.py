"""The ``rlsched`` command line.

Each subcommand lives in a small function; heavy imports (torch, the simulator) stay inside
the functions that need them so that ``rlsched --help`` and the catalog commands start fast.
Every error a user can cause ends as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Sequence

from rlsched.errors import RlschedError
from rlsched.hardware import LayoutError, enumerate_layouts, gpu_names, load_gpu, parse_layout, validate_layout

#: Exit code for bad input (config, spec, file): the reason is printed on one line.
EXIT_BAD_INPUT = 2


def _add_gpu_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", required=True, help="GPU type from the catalog (see `rlsched gpus`) or a catalog YAML path")


def _variants(args: argparse.Namespace) -> tuple[str, ...]:
    return ("standard", "double-memory") if args.with_double_memory_1g else ("standard",)


def cmd_gpus(args: argparse.Namespace) -> int:
    """Print the catalog: one line per GPU type, or JSON with every profile."""
    specs = [load_gpu(name) for name in gpu_names()]
    if args.json:
        print(json.dumps([_gpu_json(spec) for spec in specs], indent=2))
        return 0
    print(f"{'gpu':<12} {'pci id':<11} {'mem GiB':>7} {'SMs':>4} {'MIG':<4} GI profiles (unconfirmed values marked *)")
    for spec in specs:
        profiles = " ".join(p.name + ("*" if p.unconfirmed else "") for p in spec.profiles.values()) or "- (MPS / time slicing only)"
        print(f"{spec.name:<12} {spec.pci_device_id:<11} {spec.memory_gib:>7g} {spec.sm_count:>4} {'yes' if spec.mig_supported else 'no':<4} {profiles}")
    return 0


def _gpu_json(spec) -> dict:
    return {
        "name": spec.name,
        "display_name": spec.display_name,
        "pci_device_id": spec.pci_device_id,
        "mig_supported": spec.mig_supported,
        "memory_gib": spec.memory_gib,
        "sm_count": spec.sm_count,
        "memory_slices": spec.memory_slices,
        "compute_slices": spec.compute_slices,
        "unconfirmed": spec.unconfirmed,
        "gi_profiles": [
            {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.__dict__.items()} for p in spec.profiles.values()
        ],
    }


def cmd_layouts(args: argparse.Namespace) -> int:
    """Print every valid (or maximal) layout of a GPU type."""
    spec = load_gpu(args.gpu)
    layouts = enumerate_layouts(spec, _variants(args), maximal=args.maximal, driver_major=args.driver)
    if args.json:
        print(json.dumps({"gpu": spec.name, "maximal": args.maximal, "count": len(layouts), "layouts": [lay.spec() for lay in layouts]}, indent=2))
        return 0
    kind = "maximal layouts" if args.maximal else "valid layouts"
    print(f"{len(layouts)} {kind} of {spec.name}" + (f" (driver R{args.driver})" if args.driver else ""))
    for lay in layouts:
        compute = sum(spec.profiles[gi.profile].compute_slices for gi in lay)
        print(f"  {lay.spec():<48} compute slices {compute}/{spec.compute_slices}")
    return 0


def cmd_validate_layout(args: argparse.Namespace) -> int:
    """Exit 0 if the layout is valid, else 2 with the failed rule on one line."""
    spec = load_gpu(args.gpu)
    layout = parse_layout(args.spec, spec)
    validate_layout(layout, spec, driver_major=args.driver)
    print(f"valid {spec.name} layout: {layout.spec() or '(empty)'}")
    return 0


def cmd_export_mig_parted(args: argparse.Namespace) -> int:
    """Write the layout as an NVIDIA mig-parted v1 config."""
    from rlsched.fileio import write_text_atomically
    from rlsched.hardware.mig_parted import mig_parted_config

    spec = load_gpu(args.gpu)
    layout = parse_layout(args.spec, spec)
    validate_layout(layout, spec)
    text = mig_parted_config(args.name, [layout], devices=args.devices)
    if args.output:
        write_text_atomically(args.output, text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _add_scenario_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """--scenario and --trace: every command that takes a scenario accepts both."""
    parser.add_argument("--scenario", required=required, help="scenario YAML file, or the name of a bundled one (e.g. default)")
    parser.add_argument("--trace", action="append", default=[], metavar="TENANT=FILE[:SCALE[:WARP]]", help="replay a trace file for an inference tenant, rate scaled by SCALE, WARP trace seconds per simulated second (repeatable)")


def load_scenario_from_args(args: argparse.Namespace):
    """The scenario named by --scenario with the --trace overrides applied."""
    from rlsched.workloads.scenario import load_scenario, with_trace_overrides

    return with_trace_overrides(load_scenario(args.scenario), args.trace)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Run a scenario under one fixed configuration; print per-tenant totals."""
    from rlsched.simulator.run import configuration_from_args, load_performance_model, run_fixed

    scenario = load_scenario_from_args(args)
    if args.layout:
        config = configuration_from_args(scenario, args.layout, args.assign, args.mps, args.batch, args.modes)
    elif args.assign or args.mps or args.batch or args.modes:
        raise RlschedError("simulate: --assign/--mps/--batch/--modes need --layout (one per GPU)")
    elif scenario.reference is None:
        raise RlschedError(f"simulate: scenario {scenario.name} has no reference configuration: give --layout and --assign")
    else:
        config = scenario.reference
    result = run_fixed(scenario, load_performance_model(args.perf_model), config, seed=args.seed, duration_s=args.duration_s)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"scenario {result['scenario']}: {result['simulated_s']:g} s simulated, layouts {result['layouts']}, seed {result['seed']}")
    print(f"{'tenant':<14} {'arrived':>9} {'completed':>9} {'dropped':>8} {'queued':>7} {'SLO att.':>8} {'p50 ms':>8} {'p99 ms':>8} {'goodput':>11}")
    for name, t in result["tenants"].items():
        if t["kind"] != "inference":
            print(f"{name:<14} ({t['kind']}) objective {t['objective']:.1f}")
            continue
        att = "-" if t["slo_attainment"] is None else f"{t['slo_attainment']:.3f}"
        p50 = "-" if t["latency_ms_p50"] is None else f"{t['latency_ms_p50']:.1f}"
        p99 = "-" if t["latency_ms_p99"] is None else f"{t['latency_ms_p99']:.1f}"
        print(f"{name:<14} {t['arrived']:>9} {t['completed']:>9} {t['dropped']:>8} {t['queued_at_end']:>7} {att:>8} {p50:>8} {p99:>8} {t['goodput']:>11.1f}")
    g = result["goodput"]
    print(f"goodput {g['goodput/goodput']:.1f}  slo penalty {g['goodput/slo_penalty']:.1f}  best effort {g['goodput/best_effort_progress']:.1f}  reconfiguration {g['goodput/reconfiguration_cost']:.1f}  total {g['goodput/total']:.1f}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Run policies on a scenario or a suite; print the tables, write JSON and plots; or
    replay an earlier result (exit 1 when a Goodput does not reproduce)."""
    from rlsched.agents.evaluation import evaluate, evaluate_suite, format_suite, format_table, plot, policy_names, replay, write_json
    from rlsched.workloads.scenario import without_priority_fill_scheduler

    if args.planner_time_limit is not None:
        import rlsched.solver.planner as planner_module

        if not math.isfinite(args.planner_time_limit) or args.planner_time_limit <= 0.0:
            raise RlschedError(f"--planner-time-limit: {args.planner_time_limit:g} is not a positive number of seconds")
        # Process-wide: every planner this evaluation builds (the policies', static-best's, hindsight's) solves under it.
        planner_module.PLANNER_SOLVER_OPTIONS["time_limit"] = args.planner_time_limit
    if (args.rerun_hindsight or args.add_policies or args.rerun_policies) and (args.replay is None or args.json is None):
        raise RlschedError("--rerun-hindsight, --add-policies and --rerun-policies need --replay EVAL.json (the result) "
                           "and --json OUT (the updated result)")
    if args.replay is not None:
        if args.rerun_hindsight or args.add_policies or args.rerun_policies:
            from rlsched.agents.evaluation import add_policies, rerun_hindsight

            result = _read_result(args.replay)
            # First, so that a search run again is seeded with them too.
            if args.rerun_policies:
                result = add_policies(result, policy_names(args.rerun_policies), args.replay, progress=not args.no_progress, replace=True)
            if args.add_policies:
                result = add_policies(result, policy_names(args.add_policies), args.replay, progress=not args.no_progress)
            if args.rerun_hindsight:
                result = rerun_hindsight(result, args.replay, progress=not args.no_progress)
            print(format_suite(result) if "scenarios" in result else format_table(result))
            write_json(result, args.json)
            return 0
        return _replay(args.replay, replay)
    if sum(x is not None for x in (args.scenario, args.family, args.suite)) != 1:
        raise RlschedError("give one of --scenario, --family, --suite or --replay")
    if args.suite is not None:
        from rlsched.workloads.suite import load_suite

        if args.trace:
            raise RlschedError("--trace applies to --scenario, not to --suite")
        suite = load_suite(args.suite)
        if args.no_priority_fill_scheduler:
            suite = dataclasses.replace(suite, scenarios=[without_priority_fill_scheduler(s) for s in suite.scenarios])
        result = evaluate_suite(suite, policy_names(args.policies), args.episodes, args.seed, args.perf_model,
                                progress=not args.no_progress, plot_dir=args.plot_dir)
        print(f"suite {suite.name}: {len(suite.scenarios)} scenarios, {args.episodes} episode(s) per policy, seeds {args.seed}..{args.seed + args.episodes - 1}")
        print(format_suite(result))
        if args.json:
            write_json(result, args.json)
        return 0
    if args.family is not None:
        from rlsched.agents.ppo.config import load_config
        from rlsched.agents.ppo.family import ScenarioFamily

        if args.trace or args.no_priority_fill_scheduler:
            raise RlschedError("--trace and --no-priority-fill-scheduler apply to --scenario or --suite, not to --family")
        config = load_config(args.family)
        family = ScenarioFamily(config.scenario, config.randomization)
        scenario = family.base
    else:
        family, scenario = None, load_scenario_from_args(args)
        if args.no_priority_fill_scheduler:
            scenario = without_priority_fill_scheduler(scenario)
    result, runs = evaluate(scenario, policy_names(args.policies), args.episodes, args.seed, args.perf_model, progress=not args.no_progress, family=family)
    print(f"scenario {result['scenario']}: {args.episodes} episode(s) per policy, seeds {args.seed}..{args.seed + args.episodes - 1}")
    print(format_table(result))
    if args.json:
        write_json(result, args.json)
    if args.plot:
        plot(runs, scenario.decision_interval_s, args.plot, result["scenario"])
    if args.plot_dir:
        plot(runs, scenario.decision_interval_s, f"{args.plot_dir}/{result['scenario']}.png", result["scenario"])
    return 0


def _read_result(path: str) -> dict:
    """An eval JSON, or an error naming the file."""
    try:
        return json.loads(open(path).read())
    except OSError as exc:
        raise RlschedError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise RlschedError(f"{path}: not valid JSON: {exc}") from None


def _replay(path: str, replay: Callable[..., list[dict]]) -> int:
    """Re-simulate an eval JSON's recorded configurations; exit 1 on any Goodput mismatch."""
    rows = replay(_read_result(path), path)
    for r in rows:
        print(f"{'ok' if r['ok'] else 'MISMATCH':<8} {r['scenario']:<28} {r['policy']:<16} seed {r['seed']:<6} recorded {r['recorded']:>14,.1f} replayed {r['replayed']:>14,.1f}")
    bad = sum(not r["ok"] for r in rows)
    print(f"{len(rows) - bad} of {len(rows)} episodes reproduce their recorded Goodput")
    return 1 if bad else 0


def cmd_probe(args: argparse.Namespace) -> int:
    """Report what NVML sees (read-only); exit 2 without an NVIDIA driver."""
    from rlsched.node.probe import probe_node

    nvml = None
    if args.fake:
        from rlsched.node.fake_nvml import FakeNvml

        gpus, layouts = zip(*(item.partition(":")[::2] for item in args.fake))
        nvml = FakeNvml(list(gpus), layouts=list(layouts))
    report = probe_node(nvml)
    print(json.dumps(report.to_json(), indent=2) if args.json else report)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="rlsched", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("gpus", help="list the GPU catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gpus)

    driver_help = "apply the rules of an older driver branch, e.g. 470 (4g+3g rejected before R510)"
    p = sub.add_parser("layouts", help="enumerate the valid MIG layouts of a GPU type")
    _add_gpu_argument(p)
    p.add_argument("--maximal", action="store_true", help="only layouts to which no further GI fits")
    p.add_argument("--with-double-memory-1g", action="store_true", help="also use the 2-memory-slice 1g profile (e.g. 1g.10gb on A100-40GB)")
    p.add_argument("--driver", type=int, default=None, help=driver_help)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_layouts)

    p = sub.add_parser("validate-layout", help="check a layout spec such as 3g.20gb@0,2g.10gb@4,1g.5gb@6")
    _add_gpu_argument(p)
    p.add_argument("spec")
    p.add_argument("--driver", type=int, default=None, help=driver_help)
    p.set_defaults(func=cmd_validate_layout)

    p = sub.add_parser("export-mig-parted", help="write a layout as an NVIDIA mig-parted v1 config")
    _add_gpu_argument(p)
    p.add_argument("--name", required=True, help="name of the mig-config entry (the nvidia.com/mig.config label value)")
    p.add_argument("--devices", default="all", help="'all' or comma-separated GPU indices")
    p.add_argument("-o", "--output", default=None, help="file to write (atomically); stdout if omitted")
    p.add_argument("spec")
    p.set_defaults(func=cmd_export_mig_parted)

    p = sub.add_parser("simulate", help="simulate a scenario under one fixed configuration")
    _add_scenario_arguments(p)
    p.add_argument("--layout", action="append", default=[], help="MIG layout spec of one GPU (repeat per GPU); default: the scenario's reference configuration")
    p.add_argument("--assign", action="append", default=[], metavar="TENANT=[GPU:]GI_INDEX", help="place a tenant in an instance (repeatable)")
    p.add_argument("--mps", action="append", default=[], metavar="TENANT=PCT", help="MPS active-thread percentage (default 100)")
    p.add_argument("--batch", action="append", default=[], metavar="TENANT=N", help="max batch (default: the tenant's max_batch)")
    p.add_argument("--modes", action="append", default=[], metavar="MODE,MODE,...", help="sharing mode of each instance of one GPU (repeat per GPU; default mps)")
    p.add_argument("--duration-s", type=float, default=None, help="simulated seconds (default: the scenario's duration)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--perf-model", choices=["calibrated", "toy"], default="calibrated", help="calibrated: the performance model of issue 3; toy: an uncalibrated test model")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("eval", help="evaluate policies on a scenario or a suite: metrics tables, JSON and plots; or replay a result")
    _add_scenario_arguments(p, required=False)
    p.add_argument("--family", default=None, metavar="TRAIN_CONFIG.yaml",
                   help="instead of --scenario: draws of a training config's randomized scenario family (episode k: the draw seeded SEED+k)")
    p.add_argument("--policies", default="all", help="NAME,NAME,... (all: every baseline; ppo: the shipped policy; ppo:PATH: an .onnx file or a run folder; "
                   "a suffix @P sets a ppo policy's planner-takeover probability, ppo@0: its network alone)")
    p.add_argument("--episodes", type=int, default=1, help="episodes per policy (seeds SEED, SEED+1, ...)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="OUT", help="write the metrics as JSON to OUT")
    p.add_argument("--suite", default=None, metavar="NAME|SUITE.yaml",
                   help="instead of --scenario: every scenario of a suite (configs/suites/), one table each and a summary per policy")
    p.add_argument("--replay", default=None, metavar="EVAL.json",
                   help="re-simulate the configurations an earlier eval recorded and confirm each Goodput (exit 1 on a mismatch)")
    p.add_argument("--rerun-hindsight", action="store_true",
                   help="with --replay and --json OUT: search the result's hindsight reference again (after the search changed), "
                   "seeded with the other policies' recorded configurations, and write the updated result to OUT")
    p.add_argument("--add-policies", default=None, metavar="P1,P2",
                   help="with --replay and --json OUT: run these policies on the result's recorded episodes (same scenario files "
                   "and seeds) and write the result with them added, e.g. static-best-rankings (the best fixed grouping)")
    p.add_argument("--rerun-policies", default=None, metavar="P1,P2",
                   help="with --replay and --json OUT: run these policies again on the result's recorded episodes (after they "
                   "changed) and write the result with their rows replaced")
    p.add_argument("--no-priority-fill-scheduler", action="store_true",
                   help="simulate a node without a priority-fill scheduler, as a real rlsched node is: priority-fill instances "
                   "time-slice, planners plan MPS only, and static-best and hindsight are that node's (recorded in the JSON)")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="write the layout timeline and Goodput plot")
    p.add_argument("--plot-dir", default=None, metavar="DIR", help="write one plot per scenario, DIR/<scenario>.png")
    p.add_argument("--planner-time-limit", type=float, default=None, metavar="SECONDS",
                   help="wall-clock limit of each planner MILP (default 5, as the daemon runs it). The limit binds on some "
                   "two-GPU solves, and then figures depend on this machine's speed and load (each row counts them); a larger "
                   "limit makes them reproducible at the cost of evaluation time")
    p.add_argument("--perf-model", choices=["calibrated", "toy"], default="calibrated")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)

    # Performance model: heavy imports (scipy, torch) happen inside the command functions.
    from rlsched.perfmodel.commands import register as register_perfmodel
    register_perfmodel(sub)
    from rlsched.agents.ppo.cli import register as register_ppo
    register_ppo(sub)
    p = sub.add_parser("probe", help="report what NVML sees: GPUs, MIG mode, instances, profiles and placements (read-only)")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--fake", action="append", metavar="GPU[:LAYOUT]", default=[],
        help="probe the in-memory fake NVML instead (demo/test), one per GPU, e.g. a100-40gb:3g@0,3g@4",
    )
    p.set_defaults(func=cmd_probe)

    from rlsched.cli.plan import register as register_plan
    register_plan(sub)

    from rlsched.daemon.commands import register as register_daemon
    register_daemon(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlsched`` console script."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (RlschedError, LayoutError) as exc:
        print(f"rlsched {args.command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
