"""Packaging: envs/ and agents/ install under rlsched, and no package folder is left out."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapping = config["package-dir"]
    found = set()
    for package, folder in mapping.items():
        base = ROOT / folder
        for sub in [base, *(p for p in base.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
            if (sub / "__init__.py").exists() or package == "rlsched.configs":
                found.add(".".join([package, *sub.relative_to(base).parts]))
    assert found <= listed, f"add to pyproject.toml packages: {sorted(found - listed)}"


def test_envs_and_agents_import_under_the_rlsched_namespace():
    import rlsched.agents
    import rlsched.envs

    assert Path(rlsched.envs.__file__).parent.name == "envs"
    assert Path(rlsched.agents.__file__).parent.name == "agents"
