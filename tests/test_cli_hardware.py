"""The catalog commands of the CLI, run as a user runs them (console script in a subprocess)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

RLSCHED = shutil.which("rlsched") or str(Path(sys.executable).parent / "rlsched")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RLSCHED, *args], capture_output=True, text=True, timeout=60)


def test_layouts_maximal_json_lists_19():
    out = run("layouts", "--gpu", "a100-40gb", "--maximal", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["count"] == 19 == len(doc["layouts"])
    assert "4g.20gb@0,3g.20gb@4" in doc["layouts"]
    out = run("layouts", "--gpu", "h100-80gb", "--maximal", "--json")
    assert json.loads(out.stdout)["count"] == 19
    out = run("layouts", "--gpu", "a100-40gb", "--maximal", "--json", "--driver", "470")
    assert json.loads(out.stdout)["count"] == 18
    out = run("layouts", "--gpu", "a100-40gb", "--maximal", "--json", "--with-double-memory-1g")
    assert json.loads(out.stdout)["count"] == 78


@pytest.mark.parametrize(
    "spec, words",
    [("1g@7", ["start slot", "7", "not allowed"]), ("3g@0,4g@0", ["overlap"]), ("3g@0,bogus", ["syntax", "bogus"])],
)
def test_validate_layout_rejects_with_one_line_and_exit_2(spec, words):
    out = run("validate-layout", "--gpu", "a100-40gb", spec)
    assert out.returncode == 2
    assert out.stdout == "" and len(out.stderr.strip().splitlines()) == 1
    for word in words:
        assert word in out.stderr


def test_validate_layout_accepts_a_valid_layout():
    out = run("validate-layout", "--gpu", "a100-40gb", "3g.20gb@0,2g.10gb@4,1g.5gb@6")
    assert out.returncode == 0 and "valid" in out.stdout


def test_unknown_gpu_is_named():
    out = run("layouts", "--gpu", "a200", "--maximal")
    assert out.returncode == 2 and "'a200'" in out.stderr and "a100-40gb" in out.stderr


def test_export_mig_parted_writes_a_v1_config(tmp_path):
    target = tmp_path / "cfg" / "mig.yaml"
    out = run("export-mig-parted", "--gpu", "a100-80gb", "--name", "mixed", "3g@0,2g@4,1g@6", "-o", str(target))
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(target.read_text())
    assert doc["version"] == "v1"
    (entry,) = doc["mig-configs"]["mixed"]
    assert entry["devices"] == "all"
    assert entry["device-filter"] == ["0x20B210DE"]
    assert entry["mig-enabled"] is True
    assert entry["mig-devices"] == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}
    assert not list(target.parent.glob("*.tmp"))


def test_export_mig_parted_refuses_an_invalid_layout_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "mig.yaml"
    target.write_text("old\n")
    out = run("export-mig-parted", "--gpu", "a100-40gb", "--name", "x", "4g@0,4g@0", "-o", str(target))
    assert out.returncode == 2
    assert target.read_text() == "old\n"


def test_gpus_lists_the_catalog():
    out = run("gpus", "--json")
    names = [g["name"] for g in json.loads(out.stdout)]
    assert names == ["a100-40gb", "a100-80gb", "a30-24gb", "h100-80gb", "h200-141gb", "v100-16gb"]
