"""MPS shares: a tenant's share changes by restarting its client with a new thread percentage.

``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` is read when a client starts; a running client's share
cannot change (``../shared/docs/gpu-facts.md`` section 4). So applying a share means: stop
the tenant's client, make sure the MPS control daemon of its MIG instance runs (one daemon
per MIG device, with its own ``CUDA_MPS_PIPE_DIRECTORY`` and
``CUDA_VISIBLE_DEVICES=<MIG-UUID>``), and start the client again with the percentage in
its environment. Every command is an argument list (never a shell string); the daemon's
commands go to ``nvidia-cuda-mps-control`` on its standard input, as the MPS docs show.

Order with a MIG change (the daemon loop does this): make-before-break, the new client of a
tenant starts next to its running one (:meth:`MpsManager.stage`: a new GI right after it is
created, or the same GI when its memory holds both clients) and the old one stops once the
new one is ready; clients still on a GI about to be destroyed are stopped first (a busy
instance cannot be destroyed); then :meth:`MpsManager.apply` settles the rest.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rlsched.decision import Configuration, SharingMode
from rlsched.hardware.layout import GpuInstance

#: The MPS control program (on PATH with the NVIDIA driver).
MPS_CONTROL = "nvidia-cuda-mps-control"


@dataclass(frozen=True)
class TenantClient:
    """How to start one tenant's serving (or training) process.

    :param argv: the command as an argument list
    :param env: extra environment variables of the process
    :param restart_s: measured restart cost (CUDA context + model load), seconds: a tenant
        parameter, it usually dominates a reconfiguration
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    restart_s: float = 0.0


@dataclass(frozen=True)
class ClientTarget:
    """Where and with what share one tenant's client should run.

    :param device_uuid: ``MIG-...`` UUID of its instance (or ``GPU-...`` on a GPU without MIG)
    :param mps_pct: MPS active-thread percentage, (0, 100]; None when the instance is not
        shared with MPS (time slicing, priority fill): no MPS variables are set then
    """

    device_uuid: str
    mps_pct: float | None


class ProcessHandle(Protocol):
    """A started client process."""

    pid: int

    def stop(self, grace_s: float) -> None:
        """Ask it to end (SIGTERM), and kill it after ``grace_s`` seconds."""


class Runner(Protocol):
    """Runs commands; injectable so that tests check argv and env without running anything."""

    def run(self, argv: Sequence[str], env: Mapping[str, str], input_text: str | None = None) -> int:
        """Run a short command to completion; returns its exit status."""

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> ProcessHandle:
        """Start a long-running process."""


class _PopenHandle:
    def __init__(self, process: subprocess.Popen) -> None:
        self.process, self.pid = process, process.pid

    def stop(self, grace_s: float) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class SubprocessRunner:
    """The real runner: :mod:`subprocess` with argument lists, never a shell."""

    def run(self, argv: Sequence[str], env: Mapping[str, str], input_text: str | None = None) -> int:
        return subprocess.run(list(argv), env=dict(env), input=input_text, text=True, capture_output=True, check=False).returncode

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> ProcessHandle:
        return _PopenHandle(subprocess.Popen(list(argv), env=dict(env)))


@dataclass(frozen=True)
class MpsStep:
    """One command of a share change.

    :param kind: ``stop-client``, ``start-daemon``, ``start-client`` or ``stop-daemon``
    :param subject: the tenant or the MIG UUID concerned
    :param argv: the command (empty for ``stop-client``: the process is signalled)
    :param env: the variables set on top of the base environment
    :param input_text: what is written to the command's standard input
    """

    kind: str
    subject: str
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    input_text: str | None = None

    def __str__(self) -> str:
        if self.kind == "stop-client":
            return f"stop-client   {self.subject} (SIGTERM, then SIGKILL after the grace period)"
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        piped = f"echo {shlex.quote(self.input_text.strip())} | " if self.input_text else ""
        return f"{self.kind:<13} {self.subject}: {piped}{assignments} {shlex.join(self.argv)}"


