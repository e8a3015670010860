"""The daemon's configuration: ``configs/daemon/NAME.yaml``, overridden by ``rlsched serve`` flags.

A bad value raises :class:`~rlsched.errors.ConfigError` naming the file, the field and the
value (the CLI exits 2).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from rlsched.errors import ConfigError

#: Backends ``rlsched serve`` drives.
SERVE_BACKENDS = ("sim", "nvml", "mig-parted")
#: Those that drive a real node (the rest simulate one).
REAL_BACKENDS = ("nvml", "mig-parted")
#: Observation sources on real backends.
OBSERVATION_SOURCES = ("none", "prometheus")
#: The planner that decides whenever the policy cannot be trusted (the daemon config's
#: ``fallback_policy``): the planner that holds up under bursts (issue 23). On twelve ServeGen
#: traces no choice was tuned on, replayed on ``default``'s resnet, it met 0.99 high-priority
#: SLO and >= 0.98x ``static-best-slo`` on every trace where a fixed configuration meets the
#: SLO (4 of 4, serving FIFO or rejecting), where ``migrator-ilp`` (MIGRator's planner, kept
#: as that system's baseline) met both on 2 of 4 rejecting and none serving FIFO, earning
#: 0.69x ``static-best-slo`` against its 1.16x (docs/planner-bursts.md, stops 64-65). It is a
#: stateful planner: it observes every cycle, including those the policy decides.
FALLBACK_POLICY = "migrator-queue-slo"


@dataclass(frozen=True)
class DaemonConfig:
    """Everything ``rlsched serve`` needs.

    :param source: the file it was read from (named in errors)
    :param scenario: bundled scenario name or YAML path (tenants, GPU type and count)
    :param backend: ``sim`` (as fast as possible), ``nvml`` or ``mig-parted`` (real time)
    :param policy: decision policy: ``auto`` (``migrator-pf-held`` on the simulator, the method
        that measured best on held-out traffic and node shapes; on a real node, where rlsched
        starts no priority-fill scheduler, MPS only: ``migrator-queue`` with a request log,
        ``migrator-hedge-mps`` without), ``ppo`` (``ppo@P``: overriding the policy file's planner-takeover
        probability with P), ``candidate-ppo`` (the shipped file for any node; ``candidate-ppo:PATH``
        another; its library's solves run beside the loop) or a baseline name
    :param policy_path: ONNX file of the ``ppo`` policy (None: the shipped one)
    :param fallback_policy: the planner used whenever the policy cannot be trusted
        (:data:`FALLBACK_POLICY`)
    :param cycles: decision cycles to run (None: until stopped)
    :param interval_s: decision interval on real backends, seconds (None: the scenario's)
    :param metrics_addr: ``HOST:PORT`` of the Prometheus endpoint (None: none); port 0 picks one
    :param logdir: TensorBoard event folder (None: none)
    :param state: state file (None: nothing persisted)
    :param apply: change the hardware (False: real backends plan and log only)
    :param perf_model: ``calibrated`` or ``toy``
    :param seed: seed of the simulator's episodes
    :param observation_tolerance: how far (in normalized units) a feature may leave [0, 1]
        before the policy is distrusted
    :param observations: ``{source: none|prometheus, endpoints: [...], timeout_s, request_log}``
        (``request_log``: the file the serving frontend appends ``TENANT,UNIX_SECONDS`` to,
        one line per request; policies that replay the node's traffic read it)
    :param clients: tenant -> ``{argv: [...], env: {...}, restart_s}`` (MPS clients; nvml only)
    :param mig_parted: ``{config_path, node}`` for the mig-parted backend
    :param gpu_types: catalog GPU type per device (None: the scenario's GPU for each)
    :param log_level: ``debug`` (a line per cycle), ``info``, ``warning``
    """

    source: str = "(defaults)"
    scenario: str = "default"
    backend: str = "sim"
    policy: str = "auto"
    policy_path: str | None = None
    fallback_policy: str = FALLBACK_POLICY
    cycles: int | None = None
    interval_s: float | None = None
    metrics_addr: str | None = "127.0.0.1:9400"
    logdir: str | None = None
    state: str | None = None
    apply: bool = False
    perf_model: str = "calibrated"
    seed: int = 0
    observation_tolerance: float = 0.0
    observations: dict[str, Any] = field(default_factory=lambda: {"source": "none"})
    clients: dict[str, Any] = field(default_factory=dict)
    mig_parted: dict[str, Any] = field(default_factory=dict)
    gpu_types: list[str] | None = None
    log_level: str = "info"

    def metrics_host_port(self) -> tuple[str, int] | None:
        """(host, port) of :attr:`metrics_addr`, None when disabled."""
        return None if self.metrics_addr is None else parse_addr(self.metrics_addr, self.source)

    def with_overrides(self, **overrides: Any) -> DaemonConfig:
        """A copy with the given fields replaced (None values are ignored: flag not given)."""
        changed = replace(self, **{k: v for k, v in overrides.items() if v is not None})
        return validated(changed)


def parse_addr(text: str, source: str = "--metrics-addr") -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); the host must be an IP address (no name lookups)."""
    host, sep, port = str(text).rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
        number = int(port)
    except ValueError:
        raise ConfigError(source, "metrics_addr", text, "expected IP:PORT, e.g. 127.0.0.1:9400") from None
    if not sep or not 0 <= number <= 65535:
        raise ConfigError(source, "metrics_addr", text, "expected IP:PORT with a port 0-65535")
    return host.strip("[]"), number


def validated(config: DaemonConfig) -> DaemonConfig:
    """``config`` if every field is allowed, else a :class:`ConfigError` naming the first bad one."""
    src = config.source
    if config.backend not in SERVE_BACKENDS:
        raise ConfigError(src, "backend", config.backend, f"allowed: {', '.join(SERVE_BACKENDS)}")
    if config.cycles is not None and (isinstance(config.cycles, bool) or not isinstance(config.cycles, int) or config.cycles < 1):
        raise ConfigError(src, "cycles", config.cycles, "expected an integer >= 1 (or null: run until stopped)")
    if config.interval_s is not None and (not isinstance(config.interval_s, int | float) or config.interval_s <= 0):
        raise ConfigError(src, "interval_s", config.interval_s, "expected seconds > 0")
    if not isinstance(config.observation_tolerance, int | float) or config.observation_tolerance < 0:
        raise ConfigError(src, "observation_tolerance", config.observation_tolerance, "expected a number >= 0")
    if not isinstance(config.seed, int) or isinstance(config.seed, bool):
        raise ConfigError(src, "seed", config.seed, "expected an integer")
    if not isinstance(config.apply, bool):
        raise ConfigError(src, "apply", config.apply, "expected true or false")
    if config.log_level not in ("debug", "info", "warning"):
        raise ConfigError(src, "log_level", config.log_level, "allowed: debug, info, warning")
    if not isinstance(config.observations, dict) or config.observations.get("source", "none") not in OBSERVATION_SOURCES:
        raise ConfigError(src, "observations.source", config.observations, f"allowed: {', '.join(OBSERVATION_SOURCES)}")
    log = config.observations.get("request_log")
    if log is not None and (not isinstance(log, str) or not log):
        raise ConfigError(src, "observations.request_log", log, "expected the path of the frontend's request log")
    if not isinstance(config.clients, dict):
        raise ConfigError(src, "clients", config.clients, "expected a mapping tenant -> {argv, env, restart_s}")
    if config.backend == "mig-parted" and not config.mig_parted.get("config_path"):
        raise ConfigError(src, "mig_parted.config_path", None, "the mig-parted backend needs the config file to write")
    config.metrics_host_port()
    return config


def load_daemon_config(path: str | Path | None) -> DaemonConfig:
    """Read a daemon YAML (None: the defaults)."""
    if path is None:
        return validated(DaemonConfig())
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(path, "(file)", str(path), f"cannot be read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, "(file)", None, f"not YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, "(top level)", data, "expected a mapping of daemon settings")
    known = {f.name for f in fields(DaemonConfig)} - {"source"}
    for key in data:
        if key not in known:
            raise ConfigError(path, key, data[key], f"unknown field (allowed: {', '.join(sorted(known))})")
    return validated(DaemonConfig(source=str(path), **data))
