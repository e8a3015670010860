"""Exact search for one GPU's repair: every enumerated layout, each with its best packing.

The layout ILP (:mod:`rlsched.solver.repair`, formulation ``layouts``) chooses one of the
enumerated layouts of a GPU and packs the GPU's tenants into its GIs. Its LP relaxation is
weak (the GI-size and mode preferences), so HiGHS spends its time on cuts and heuristics.
This module solves the same problem exactly by enumeration with dynamic programming:

- The cost of a GI holding a tenant set S is a set function ``f(S)`` of the GI's compute
  slices, memory and per-tenant assignment costs (GI-size and moved-tenant terms, which
  differ between candidates): tenants' assignment costs, minus the compute the GI gives
  (``min(GI slices, sum of min(request, GI slices))``), plus the mode misses (the GI runs
  the mode most of its stating tenants asked for); ``inf`` when the tenants' memory exceeds
  the GI's. For n tenants ``f`` is a table of 2**n values per GI *type*.
- Candidates with the same slices, memory and assignment costs are one type: they are
  interchangeable, so the best packing of a layout depends only on the multiset of its
  types (symmetry). A100-40GB's 297 layouts have a few dozen type multisets when nothing
  runs yet; GIs that running tenants sit in become types of their own.
- The best packing of a multiset extends the best packings of its prefix (types in a fixed
  order) by one GI: ``best[T + t][M] = min over S within M of best[T][M - S] + f_t(S)``, a
  min-plus subset convolution of 3**n terms, done with numpy once per distinct prefix.
- A layout's value is its reconfiguration cost plus the best packing of all tenants in its
  multiset; the smallest value wins (ties: the first layout in enumeration order).

The result is the exact optimum of the same objective as the ILP (no gap, no time limit).
The work grows as 3**n, so it is used up to :data:`MAX_SEARCH_TENANTS` tenants per GPU;
beyond that the caller solves the ILP.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

#: Most tenants on one GPU for the search: 3**10 = 59,049 terms per convolution (about
#: 0.5 ms); more tenants go to the ILP.
MAX_SEARCH_TENANTS = 10


@dataclass(frozen=True)
class SearchResult:
    """The optimum of one GPU's repair found by :func:`search_packing`.

    :param layout: index of the chosen layout (into the ``layout_members`` given)
    :param candidate_of: per tenant, the candidate GI index it is placed in
    :param value: optimal objective without the caller's constant terms (reconfiguration
        cost + packing cost), in units of the weights
    """

    layout: int
    candidate_of: tuple[int, ...]
    value: float


@functools.cache
def _subset_pairs(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (mask, sub) with sub within mask over n tenants, grouped by mask.

    :returns: ``rest = mask ^ sub``, ``sub``, and the start of each mask's group (for
        ``np.minimum.reduceat``); 3**n pairs
    """
    masks = np.arange(1 << n)
    mask, sub = np.nonzero((masks[None, :] & ~masks[:, None]) == 0)  # row mask, column sub
    starts = np.searchsorted(mask, masks)
    return (mask ^ sub).astype(np.intp), sub.astype(np.intp), starts.astype(np.intp)


def subset_sums(values: np.ndarray) -> np.ndarray:
    """Sums over every subset: ``out[mask] = sum of values[i] for bit i in mask``.

    :param values: shape (n, ...) per tenant
    :returns: shape (2**n, ...)
    """
    n = values.shape[0]
    out = np.zeros((1 << n, *values.shape[1:]))
    for i in range(n):
        out[1 << i : 2 << i] = out[: 1 << i] + values[i]
    return out


@dataclass(frozen=True)
class _PrefixTree:
    """The type multisets of a GPU's layouts as a tree of prefixes (types in a fixed order).

    :param parent: per node, its parent node (-1 for the root, the empty multiset)
    :param last_type: per node, the type it adds to its parent (-1 for the root)
    :param has_children: per node, whether some node extends it
    :param node_of_layout: per layout, the node of its multiset
    """

    parent: tuple[int, ...]
    last_type: tuple[int, ...]
    has_children: tuple[bool, ...]
    node_of_layout: tuple[int, ...]


