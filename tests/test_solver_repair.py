"""The repair ILP: hardware rules cross-checked, identity, feasibility of random requests."""

import math

import numpy as np
import pytest

from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.errors import ConfigError
from rlsched.hardware import Layout, enumerate_layouts, parse_layout
from rlsched.solver import (
    InfeasibleRequest,
    Milp,
    RepairProblem,
    RepairWeights,
    TenantRequest,
    feasibility_problems,
    gpu_table,
    repair,
    repair_configuration,
    requests_from_configuration,
)
from rlsched.solver.assignment import assign_by_local_search
from rlsched.solver.instances import add_placement_rules
from rlsched.solver.random_requests import random_problem
from rlsched.solver.repair import fill_shares

MPS, TIME_SLICE = SharingMode.MPS, SharingMode.TIME_SLICE


def _feasible_layouts_by_no_good_loop(gpu: str, driver_major: int | None) -> set[str]:
    """Every 0/1 point of the ILP's placement rules, found one at a time with no-good cuts."""
    table = gpu_table(gpu, driver_major=driver_major)
    found: list[list[int]] = []
    while True:
        milp = Milp()
        exists = [milp.add_binary(0.0) for _ in table.candidates]
        add_placement_rules(milp, table, exists)
        for chosen in found:
            # At least one candidate must differ from this already-found solution.
            others = [c for k, c in enumerate(exists) if k not in chosen]
            milp.add_row([*others, *(exists[k] for k in chosen)], [1.0] * len(others) + [-1.0] * len(chosen), lower=1.0 - len(chosen))
        solution = milp.solve()
        if not solution.feasible:
            break
        found.append([k for k, c in enumerate(exists) if solution.values[c] > 0.5])
        assert len(found) < 1000, "the placement rules admit far more layouts than the catalog"
    return {table.layout_of(chosen).spec() for chosen in found}


def _searched_layouts(gpu: str, driver_major: int | None) -> set[str]:
    """The layouts the exact search and the layout ILP choose among (the table's members)."""
    table = gpu_table(gpu, driver_major=driver_major)
    return {table.layout_of(list(members)).spec() for members in table.layout_members}


@pytest.mark.parametrize("driver_major", [None, 470])
def test_ilp_feasible_layouts_equal_enumerated_layouts_on_a100(driver_major):
    ilp = _feasible_layouts_by_no_good_loop("a100-40gb", driver_major)
    enumerated = {layout.spec() for layout in enumerate_layouts("a100-40gb", driver_major=driver_major)}
    assert ilp == enumerated | {""}
    assert ilp == _searched_layouts("a100-40gb", driver_major)
    assert len(enumerated) == (297 if driver_major is None else len(ilp) - 1)


def test_ilp_feasible_layouts_equal_enumerated_layouts_on_a30():
    ilp = _feasible_layouts_by_no_good_loop("a30-24gb", None)
    assert ilp == {l.spec() for l in enumerate_layouts("a30-24gb")} | {""}
    assert ilp == _searched_layouts("a30-24gb", None)


@pytest.mark.parametrize("seed", range(12))
def test_both_formulations_reach_the_same_optimum(seed):
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, ("a100-40gb",), 5)
    by_layouts = repair(problem, formulation="layouts")
    by_placements = repair(problem, formulation="placements")
    assert by_layouts.solver_objective == pytest.approx(by_placements.solver_objective, abs=1e-5)


def test_search_reaches_the_layout_ilp_optimum_on_random_requests():
    """The exact search and the reference layout ILP agree on 300 random single-GPU requests,
    a third of them measured from a running configuration (moves and GI changes priced)."""
    rng = np.random.default_rng(11)
    gpu_types = ("a100-40gb", "a30-24gb", "h100-80gb", "v100-16gb")
    previous: dict[str, Configuration] = {}
    for i in range(300):
        gpu = gpu_types[i % len(gpu_types)]
        problem = random_problem(rng, (gpu,), int(rng.integers(1, 7)))
        running = previous.get(gpu) if i % 3 == 0 else None
        if running is not None and not set(running.placements) <= set(problem.tenants):
            running = None
        by_search = repair(problem, running, formulation="search", fast_path=False)
        by_ilp = repair(problem, running, formulation="layouts", fast_path=False)
        assert by_search.optimal and by_ilp.optimal
        assert by_search.solver_objective == pytest.approx(by_ilp.solver_objective, abs=1e-5), (i, problem)
        # The search's objective is the evaluated one, up to the 1 % minimum share (a tenant
        # asking 0.05 slices of a 7g gets 0.07), as for the ILP.
        assert by_search.solver_objective == pytest.approx(by_search.distance + by_search.reconfiguration_cost, abs=0.05)
        previous[gpu] = by_search.configuration


