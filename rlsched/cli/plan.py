"""``rlsched plan``: the fewest GPUs (and the cheapest GPU type) that meet every service's SLO.

Parses the services (``--tenant NAME:MODEL:SLO_MS:RATE_RPS`` and/or ``--tenants FILE.yaml``
with ``tenants: [{name, model, slo_ms, rate_rps}]``), plans per GPU type
(:mod:`rlsched.solver.capacity`), optionally verifies and repairs in the simulator
(:mod:`rlsched.solver.capacity_verify`), prints a table or JSON, and with ``-o DIR`` writes
one mig-parted config per GPU and a scenario YAML.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import yaml

from rlsched.errors import ConfigError

#: The price table (user-editable example values; see the file).
PRICES_FILE = "gpu-prices.yaml"


def parse_tenant(text: str) -> "ServiceSpec":
    """``NAME:MODEL:SLO_MS:RATE_RPS`` -> a service (ConfigError naming the field and value)."""
    from rlsched.solver.capacity import ServiceSpec

    parts = text.split(":")
    if len(parts) != 4 or not all(parts):
        raise ConfigError("--tenant", "--tenant", text, "expected NAME:MODEL:SLO_MS:RATE_RPS, e.g. web:resnet50:50:400")
    name, model, slo, rate = parts
    values = []
    for field, raw in (("slo_ms", slo), ("rate_rps", rate)):
        try:
            values.append(float(raw))
        except ValueError:
            raise ConfigError("--tenant", f"{name}.{field}", raw, "expected a number") from None
    return ServiceSpec(name, model, values[0], values[1])


def load_tenants_file(path: str | Path) -> list:
    """Services from a YAML file ``tenants: [{name, model, slo_ms, rate_rps}, ...]``."""
    from rlsched.solver.capacity import ServiceSpec

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(path, "<file>", str(path), f"cannot read YAML: {exc}") from None
    entries = raw.get("tenants") if isinstance(raw, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(path, "tenants", entries, "expected a non-empty list of {name, model, slo_ms, rate_rps}")
    services = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or set(e) != {"name", "model", "slo_ms", "rate_rps"}:
            raise ConfigError(path, f"tenants[{i}]", e, "expected exactly the fields name, model, slo_ms, rate_rps")
        for field in ("slo_ms", "rate_rps"):
            if isinstance(e[field], bool) or not isinstance(e[field], int | float):
                raise ConfigError(path, f"tenants[{i}].{field}", e[field], "expected a number")
        services.append(ServiceSpec(str(e["name"]), str(e["model"]), float(e["slo_ms"]), float(e["rate_rps"])))
    return services


def load_prices() -> dict[str, float]:
    """GPU type -> example price per GPU-hour from ``configs/gpu-prices.yaml``."""
    import rlsched.configs

    path = Path(rlsched.configs.__file__).parent / PRICES_FILE
    raw = yaml.safe_load(path.read_text())
    prices = raw.get("usd_per_gpu_hour", {}) if isinstance(raw, dict) else {}
    for name, value in prices.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(path, f"usd_per_gpu_hour.{name}", value, "expected a price > 0")
    return {str(k): float(v) for k, v in prices.items()}


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan, (verify,) print and export."""
    from rlsched.hardware import gpu_names, load_gpu
    from rlsched.perfmodel import PerformanceModel
    from rlsched.solver.capacity import OptionTable, plan_capacity, plan_igniter
    from rlsched.solver.capacity_verify import plan_verified, verify

    services = [parse_tenant(t) for t in args.tenant]
    for f in args.tenants:
        services += load_tenants_file(f)
    if not services:
        raise ConfigError("--tenant", "--tenant", None, "give at least one --tenant NAME:MODEL:SLO_MS:RATE_RPS or --tenants FILE.yaml")
    perf = PerformanceModel.load()
    explicit = [g for g in args.gpu if g != "any"]
    for g in explicit:
        load_gpu(g)  # ConfigError naming the unknown type
    candidates = sorted(set(explicit) | ({n for n in gpu_names()} if "any" in args.gpu else set()), key=lambda n: args.gpu.index(n) if n in args.gpu else len(args.gpu))
    planner_of = {"rlsched": plan_capacity, "igniter": plan_igniter}[args.method]
    results, skipped = [], {}
    for gpu in candidates:
        table = OptionTable(gpu, perf)
        try:
            if args.verify:
                plan, check, repairs = plan_verified(services, lambda s, g=gpu, t=table: planner_of(s, g, perf, t), table, perf, args.verify_duration_s,
                                                     False, args.seed)
                burst = verify(plan, services, perf, args.verify_duration_s, True, args.seed) if args.burst else None
            else:
                plan, check, repairs, burst = planner_of(services, gpu, perf, table), None, [], None
        except ConfigError as exc:
            if len(candidates) == 1:
                raise
            skipped[gpu] = str(exc)
            continue
        results.append((plan, check, repairs, burst))
    if not results:
        raise ConfigError("--gpu", "--gpu", ",".join(args.gpu), "no GPU type can serve these services: " + "; ".join(f"{g}: {r}" for g, r in skipped.items()))
    prices = load_prices()
    best = min(results, key=lambda r: (prices.get(r[0].gpu_type, math.inf) * r[0].gpus, r[0].gpus))
    docs = [_json(r, prices) for r in results]
    doc = dict(_json(best, prices))
    if len(results) > 1 or skipped:
        doc["comparison"] = [{"gpu_type": d["gpu_type"], "gpus": d["gpus"], "usd_per_hour": d["usd_per_hour"]} for d in docs]
        doc["skipped"] = skipped
        doc["price_note"] = "prices: configs/gpu-prices.yaml, user-editable EXAMPLE values (UNCONFIRMED), not quotes"
    if args.output:
        _export(best[0], services, Path(args.output))
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print(doc, best, docs, skipped)
    return 0