@functools.lru_cache(maxsize=4096)
def _prefix_tree(layout_members: tuple[tuple[int, ...], ...], type_of: tuple[int, ...]) -> _PrefixTree:
    """The prefix tree of the layouts' type multisets (parents always before children)."""
    index: dict[tuple[int, ...], int] = {(): 0}
    parent, last, children = [-1], [-1], [False]
    node_of_layout = []
    for members in layout_members:
        key = tuple(sorted(type_of[k] for k in members))
        for depth in range(1, len(key) + 1):
            prefix = key[:depth]
            if prefix not in index:
                index[prefix] = len(parent)
                parent.append(index[prefix[:-1]])
                last.append(prefix[-1])
                children.append(False)
                children[parent[-1]] = True
        node_of_layout.append(index[key])
    return _PrefixTree(tuple(parent), tuple(last), tuple(children), tuple(node_of_layout))


def _types(compute_slices: np.ndarray, memory_gib: np.ndarray, assign_cost: np.ndarray) -> tuple[int, ...]:
    """Per candidate its type: equal slices, memory and assignment costs are one type.

    Types are numbered by how many candidates share them (most first), so that GIs of
    their own (the running tenants' ones) come last in the multisets and the layouts share
    long prefixes.
    """
    keys = np.column_stack([compute_slices, memory_gib, assign_cost.T])
    _, first, inverse, counts = np.unique(keys, axis=0, return_index=True, return_inverse=True, return_counts=True)
    order = sorted(range(len(counts)), key=lambda t: (-counts[t], first[t]))
    rank = {t: r for r, t in enumerate(order)}
    return tuple(rank[int(t)] for t in inverse.reshape(-1))


def search_packing(
    layout_members: tuple[tuple[int, ...], ...],
    layout_cost: np.ndarray,
    compute_slices: np.ndarray,
    memory_gib: np.ndarray,
    requested_slices: np.ndarray,
    tenant_memory_gib: np.ndarray,
    assign_cost: np.ndarray,
    mode_index: np.ndarray,
    compute_weight: float,
    mode_weight: float,
    memory_slack_gib: float,
) -> SearchResult | None:
    """The layout and packing of least total cost, or None when no layout holds the tenants.

    Minimises ``layout_cost[l] + sum over the layout's GIs of f_k(tenants in k)`` with
    ``f_k(S) = sum(assign_cost[S, k]) - compute_weight * min(slices_k, sum min(request, slices_k))
    + mode_weight * (tenants of S stating a mode - the most of S stating one mode)``, and
    every GI's tenants' memory at most its memory + ``memory_slack_gib``.

    :param layout_members: per layout, the candidate indices it holds
    :param layout_cost: per layout, the cost of choosing it (reconfiguration)
    :param compute_slices: per candidate, its compute slices
    :param memory_gib: per candidate, its memory, GiB
    :param requested_slices: per tenant, the compute slices requested
    :param tenant_memory_gib: per tenant, its memory need, GiB
    :param assign_cost: shape (tenants, candidates): cost of the tenant in that candidate
    :param mode_index: per tenant, the index of the mode it asks for, -1 for none
    :param compute_weight: price per compute slice given less than requested
    :param mode_weight: price per tenant whose GI runs another mode
    :param memory_slack_gib: tolerance on the memory rows, GiB
    """
    n = len(requested_slices)
    if n > MAX_SEARCH_TENANTS:
        raise ValueError(f"{n} tenants: the search handles at most {MAX_SEARCH_TENANTS}")
    type_of = _types(compute_slices, memory_gib, assign_cost)
    tree = _prefix_tree(layout_members, type_of)
    cost = _type_costs(type_of, compute_slices, memory_gib, requested_slices, tenant_memory_gib, assign_cost, mode_index, compute_weight, mode_weight, memory_slack_gib)
    rest, sub, starts = _subset_pairs(n)
    full = (1 << n) - 1
    # Submasks of the full mask: its group is the last one of the pairs.
    full_rest, full_sub = rest[starts[full] :], sub[starts[full] :]
    best: list[np.ndarray | None] = [None] * len(tree.parent)
    best_full = np.empty(len(tree.parent))
    root = np.full(1 << n, np.inf)
    root[0] = 0.0
    best[0], best_full[0] = root, root[full]
    for node in range(1, len(tree.parent)):
        above, f = best[tree.parent[node]], cost[:, tree.last_type[node]]
        if tree.has_children[node]:
            table = np.minimum.reduceat(above[rest] + f[sub], starts)
            best[node], best_full[node] = table, table[full]
        else:  # a leaf: only the packing of every tenant is needed
            best_full[node] = float(np.min(above[full_rest] + f[full_sub]))
    totals = layout_cost + best_full[list(tree.node_of_layout)]
    chosen = int(np.argmin(totals))
    if not np.isfinite(totals[chosen]):
        return None
    return SearchResult(chosen, _unpack(tree, best, cost, type_of, layout_members[chosen], chosen, n), float(totals[chosen]))