def _mixed_configuration() -> Configuration:
    layout = parse_layout("3g@0,2g@4,1g@6", "a100-40gb")
    return Configuration(
        (layout, Layout("v100-16gb", ())),
        ((MPS, TIME_SLICE, MPS), (MPS,)),
        {
            "a": TenantPlacement(0, 0, 60.0, 8),
            "b": TenantPlacement(0, 0, 40.0, 4),
            "c": TenantPlacement(0, 1, 100.0, 2),
            "d": TenantPlacement(0, 2, 50.0, 1),
            "e": TenantPlacement(1, 0, 30.0, 16),
        },
    )


MEMORY = {"a": 8.0, "b": 6.0, "c": 9.0, "d": 2.0, "e": 12.0}


def test_feasible_requested_configuration_comes_back_unchanged():
    config = _mixed_configuration()
    result = repair_configuration(config, MEMORY)
    assert result.configuration is config and result.fast_path and result.distance == 0.0


@pytest.mark.parametrize("formulation", ["search", "layouts", "placements"])
def test_requests_met_by_the_running_configuration_come_back_unchanged(formulation):
    config = _mixed_configuration()
    problem = requests_from_configuration(config, MEMORY)
    assert repair(problem, config).fast_path
    solved = repair(problem, config, formulation=formulation, fast_path=False)
    assert not solved.fast_path
    assert solved.configuration == config and not solved.changed
    assert solved.distance == pytest.approx(0.0, abs=1e-6) and solved.reconfiguration_cost == 0.0


def test_infeasible_requested_configuration_is_repaired_near_it():
    config = _mixed_configuration()
    # b now wants 70 % next to a's 60 %: the 3g cannot give both; memory 30 GiB on the v100 too much.
    crowded = Configuration(config.layouts, config.modes, {**config.placements, "b": TenantPlacement(0, 0, 70.0, 4)})
    assert feasibility_problems(crowded, requests_from_configuration(crowded, MEMORY))
    result = repair_configuration(crowded, MEMORY)
    problem = requests_from_configuration(crowded, MEMORY)
    assert feasibility_problems(result.configuration, problem) == []
    assert result.changed and not result.fast_path and result.distance > 0
    # Tenants the conflict does not touch stay where they were.
    for name in ("c", "d", "e"):
        assert result.configuration.placements[name] == crowded.placements[name]


def test_memory_need_forces_a_larger_instance():
    problem = RepairProblem(("a100-40gb",), {"big": TenantRequest(1.0, 15.0, mps_pct=100.0)})
    result = repair(problem)
    placement = result.configuration.placements["big"]
    gi = result.configuration.layouts[0].instances[placement.instance_index]
    assert gi.profile in ("3g.20gb", "4g.20gb", "7g.40gb")
    # 1 slice of a 3g or 4g: the share gives exactly what was asked.
    assert result.terms.compute_slices_off == pytest.approx(0.0, abs=1e-3)


def test_request_that_fits_nowhere_is_reported():
    with pytest.raises(InfeasibleRequest, match="tenant huge needs 50 GiB"):
        repair(RepairProblem(("a100-40gb",), {"huge": TenantRequest(1.0, 50.0)}))
    with pytest.raises(InfeasibleRequest, match="cannot be packed"):
        repair(RepairProblem(("a100-40gb",), {f"t{i}": TenantRequest(1.0, 15.0) for i in range(3)}))


def test_gpu_without_mig_is_shared_by_shares():
    problem = RepairProblem(("v100-16gb",), {"a": TenantRequest(3.5, 4.0), "b": TenantRequest(7.0, 4.0)})
    result = repair(problem)
    shares = {n: p.mps_pct for n, p in result.configuration.placements.items()}
    # 10.5 slices asked of a 7-slice device: both scaled by 7 / 10.5.
    assert shares == pytest.approx({"a": 100 / 3, "b": 200 / 3}, abs=1e-3)
    assert result.terms.compute_slices_off == pytest.approx(3.5, abs=1e-3)


