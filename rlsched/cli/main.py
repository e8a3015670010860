"""The ``rlsched`` command line.

Each subcommand lives in a small function; heavy imports (torch, the simulator) stay inside
the functions that need them so that ``rlsched --help`` and the catalog commands start fast.
Every error a user can cause ends as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
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

    # Performance model: heavy imports (scipy, torch) happen inside the command functions.
    from rlsched.perfmodel.commands import register as register_perfmodel
    register_perfmodel(sub)
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
