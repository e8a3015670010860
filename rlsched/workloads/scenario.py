"""Scenarios: a node (GPU type and count), its tenants and their arrivals, the run length,
the decision interval and the Goodput weights, read from YAML (``configs/scenarios/``).

Relative trace paths are resolved against the scenario file's folder. A bad value raises
:class:`~rlsched.errors.ConfigError` naming the file, the dotted field and the value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.errors import ConfigError
from rlsched.goodput import GoodputWeights
from rlsched.hardware import LayoutError, gpu_names, load_gpu, parse_layout
from rlsched.workloads.arrivals import ArrivalProcess, MmppArrivals, PoissonArrivals, diurnal_arrivals
from rlsched.workloads.tenants import BestEffortJob, ContinualLearningJob, EkyaCurve, InferenceTenant, Priority, Tenant
from rlsched.workloads.traces import FORMATS, load_trace


def scenarios_dir() -> Path:
    """The folder of the bundled scenarios (``configs/scenarios``)."""
    import rlsched.configs

    return Path(rlsched.configs.__file__).parent / "scenarios"


def scenario_path(name_or_path: str | Path) -> Path:
    """A scenario file: a path, or the name of a bundled scenario (``default``)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    return scenarios_dir() / f"{name_or_path}.yaml"


@dataclass
class Scenario:
    """Everything a simulation run needs besides the policy, the performance model and a seed.

    :param name: scenario name
    :param gpu: catalog name of the node's GPU type
    :param gpu_count: GPUs in the node, each with its own layout
    :param duration_s: simulated time of one episode, seconds
    :param decision_interval_s: time between decisions, seconds
    :param tenants: every tenant, inference first in file order
    :param weights: Goodput weights
    :param reference: a sensible fixed configuration (used by ``rlsched simulate`` when no
        layout is given, by the benchmark, and as the state the node starts in)
    :param service_jitter: draw batch service times from a lognormal matching the model's
        mean and p99 (False: every batch takes the mean)
    :param make_before_break: reconfigure make-before-break (MIGRator's pre-initialisation):
        a tenant's new instance is created and its server started while the old one keeps
        serving whenever the hardware allows (``reconfiguration: {make_before_break: ...}``
        in the YAML; the old instance serves at its own speed until the new server is ready.
        False, the default: every change stops the tenant for its full restart, because the
        planners do not yet hold back the changes that near-free switches make too frequent)
    :param priority_fill_scheduler: the node runs a priority-fill instance as FIKIT's kernel
        scheduler does (the first tenant at its solo latency plus a small overhead, the others
        in its idle time). False: the node has no such scheduler, as a real rlsched node has
        none, and the tenants of a priority-fill instance time-slice it
        (:meth:`~rlsched.decision.Configuration.priority_fill_time_sliced`;
        ``docs/hardware-probes/README.md``). The planners plan MPS only there; a fixed
        baseline that asks for priority fill (``fikit``) gets time slicing.
        ``priority_fill_scheduler: false`` in the YAML, or ``rlsched eval
        --no-priority-fill-scheduler``
    :param source: the file it was read from
    """

    name: str
    gpu: str
    gpu_count: int
    duration_s: float
    decision_interval_s: float
    tenants: list[Tenant]
    weights: GoodputWeights = field(default_factory=GoodputWeights)
    reference: Configuration | None = None
    service_jitter: bool = True
    make_before_break: bool = False
    priority_fill_scheduler: bool = True
    description: str = ""
    source: str = "<memory>"

    def tenant(self, name: str) -> Tenant:
        """The tenant called ``name`` (KeyError if none)."""
        for t in self.tenants:
            if t.name == name:
                return t
        raise KeyError(name)

    def inference_tenants(self) -> list[InferenceTenant]:
        """The inference services, in scenario order."""
        return [t for t in self.tenants if isinstance(t, InferenceTenant)]

    def total_mean_rate_rps(self) -> float:
        """Sum of the inference tenants' long-run mean arrival rates, requests per second."""
        return sum(t.arrivals.mean_rate_rps() for t in self.inference_tenants())

    @property
    def steps(self) -> int:
        """Decision steps in one episode."""
        return int(math.ceil(self.duration_s / self.decision_interval_s - 1e-9))


