"""The mig-parted backend: the config it writes, the node label command, dry runs."""

import pytest
import yaml

from rlsched.node.mig_parted_backend import MigPartedBackend
from rlsched.errors import ConfigError
from rlsched.hardware import LayoutError, parse_layout


def node_layouts():
    return [parse_layout("3g@0,2g@4,1g@6", "a100-40gb"), parse_layout("7g@0", "a100-40gb")]


def test_dry_run_prints_the_config_and_label_and_writes_nothing(tmp_path):
    ran = []
    backend = MigPartedBackend(tmp_path / "mig.yaml", "mixed", node="gpu-node-1", runner=lambda argv: ran.append(argv) or 0)
    report = backend.apply(node_layouts())
    text = str(report)
    assert "kubectl label node gpu-node-1 nvidia.com/mig.config=mixed --overwrite" in text
    assert "all tenants restart" in text and "dry run" in text
    assert not (tmp_path / "mig.yaml").exists() and ran == []


def test_apply_writes_a_v1_config_per_gpu_and_labels_the_node(tmp_path):
    ran = []
    backend = MigPartedBackend(tmp_path / "cfg" / "mig.yaml", "mixed", node="gpu-node-1", runner=lambda argv: ran.append(list(argv)) or 0)
    report = backend.apply(node_layouts(), dry_run=False)
    assert report.ok and report.wrote and report.labelled
    doc = yaml.safe_load((tmp_path / "cfg" / "mig.yaml").read_text())
    assert doc["version"] == "v1"
    gpu0, gpu1 = doc["mig-configs"]["mixed"]
    assert gpu0 == {"devices": [0], "device-filter": ["0x20B010DE"], "mig-enabled": True, "mig-devices": {"1g.5gb": 1, "2g.10gb": 1, "3g.20gb": 1}}
    assert gpu1["devices"] == [1] and gpu1["mig-devices"] == {"7g.40gb": 1}
    assert ran == [["kubectl", "label", "node", "gpu-node-1", "nvidia.com/mig.config=mixed", "--overwrite"]]


def test_the_default_name_changes_with_the_layouts(tmp_path):
    backend = MigPartedBackend(tmp_path / "mig.yaml")
    first = backend.plan(node_layouts()).config_name
    assert first.startswith("rlsched-") and first == backend.plan(node_layouts()).config_name
    assert backend.plan([parse_layout("7g@0", "a100-40gb")] * 2).config_name != first
    assert backend.plan(node_layouts()).label_argv is None  # no node: the file only


def test_failures_are_reported(tmp_path):
    with pytest.raises(ConfigError, match="label value"):
        MigPartedBackend(tmp_path / "m.yaml", "bad name!")
    backend = MigPartedBackend(tmp_path / "m.yaml", "x", node="n", runner=lambda argv: 1)
    with pytest.raises(ConfigError, match="exited with status 1"):
        backend.apply(node_layouts(), dry_run=False)
    with pytest.raises(LayoutError):
        backend.plan([parse_layout("3g@0,4g@0", "a100-40gb")])