@dataclass
class MpsReport:
    """What a share change did (or would do).

    :param steps: the commands, in order
    :param restarted: tenants whose client was (re)started
    :param estimated_restart_s: the longest restart among them (clients restart in parallel), seconds
    :param dry_run: True when nothing was run
    """

    steps: list[MpsStep]
    restarted: list[str]
    estimated_restart_s: float
    dry_run: bool

    def __str__(self) -> str:
        lines = [str(step) for step in self.steps] or ["no client to restart"]
        if self.dry_run:
            lines.append("dry run: nothing was run")
        return "\n".join(lines)


class MpsError(RuntimeError):
    """An MPS control command failed."""


class MpsManager:
    """Keeps each tenant's client running on its instance with its MPS share.

    :param clients: tenant name -> how to start it
    :param runner: runs the commands (inject a recorder in tests)
    :param pipe_root: one ``CUDA_MPS_PIPE_DIRECTORY`` per MIG device is made under it
    :param log_root: one ``CUDA_MPS_LOG_DIRECTORY`` per MIG device is made under it
    :param base_env: the environment every command starts from (default: this process's)
    :param grace_s: how long a stopped client may take to exit before it is killed, seconds
    """

    def __init__(
        self,
        clients: Mapping[str, TenantClient],
        runner: Runner | None = None,
        pipe_root: Path = Path("/tmp/rlsched-mps/pipe"),
        log_root: Path = Path("/tmp/rlsched-mps/log"),
        base_env: Mapping[str, str] | None = None,
        grace_s: float = 10.0,
    ) -> None:
        self.clients = dict(clients)
        self.runner: Runner = runner or SubprocessRunner()
        self.pipe_root, self.log_root = pipe_root, log_root
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.grace_s = grace_s
        self.running: dict[str, tuple[ClientTarget, ProcessHandle | None]] = {}
        self.staging: dict[str, tuple[ClientTarget, ProcessHandle | None]] = {}  # new clients not yet switched to
        self.daemons: set[str] = set()

    def daemon_env(self, device_uuid: str) -> dict[str, str]:
        """The variables that tie a daemon and its clients to one MIG device."""
        return {
            "CUDA_VISIBLE_DEVICES": device_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_root / device_uuid),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_root / device_uuid),
        }

    def client_env(self, tenant: str, target: ClientTarget) -> dict[str, str]:
        """The variables a tenant's client starts with (on top of the base environment)."""
        env = dict(self.clients[tenant].env)
        if target.mps_pct is None:
            env["CUDA_VISIBLE_DEVICES"] = target.device_uuid
            return env
        if not 0 < target.mps_pct <= 100:
            raise ValueError(f"tenant {tenant}: mps_pct {target.mps_pct} outside (0, 100]")
        env.update(self.daemon_env(target.device_uuid))
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = f"{target.mps_pct:g}"
        return env

    def plan(self, targets: Mapping[str, ClientTarget]) -> list[MpsStep]:
        """The commands that bring every tenant of ``targets`` to its target; runs nothing.

        Tenants already running with the same device and share are left alone; tenants
        running but absent from ``targets`` are stopped; daemons no client needs are quit.
        """
        unknown = sorted(set(targets) - set(self.clients))
        if unknown:
            raise ValueError(f"no client command for tenants {', '.join(unknown)}")
        changed = [t for t, target in sorted(targets.items()) if self.running.get(t, (None, None))[0] != target]
        steps = [MpsStep("stop-client", t) for t in sorted(self.running) if t not in targets or t in changed]
        needed = {target.device_uuid for target in targets.values() if target.mps_pct is not None}
        for device_uuid in sorted(needed - self.daemons):
            steps.append(MpsStep("start-daemon", device_uuid, (MPS_CONTROL, "-d"), self.daemon_env(device_uuid)))
        for tenant in changed:
            steps.append(MpsStep("start-client", tenant, tuple(self.clients[tenant].argv), self.client_env(tenant, targets[tenant])))
        for device_uuid in sorted(self.daemons - needed):
            steps.append(MpsStep("stop-daemon", device_uuid, (MPS_CONTROL,), self.daemon_env(device_uuid), "quit\n"))
        return steps

    def apply(self, targets: Mapping[str, ClientTarget], dry_run: bool = True) -> MpsReport:
        """Plan and, unless ``dry_run``, run the commands; returns what was (or would be) done."""
        steps = self.plan(targets)
        restarted = [s.subject for s in steps if s.kind == "start-client"]
        estimate = max((self.clients[t].restart_s for t in restarted), default=0.0)
        if not dry_run:
            for step in steps:
                self._run(step, targets)
        return MpsReport(steps, restarted, estimate, dry_run)

    def stage(self, targets: Mapping[str, ClientTarget], wait: Callable[[float], None]) -> list[str]:
        """Make-before-break: start each tenant's new client next to its running one (the
        device's MPS daemon first, if needed), wait for the slowest one's ``restart_s`` (its
        model is loaded), then stop the old clients. Returns the tenants switched.

        :param wait: sleeps the given seconds (the backend's clock in tests)
        """
        started = []
        for tenant, target in sorted(targets.items()):
            if self.running.get(tenant, (None, None))[0] == target:
                continue
            if target.mps_pct is not None and target.device_uuid not in self.daemons:
                self._run(MpsStep("start-daemon", target.device_uuid, (MPS_CONTROL, "-d"), self.daemon_env(target.device_uuid)), {})
            env = {**self.base_env, **self.client_env(tenant, target)}
            self.staging[tenant] = (target, self.runner.start(tuple(self.clients[tenant].argv), env))
            started.append(tenant)
        if started:
            wait(max(self.clients[t].restart_s for t in started))
        for tenant in started:
            if tenant in self.running:
                self._run(MpsStep("stop-client", tenant), {})
            self.running[tenant] = self.staging.pop(tenant)
        return started

    def on_device(self, device_uuid: str) -> list[str]:
        """The tenants whose running client uses ``device_uuid``."""
        return sorted(t for t, (target, _) in self.running.items() if target.device_uuid == device_uuid)

    def stop_tenants(self, tenants: Sequence[str]) -> None:
        """Stop these tenants' clients now (before their instance is destroyed)."""
        for tenant in tenants:
            if tenant in self.running:
                self._run(MpsStep("stop-client", tenant), {})

    def _run(self, step: MpsStep, targets: Mapping[str, ClientTarget]) -> None:
        env = {**self.base_env, **step.env}
        if step.kind == "stop-client":
            _, handle = self.running.pop(step.subject)
            if handle is not None:
                handle.stop(self.grace_s)
        elif step.kind == "start-client":
            self.running[step.subject] = (targets[step.subject], self.runner.start(step.argv, env))
        else:
            # The pipe and log folders must exist before the daemon starts.
            if step.kind == "start-daemon":
                for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
                    Path(step.env[key]).mkdir(parents=True, exist_ok=True)
            status = self.runner.run(step.argv, env, step.input_text)
            if status != 0:
                raise MpsError(f"{shlex.join(step.argv)} for {step.subject} exited with status {status}")
            (self.daemons.add if step.kind == "start-daemon" else self.daemons.discard)(step.subject)


def client_targets(config: Configuration, device_uuids: Sequence[Mapping[GpuInstance, str] | str]) -> dict[str, ClientTarget]:
    """Each tenant's target from a configuration and the node's device UUIDs.

    :param device_uuids: per GPU, GI -> ``MIG-...`` UUID (from
        :meth:`NvmlMigBackend.mig_device_uuids`), or the ``GPU-...`` UUID of a GPU without MIG
    """
    targets = {}
    for tenant, placement in config.placements.items():
        uuids = device_uuids[placement.gpu_index]
        if isinstance(uuids, str):
            device_uuid = uuids
        else:
            device_uuid = uuids[config.layouts[placement.gpu_index].instances[placement.instance_index]]
        mode = config.modes[placement.gpu_index][placement.instance_index]
        targets[tenant] = ClientTarget(device_uuid, placement.mps_pct if mode == SharingMode.MPS else None)
    return targets
