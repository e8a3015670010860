"""The package's imports point down its layers, never up (issue: a decision path a newcomer
can read): a module may import its own layer or a lower one, at module level or inside a
function alike, so no layer needs to know who builds on it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Source folders of the installed packages (pyproject.toml's package-dir).
ROOTS = {"rlsched": REPO / "rlsched", "rlsched.envs": REPO / "envs", "rlsched.agents": REPO / "agents"}
#: Bottom to top. Each entry is a layer: packages (or top-level modules) of equal rank.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("rlsched.errors", "rlsched.fileio", "rlsched.configs"),
    ("rlsched.hardware",),
    ("rlsched.decision", "rlsched.goodput", "rlsched.metrics"),
    ("rlsched.perfmodel",),
    ("rlsched.workloads",),
    ("rlsched.simulator",),
    ("rlsched.solver", "rlsched.node"),
    ("rlsched.envs",),
    ("rlsched.agents",),
    ("rlsched.daemon", "rlsched.cli"),
)
RANK = {unit: rank for rank, layer in enumerate(LAYERS) for unit in layer}


def unit_of(module: str) -> str:
    """The layer unit a dotted module name belongs to (``rlsched.solver.planner`` -> ``rlsched.solver``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def modules() -> list[tuple[str, Path]]:
    """Every module of the package, by dotted name."""
    found = []
    for prefix, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root).with_suffix("")
            if prefix == "rlsched" and relative.parts[0] in ("envs", "agents"):
                continue
            found.append((".".join((prefix, *relative.parts)).removesuffix(".__init__"), path))
    return found


def upward_imports(module: str, path: Path) -> list[str]:
    """``file:line imports TARGET (layer k above layer j)`` for every import of a higher layer."""
    own = RANK.get(unit_of(module), len(LAYERS))  # the package's own __init__: above every layer
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = [node.module] if isinstance(node, ast.ImportFrom) and node.module else [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for target in targets:
            if not target.startswith("rlsched."):
                continue
            rank = RANK.get(unit_of(target))
            assert rank is not None, f"{path}:{node.lineno}: {target} is in no layer: add its package to LAYERS"
            if rank > own:
                found.append(f"{where}:{node.lineno} imports {target} (layer {rank} above {own})")
    return found


def test_every_package_has_a_layer():
    units = {unit_of(name) for name, _ in modules() if name != "rlsched"}
    assert units <= set(RANK), f"packages without a layer: {sorted(units - set(RANK))}"


@pytest.mark.parametrize(("module", "path"), modules(), ids=lambda x: x if isinstance(x, str) else "")
def test_imports_only_point_down(module, path):
    assert upward_imports(module, path) == []


def test_the_check_finds_an_upward_import_inside_a_function(tmp_path):
    # The solver reaching up into the environment, as planner.py once did for the action levels.
    source = tmp_path / "planner.py"
    source.write_text("def levels():\n    from rlsched.envs.actions import BATCH_LEVELS\n    return BATCH_LEVELS\n")
    assert upward_imports("rlsched.solver.planner", source) == [f"{source}:2 imports rlsched.envs.actions (layer 7 above 6)"]
    assert upward_imports("rlsched.agents.planner", source) == []