class _Reader:
    """Typed access to a YAML mapping that reports the file and dotted field on error."""

    def __init__(self, source: str, raw: Any, prefix: str) -> None:
        self.source = source
        self.prefix = prefix
        if not isinstance(raw, dict):
            raise ConfigError(source, prefix or "(top level)", raw, "expected a mapping")
        self.raw = raw

    def path(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def has(self, key: str) -> bool:
        return key in self.raw

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.raw:
            if default is ...:
                raise ConfigError(self.source, self.path(key), None, "missing")
            return default
        value = self.raw[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise ConfigError(self.source, self.path(key), value, f"expected {getattr(kind, '__name__', kind)}")
        return value

    def number(self, key: str, default: Any = ..., minimum: float = 0.0, strict: bool = False, integer: bool = False, maximum: float | None = None) -> Any:
        value = self.get(key, int if integer else float, default)
        if value is None:
            return None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum) or (maximum is not None and value > maximum):
            bound = f"{'>' if strict else '>='} {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
            raise ConfigError(self.source, self.path(key), value, f"must be {bound}")
        return value

    def choice(self, key: str, allowed: Sequence[str], default: Any = ...) -> str:
        value = self.get(key, str, default)
        if value not in allowed:
            raise ConfigError(self.source, self.path(key), value, f"allowed: {', '.join(allowed)}")
        return value

    def sub(self, key: str) -> _Reader:
        return _Reader(self.source, self.get(key, dict), self.path(key))

    def unknown(self, allowed: Sequence[str]) -> None:
        extra = sorted(set(self.raw) - set(allowed))
        if extra:
            raise ConfigError(self.source, self.path(extra[0]), self.raw[extra[0]], f"unknown field (allowed: {', '.join(allowed)})")


ARRIVAL_KINDS = ("poisson", "mmpp", "diurnal", "trace")


def parse_arrivals(r: _Reader, base_dir: Path) -> ArrivalProcess:
    """An arrival process from its scenario entry (``kind`` picks the process)."""
    kind = r.choice("kind", ARRIVAL_KINDS)
    if kind == "poisson":
        r.unknown(["kind", "rate_rps"])
        return PoissonArrivals(r.number("rate_rps"))
    if kind == "mmpp":
        r.unknown(["kind", "rates_rps", "mean_sojourn_s", "rate_scale"])
        rates = r.get("rates_rps", list)
        sojourns = r.get("mean_sojourn_s", list)
        if len(rates) != len(sojourns) or not rates:
            raise ConfigError(r.source, r.path("mean_sojourn_s"), sojourns, f"needs one entry per rate ({len(rates)} rates)")
        for i, x in enumerate(rates):
            if isinstance(x, bool) or not isinstance(x, int | float) or x < 0:
                raise ConfigError(r.source, r.path(f"rates_rps[{i}]"), x, "must be a number >= 0")
        for i, x in enumerate(sojourns):
            if isinstance(x, bool) or not isinstance(x, int | float) or x <= 0:
                raise ConfigError(r.source, r.path(f"mean_sojourn_s[{i}]"), x, "must be a number > 0")
        return MmppArrivals([float(x) for x in rates], [float(x) for x in sojourns], r.number("rate_scale", 1.0))
    if kind == "diurnal":
        r.unknown(["kind", "mean_rate_rps", "amplitude", "period_s", "phase_s", "resolution_s"])
        return diurnal_arrivals(
            r.number("mean_rate_rps"),
            r.number("amplitude", 0.5, maximum=1.0),
            r.number("period_s", 86400.0, strict=True),
            r.number("phase_s", 0.0, minimum=-math.inf),
            r.number("resolution_s", 60.0, strict=True),
        )
    r.unknown(["kind", "file", "format", "rate_scale", "time_warp", "offset_s"])
    file = Path(r.get("file", str))
    path = file if file.is_absolute() else base_dir / file
    if not path.exists():
        raise ConfigError(r.source, r.path("file"), str(file), f"no such trace file ({path})")
    return load_trace(
        path,
        r.choice("format", FORMATS, "auto"),
        r.number("rate_scale", 1.0, strict=True),
        r.number("time_warp", 1.0, strict=True),
        r.number("offset_s", 0.0),
    )


def _priority(r: _Reader, default: str) -> Priority:
    return Priority(r.choice("priority", [p.value for p in Priority], default))


def parse_activity(r: _Reader, duration_s: float) -> tuple[tuple[float, float], ...]:
    """A tenant's ``active`` windows: ``[{from_s, until_s}, ...]``, sorted and disjoint, in
    seconds of episode time (``from_s`` defaults to 0, ``until_s`` to the episode's end);
    no ``active`` field: active the whole episode (no windows)."""
    if not r.has("active"):
        return ()
    raw = r.get("active", list)
    if not raw:
        raise ConfigError(r.source, r.path("active"), raw, "no window: the tenant would never be active (omit the field to keep it active the whole episode)")
    windows: list[tuple[float, float]] = []
    for i, entry in enumerate(raw):
        w = _Reader(r.source, entry, r.path(f"active[{i}]"))
        w.unknown(["from_s", "until_s"])
        start = w.number("from_s", 0.0)
        end = w.number("until_s") if w.has("until_s") else math.inf  # number() would reject an infinite default
        if end <= start:
            raise ConfigError(r.source, w.path("until_s"), end, f"must be > from_s ({start}): the tenant would be active for zero seconds")
        if start >= duration_s:
            raise ConfigError(r.source, w.path("from_s"), start, f"at or after the end of the episode (duration_s {duration_s}): the window is never active")
        if windows and start < windows[-1][0]:
            raise ConfigError(r.source, w.path("from_s"), start, f"activity windows must be sorted by from_s (the previous one starts at {windows[-1][0]})")
        if windows and start < windows[-1][1]:
            raise ConfigError(r.source, w.path("from_s"), start, f"overlapping activity windows (the previous one lasts until {windows[-1][1]})")
        windows.append((start, end))
    return tuple(windows)


def _model_key(r: _Reader) -> str:
    """The tenant's model, ``MODEL@SOURCE`` when it names a calibration source (``auto`` or a
    calibration file's stem, e.g. ``parvagpu-a100-80gb``). Without ``source`` the model keeps
    the performance model's original choice (sources that measured slices or shares)."""
    model = r.get("model", str)
    source = r.get("source", str, None)
    if source is None:
        return model
    if not source or "@" in source or "@" in model:
        raise ConfigError(r.source, r.path("source"), source, "expected auto or a calibration file's stem, e.g. parvagpu-a100-80gb")
    return f"{model}@{source}"


def parse_tenant(r: _Reader, base_dir: Path, duration_s: float = math.inf) -> Tenant:
    """One tenant entry; ``kind`` is inference, continual-learning or best-effort.

    :param duration_s: the episode's duration (an activity window must start before it), seconds
    """
    kind = r.choice("kind", ["inference", "continual-learning", "best-effort"], "inference")
    name = r.get("name", str)
    active = parse_activity(r, duration_s)
    if kind == "inference":
        r.unknown(["kind", "name", "model", "source", "slo_ms", "priority", "arrivals", "max_batch", "batch_timeout_ms", "queue_capacity", "queue_timeout_ms", "restart_s", "accuracy", "tuned_at_mps_pct", "tuning_mismatch_penalty", "active"])
        return InferenceTenant(
            name=name,
            model=_model_key(r),
            slo_ms=r.number("slo_ms", strict=True),
            arrivals=parse_arrivals(r.sub("arrivals"), base_dir),
            priority=_priority(r, "normal"),
            max_batch=r.number("max_batch", 32, minimum=1, integer=True),
            batch_timeout_ms=r.number("batch_timeout_ms", 2.0),
            queue_capacity=r.number("queue_capacity", 4096, minimum=1, integer=True),
            queue_timeout_ms=r.number("queue_timeout_ms", None, strict=True),
            restart_s=r.number("restart_s", 0.0),
            accuracy=r.number("accuracy", 1.0, maximum=1.0),
            tuned_at_mps_pct=r.number("tuned_at_mps_pct", None, strict=True, maximum=100.0),
            tuning_mismatch_penalty=r.number("tuning_mismatch_penalty", 0.0),
            active_windows_s=active,
        )
    if kind == "continual-learning":
        r.unknown(["kind", "name", "serves", "model", "source", "ekya", "samples_per_unit", "drift_window_s", "units_after_drift", "restart_s", "priority", "active"])
        ekya = r.sub("ekya")
        ekya.unknown(["b0", "b1", "b2"])
        curve = EkyaCurve(ekya.number("b0", strict=True), ekya.number("b1", strict=True), ekya.number("b2", minimum=-math.inf))
        return ContinualLearningJob(
            name=name,
            serves=r.get("serves", str),
            model=_model_key(r),
            curve=curve,
            samples_per_unit=r.number("samples_per_unit", strict=True),
            drift_window_s=r.number("drift_window_s", strict=True),
            units_after_drift=r.number("units_after_drift", 0.0),
            restart_s=r.number("restart_s", 0.0),
            priority=_priority(r, "low"),
            active_windows_s=active,
        )
    r.unknown(["kind", "name", "model", "source", "restart_s", "priority", "work_weight", "tuned_at_mps_pct", "tuning_mismatch_penalty", "active"])
    return BestEffortJob(
        name=name,
        model=_model_key(r),
        restart_s=r.number("restart_s", 0.0),
        priority=_priority(r, "low"),
        work_weight=r.number("work_weight", 1.0),
        tuned_at_mps_pct=r.number("tuned_at_mps_pct", None, strict=True, maximum=100.0),
        tuning_mismatch_penalty=r.number("tuning_mismatch_penalty", 0.0),
        active_windows_s=active,
    )


def parse_configuration(r: _Reader, gpu: str, gpu_count: int, tenant_names: list[str]) -> Configuration:
    """A configuration from ``{layouts: [spec per GPU], modes: [[mode per instance]], placements: {...}}``."""
    r.unknown(["layouts", "modes", "placements"])
    specs = r.get("layouts", list)
    if len(specs) != gpu_count:
        raise ConfigError(r.source, r.path("layouts"), specs, f"needs one layout spec per GPU ({gpu_count})")
    layouts = []
    for g, spec in enumerate(specs):
        try:
            layout = parse_layout(str(spec or ""), gpu)
        except LayoutError as exc:
            raise ConfigError(r.source, r.path(f"layouts[{g}]"), spec, str(exc)) from None
        layouts.append(layout)
    spec_gpu = load_gpu(gpu)
    default_modes = [["mps"] * (len(lay) if spec_gpu.mig_supported else 1) for lay in layouts]
    raw_modes = r.get("modes", list, default_modes)
    allowed = [m.value for m in SharingMode]
    modes = []
    for g, per_gpu in enumerate(raw_modes):
        if not isinstance(per_gpu, list) or any(m not in allowed for m in per_gpu):
            raise ConfigError(r.source, r.path(f"modes[{g}]"), per_gpu, f"a list of sharing modes ({', '.join(allowed)})")
        modes.append(tuple(SharingMode(m) for m in per_gpu))
    placements = {}
    raw = r.sub("placements")
    for name in raw.raw:
        if name not in tenant_names:
            raise ConfigError(r.source, raw.path(name), name, f"unknown tenant (tenants: {', '.join(tenant_names)})")
        p = raw.sub(name)
        p.unknown(["gpu", "instance", "mps_pct", "batch_size"])
        placements[name] = TenantPlacement(
            p.number("gpu", 0, integer=True),
            p.number("instance", 0, integer=True),
            p.number("mps_pct", 100.0, strict=True, maximum=100.0),
            p.number("batch_size", 1, minimum=1, integer=True),
        )
    config = Configuration(tuple(layouts), tuple(modes), placements)
    problems = config.problems()
    if problems:
        raise ConfigError(r.source, r.path("placements"), None, "; ".join(problems))
    return config


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Read and check a scenario file (or a bundled scenario by name)."""
    path = scenario_path(name_or_path)
    if not path.exists():
        raise ConfigError(path, "file", str(name_or_path), "no such scenario (bundled: " + ", ".join(sorted(p.stem for p in scenarios_dir().glob("*.yaml"))) + ")")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(path, "file", str(path), f"not valid YAML: {exc}") from None
    r = _Reader(str(path), raw, "")
    r.unknown(["name", "description", "gpu", "gpu_count", "duration_s", "decision_interval_s", "tenants", "weights", "reference", "service_jitter", "reconfiguration",
               "priority_fill_scheduler"])
    gpu = r.choice("gpu", gpu_names())
    tenants_raw = r.get("tenants", list)
    if not tenants_raw:
        raise ConfigError(path, "tenants", tenants_raw, "a scenario needs at least one tenant")
    duration_s = r.number("duration_s", strict=True)  # read first: activity windows are checked against it
    tenants = [parse_tenant(_Reader(str(path), t, f"tenants[{i}]"), path.parent, duration_s) for i, t in enumerate(tenants_raw)]
    names = [t.name for t in tenants]
    for i, t in enumerate(tenants):
        if names.index(t.name) != i:
            raise ConfigError(path, f"tenants[{i}].name", t.name, "tenant names must be unique")
        if isinstance(t, ContinualLearningJob) and not any(isinstance(s, InferenceTenant) and s.name == t.serves for s in tenants):
            raise ConfigError(path, f"tenants[{i}].serves", t.serves, "must name an inference tenant of this scenario")
    weights = GoodputWeights()
    if r.has("weights"):
        w = r.sub("weights")
        w.unknown(["priority", "slo_penalty", "best_effort", "reconfiguration_per_s"])
        prio = dict(weights.priority)
        if w.has("priority"):
            pw = w.sub("priority")
            pw.unknown([p.value for p in Priority])
            prio.update({k: pw.number(k) for k in pw.raw})
        weights = GoodputWeights(prio, w.number("slo_penalty", 1.0), w.number("best_effort", 1.0), w.number("reconfiguration_per_s", 0.0))
    gpu_count = r.number("gpu_count", 1, minimum=1, integer=True)
    scenario = Scenario(
        name=r.get("name", str, path.stem),
        description=r.get("description", str, ""),
        gpu=gpu,
        gpu_count=gpu_count,
        duration_s=duration_s,
        decision_interval_s=r.number("decision_interval_s", strict=True),
        tenants=tenants,
        weights=weights,
        service_jitter=r.get("service_jitter", bool, True),
        make_before_break=_make_before_break(r),
        priority_fill_scheduler=r.get("priority_fill_scheduler", bool, True),
        source=str(path),
    )
    if r.has("reference"):
        scenario.reference = parse_configuration(r.sub("reference"), gpu, gpu_count, names)
    return scenario


def without_priority_fill_scheduler(scenario: Scenario) -> Scenario:
    """``scenario`` on a node without a priority-fill scheduler (``Scenario.priority_fill_scheduler``)."""
    return dataclasses.replace(scenario, priority_fill_scheduler=False)


def _make_before_break(r: _Reader) -> bool:
    """``reconfiguration: {make_before_break: bool}`` (default False)."""
    if not r.has("reconfiguration"):
        return False
    sub = r.sub("reconfiguration")
    sub.unknown(["make_before_break"])
    return bool(sub.get("make_before_break", bool, False))


def parse_trace_override(text: str, source: str = "--trace") -> tuple[str, Path, float, float]:
    """``TENANT=FILE[:SCALE[:WARP]]`` -> (tenant, file, rate scale, time warp).

    WARP is the trace seconds replayed per simulated second (``time_warp``): 144 replays
    one day of a 14-day rate series in 10 simulated minutes, 48 two days in the hour.
    """
    tenant, eq, rest = text.partition("=")
    if not eq or not tenant or not rest:
        raise ConfigError(source, "--trace", text, "expected TENANT=FILE, TENANT=FILE:SCALE or TENANT=FILE:SCALE:WARP")
    numbers: list[float] = []
    file = rest
    while len(numbers) < 2:
        head, colon, tail = file.rpartition(":")
        if not colon:
            break
        try:
            number = float(tail)
        except ValueError:
            break  # a colon inside the path
        if not math.isfinite(number) or number <= 0:
            raise ConfigError(source, f"--trace {tenant}", tail, "the rate scale and the time warp must be numbers > 0")
        numbers.insert(0, number)
        file = head
    scale, warp = (numbers + [1.0, 1.0])[:2]
    return tenant, Path(file), scale, warp


def with_trace_overrides(scenario: Scenario, overrides: Sequence[str], source: str = "--trace") -> Scenario:
    """A copy of ``scenario`` whose named inference tenants replay the given trace files."""
    if not overrides:
        return scenario
    tenants = list(scenario.tenants)
    for text in overrides:
        name, file, scale, warp = parse_trace_override(text, source)
        index = next((i for i, t in enumerate(tenants) if t.name == name), None)
        if index is None or not isinstance(tenants[index], InferenceTenant):
            allowed = ", ".join(t.name for t in scenario.inference_tenants())
            raise ConfigError(source, "--trace", name, f"not an inference tenant of scenario {scenario.name} (allowed: {allowed})")
        if not file.exists():
            raise ConfigError(source, f"--trace {name}", str(file), "no such trace file")
        tenants[index] = dataclasses.replace(tenants[index], arrivals=load_trace(file, "auto", rate_scale=scale, time_warp=warp))
    # No longer the file's scenario: nothing may take the file for it (e.g. a replay).
    return dataclasses.replace(scenario, tenants=tenants, source=f"{scenario.source} with {source} {' '.join(overrides)}")
