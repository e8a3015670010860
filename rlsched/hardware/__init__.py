"""The hardware model: the MIG catalog of each GPU type and the layout rules built on it."""

from rlsched.hardware.catalog import ComputeInstanceProfile, GiProfile, GpuSpec, gpu_names, load_gpu
from rlsched.hardware.layout import (
    ChangePlan,
    GpuInstance,
    Layout,
    LayoutError,
    StagedChangePlan,
    StagedOperation,
    change_plan,
    enumerate_layouts,
    fits_alongside,
    is_maximal,
    layout_violation,
    parse_layout,
    staged_change_plan,
    validate_layout,
)

__all__ = [
    "ChangePlan",
    "ComputeInstanceProfile",
    "GiProfile",
    "GpuInstance",
    "GpuSpec",
    "Layout",
    "LayoutError",
    "StagedChangePlan",
    "StagedOperation",
    "change_plan",
    "enumerate_layouts",
    "fits_alongside",
    "gpu_names",
    "is_maximal",
    "layout_violation",
    "load_gpu",
    "parse_layout",
    "staged_change_plan",
    "validate_layout",
]