def _type_costs(
    type_of: tuple[int, ...],
    compute_slices: np.ndarray,
    memory_gib: np.ndarray,
    requested_slices: np.ndarray,
    tenant_memory_gib: np.ndarray,
    assign_cost: np.ndarray,
    mode_index: np.ndarray,
    compute_weight: float,
    mode_weight: float,
    memory_slack_gib: float,
) -> np.ndarray:
    """``f_t(S)`` for every tenant subset S (rows) and type t (columns)."""
    representative = [type_of.index(t) for t in range(max(type_of) + 1)]
    slices = compute_slices[representative]
    usable = np.minimum(requested_slices[:, None], slices[None, :])  # what a tenant can get there
    given = np.minimum(subset_sums(usable), slices[None, :])
    mode_count = int(mode_index.max()) + 1 if len(mode_index) else 0
    modes = subset_sums((mode_index[:, None] == np.arange(max(mode_count, 1))[None, :]).astype(float))
    misses = modes.sum(axis=1) - modes.max(axis=1)
    cost = subset_sums(assign_cost[:, representative]) - compute_weight * given + mode_weight * misses[:, None]
    too_big = subset_sums(tenant_memory_gib)[:, None] > memory_gib[representative][None, :] + memory_slack_gib
    cost[too_big] = np.inf
    return cost


def _unpack(
    tree: _PrefixTree,
    best: list[np.ndarray | None],
    cost: np.ndarray,
    type_of: tuple[int, ...],
    members: tuple[int, ...],
    layout: int,
    n: int,
) -> tuple[int, ...]:
    """The candidate of each tenant in the optimal packing of one layout (backtracking)."""
    rest, sub, starts = _subset_pairs(n)
    # GIs of one type are interchangeable: hand them out in candidate order.
    free: dict[int, list[int]] = {}
    for k in sorted(members):
        free.setdefault(type_of[k], []).append(k)
    candidate_of = [-1] * n
    mask, node = (1 << n) - 1, tree.node_of_layout[layout]
    while node > 0:
        above, f = best[tree.parent[node]], cost[:, tree.last_type[node]]
        group = slice(starts[mask], starts[mask + 1] if mask + 1 < len(starts) else len(sub))
        pick = int(np.argmin(above[rest[group]] + f[sub[group]]))
        taken, k = int(sub[group][pick]), free[tree.last_type[node]].pop(0)
        for i in range(n):
            if taken >> i & 1:
                candidate_of[i] = k
        mask ^= taken
        node = tree.parent[node]
    assert mask == 0, "backtracking left tenants unplaced"
    return tuple(candidate_of)
