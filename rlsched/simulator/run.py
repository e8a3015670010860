"""Running a scenario under one fixed configuration (what ``rlsched simulate`` does).

Also the helpers the CLI uses to build a :class:`~rlsched.decision.Configuration` from
``--layout`` / ``--assign`` / ``--mps`` / ``--batch`` / ``--modes`` arguments, and to load
the performance model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.errors import ConfigError
from rlsched.hardware import LayoutError, load_gpu, parse_layout
from rlsched.simulator.node import NodeSimulator
from rlsched.simulator.perf import PerformanceModelLike
from rlsched.workloads.scenario import Scenario

PERF_MODELS = ("calibrated", "toy")


def load_performance_model(kind: str = "calibrated") -> PerformanceModelLike:
    """The calibrated model of issue 3 (``calibrated``) or the uncalibrated test model (``toy``)."""
    if kind == "toy":
        from rlsched.simulator.testing import FakePerformanceModel

        return FakePerformanceModel()
    from rlsched.perfmodel import PerformanceModel

    return PerformanceModel.load()


def _pairs(items: Sequence[str], flag: str) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name or not value:
            raise ConfigError(flag, flag, item, "expected TENANT=VALUE")
        pairs.append((name, value))
    return pairs


def configuration_from_args(
    scenario: Scenario,
    layouts: Sequence[str],
    assign: Sequence[str],
    mps: Sequence[str] = (),
    batch: Sequence[str] = (),
    modes: Sequence[str] = (),
) -> Configuration:
    """A configuration from CLI-style specs.

    :param layouts: one layout spec per GPU (``3g@0,2g@4,1g@6``; empty for a GPU without MIG)
    :param assign: ``TENANT=GI_INDEX`` (GPU 0) or ``TENANT=GPU:GI_INDEX``
    :param mps: ``TENANT=PCT`` MPS active-thread percentages (default 100)
    :param batch: ``TENANT=N`` max batch (default: the tenant's ``max_batch``)
    :param modes: per GPU, comma-separated sharing modes per instance (default all ``mps``)
    """
    if len(layouts) != scenario.gpu_count:
        raise ConfigError("--layout", "--layout", list(layouts), f"give one --layout per GPU ({scenario.gpu_count})")
    spec = load_gpu(scenario.gpu)
    parsed = []
    for g, text in enumerate(layouts):
        try:
            parsed.append(parse_layout(text, spec))
        except LayoutError as exc:
            raise ConfigError("--layout", f"--layout[{g}]", text, str(exc)) from None
    allowed = [m.value for m in SharingMode]
    mode_lists = []
    for g, layout in enumerate(parsed):
        count = len(layout) if spec.mig_supported else 1
        if g < len(modes):
            items = [m.strip() for m in modes[g].split(",")]
            if len(items) != count or any(m not in allowed for m in items):
                raise ConfigError("--modes", f"--modes[{g}]", modes[g], f"{count} comma-separated modes from {', '.join(allowed)}")
            mode_lists.append(tuple(SharingMode(m) for m in items))
        else:
            mode_lists.append((SharingMode.MPS,) * count)
    names = [t.name for t in scenario.tenants]
    share = {}
    for name, value in _pairs(mps, "--mps"):
        try:
            share[name] = float(value)
        except ValueError:
            raise ConfigError("--mps", f"--mps {name}", value, "a percentage in (0, 100]") from None
    batches = {}
    for name, value in _pairs(batch, "--batch"):
        if not value.isdigit() or int(value) < 1:
            raise ConfigError("--batch", f"--batch {name}", value, "an integer >= 1")
        batches[name] = int(value)
    placements = {}
    for name, value in _pairs(assign, "--assign"):
        if name not in names:
            raise ConfigError("--assign", "--assign", name, f"unknown tenant (tenants: {', '.join(names)})")
        gpu_text, colon, gi_text = value.rpartition(":")
        gpu_text = gpu_text if colon else "0"
        if not gpu_text.isdigit() or not gi_text.isdigit():
            raise ConfigError("--assign", f"--assign {name}", value, "expected GI_INDEX or GPU:GI_INDEX (integers)")
        tenant = scenario.tenant(name)
        default_batch = getattr(tenant, "max_batch", 1)
        placements[name] = TenantPlacement(int(gpu_text), int(gi_text), share.get(name, 100.0), batches.get(name, default_batch))
    for flag, given in (("--mps", share), ("--batch", batches)):
        for name in given:
            if name not in placements:
                raise ConfigError(flag, flag, name, "tenant not assigned with --assign")
    config = Configuration(tuple(parsed), tuple(mode_lists), placements)
    problems = config.problems([t.name for t in scenario.inference_tenants()])
    if problems:
        raise ConfigError("--assign", "configuration", None, "; ".join(problems))
    return config


def run_fixed(scenario: Scenario, perf_model: PerformanceModelLike, configuration: Configuration, seed: int = 0, duration_s: float | None = None) -> dict:
    """Simulate ``scenario`` for ``duration_s`` (default: its duration) under one configuration.

    Returns a JSON-ready dict: per-tenant totals (with ``conservation_ok``) and Goodput terms.
    """
    sim = NodeSimulator(scenario, perf_model, seed)
    sim.reset(seed, configuration=configuration)
    end_s = scenario.duration_s if duration_s is None else duration_s
    steps = 0
    while sim.time_s < end_s - 1e-9:
        sim.step(configuration)
        steps += 1
    tenants = sim.summary()
    for entry in tenants.values():
        if entry["kind"] == "inference":
            entry["conservation_ok"] = entry["arrived"] == entry["completed"] + entry["dropped"] + entry["queued_at_end"]
    return {
        "scenario": scenario.name,
        "gpu": scenario.gpu,
        "gpu_count": scenario.gpu_count,
        "seed": seed,
        "simulated_s": sim.time_s,
        "steps": steps,
        "layouts": [layout.spec() for layout in configuration.layouts],
        "tenants": {name: {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in entry.items()} for name, entry in tenants.items()},
        "goodput": sim.totals.as_dict(),
    }
