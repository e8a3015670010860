"""MIG through NVIDIA mig-parted and the Kubernetes GPU operator, declaratively.

The backend writes a mig-parted v1 config (:func:`rlsched.hardware.mig_parted.mig_parted_config`)
atomically and sets the node label ``nvidia.com/mig.config=<name>`` that the GPU operator's
MIG manager watches (``../shared/docs/gpu-facts.md`` section 5). The label is printed, or run
with ``kubectl`` when applying. mig-parted takes GI counts, not placements, and rebuilds
every GPU: all tenants restart. Prefer the NVML backend where rlsched runs on the node.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlsched.errors import ConfigError
from rlsched.fileio import write_text_atomically
from rlsched.hardware.layout import Layout, validate_layout
from rlsched.hardware.mig_parted import mig_parted_config

#: The node label the GPU operator's MIG manager watches.
MIG_CONFIG_LABEL = "nvidia.com/mig.config"

# Kubernetes label values: at most 63 characters, alphanumeric at both ends, - _ . inside.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


def _run_argv(argv: Sequence[str]) -> int:
    return subprocess.run(list(argv), check=False).returncode


@dataclass(frozen=True)
class MigPartedPlan:
    """What applying would write and run.

    :param config_name: the mig-config entry and label value
    :param config_text: the mig-parted YAML
    :param config_path: where it is written
    :param label_argv: the ``kubectl label`` command, or None without a node
    """

    config_name: str
    config_text: str
    config_path: Path
    label_argv: tuple[str, ...] | None

    def __str__(self) -> str:
        lines = [f"write {self.config_path} (mig-config '{self.config_name}'):", self.config_text.rstrip()]
        if self.label_argv:
            lines.append(f"run   {shlex.join(self.label_argv)}")
        lines.append("note: mig-parted rebuilds every GPU without placements: all tenants restart")
        return "\n".join(lines)


@dataclass(frozen=True)
class MigPartedReport:
    """The result of :meth:`MigPartedBackend.apply`.

    :param plan: what was (or would be) done
    :param dry_run: True when nothing was written or run
    :param wrote: whether the config file was written
    :param labelled: whether the node label was set
    """

    plan: MigPartedPlan
    dry_run: bool
    wrote: bool
    labelled: bool

    @property
    def ok(self) -> bool:
        """True when it was a dry run or everything planned was done."""
        return self.dry_run or (self.wrote and (self.labelled or self.plan.label_argv is None))

    def __str__(self) -> str:
        return str(self.plan) + ("\ndry run: nothing written or run" if self.dry_run else "")


class MigPartedBackend:
    """Writes the node's layouts as a mig-parted config and labels the node to apply it.

    :param config_path: the YAML file to write (put it in the MIG manager's ConfigMap)
    :param config_name: the mig-config name; None derives ``rlsched-<hash of the layouts>``,
        so that the label value changes whenever the layouts do (the MIG manager acts on
        label changes, not on file contents)
    :param node: Kubernetes node name to label; None writes the file only
    :param runner: runs an argument list, returns its exit status (inject in tests)
    :param kubectl: the kubectl program
    """

    def __init__(
        self,
        config_path: str | Path,
        config_name: str | None = None,
        node: str | None = None,
        runner: Callable[[Sequence[str]], int] = _run_argv,
        kubectl: str = "kubectl",
    ) -> None:
        if config_name is not None and not _LABEL_VALUE.match(config_name):
            raise ConfigError("--name", "config_name", config_name, "must be a Kubernetes label value: 1-63 characters, A-Z a-z 0-9 - _ . and alphanumeric at both ends")
        self.config_path, self.config_name, self.node = Path(config_path), config_name, node
        self.runner, self.kubectl = runner, kubectl

    def plan(self, targets: Sequence[Layout]) -> MigPartedPlan:
        """The config and label command for ``targets`` (one layout per GPU, index 0..G-1)."""
        if not targets:
            raise ConfigError("targets", "layouts", [], "at least one GPU layout is needed")
        for layout in targets:
            validate_layout(layout)
        name = self.config_name or "rlsched-" + hashlib.sha256("|".join(f"{t.gpu}:{t.spec()}" for t in targets).encode()).hexdigest()[:12]
        text = mig_parted_config(name, list(targets), devices=[0])
        label = None
        if self.node is not None:
            label = (self.kubectl, "label", "node", self.node, f"{MIG_CONFIG_LABEL}={name}", "--overwrite")
        return MigPartedPlan(name, text, self.config_path, label)

    def apply(self, targets: Sequence[Layout], dry_run: bool = True) -> MigPartedReport:
        """Write the config atomically and set the node label, unless ``dry_run``.

        Raises :class:`ConfigError` when kubectl fails (the file is written by then).
        """
        plan = self.plan(targets)
        if dry_run:
            return MigPartedReport(plan, True, False, False)
        write_text_atomically(plan.config_path, plan.config_text)
        if plan.label_argv is None:
            return MigPartedReport(plan, False, True, False)
        status = self.runner(plan.label_argv)
        if status != 0:
            raise ConfigError("kubectl", "node label", f"{MIG_CONFIG_LABEL}={plan.config_name}", f"`{shlex.join(plan.label_argv)}` exited with status {status}")
        return MigPartedReport(plan, False, True, True)
