"""A small mixed-integer program built from arrays and solved with HiGHS (highspy).

Every rlsched ILP goes through :class:`Milp`: columns and rows are appended as plain
numbers, the model is handed to HiGHS in one ``passModel`` call (row-wise CSR), and the
status of every solve is checked. Options are fixed (one thread, fixed seed, no output) so
that the same model always gives the same solution.
"""

from __future__ import annotations

import os
import sys

from collections.abc import Sequence
from dataclasses import dataclass, field

import highspy
import numpy as np

from rlsched.errors import RlschedError

INF = highspy.kHighsInf

#: Fixed HiGHS options: deterministic (one thread, fixed seed) and quiet. The gap is tight
#: so that "nearest" means nearest; the time limit only guards against a runaway solve.
SOLVER_OPTIONS: dict[str, object] = {
    "output_flag": False,
    "threads": 1,
    "random_seed": 0,
    "mip_rel_gap": 1e-6,
    "mip_abs_gap": 1e-7,
    "time_limit": 10.0,
    "presolve": "off",
}


class SolverError(RlschedError):
    """HiGHS did not return a usable solution (error status, or time limit without one)."""


@dataclass(frozen=True)
class MilpSolution:
    """The outcome of one solve.

    :param status: HiGHS model status name, e.g. ``"kOptimal"``
    :param values: column values (empty when infeasible)
    :param objective: objective value including the constant offset (nan when infeasible)
    :param optimal: True when HiGHS proved optimality (within the fixed gaps)
    :param row_duals: dual values of the rows of an LP (no integer column) solved to
        optimality, HiGHS's sign convention (reduced cost = cost - A^T duals); empty otherwise
    """

    status: str
    values: np.ndarray
    objective: float
    optimal: bool
    row_duals: np.ndarray = field(default_factory=lambda: np.empty(0))

    @property
    def feasible(self) -> bool:
        """True when ``values`` hold a feasible solution."""
        return self.values.size > 0


class Milp:
    """A minimisation MILP assembled column by column and row by row."""

    def __init__(self) -> None:
        self._cost: list[float] = []
        self._lower: list[float] = []
        self._upper: list[float] = []
        self._integer: list[bool] = []
        self._row_start: list[int] = [0]
        self._row_index: list[int] = []
        self._row_value: list[float] = []
        self._row_lower: list[float] = []
        self._row_upper: list[float] = []
        self.offset = 0.0

    @property
    def num_columns(self) -> int:
        """Columns added so far."""
        return len(self._cost)

    @property
    def num_rows(self) -> int:
        """Rows added so far."""
        return len(self._row_lower)

    def add_column(self, cost: float, lower: float = 0.0, upper: float = 1.0, integer: bool = False) -> int:
        """Append one column; returns its index."""
        self._cost.append(cost)
        self._lower.append(lower)
        self._upper.append(upper)
        self._integer.append(integer)
        return len(self._cost) - 1

    def add_binary(self, cost: float) -> int:
        """Append one 0/1 column; returns its index."""
        return self.add_column(cost, 0.0, 1.0, True)

    def add_row(self, indices: Sequence[int], values: Sequence[float], lower: float = -INF, upper: float = INF) -> int:
        """Append the row ``lower <= sum(values[i] * x[indices[i]]) <= upper``; returns its index."""
        self._row_index.extend(indices)
        self._row_value.extend(values)
        self._row_start.append(len(self._row_index))
        self._row_lower.append(lower)
        self._row_upper.append(upper)
        return len(self._row_lower) - 1

    def solve(self, options: dict[str, object] | None = None) -> MilpSolution:
        """Solve with :data:`SOLVER_OPTIONS` (``options`` override some of them; threads
        and seed stay fixed).

        Infeasibility is an answer (``feasible`` False), not an error. Raises
        :class:`SolverError` on any status that is neither optimal, infeasible, nor a time
        limit reached with a feasible solution in hand.
        """
        lp = highspy.HighsLp()
        lp.num_col_ = self.num_columns
        lp.num_row_ = self.num_rows
        lp.col_cost_ = np.asarray(self._cost, dtype=np.float64)
        lp.col_lower_ = np.asarray(self._lower, dtype=np.float64)
        lp.col_upper_ = np.asarray(self._upper, dtype=np.float64)
        lp.row_lower_ = np.asarray(self._row_lower, dtype=np.float64)
        lp.row_upper_ = np.asarray(self._row_upper, dtype=np.float64)
        lp.offset_ = self.offset
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_ = self.num_columns
        lp.a_matrix_.num_row_ = self.num_rows
        lp.a_matrix_.start_ = np.asarray(self._row_start, dtype=np.int32)
        lp.a_matrix_.index_ = np.asarray(self._row_index, dtype=np.int32)
        lp.a_matrix_.value_ = np.asarray(self._row_value, dtype=np.float64)
        if any(self._integer):
            kinds = (highspy.HighsVarType.kInteger, highspy.HighsVarType.kContinuous)
            lp.integrality_ = [kinds[0] if flag else kinds[1] for flag in self._integer]

        highs = _new_highs()
        for name, value in {**SOLVER_OPTIONS, **(options or {})}.items():
            highs.setOptionValue(name, value)
        highs.passModel(lp)
        run_status = highs.run()
        model_status = highs.getModelStatus()
        name = model_status.name
        if model_status == highspy.HighsModelStatus.kInfeasible:
            return MilpSolution(name, np.empty(0), float("nan"), True)
        has_solution = highs.getInfo().primal_solution_status == 2  # kSolutionStatusFeasible
        if model_status == highspy.HighsModelStatus.kOptimal or (
            model_status == highspy.HighsModelStatus.kTimeLimit and has_solution
        ):
            solution = highs.getSolution()
            values = np.asarray(solution.col_value, dtype=np.float64)
            optimal = model_status == highspy.HighsModelStatus.kOptimal
            duals = np.asarray(solution.row_dual, dtype=np.float64) if optimal and not any(self._integer) and solution.dual_valid else np.empty(0)
            return MilpSolution(name, values, float(highs.getInfo().objective_function_value), optimal, duals)
        raise SolverError(
            f"HiGHS returned model status {name} (run status {run_status.name}) for a model of "
            f"{self.num_columns} columns and {self.num_rows} rows"
        )


_banner_shown = False


def _new_highs() -> highspy.Highs:
    """A HiGHS instance. HiGHS prints a banner on standard output when a process creates its
    first one (before any option can switch it off); that first creation writes to /dev/null,
    so commands whose standard output is JSON or a table stay clean."""
    global _banner_shown
    if _banner_shown:
        return highspy.Highs()
    _banner_shown = True
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
