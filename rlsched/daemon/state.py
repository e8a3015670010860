"""The daemon's persisted state: what it last applied, so that a restart resumes from it.

Written atomically every cycle (:func:`rlsched.fileio.write_text_atomically`): after a crash,
even ``kill -9`` mid-write, the file holds the previous cycle's state or this one's, never a
mix. A restart starts the backend in :attr:`DaemonState.last_good`; the backends change only
what the minimal change plan names, so a GPU that is already right is not touched.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.errors import ConfigError
from rlsched.fileio import write_text_atomically
from rlsched.hardware import parse_layout
from rlsched.hardware.layout import LayoutError

#: Format version of the state file; a file of another version is refused, not guessed at.
STATE_VERSION = 1


def configuration_to_dict(config: Configuration) -> dict[str, Any]:
    """A configuration as plain JSON values (layout specs, mode names, placements)."""
    return {
        "gpu": config.layouts[0].gpu if config.layouts else None,
        "layouts": [layout.spec() for layout in config.layouts],
        "modes": [[mode.value for mode in modes] for modes in config.modes],
        "placements": {
            name: {"gpu": p.gpu_index, "instance": p.instance_index, "mps_pct": float(p.mps_pct), "batch_size": int(p.batch_size)}
            for name, p in config.placements.items()
        },
    }


def configuration_from_dict(data: Any, source: str | Path, field: str = "last_good") -> Configuration:
    """The inverse of :func:`configuration_to_dict`; a :class:`ConfigError` names what is wrong."""
    try:
        gpu = data["gpu"]
        layouts = tuple(parse_layout(spec, gpu) for spec in data["layouts"])
        modes = tuple(tuple(SharingMode(m) for m in gpu_modes) for gpu_modes in data["modes"])
        placements = {
            name: TenantPlacement(int(p["gpu"]), int(p["instance"]), float(p["mps_pct"]), int(p["batch_size"]))
            for name, p in data["placements"].items()
        }
    except (KeyError, TypeError, ValueError, LayoutError) as exc:
        raise ConfigError(source, field, data, f"not a configuration ({type(exc).__name__}: {exc})") from None
    config = Configuration(layouts, modes, placements)
    problems = config.problems()
    if problems:
        raise ConfigError(source, field, data, "; ".join(problems))
    return config


@dataclass
class DaemonState:
    """What survives a restart.

    :param cycle: decision cycles completed (the next cycle has this number)
    :param scenario: name of the scenario the state belongs to (a state of another node is refused)
    :param backend: the backend that applied it (``sim``, ``nvml``, ``mig-parted``)
    :param last_good: the last configuration applied successfully (None before the first)
    :param fallbacks: fallbacks to the planner so far
    :param updated_unix_s: when it was written, seconds since the epoch
    """

    cycle: int = 0
    scenario: str = ""
    backend: str = ""
    last_good: Configuration | None = None
    fallbacks: int = 0
    updated_unix_s: float = 0.0

    def to_json(self) -> str:
        """The file's text: the last good configuration's layouts and placements at top level too,
        so an operator (or ``jq .layouts``) reads them without knowing the nesting."""
        good = configuration_to_dict(self.last_good) if self.last_good is not None else None
        return json.dumps(
            {
                "version": STATE_VERSION,
                "cycle": self.cycle,
                "scenario": self.scenario,
                "backend": self.backend,
                "layouts": good["layouts"] if good else [],
                "placements": good["placements"] if good else {},
                "last_good": good,
                "fallbacks": self.fallbacks,
                "updated_unix_s": self.updated_unix_s,
            },
            indent=1,
        )

    def save(self, path: str | Path) -> None:
        """Write atomically (old or new file, never half of one)."""
        self.updated_unix_s = time.time()
        write_text_atomically(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> DaemonState | None:
        """The state in ``path``; None when there is no file yet (a first start)."""
        path = Path(path)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(path, "(file)", None, f"not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise ConfigError(path, "version", data.get("version") if isinstance(data, dict) else data, f"expected {STATE_VERSION}")
        cycle = data.get("cycle")
        if isinstance(cycle, bool) or not isinstance(cycle, int) or cycle < 0:
            raise ConfigError(path, "cycle", cycle, "expected an integer >= 0")
        good = data.get("last_good")
        return cls(
            cycle=cycle,
            scenario=str(data.get("scenario", "")),
            backend=str(data.get("backend", "")),
            last_good=None if good is None else configuration_from_dict(good, path),
            fallbacks=int(data.get("fallbacks", 0)),
            updated_unix_s=float(data.get("updated_unix_s", 0.0)),
        )
