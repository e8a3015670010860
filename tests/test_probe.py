"""`rlsched probe`: the read-only NVML report, against the fake and on this machine."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from rlsched.node.fake_nvml import FakeNvml
from rlsched.node.probe import NoDriverError, probe_node

RLSCHED = shutil.which("rlsched") or str(Path(sys.executable).parent / "rlsched")


def driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_probe_without_a_driver_exits_2_with_one_line():
    out = subprocess.run([RLSCHED, "probe"], capture_output=True, text=True, timeout=60, check=False)
    if driver_present():  # a GPU machine: the report itself
        assert out.returncode == 0 and "NVIDIA driver" in out.stdout
        return
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1
    assert "no NVIDIA driver found" in out.stderr and "NVMLError_LibraryNotFound" in out.stderr


def test_probe_node_raises_no_driver_error_when_nvml_cannot_start():
    fake = FakeNvml(["a100-40gb"])
    fake.inject_fault(0, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(NoDriverError, match="DriverNotLoaded"):
        probe_node(fake)


def test_probe_reports_gpus_modes_instances_and_placements():
    fake = FakeNvml(["a100-40gb", "h100-80gb", "v100-16gb"], layouts=["3g@0,2g@4,1g@6"], profile_id_overrides={"1g.5gb": 23})
    fake.gpus[1].mig_current, fake.gpus[1].mig_pending = 0, 1  # enabled, waiting for a reset
    report = probe_node(fake).to_json()
    assert report["driver_version"] == "550.90.07" and fake.initialized == 0  # shut down again
    a100, h100, v100 = report["gpus"]
    assert (a100["catalog"], a100["pci_device_id"], a100["mig_current"]) == ("a100-40gb", "0x20B010DE", "enabled")
    assert [(gi["profile"], gi["start"], gi["size"]) for gi in a100["instances"]] == [("3g.20gb", 0, 4), ("2g.10gb", 4, 2), ("1g.5gb", 6, 1)]
    assert all(len(gi["compute_instances"]) == 1 and gi["mig_uuid"].startswith("MIG-") for gi in a100["instances"])
    two_g = next(p for p in a100["profiles"] if p["name"] == "2g.10gb")
    assert (two_g["profile_id"], two_g["start_slots"], two_g["memory_slices"]) == (14, [0, 2, 4], 2)
    assert a100["mismatches"] == ["a100-40gb 1g.5gb (profile index 0): catalog profile id 19, NVML 23"]
    assert (h100["mig_current"], h100["mig_pending"], h100["instances"]) == ("disabled", "enabled", [])
    # With MIG off the profiles are still read and checked (a real H100 answers so): the catalog
    # can be checked before MIG is enabled.
    assert [p["name"] for p in h100["profiles"]] == ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me", "1g.20gb"]
    assert h100["mismatches"] == [] and v100["profiles"] == []
    assert (v100["catalog"], v100["mig_current"]) == ("v100-16gb", "unsupported")
    assert not {"nvmlGpuInstanceDestroy", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlDeviceSetMigMode"} & set(fake.calls)


def test_probe_cli_on_the_fake_prints_json_and_text():
    out = subprocess.run([RLSCHED, "probe", "--json", "--fake", "h100-80gb:4g@0,3g@4"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    gpu = json.loads(out.stdout)["gpus"][0]
    assert [f"{gi['profile']}@{gi['start']}" for gi in gpu["instances"]] == ["4g.40gb@0", "3g.40gb@4"]
    text = subprocess.run([RLSCHED, "probe", "--fake", "a100-40gb"], capture_output=True, text=True, timeout=60, check=False).stdout
    assert "catalog a100-40gb MIG enabled" in text and "no GPU instances" in text


def test_an_nvml_failure_while_probing_is_one_clear_error():
    from rlsched.node.nvml_backend import BackendError

    fake = FakeNvml(["a100-40gb"])
    fake.inject_fault(3, pynvml.NVML_ERROR_GPU_IS_LOST, persistent=True)
    with pytest.raises(BackendError, match="NVML failed while probing: nvml[A-Za-z]+: NVMLError_GpuIsLost"):
        probe_node(fake)
