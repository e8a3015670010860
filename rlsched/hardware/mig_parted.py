"""Export layouts as NVIDIA mig-parted v1 configs (the file the GPU operator's MIG manager reads).

mig-parted takes GI counts, not placements: it wipes the GPU and lets the driver place the
GIs. The header comment of every exported file records the placements rlsched planned, so an
operator can check them with ``nvidia-smi mig -lgi`` after applying.
"""

from __future__ import annotations

from collections.abc import Sequence

import yaml

from rlsched.hardware.catalog import load_gpu
from rlsched.hardware.layout import Layout



def mig_parted_config(name: str, layouts: Sequence[Layout], devices: str | Sequence[int] = "all") -> str:
    """A mig-parted v1 YAML document with one mig-config called ``name``.

    :param layouts: one layout (applied to ``devices``) or one per GPU index 0..G-1
    :param devices: ``"all"``, a comma-separated string of indices, or a list of indices;
        used only when a single layout is given
    """
    if not layouts:
        raise ValueError("at least one layout is needed")
    if len(layouts) == 1:
        targets: list[str | list[int]] = [_parse_devices(devices)]
    else:
        targets = [[index] for index in range(len(layouts))]
    entries = []
    for layout, target in zip(layouts, targets):
        gpu = load_gpu(layout.gpu)
        entry: dict = {"devices": target, "device-filter": [gpu.pci_device_id]}
        entry["mig-enabled"] = bool(layout.instances)
        if layout.instances:
            entry["mig-devices"] = {profile: count for profile, count in sorted(layout.profile_counts().items())}
        entries.append(entry)
    header = "".join(
        f"# device {target}: {layout.gpu} placements planned by rlsched: {layout.spec() or '(none)'}\n" for layout, target in zip(layouts, targets)
    )
    body = yaml.safe_dump({"version": "v1", "mig-configs": {name: entries}}, sort_keys=False, default_flow_style=False)
    return header + body


def _parse_devices(devices: str | Sequence[int]) -> str | list[int]:
    if isinstance(devices, str):
        if devices == "all":
            return "all"
        try:
            return [int(d) for d in devices.split(",")]
        except ValueError:
            raise ValueError(f"devices must be 'all' or comma-separated GPU indices, got {devices!r}") from None
    return list(devices)
