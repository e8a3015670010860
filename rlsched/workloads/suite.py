"""Scenario suites: named lists of scenarios that ``rlsched eval --suite NAME`` scores together.

A suite file (``configs/suites/<name>.yaml``)::

    name: heldout
    description: what the suite is for
    scenarios:
      - ../scenarios/suite/heldout-bursty-hi.yaml   # a path, relative to the suite file
      - default                                     # or a bundled scenario's name

Every scenario is loaded (and so checked) when the suite is: a bad entry fails before any
episode runs, with the suite file, the field and the value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlsched.errors import ConfigError
from rlsched.workloads.scenario import Scenario, _Reader, load_scenario, scenario_path, scenarios_dir


def suites_dir() -> Path:
    """The folder of the bundled suites (``configs/suites``)."""
    return scenarios_dir().parent / "suites"


@dataclass
class Suite:
    """A named list of scenarios.

    :param name: suite name
    :param description: what it is for
    :param scenarios: the scenarios, loaded and checked, in file order
    :param source: the file it was read from
    """

    name: str
    description: str
    scenarios: list[Scenario]
    source: str


def suite_path(name_or_path: str | Path) -> Path:
    """A suite file: a path, or the name of a bundled suite (``heldout``)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    return suites_dir() / f"{name_or_path}.yaml"


def load_suite(name_or_path: str | Path) -> Suite:
    """Read a suite and every scenario it lists."""
    path = suite_path(name_or_path)
    if not path.is_file():
        bundled = ", ".join(sorted(p.stem for p in suites_dir().glob("*.yaml")))
        raise ConfigError(path, "file", str(name_or_path), f"no such suite (bundled: {bundled})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(path, "file", str(path), f"not valid YAML: {exc}") from None
    r = _Reader(str(path), raw, "")
    r.unknown(["name", "description", "scenarios"])
    entries = r.get("scenarios", list)
    if not entries:
        raise ConfigError(path, "scenarios", entries, "a suite needs at least one scenario")
    scenarios: list[Scenario] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, str) or not entry:
            raise ConfigError(path, f"scenarios[{i}]", entry, "expected a scenario file path or a bundled scenario name")
        relative = Path(os.path.normpath(path.parent / entry))
        file = relative if relative.suffix in (".yaml", ".yml") else scenario_path(entry)
        if not file.is_file():
            raise ConfigError(path, f"scenarios[{i}]", entry, f"no such scenario file or bundled scenario ({file})")
        scenario = load_scenario(file)
        if any(s.name == scenario.name for s in scenarios):
            raise ConfigError(path, f"scenarios[{i}]", entry, f"a second scenario named {scenario.name!r} (names key the results)")
        scenarios.append(scenario)
    return Suite(r.get("name", str, path.stem), r.get("description", str, ""), scenarios, str(path))