def _json(result: tuple, prices: dict[str, float]) -> dict:
    plan, check, repairs, burst = result
    doc = plan.to_json()
    price = prices.get(plan.gpu_type)
    doc["usd_per_hour"] = round(price * plan.gpus, 2) if price is not None else None
    if check is not None:
        doc["verified"] = {"slo_attainment": {k: round(v, 4) for k, v in check.slo_attainment.items()}, "passed": check.passed,
                           "target": check.target, "duration_s": check.duration_s, "arrivals": "poisson", "repairs": repairs}
        if burst is not None:
            doc["verified"]["burst"] = {"slo_attainment": {k: round(v, 4) for k, v in burst.slo_attainment.items()}, "passed": burst.passed,
                                        "arrivals": "mmpp, same mean"}
    return doc


def _print(doc: dict, best: tuple, docs: list[dict], skipped: dict[str, str]) -> None:
    if len(docs) > 1 or skipped:
        print(f"{'gpu type':<12} {'GPUs':>4} {'$/h (example prices)':>21}")
        for d in docs:
            cost = "-" if d["usd_per_hour"] is None else f"{d['usd_per_hour']:.2f}"
            print(f"{d['gpu_type']:<12} {d['gpus']:>4} {cost:>21}")
        for g, why in skipped.items():
            print(f"{g:<12} cannot serve: {why}")
        print()
    bound = f", lower bound {doc['lower_bound_gpus']}" if doc["lower_bound_gpus"] is not None else ""
    print(f"{doc['method']} plan: {doc['gpus']} x {doc['gpu_type']}{bound}, solved in {doc['solve_time_s']:.2f} s")
    att = doc.get("verified", {}).get("slo_attainment", {})
    print(f"{'gpu':>3} {'layout':<34} {'tenant':<12} {'model':<10} {'instance':<14} {'mps %':>6} {'batch':>5} {'p99 ms':>7} {'max rps':>8} {'SLO att.':>8}")
    for g in doc["gpu_plans"]:
        for t in g["tenants"]:
            a = f"{att[t['name']]:.4f}" if t["name"] in att else "-"
            print(f"{g['gpu']:>3} {g['layout'] or '(no MIG)':<34} {t['name']:<12} {t['model']:<10} {t['instance']:<14} {t['mps_pct']:>6g} {t['batch']:>5} "
                  f"{t['predicted_latency_ms_p99']:>7.2f} {t['throughput_rps']:>8.1f} {a:>8}")
    verified = doc.get("verified")
    if verified:
        print(f"verification ({verified['duration_s']:g} s, Poisson): {'passed' if verified['passed'] else 'FAILED'} (target {verified['target']})")
        for r in verified["repairs"]:
            print(f"  repair round {r['round']}: {r['failing']} -> {r['action']} (GPUs {r['gpus_before']} -> {r['gpus_after']})")
        if "burst" in verified:
            print(f"burst replay (MMPP, same mean): {'passed' if verified['burst']['passed'] else 'missed'}: {verified['burst']['slo_attainment']}")
    for note in doc["notes"]:
        print(f"note: {note}")


def _export(plan, services, out: Path) -> None:
    """One mig-parted config per GPU and ``scenario.yaml`` under ``out`` (atomic writes)."""
    from rlsched.fileio import write_text_atomically
    from rlsched.hardware.mig_parted import mig_parted_config
    from rlsched.solver.capacity_verify import scenario_yaml

    for g, layout in enumerate(plan.layouts):
        write_text_atomically(out / f"mig-parted-gpu{g}.yaml", mig_parted_config(f"rlsched-plan-gpu{g}", [layout], devices=[g]))
    write_text_atomically(out / "scenario.yaml", scenario_yaml(plan, services))
    print(f"wrote {plan.gpus} mig-parted config(s) and scenario.yaml to {out}", file=sys.stderr)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``rlsched plan`` to the command line."""
    p = sub.add_parser("plan", help="capacity planning: the fewest GPUs (and cheapest type) meeting every service's SLO")
    p.add_argument("--gpu", action="append", required=True, help="GPU type (repeat to compare types; 'any': every catalog type)")
    p.add_argument("--tenant", action="append", default=[], metavar="NAME:MODEL:SLO_MS:RATE_RPS", help="a service (repeatable)")
    p.add_argument("--tenants", action="append", default=[], metavar="FILE.yaml", help="services: tenants: [{name, model, slo_ms, rate_rps}]")
    p.add_argument("--method", choices=["rlsched", "igniter"], default="rlsched", help="rlsched: column generation in HiGHS; igniter: the iGniter-style greedy")
    p.add_argument("--verify", action="store_true", help="replay in the simulator (Poisson) and repair until every service reaches 0.99 SLO attainment")
    p.add_argument("--burst", action="store_true", help="with --verify: also replay an MMPP of the same mean (reported, not repaired)")
    p.add_argument("--verify-duration-s", type=float, default=120.0,
                   help="simulated seconds per replay, at least (longer when a tenant is slow, so that it gets enough requests for its p99)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("-o", "--output", default=None, metavar="DIR", help="write mig-parted configs (one per GPU) and scenario.yaml here")
    p.set_defaults(func=cmd_plan)