def test_running_layout_is_kept_when_it_can_serve_the_request():
    current = _mixed_configuration()
    problem = requests_from_configuration(current, MEMORY)
    # Ask a for a little less: only its share changes, no GI is touched, nobody moves.
    tenants = dict(problem.tenants)
    tenants["a"] = TenantRequest(1.5, 8.0, preferred_gpu=0, mode=MPS, mps_pct=50.0, batch_size=8)
    result = repair(RepairProblem(problem.gpus, tenants), current)
    assert result.configuration.layouts == current.layouts
    assert result.terms.reconfiguration_s == 0.0 and result.terms.moved_tenants == 0
    assert result.configuration.placements["a"].mps_pct == pytest.approx(50.0)


def test_reconfiguration_cost_weighs_against_a_better_fitting_layout():
    current = Configuration((parse_layout("7g@0", "a100-40gb"),), ((MPS,),), {"a": TenantPlacement(0, 0, 100.0)})
    wants_1g = RepairProblem(("a100-40gb",), {"a": TenantRequest(1.0, 1.0, mps_pct=100.0)})
    # Staying costs the size term 0.25 * (7 - 1) = 1.5; moving 0.22 s + 0.16 s of GI work
    # plus one moved tenant (0.2) = 0.58 at the default prices, 4.0 at 10 per second.
    moves = repair(wants_1g, current)
    assert [gi.profile for gi in moves.configuration.layouts[0]] == ["1g.5gb"]
    assert moves.terms.reconfiguration_s == pytest.approx(0.38) and moves.terms.moved_tenants == 1
    stays = repair(wants_1g, current, RepairWeights(reconfiguration_per_s=10.0))
    assert stays.configuration.layouts == current.layouts
    assert stays.configuration.placements["a"].mps_pct == pytest.approx(100.0 / 7, abs=1e-3)


def test_objective_matches_the_evaluated_distance():
    rng = np.random.default_rng(7)
    for _ in range(10):
        problem = random_problem(rng, ("a100-40gb",), 6)
        result = repair(problem)
        assert result.solver_objective == pytest.approx(result.distance + result.reconfiguration_cost, abs=0.05)


def test_multi_gpu_prefers_the_requested_gpu_and_is_deterministic():
    rng = np.random.default_rng(3)
    problem = random_problem(rng, ("a100-40gb", "a100-40gb", "v100-16gb", "a30-24gb"), 10)
    first, second = repair(problem), repair(problem)
    assert first.configuration == second.configuration
    assert feasibility_problems(first.configuration, problem) == []
    honoured = [first.configuration.placements[n].gpu_index == r.preferred_gpu for n, r in problem.tenants.items() if r.preferred_gpu is not None]
    assert sum(honoured) >= len(honoured) - 2


def test_multi_gpu_memory_spreads_tenants_off_their_preferred_gpu():
    # Three 15 GiB tenants all prefer GPU 0, whose 40 GiB hold only two of them.
    tenants = {f"t{i}": TenantRequest(1.0, 15.0, preferred_gpu=0) for i in range(3)}
    result = repair(RepairProblem(("a100-40gb", "a100-40gb"), tenants))
    gpus = sorted(p.gpu_index for p in result.configuration.placements.values())
    assert gpus == [0, 0, 1]


def test_fill_shares_never_exceeds_one_hundred():
    shares = fill_shares(1.0, {f"t{i}": 0.001 for i in range(99)} | {"big": 5.0})
    assert sum(shares.values()) <= 100.0 and min(shares.values()) >= 1.0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(compute_slices=[1.0, math.nan]), "compute_slices[1]"),
        (dict(compute_slices=[1.0]), "compute_slices"),
        (dict(memory_gib=[1.0, -2.0]), "tenants['t1'].memory_gib"),
        (dict(preferred_gpu=[0, 5]), "tenants['t1'].preferred_gpu"),
        (dict(modes=["mps", "gang"]), "modes[1]"),
        (dict(mps_pct=[50.0, 150.0]), "tenants['t1'].mps_pct"),
        (dict(batch_size=[1, 2.5]), "batch_size[1]"),
    ],
)
def test_bad_action_names_field_and_value(kwargs, field):
    arrays = dict(compute_slices=[1.0, 2.0], memory_gib=[1.0, 1.0]) | kwargs
    with pytest.raises(ConfigError) as error:
        RepairProblem.from_arrays(("a100-40gb",), ["t0", "t1"], **arrays)
    assert field in str(error.value)


