"""The MIG catalog: every packaged GPU loads, its numbers match gpu-facts.md, bad files are named."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import yaml

from rlsched.errors import ConfigError
from rlsched.hardware import gpu_names, load_gpu
from rlsched.hardware.catalog import _parse_gpu

REPO = Path(__file__).resolve().parents[1]
CATALOG = ["a100-40gb", "a100-80gb", "a30-24gb", "h100-80gb", "h200-141gb", "v100-16gb"]


def test_catalog_lists_every_gpu_type_of_the_issue():
    assert gpu_names() == sorted(CATALOG)


@pytest.mark.parametrize("name", CATALOG)
def test_every_profile_fits_its_gpu(name):
    gpu = load_gpu(name)
    for profile in gpu.profiles.values():
        assert max(profile.start_slots) + profile.memory_slices <= gpu.memory_slices
        assert profile.compute_slices <= gpu.compute_slices
        assert profile.sm_count <= gpu.sm_count
        assert profile.memory_gib <= gpu.memory_gib
        assert profile.compute_slices in gpu.compute_instance_profiles


@pytest.mark.parametrize("name", ["a100-40gb", "a100-80gb", "h100-80gb"])
def test_placements_and_ids_follow_gpu_facts(name):
    gpu = load_gpu(name)
    by_id = {p.nvml_profile_id: p for p in gpu.profiles.values()}
    expected = {  # id: (start slots, memory slices, max count), gpu-facts.md section 1
        19: ((0, 1, 2, 3, 4, 5, 6), 1, 7),
        20: ((0, 1, 2, 3, 4, 5, 6), 1, 1),
        15: ((0, 2, 4, 6), 2, 4),
        14: ((0, 2, 4), 2, 3),
        9: ((0, 4), 4, 2),
        5: ((0,), 4, 1),
        0: ((0,), 8, 1),
    }
    for profile_id, (starts, memory_slices, max_count) in expected.items():
        p = by_id[profile_id]
        assert (p.start_slots, p.memory_slices, p.max_count) == (starts, memory_slices, max_count)
    assert by_id[9].compute_slices == 3  # a 3g takes 4 memory slices but 3 SM slices


def test_sm_counts_and_unconfirmed_flags():
    a100, h100, h200 = load_gpu("a100-40gb"), load_gpu("h100-80gb"), load_gpu("h200-141gb")
    assert [a100.profile(s).sm_count for s in ("1g", "2g", "3g", "4g", "7g")] == [14, 28, 42, 56, 98]
    assert [h100.profile(s).sm_count for s in ("1g", "2g", "3g", "4g", "7g")] == [16, 32, 60, 64, 132]
    assert h100.profiles["1g.20gb"].sm_count == 26
    # UNCONFIRMED in gpu-facts.md (a mock says 16); a real H100 reports 26 (docs/hardware-probes/).
    assert "sm_count" not in h100.profiles["1g.20gb"].unconfirmed
    assert "start_slots" in h100.profiles["1g.20gb"].unconfirmed  # mixed layouts are not confirmed
    # A real H200 reports the H100's ids, placements and SMs (docs/hardware-probes/): no longer flagged.
    assert [h200.profile(s).sm_count for s in ("1g", "2g", "3g", "4g", "7g")] == [16, 32, 60, 64, 132]
    assert not any({"nvml_profile_id", "start_slots", "sm_count"} & set(p.unconfirmed) for n, p in h200.profiles.items() if n != "1g.35gb")
    # Usable memory was measured on the H100 and H200 only: the A100's is the profile name's.
    assert set(a100.profiles["3g.20gb"].unconfirmed) == {"memory_gib"}
    assert not any("memory_gib" in p.unconfirmed for p in (*h100.profiles.values(), *h200.profiles.values()))


def test_pci_ids_and_no_mig_v100():
    assert load_gpu("a100-80gb").pci_device_id == "0x20B210DE"
    assert load_gpu("h200-141gb").pci_device_id == "0x233510DE"
    v100 = load_gpu("v100-16gb")
    assert not v100.mig_supported and not v100.profiles


def test_short_profile_names_pick_the_standard_variant():
    gpu = load_gpu("a100-40gb")
    assert gpu.profile("1g").name == "1g.5gb"
    assert gpu.profile("1g.10gb").variant == "double-memory"
    with pytest.raises(KeyError, match="5g"):
        gpu.profile("5g")


def _raw(name="a100-40gb"):
    return yaml.safe_load(Path(load_gpu(name).source_file).read_text())


@pytest.mark.parametrize(
    "mutate, field, value",
    [
        (lambda d: d["gi_profiles"][0].__setitem__("start_slots", [0, 8]), "gi_profiles[0].start_slots", "[0, 8]"),
        (lambda d: d["gi_profiles"][3].__setitem__("sm_count", "many"), "gi_profiles[3].sm_count", "'many'"),
        (lambda d: d["gi_profiles"][2].pop("max_count"), "gi_profiles[2].max_count", "None"),
        (lambda d: d["gi_profiles"][1].__setitem__("variant", "huge"), "gi_profiles[1].variant", "'huge'"),
        (lambda d: d.__setitem__("mig_supported", "yes"), "mig_supported", "'yes'"),
        (lambda d: d["unconfirmed"].__setitem__("9g.99gb.sm_count", "x"), "unconfirmed.9g.99gb.sm_count", "'9g.99gb.sm_count'"),
        (lambda d: d["forbidden_combinations"][0].__setitem__("profiles", ["4g.20gb", "8g"]), "forbidden_combinations[0].profiles", "'8g'"),
    ],
)
def test_malformed_catalog_names_file_field_and_value(tmp_path, mutate, field, value):
    raw = _raw()
    mutate(raw)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as info:
        load_gpu(path)
    message = str(info.value)
    assert str(path) in message and f"'{field}'" in message and value in message


def test_unreadable_yaml_is_a_config_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_gpu(path)


def test_root_must_be_a_mapping():
    with pytest.raises(ConfigError, match="expected a mapping"):
        _parse_gpu([1, 2], Path("x.yaml"))


def recorded_nvml_profiles(dump: dict) -> dict:
    """The GI profiles of a recorded read-only NVML dump (``scripts/nvml_readonly_dump.py``), by index."""
    from rlsched.node.nvml_backend import NvmlGiProfile

    seen = {}
    for index, info in dump["profile_info_by_index"].items():
        if "error" in info:
            continue
        placements = dump["possible_placements_by_profile_id"][str(info["id"])]
        seen[int(index)] = NvmlGiProfile(int(index), info["id"], info["name"].removeprefix("MIG "), info["sliceCount"],
                                         info["instanceCount"], info["multiprocessorCount"], info["memorySizeMB"],
                                         tuple(p["start"] for p in placements), placements[0]["size"])
    return seen


@pytest.mark.parametrize("gpu, dump_file", [("h100-80gb", "h100-80gb-2026-11-26-nvml.json"),
                                             ("h200-141gb", "h200-141gb-2026-11-27-nvml.json")])
def test_catalog_equals_what_a_real_gpu_reports(gpu, dump_file):
    """Read-only NVML answers of a real H100 80GB HBM3 and a real H200 (driver 580.159.04, MIG
    off), recorded in docs/hardware-probes/: every catalog profile is offered with the catalog's
    id, name, slices, SMs, count, possible placements and memory, and the device offers no
    other profile."""
    from rlsched.node.nvml_backend import match_catalog

    recorded = json.loads((REPO / "docs/hardware-probes" / dump_file).read_text())
    spec = load_gpu(gpu)
    assert recorded["pci_device_id"] == spec.pci_device_id
    seen = recorded_nvml_profiles(recorded)
    assert sorted(seen) == sorted(p.nvml_profile_index for p in spec.profiles.values())
    assert match_catalog(spec, seen).mismatches == ()
    # memory_gib is what NVML reports, exactly: the capacity every fit check uses
    assert {n.name: n.memory_mib for n in seen.values()} == {p.name: p.memory_gib * 1024 for p in spec.profiles.values()}
    assert spec.memory_gib <= recorded["memory"]["total"] / 2**30 < spec.memory_gib + 0.01
    assert {p.sm_count for p in seen.values()} >= {spec.sm_count}  # the 7g profile holds all 132 SMs


def test_a_catalog_that_claims_more_memory_than_the_device_has_is_reported():
    """A100 and A30 catalogs carry the profile names' nominal memory: on a device that reports
    less, the operator is told which value to set, and the profile stays usable."""
    from rlsched.node.nvml_backend import match_catalog

    spec = load_gpu("h100-80gb")
    seen = recorded_nvml_profiles(json.loads((REPO / "docs/hardware-probes/h100-80gb-2026-11-26-nvml.json").read_text()))
    nominal = dataclasses.replace(spec, profiles={n: dataclasses.replace(p, memory_gib=float(math.ceil(p.memory_gib)))
                                                  for n, p in spec.profiles.items()})
    match = match_catalog(nominal, seen)
    assert len(match.mismatches) == len(spec.profiles)
    assert any("1g.10gb (profile index 0): catalog memory 10240 MiB, NVML 9984 MiB" in m and "memory_gib to 9.75" in m
               for m in match.mismatches)
    assert match.unusable == frozenset()
