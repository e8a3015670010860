"""The ILPs (HiGHS): repair of requested configurations, the Goodput planner, capacity planning."""

from rlsched.solver.instances import NON_MIG_COMPUTE_SLICES, GpuTable, gpu_table
from rlsched.solver.milp import Milp, MilpSolution, SolverError
from rlsched.solver.repair import (
    InfeasibleRequest,
    RepairProblem,
    RepairResult,
    RepairTerms,
    RepairWeights,
    TenantRequest,
    feasibility_problems,
    repair,
    repair_configuration,
    repair_terms,
    requests_from_configuration,
)

__all__ = [
    "NON_MIG_COMPUTE_SLICES",
    "GpuTable",
    "InfeasibleRequest",
    "Milp",
    "MilpSolution",
    "RepairProblem",
    "RepairResult",
    "RepairTerms",
    "RepairWeights",
    "SolverError",
    "TenantRequest",
    "feasibility_problems",
    "gpu_table",
    "repair",
    "repair_configuration",
    "repair_terms",
    "requests_from_configuration",
]