def test_unknown_tenant_and_wrong_node_are_named():
    config = _mixed_configuration()
    with pytest.raises(ConfigError, match="unknown tenant"):
        requests_from_configuration(config, MEMORY | {"ghost": 1.0})
    problem = RepairProblem(("a100-40gb",), {"a": TenantRequest(1.0, 1.0)})
    with pytest.raises(ConfigError, match="current.layouts"):
        repair(problem, config)
    with pytest.raises(ConfigError, match="unknown GPU type"):
        RepairProblem(("b200",), {})


def test_ten_thousand_random_requests_all_repair_to_feasible_configurations():
    rng = np.random.default_rng(2024)
    gpu_types = ("a100-40gb", "a30-24gb", "v100-16gb", "h100-80gb")
    current = None
    for i in range(10_000):  # ~60 s: small nodes, so the count stays
        gpus = (gpu_types[i % len(gpu_types)],)
        problem = random_problem(rng, gpus, int(rng.integers(1, 3)))
        # Every fourth request follows the previous one, so the reconfiguration terms act.
        running = current if current is not None and i % 4 == 1 and current.layouts[0].gpu == gpus[0] else None
        result = repair(problem, running if running and set(running.placements) <= set(problem.tenants) else None)
        assert result.configuration.problems(list(problem.tenants)) == []
        assert feasibility_problems(result.configuration, problem) == []
        current = result.configuration


def _assignment_objective(where, cost, compute, capacity, weight):
    loads = np.bincount(where, weights=compute, minlength=len(capacity))
    return cost[np.arange(len(where)), where].sum() + weight * np.maximum(loads - capacity, 0.0).sum()


@pytest.mark.parametrize("seed", range(20))
def test_local_search_assignment_fits_memory_and_no_move_or_swap_improves_it(seed):
    rng = np.random.default_rng(seed)
    n, gpus = int(rng.integers(2, 16)), int(rng.integers(2, 5))
    cost = rng.choice([0.0, 0.2, 1.0, 1.2], size=(n, gpus))
    compute, memory = rng.uniform(0.05, 4.0, n), rng.uniform(0.0, 10.0, n)
    capacity, memory_cap = np.full(gpus, 7.0), np.full(gpus, 40.0)
    where = assign_by_local_search(cost, compute, memory, capacity, memory_cap, 1.0)
    assert where is not None

    def fits(w):
        return bool(np.all(np.bincount(w, weights=memory, minlength=gpus) <= memory_cap))

    assert fits(where)
    value = _assignment_objective(where, cost, compute, capacity, 1.0)
    neighbours = []
    for i in range(n):
        for g in range(gpus):
            neighbours.append(np.where(np.arange(n) == i, g, where))
        for j in range(n):
            swapped = where.copy()
            swapped[i], swapped[j] = where[j], where[i]
            neighbours.append(swapped)
    for other in neighbours:
        if fits(other):
            assert _assignment_objective(other, cost, compute, capacity, 1.0) >= value - 1e-9


def test_a_move_the_hardware_can_stage_is_priced_as_a_staged_move():
    import dataclasses

    from rlsched.solver.repair import repair_terms

    def cfg(spec, placements):
        layout = parse_layout(spec, "a100-40gb")
        return Configuration((layout,), ((SharingMode.MPS,) * len(layout),), placements)

    current = cfg("3g@0,2g@4", {"a": TenantPlacement(0, 0), "b": TenantPlacement(0, 1)})
    to_free_slice = cfg("3g@0,2g@4,1g@6", {"a": TenantPlacement(0, 0), "b": TenantPlacement(0, 2)})
    into_own_slices = cfg("3g@0,1g@4,1g@5,1g@6", {"a": TenantPlacement(0, 0), "b": TenantPlacement(0, 1)})
    problem = RepairProblem(("a100-40gb",), {"a": TenantRequest(3.0, 1.0), "b": TenantRequest(1.0, 1.0)}, make_before_break=True)
    staged = repair_terms(to_free_slice, problem, current)
    assert (staged.staged_moves, staged.moved_tenants) == (1, 0)
    assert (repair_terms(into_own_slices, problem, current).moved_tenants, repair_terms(into_own_slices, problem, current).staged_moves) == (1, 0)
    full = repair_terms(to_free_slice, dataclasses.replace(problem, make_before_break=False), current)
    assert (full.staged_moves, full.moved_tenants) == (0, 1)
    w = RepairWeights()
    assert staged.reconfiguration_cost(w) == pytest.approx(full.reconfiguration_cost(w) - w.moved_tenant + w.staged_move)
    assert staged.reconfiguration_cost(w) < full.reconfiguration_cost(w)
