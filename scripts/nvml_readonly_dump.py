"""Dump what NVML answers about GPU 0, read-only, as JSON: every call's value or error code.

For checking the MIG catalog (``configs/hardware``) and the fake NVML against a real GPU before
anything is changed on it. Only NVML get-calls are made: MIG mode, instances and MPS are left
as they are. ``rlsched probe --json`` gives the project's own view of the same answers; this
script also keeps the calls that fail, with their NVML error codes, and asks for the
placements of every profile id up to 39, so that an answer the catalog does not expect shows.

    python scripts/nvml_readonly_dump.py > nvml.json

The dump of a real H100 is in ``docs/hardware-probes/``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import pynvml as nvml

from rlsched.node.nvml_backend import possible_placements

#: Profile ids whose possible placements are asked for (NVML's ids are below 40 today).
PROFILE_IDS = range(40)


def answer(call: Callable[[], Any]) -> Any:
    """The call's value, or ``{"error": NVML error code, "text": ...}`` if NVML refused it."""
    try:
        return call()
    except nvml.NVMLError as exc:
        return {"error": int(exc.value), "text": str(exc)}


def profile_info(handle: Any, index: int) -> dict[str, Any]:
    """``nvmlDeviceGetGpuInstanceProfileInfo`` for one profile index, as a dict."""
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
    name = info.name.decode() if isinstance(info.name, bytes) else str(info.name)
    return {"id": info.id, "name": name, "sliceCount": info.sliceCount, "instanceCount": info.instanceCount,
            "multiprocessorCount": info.multiprocessorCount, "memorySizeMB": int(info.memorySizeMB),
            "copyEngineCount": info.copyEngineCount, "decoderCount": info.decoderCount}


def placements(handle: Any, profile_id: int) -> list[dict[str, int]]:
    """``nvmlDeviceGetGpuInstancePossiblePlacements`` for one profile id (answers with MIG off)."""
    return [{"start": start, "size": size} for start, size in possible_placements(nvml, handle, profile_id)]


def dump() -> dict[str, Any]:
    """Everything this script asks NVML about GPU 0."""
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            "driver": answer(nvml.nvmlSystemGetDriverVersion),
            "nvml_version": answer(nvml.nvmlSystemGetNVMLVersion),
            "name": answer(lambda: nvml.nvmlDeviceGetName(handle)),
            "pci_device_id": f"0x{nvml.nvmlDeviceGetPciInfo(handle).pciDeviceId:08X}",
            "mig_mode": answer(lambda: list(nvml.nvmlDeviceGetMigMode(handle))),
            "max_mig_devices": answer(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle)),
            "memory": {"total": memory.total, "used": memory.used},
            "gpm_supported": answer(lambda: int(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)),
            "cuda_compute_capability": answer(lambda: list(nvml.nvmlDeviceGetCudaComputeCapability(handle))),
            "profile_info_by_index": {str(i): answer(lambda i=i: profile_info(handle, i))
                                      for i in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)},
            "possible_placements_by_profile_id": {str(i): answer(lambda i=i: placements(handle, i)) for i in PROFILE_IDS},
        }
    finally:
        nvml.nvmlShutdown()


if __name__ == "__main__":
    json.dump(dump(), sys.stdout, indent=1)
    print()
