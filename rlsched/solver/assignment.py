"""Tenant -> GPU assignment of a multi-GPU repair by local search (stage one, fast).

The assignment objective is the one of the assignment ILP in :mod:`rlsched.solver.repair`:
per tenant the cost of its GPU (preferred GPU missed, moved off its GPU), plus per GPU the
compute requested beyond its slices times a price; each GPU's tenants' memory must fit.
Proving the optimum of that ILP is a multi-way number-partitioning problem: on 8 GPUs and 32
tenants HiGHS needed seconds, while the objective is only a proxy for stage two (the exact
layout of each GPU). So this module finds a good assignment fast, deterministically:

1. greedy: tenants by decreasing compute, each to the GPU where it adds the least cost;
2. local search: repeatedly apply the best improving move of one tenant to another GPU or
   swap of two tenants on different GPUs, until none improves (a local optimum under moves
   and swaps; not a proven global optimum of the assignment objective).
"""

from __future__ import annotations

import numpy as np

#: Improving steps before the local search stops (it reaches a local optimum far earlier:
#: each step lowers the objective, typically a few dozen steps for 32 tenants).
MAX_STEPS = 1000

#: Smallest decrease of the objective that counts as an improvement (solver-scale tolerance).
IMPROVEMENT = 1e-9


def assign_by_local_search(
    cost: np.ndarray,
    compute_slices: np.ndarray,
    memory_gib: np.ndarray,
    capacity_slices: np.ndarray,
    memory_capacity_gib: np.ndarray,
    compute_weight: float,
) -> np.ndarray | None:
    """A GPU per tenant, locally optimal for the assignment objective; None if greedy finds
    no memory-feasible start (the caller then solves the assignment ILP).

    :param cost: shape (tenants, GPUs): cost of the tenant on that GPU, ``inf`` where it
        cannot go (its memory exceeds every GI there)
    :param compute_slices: per tenant, requested compute slices
    :param memory_gib: per tenant, memory need, GiB
    :param capacity_slices: per GPU, compute slices before overload is priced
    :param memory_capacity_gib: per GPU, memory its tenants may need in all, GiB (includes
        the caller's tolerance)
    :param compute_weight: price per compute slice of overload
    """
    n, gpus = cost.shape
    load, used = np.zeros(gpus), np.zeros(gpus)
    where = np.full(n, -1)

    def overload(loads: np.ndarray, caps: np.ndarray) -> np.ndarray:
        return compute_weight * np.maximum(loads - caps, 0.0)

    for i in sorted(range(n), key=lambda i: (-compute_slices[i], i)):
        added = cost[i] + overload(load + compute_slices[i], capacity_slices) - overload(load, capacity_slices)
        added[used + memory_gib[i] > memory_capacity_gib] = np.inf
        g = int(np.argmin(added))
        if not np.isfinite(added[g]):
            return None
        where[i], load[g], used[g] = g, load[g] + compute_slices[i], used[g] + memory_gib[i]

    tenants = np.arange(n)
    for _ in range(MAX_STEPS):
        own = cost[tenants, where]
        home_cap = capacity_slices[where]
        # Moves: tenant i to GPU g.
        leave = overload(load[where] - compute_slices, home_cap) - overload(load[where], home_cap)
        join = overload(load[None, :] + compute_slices[:, None], capacity_slices[None, :]) - overload(load, capacity_slices)[None, :]
        move = cost - own[:, None] + leave[:, None] + join
        move[used[None, :] + memory_gib[:, None] > memory_capacity_gib[None, :]] = np.inf
        move[tenants, where] = np.inf
        # Swaps: tenant i to j's GPU and j to i's GPU (each pair counted from both ends).
        net = compute_slices[None, :] - compute_slices[:, None]  # j's compute in, i's out
        net_memory = memory_gib[None, :] - memory_gib[:, None]
        gi, gj = where[:, None], where[None, :]
        swap = (
            cost[:, where] + cost[:, where].T - own[:, None] - own[None, :]
            + overload(load[gi] + net, home_cap[:, None]) - overload(load[gi], home_cap[:, None])
            + overload(load[gj] - net, home_cap[None, :]) - overload(load[gj], home_cap[None, :])
        )
        swap[(gi == gj) | (used[gi] + net_memory > memory_capacity_gib[gi]) | (used[gj] - net_memory > memory_capacity_gib[gj])] = np.inf
        best_move, best_swap = int(np.argmin(move)), int(np.argmin(swap))
        if min(move.flat[best_move], swap.flat[best_swap]) > -IMPROVEMENT:
            break
        if move.flat[best_move] <= swap.flat[best_swap]:
            i, g = divmod(best_move, gpus)
            _relocate(i, g, where, load, used, compute_slices, memory_gib)
        else:
            i, j = divmod(best_swap, n)
            gi_, gj_ = int(where[i]), int(where[j])
            _relocate(i, gj_, where, load, used, compute_slices, memory_gib)
            _relocate(j, gi_, where, load, used, compute_slices, memory_gib)
    return where


def _relocate(i: int, g: int, where: np.ndarray, load: np.ndarray, used: np.ndarray, compute_slices: np.ndarray, memory_gib: np.ndarray) -> None:
    """Move tenant ``i`` to GPU ``g``, updating the loads (slices) and memory used (GiB)."""
    old = where[i]
    load[old] -= compute_slices[i]
    used[old] -= memory_gib[i]
    where[i] = g
    load[g] += compute_slices[i]
    used[g] += memory_gib[i]
