"""The candidate library, the library planner, the candidate-choice environment and its scorer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlsched.agents.baselines.base import observed_load
from rlsched.agents.baselines.planners import MIGRATOR_LOOKAHEAD
from rlsched.agents.candidates import JOINT_RATE_SCALES, CandidateLibrary
from rlsched.agents.evaluation import run_episode
from rlsched.agents.ppo.candidate_env import ACTION_ADVANTAGES_KEY, CANDIDATE_FEATURES, CANDIDATES, CHOOSE_AT, GLOBAL_FEATURES, CandidateChoiceEnv
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.solver.planner import Planner

DATA = Path(__file__).parent / "data"
TINY = str(DATA / "env_tiny.yaml")
TWO_GPUS = str(DATA / "env_tiny_two_gpus.yaml")


@pytest.fixture
def library() -> CandidateLibrary:
    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    library = CandidateLibrary(env, Planner(env.scenario, env.backend.perf_model, env.backend.memory_gib))
    library.seed(MIGRATOR_LOOKAHEAD)
    return library


def _windows(library: CandidateLibrary, scale: float) -> list[dict[str, float]]:
    return [{t.name: t.arrivals.mean_rate_rps() * scale for t in library.env.scenario.inference_tenants()}] * MIGRATOR_LOOKAHEAD


def test_seeding_solves_every_seed_load_and_keeps_distinct_configurations(library):
    tenants = len(library.env.scenario.inference_tenants())
    assert library.solves == len(JOINT_RATE_SCALES) + 2 * tenants
    assert 1 <= len(library.configurations) <= library.solves
    assert len(set(map(repr, library.configurations))) == len(library.configurations)
    assert all(not c.problems(library.env.tenant_names) for c in library.configurations)


def test_a_new_load_joins_at_the_next_refresh_and_is_solved_once(library):
    windows = _windows(library, 40.0)  # far beyond every seed load: a new bin, a new solution
    solves, size = library.solves, len(library.configurations)
    library.request(windows)
    assert library.solves == solves + 1 and len(library.configurations) == size  # not yet: a decision never waits for it
    library.request(windows)
    assert library.solves == solves + 1  # same bin: no second solve
    library.refresh()
    assert library.pending == [] and len(library.configurations) >= size


def test_a_library_solving_ahead_also_solves_the_load_one_bin_up(library):
    from rlsched.agents.candidates import FORECAST_BIN_RATIO

    library.solve_ahead = True
    windows = _windows(library, 40.0)
    up = _windows(library, 40.0 * FORECAST_BIN_RATIO)
    solves = library.solves
    library.request(windows)
    assert library.solves == solves + 2  # the load's bin and the bin a rising load enters next
    assert {CandidateLibrary.bin_of(windows), CandidateLibrary.bin_of(up)} <= library.seen_bins
    library.request(up)  # the load rose one bin: solved already, and one bin further up is new
    assert library.solves == solves + 3
    library.refresh()
    assert library.pending == []


def test_a_library_with_a_worker_keeps_at_most_two_solves_unfinished_and_asks_again_for_a_load_it_turned_away(monkeypatch):
    """A daemon's library (``background``) solves beside the decision loop; while two solves are
    unfinished a new load is not queued, nor marked seen: it is asked for again while it lasts."""
    import threading

    from rlsched.agents.candidates import MAX_UNFINISHED_SOLVES

    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    library = CandidateLibrary(env, Planner(env.scenario, env.backend.perf_model, env.backend.memory_gib), background=True)
    library.seed(MIGRATOR_LOOKAHEAD)
    release = threading.Event()
    solve = library._solve
    solvers: list[Planner] = []

    def held(windows, running, rate_cv=None, solver=None):
        solvers.append(solver)
        release.wait(timeout=60)
        return solve(windows, running, rate_cv, solver)

    monkeypatch.setattr(library, "_solve", held)
    loads = [_windows(library, scale) for scale in (40.0, 60.0, 90.0)]
    for windows in loads:
        library.request(windows)
    library.start_solves()
    assert MAX_UNFINISHED_SOLVES == 2 and len(library.running) == 2
    assert CandidateLibrary.bin_of(loads[2]) not in library.seen_bins  # turned away, not forgotten as seen
    release.set()
    for future, _ in library.running:
        future.result(timeout=60)
    library.refresh()
    assert library.running == [] and library.pending == []
    library.request(loads[2])  # the load lasts: asked for again, and queued now
    library.start_solves()
    assert len(library.running) == 1
    library.running[0][0].result(timeout=60)
    # Each solve had its own snapshot of the planner, not the planner the decision loop goes on with.
    assert len(solvers) == 3 and all(s is not None and s is not library.planner for s in solvers)


def test_the_queue_planner_s_library_solving_on_a_worker_decides_as_solving_at_once():
    """``queue-slo-offered`` as the daemon runs it (its library's solves on the worker thread,
    each done before the next decision, as a 10 s interval allows) makes the decisions it makes
    with the solves made at once in the decision."""
    from concurrent.futures import wait

    from rlsched.agents.baselines import apply, make_policy

    def decisions(background: bool) -> tuple[list[str], int]:
        env = GpuShareEnv(TINY)
        observation, _ = env.reset(seed=1)
        policy = make_policy("queue-slo-offered")
        policy.background_solves = background
        policy.reset(env)
        assert (policy.library.worker is not None) == background
        seeded = policy.library.solves
        if background:  # a solve starts once the decision is made, never while it is being made
            deciding, started_while = [False], []
            decide, submit = policy._decide, policy.library.worker.submit

            def watched_decide(*args):
                deciding[0] = True
                try:
                    return decide(*args)
                finally:
                    deciding[0] = False

            def watched_submit(*args):
                started_while.append(deciding[0])
                return submit(*args)

            policy._decide, policy.library.worker.submit = watched_decide, watched_submit
        made = []
        for _ in range(8):
            decision = policy.act(observation, env)
            wait([future for future, _ in policy.library.running])
            made.append(repr(decision))
            observation, *_ = apply(env, decision)
        if background:
            assert started_while and not any(started_while)
        return made, policy.library.solves - seeded

    at_once, worker = decisions(False), decisions(True)
    assert at_once == worker and worker[1] > 0  # it did solve new loads on the way


def test_the_daemon_runs_the_queue_planner_s_library_solves_on_its_worker(tmp_path):
    """``rlsched serve --policy queue-slo-offered`` decides with its library solving beside the loop."""
    from rlsched.daemon.config import DaemonConfig
    from rlsched.daemon.loop import Daemon

    config = DaemonConfig(scenario=TINY, backend="sim", policy="queue-slo-offered", cycles=4, metrics_addr=None,
                          perf_model="calibrated", source=str(tmp_path / "daemon.yaml"), logdir=str(tmp_path / "tb"))
    daemon = Daemon(config)
    assert daemon.run() == 0
    assert daemon.cycle == 4 and daemon.fallbacks == 0
    assert daemon.guard.policy.name == "queue-slo-offered" and daemon.guard.policy.library.worker is not None


def test_the_library_is_bounded_and_an_entry_dropped_for_room_is_solved_again(library, monkeypatch):
    import rlsched.agents.candidates as candidates

    monkeypatch.setattr(candidates, "MAX_LIBRARY_ENTRIES", 3)
    means = {t.name: t.arrivals.mean_rate_rps() for t in library.env.scenario.inference_tenants()}
    resnet, bert = means  # the tiny node's two services

    def load(a: float, b: float) -> list[dict[str, float]]:
        return [{resnet: means[resnet] * a, bert: means[bert] * b}] * MIGRATOR_LOOKAHEAD

    loads = [load(0.1, 4.0), load(4.0, 0.1), load(0.05, 0.05), load(6.0, 6.0)]  # four new bins, each a different configuration
    for windows in loads:  # one decision each
        library.request(windows)
        library.refresh()
        assert len(library.configurations) <= 3
        assert library.seen_bins == set().union(*library.bins)  # a bin asked for is held by an entry, or forgotten
    assert len(library.bins) == len(library.last_used) == len(library.configurations)
    first = loads[0]
    assert CandidateLibrary.bin_of(first) not in library.seen_bins  # dropped for room (never ranked in use)
    solves = library.solves
    library.request(first)
    assert library.solves == solves + 1  # asked again, solved again


def test_a_library_solving_from_the_running_configuration_plans_from_it_on_one_gpu(library, monkeypatch):
    env, planner = library.env, library.planner
    asked: list[object] = []
    plan = planner.plan
    monkeypatch.setattr(planner, "plan", lambda windows, current=None, *args, **kwargs: asked.append(current) or plan(windows, current, *args, **kwargs))
    library.request(_windows(library, 30.0))
    moving = CandidateLibrary(env, planner, from_running=True)
    moving.request(_windows(library, 30.0))
    assert asked == [None, env.current] and env.current is not None  # an entry for its load; a move from the running one


def test_only_a_decision_marks_library_entries_in_use(library):
    env = library.env
    library.refresh()
    marks = list(library.last_used)
    library.score(_windows(library, 1.0), env.current, {}, record_use=False)  # e.g. a training branch's look
    assert library.last_used == marks
    scored = library.score(_windows(library, 1.0), env.current, {})
    top = [repr(scored.configurations[i]) for i in np.argsort(-scored.objective, kind="stable")[:3]]
    marked = [repr(c) for c, used in zip(library.configurations, library.last_used, strict=True) if used == library.decisions]
    assert marked and set(marked) <= set(top)


def test_scores_put_the_running_configuration_first_at_no_cost_and_match_the_planner(library):
    env, planner = library.env, library.planner
    windows = _windows(library, 1.0)
    scored = library.score(windows, env.current, {})
    assert scored.configurations[0] == env.current and scored.cost[0] == 0.0
    for i, configuration in enumerate(scored.configurations):
        assert (scored.value[i], scored.cost[i]) == pytest.approx(planner.evaluate(configuration, windows, env.current))
    assert scored.objective[scored.best()] == scored.objective.max()


def test_scoring_several_forecasts_at_once_gives_each_forecast_s_own_scores(library):
    env = library.env
    forecasts = [_windows(library, 0.7), _windows(library, 1.9)]
    forecasts[0][0] = {n: r * 1.4 for n, r in forecasts[0][0].items()}  # a first window apart (a backlog)
    together = library.score_forecasts(forecasts, env.current, {}, record_use=False)
    for joint, windows in zip(together, forecasts, strict=True):
        alone = library.score(windows, env.current, {}, record_use=False)
        assert joint.configurations == alone.configurations
        assert np.array_equal(joint.value, alone.value) and np.array_equal(joint.cost, alone.cost)  # the same numbers, not close ones
    assert not np.array_equal(together[0].value, together[1].value)


def test_the_library_planner_runs_an_episode_on_two_node_shapes():
    for scenario in (TINY, TWO_GPUS):
        episode = run_episode(GpuShareEnv(scenario), "planner-library", seed=0)
        assert len(episode.configurations) == 6 and episode.goodput > 0
        assert episode.repaired == 0  # it applies configurations the planner produced: nothing to repair


def test_the_hurdle_library_moves_only_where_a_move_clears_its_payback_hurdle():
    from rlsched.agents.baselines import apply, make_policy

    def configurations(name: str, margin: float | None = None, steps: int = 15) -> list:
        env = GpuShareEnv("default")
        observation, _ = env.reset(seed=0)
        policy = make_policy(name)
        policy.reset(env)
        if margin is not None:
            policy.planner.value_model_error = margin  # the payback hurdle's margin (None: VALUE_MODEL_ERROR)
        ran = []
        for _ in range(steps):
            observation, _, _, _, _ = apply(env, policy.act(observation, env))
            ran.append(env.current)
        return ran

    def moves(ran: list) -> int:
        return sum(a != b for a, b in zip(ran, ran[1:]))

    plain = configurations("planner-library")
    assert moves(plain) >= 2
    assert configurations("planner-library-hurdle", margin=0.0) == plain  # no margin: no hurdle, the same choices
    assert moves(configurations("planner-library-hurdle", margin=100.0)) == 0  # no gain clears a 100x margin: it keeps
    hurdled = configurations("planner-library-hurdle")
    assert hurdled != plain and moves(hurdled) <= moves(plain)


def test_the_queue_slo_library_runs_an_episode_on_two_node_shapes():
    for scenario in (TINY, TWO_GPUS):
        episode = run_episode(GpuShareEnv(scenario), "queue-slo-library", seed=0)
        assert len(episode.configurations) == 6 and episode.goodput > 0
        assert episode.repaired == 0


def test_the_queue_slo_library_decides_first_as_its_planner_then_solves_only_new_loads_and_moves(monkeypatch):
    from rlsched.agents.baselines import apply, make_policy

    env, twin = GpuShareEnv("default"), GpuShareEnv("default")
    observation, _ = env.reset(seed=0)
    twin_observation, _ = twin.reset(seed=0)
    policy, planner = make_policy("queue-slo-library"), make_policy("migrator-queue-slo")
    policy.reset(env)
    planner.reset(twin)
    first = policy.act(observation, env)
    assert first == planner.act(twin_observation, twin)  # the node's first move is the MILP's
    observation, *_ = apply(env, first)
    seeded = list(policy.library.configurations)
    solves: list[object] = []
    monkeypatch.setattr(policy.library, "_solve", lambda windows, running, rate_cv=None: solves.append(rate_cv) or seeded[0])
    milp_answers: list[object] = []
    plan = policy.planner.plan

    def counted_plan(*args: object, **kwargs: object) -> object:
        answer = plan(*args, **kwargs)
        milp_answers.append(answer.configuration)
        return answer

    monkeypatch.setattr(policy.planner, "plan", counted_plan)
    seen = len(policy.library.seen_bins)
    statuses = []
    for _ in range(12):
        running, asked = env.current, len(milp_answers)
        decision = policy.act(observation, env)
        statuses.append(policy.last_plan.status)
        if policy.last_plan.status == "library":  # the library keeps: no MILP
            assert decision == running and len(milp_answers) == asked
        else:  # the library moves: checked against one MILP answer, which joins the library
            assert policy.last_plan.status == "library+milp" and len(milp_answers) == asked + 1
            milp = milp_answers[-1]
            assert (milp, None) in policy.library.pending
            objective, *_ = policy._objective([running, milp, decision], policy.planner.forecast(
                [policy.taken_in[1]] * policy.lookahead, observed_load(env)[1]), running, observed_load(env)[2])
            assert objective[2] >= objective[1] - 1e-6 * abs(objective[1])
        observation, *_ = apply(env, decision)
    assert {"library", "library+milp"} <= set(statuses)
    # One solve per load bin met for the first time, with the forecast's spread (the MILP's rate_cv).
    assert 1 <= len(solves) == len(policy.library.seen_bins) - seen
    assert all(isinstance(cv, dict) and set(cv) == set(policy.smoothed_rps) for cv in solves)


def test_the_offered_queue_slo_library_weighs_only_the_offered_candidates_and_solves_no_milp_to_decide(monkeypatch):
    from rlsched.agents.baselines import apply, make_policy
    from rlsched.agents import candidates as offering
    from rlsched.agents.baselines.planners import QueueSloLibrary

    offered_slots = 4  # fewer than default's candidates (12 or more), so that the offer cuts
    monkeypatch.setattr(offering, "CANDIDATES", offered_slots)
    env = GpuShareEnv("default")
    observation, _ = env.reset(seed=0)
    policy = make_policy("queue-slo-offered")
    policy.reset(env)
    observation, *_ = apply(env, policy.act(observation, env))  # the node's first move is the MILP's
    seeded = list(policy.library.configurations)
    monkeypatch.setattr(policy.library, "_solve", lambda windows, running, rate_cv=None: seeded[0])
    milp_answers: list[object] = []
    monkeypatch.setattr(policy.planner, "plan", lambda *args, **kwargs: milp_answers.append(args) or None)
    weighed: list[tuple[list, np.ndarray]] = []
    objective = policy._objective

    def recorded(candidates, *args):
        result = objective(candidates, *args)
        weighed.append((candidates, result[0]))
        return result

    monkeypatch.setattr(policy, "_objective", recorded)
    moves = 0
    for _ in range(12):
        running = env.current
        decision = policy.act(observation, env)
        candidates, values = weighed[-1]
        assert candidates[0] == running and len(candidates) <= offered_slots
        assert decision == candidates[int(np.argmax(values))]  # the daemon objective's best of the offered
        moves += decision != running
        observation, *_ = apply(env, decision)
    assert milp_answers == []  # no MILP in a decision: only the library's solves for new loads
    assert len(weighed) == 12 and moves >= 1
    # The whole candidate set is larger than what is offered: the plain model's ranking cut it.
    assert len(QueueSloLibrary._candidates(policy, env, env.current, policy.lookahead, observed_load(env)[1], {})) > offered_slots


def test_the_candidate_observation_has_the_same_size_on_any_node():
    shapes = set()
    for scenario in (TINY, TWO_GPUS):
        env = CandidateChoiceEnv(GpuShareEnv(scenario))
        observation, _ = env.reset(seed=0)
        assert env.observation_space.contains(observation)
        masks = env.action_masks()
        assert masks[0] and masks.sum() == len(env.offered) <= CANDIDATES
        shapes.add(observation.shape)
        rows = observation[: CANDIDATES * len(CANDIDATE_FEATURES)].reshape(CANDIDATES, len(CANDIDATE_FEATURES))
        assert rows[0, CANDIDATE_FEATURES.index("keep")] == 1.0 and rows[0, CANDIDATE_FEATURES.index("gain_ewma")] == 0.0
    assert shapes == {(CANDIDATES * len(CANDIDATE_FEATURES) + len(GLOBAL_FEATURES),)}


def test_a_masked_slot_keeps_the_running_configuration():
    env = CandidateChoiceEnv(GpuShareEnv(TINY))
    env.reset(seed=0)
    running = env.env.current
    _, _, _, _, info = env.step(CANDIDATES - 1 if len(env.offered) < CANDIDATES else 0)
    assert info["configuration"] == running


def test_the_scorer_starts_as_the_library_planner_and_is_permutation_equivariant():
    from sb3_contrib import MaskablePPO

    from rlsched.agents.ppo.candidate_policy import CandidateScorerPolicy

    env = CandidateChoiceEnv(GpuShareEnv(TINY))
    model = MaskablePPO(CandidateScorerPolicy, env, n_steps=6, batch_size=6, seed=0)
    observation, _ = env.reset(seed=0)
    done = False
    while not done:
        action, _ = model.predict(observation, action_masks=env.action_masks(), deterministic=True)
        assert int(action) == env.planner_choice()  # the warm start is built in
        observation, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    scorer = model.policy.mlp_extractor
    obs = torch.as_tensor(observation).unsqueeze(0)
    rows = obs[:, : CANDIDATES * len(CANDIDATE_FEATURES)].reshape(CANDIDATES, -1)
    permutation = torch.randperm(CANDIDATES, generator=torch.Generator().manual_seed(0))
    permuted = torch.cat([rows[permutation].reshape(1, -1), obs[:, CANDIDATES * len(CANDIDATE_FEATURES):]], dim=1)
    with torch.no_grad():
        assert torch.allclose(scorer.forward_actor(obs)[0, permutation], scorer.forward_actor(permuted)[0], atol=1e-5)
        assert torch.allclose(scorer.forward_critic(obs), scorer.forward_critic(permuted), atol=1e-5)
    model.learn(12)  # PPO updates run through the custom network
    assert np.isfinite(float(scorer.prior_weight.detach()))


def test_a_paired_advantage_is_zero_for_the_rule_and_leaves_the_episode_as_it_was():
    """The counterfactual branches run on copies of the node's state: the rule against itself
    is worth exactly 0, and an episode that measures departures on the way earns what the same
    episode without the measurements earns."""
    measured = CandidateChoiceEnv(GpuShareEnv(TINY), paired_horizon=3)
    plain = CandidateChoiceEnv(GpuShareEnv(TINY))
    measured.reset(seed=0)
    plain.reset(seed=0)
    done, advantages = False, []
    while not done:
        action = 0 if measured.planner_choice() != 0 else len(measured.offered) - 1  # depart from the rule
        rule = measured.observer.configuration(measured.planner_choice())
        assert measured.paired_advantage(rule, rule) == 0.0
        _, r_measured, _, truncated, info = measured.step(action)
        _, r_plain, _, _, _ = plain.step(action)
        assert r_measured == r_plain
        advantages.append(info["paired_advantage"])
        done = truncated
    assert any(a != 0.0 for a in advantages) and all(np.isfinite(advantages))


def test_through_the_daemon_observer_a_paired_advantage_is_what_the_two_courses_earn_apart():
    """A departure's paired advantage, measured in branches that copy ``queue-slo-offered`` as it
    stands, is the difference of what two whole episodes earn over the horizon: one departing
    at that step, one following the planner throughout (the library asking for no solves, as in
    the branches); and measuring it leaves the episode as it was."""
    horizon, depart_at, steps = 3, 2, 12

    def course(depart: bool, measure: bool) -> tuple[list[float], float]:
        env = CandidateChoiceEnv(GpuShareEnv(TINY), paired_horizon=horizon if measure else 0, observer="daemon")
        env.reset(seed=0)
        env.observer.library.frozen = True
        rewards, advantage = [], 0.0
        for step in range(steps):
            action = env.planner_choice()
            if depart and step == depart_at:
                action = int(np.flatnonzero(env.action_masks())[-1])
                assert action != env.planner_choice()
            decisions = env.observer.policy.library.decisions
            planner_keeps = env.observer.configuration(env.planner_choice()) == env.env.current
            _, reward, _, _, info = env.step(action)
            assert env.observer.policy.library.decisions == decisions + 1  # the branches decided on copies
            assert info["planner_keeps"] == planner_keeps
            rewards.append(reward)
            advantage = info["paired_advantage"] if step == depart_at else advantage
        return rewards, advantage

    departed, advantage = course(depart=True, measure=True)
    assert departed == course(depart=True, measure=False)[0]
    followed, _ = course(depart=False, measure=False)
    assert advantage != 0.0
    window = slice(depart_at, depart_at + horizon)
    assert advantage == pytest.approx(sum(departed[window]) - sum(followed[window]), rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("observer", ["plain", "daemon"])
def test_choosing_at_the_planner_s_moves_masks_all_but_the_planner_s_slot_where_it_keeps(observer):
    """With ``choose_at: planner-moves``, where the observer's planner moves the policy may
    choose any offered slot, and where it keeps only the planner's; following the planner, the
    episode is the one of choosing at every decision (``default``: both kinds of decision, with
    twelve slots offered, within eight intervals)."""
    from rlsched.workloads.scenario import load_scenario

    every, at_moves = [CandidateChoiceEnv(GpuShareEnv(load_scenario("default")), observer=observer, choose_at=where) for where in CHOOSE_AT]
    for env in (every, at_moves):
        env.reset(seed=0)
    moves = restricted = 0
    for _ in range(8):
        slot = every.planner_choice()
        assert at_moves.planner_choice() == slot and at_moves.env.current == every.env.current
        if every.observer.configuration(slot) == every.env.current:
            assert np.array_equal(at_moves.action_masks(), np.arange(CANDIDATES) == slot)
            restricted += int(every.action_masks().sum() > 1)
        else:
            assert np.array_equal(at_moves.action_masks(), every.action_masks())
            moves += int(every.action_masks().sum() > 1)
        for env in (every, at_moves):
            env.step(slot)
    assert moves and restricted


def test_choosing_only_at_choices_runs_the_episode_the_planner_runs_and_stops_only_where_a_choice_is_left():
    """With ``choices_only``, a step runs on to the next decision where the mask leaves more
    than one slot: following the planner, the episode earns what the step-by-step one earns,
    every step after the reset is a choice, and the rewards add up to the episode's from the
    first choice on (train-retrain cut to 30 intervals: queue-slo-offered offers a choice at
    three of them, two in a row)."""
    import dataclasses

    from rlsched.workloads.scenario import load_scenario

    scenario = load_scenario(Path(__file__).parents[1] / "configs/scenarios/suite/train-retrain.yaml")
    scenario = dataclasses.replace(scenario, duration_s=30 * scenario.decision_interval_s)
    every, choices = (CandidateChoiceEnv(GpuShareEnv(scenario), observer="daemon", choose_at="planner-moves", choices_only=flag)
                      for flag in (False, True))
    every.reset(seed=0)
    choices.reset(seed=0)
    to_first, done = 0.0, False
    while every.action_masks().sum() <= 1:  # the step-by-step episode's intervals before the first choice
        _, reward, _, _, _ = every.step(every.planner_choice())
        to_first += reward
    step_by_step, decisions_with_a_choice = 0.0, 1
    while not done:
        _, reward, terminated, truncated, _ = every.step(every.planner_choice())
        step_by_step += reward
        done = terminated or truncated
        decisions_with_a_choice += int(not done and every.action_masks().sum() > 1)
    summed, steps, done = 0.0, 0, False
    while not done:
        assert choices.action_masks().sum() > 1
        _, reward, terminated, truncated, _ = choices.step(choices.planner_choice())
        summed += reward
        steps += 1
        done = terminated or truncated
    assert steps == decisions_with_a_choice >= 2
    assert choices.env.objective == pytest.approx(every.env.objective, rel=1e-12)
    assert summed == pytest.approx(step_by_step, rel=1e-9)


def test_branches_that_follow_the_policy_price_a_departure_as_the_policy_repeats_it():
    """``set_branch_policy``: a slot's branch follows the policy's deterministic choice where
    it chooses, not the planner. The warm-start scorer (the planner's choice) measures every
    slot exactly as the planner's branches do; a policy that keeps wherever it may prices the
    keeping slot as kept throughout, not once. The episode goes on as it was either way; the
    plain observer, whose state a branch cannot copy, refuses."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlsched.agents.ppo.candidate_policy import CANDIDATE_LAYOUTS, CandidateScorerPolicy
    from rlsched.agents.ppo.expected_ppo import ExpectedPPO
    from rlsched.workloads.scenario import load_scenario

    env = CandidateChoiceEnv(GpuShareEnv(load_scenario("default")), observer="daemon", choose_at="planner-moves",
                             choices_only=True, paired_horizon=6, action_advantages=True)
    warm_start = ExpectedPPO(CandidateScorerPolicy, DummyVecEnv([lambda: env]), device="cpu",
                             policy_kwargs={"hidden": 8, "prior_weight": 20.0, "learn_prior": False, "layout": CANDIDATE_LAYOUTS["daemon"]})
    env.reset(seed=0)
    keep = 0
    assert env.action_masks()[keep] and env.observer.configuration(keep) != env.observer.configuration(env.planner_choice())
    planner_followed = env.slot_advantages()
    env.set_branch_policy(warm_start.policy)
    assert np.array_equal(env.slot_advantages(), planner_followed)
    env.branch_choose = lambda observation, masks: keep
    kept_throughout = env.slot_advantages()
    assert kept_throughout[keep] != pytest.approx(planner_followed[keep], abs=1e-6)
    env.set_branch_policy(None)
    assert np.array_equal(env.slot_advantages(), planner_followed)  # the episode's state was restored each time
    with pytest.raises(ValueError, match="daemon observer"):
        CandidateChoiceEnv(GpuShareEnv(TINY)).set_branch_policy(warm_start.policy)


def test_every_slot_s_advantage_is_its_paired_advantage_over_the_planner_s_choice():
    """``slot_advantages`` measures each unmasked slot as ``paired_advantage`` does, the
    planner's own slot and the masked ones at 0; a step with ``action_advantages`` reports
    them, the chosen slot's as its ``paired_advantage``, and earns what a step without them
    earns (the branches leave the episode as it was)."""
    from rlsched.workloads.scenario import load_scenario

    measured, plain = (CandidateChoiceEnv(GpuShareEnv(load_scenario("default")), observer="daemon", choose_at="planner-moves",
                                          choices_only=True, paired_horizon=3, action_advantages=flag) for flag in (True, False))
    measured.reset(seed=0)
    plain.reset(seed=0)
    masks, planned_slot = measured.action_masks(), measured.planner_choice()
    planned = measured.observer.configuration(planned_slot)
    advantages = measured.slot_advantages()
    for slot in range(CANDIDATES):
        configuration = measured.observer.configuration(slot)
        expected = measured.paired_advantage(configuration, planned) if masks[slot] and configuration != planned else 0.0
        assert advantages[slot] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert advantages[planned_slot] == 0.0 and np.count_nonzero(advantages) >= 2
    departure = int(np.argmax(np.where(masks & (np.arange(CANDIDATES) != planned_slot), np.abs(advantages), -1.0)))
    _, reward, _, _, info = measured.step(departure)
    _, reward_plain, _, _, _ = plain.step(departure)
    assert np.array_equal(info[ACTION_ADVANTAGES_KEY], advantages)
    assert info["paired_advantage"] == advantages[departure] != 0.0
    assert reward == reward_plain
    with pytest.raises(ValueError, match="paired_horizon"):
        CandidateChoiceEnv(GpuShareEnv(TINY), action_advantages=True)


def four_kinds_scenario(tmp_path: Path) -> str:
    """The tiny node with a retraining job and a best-effort job added: every tenant kind of
    :data:`~rlsched.agents.ppo.candidate_env.TENANT_KINDS` on one GPU, one minute long."""
    import yaml

    spec = yaml.safe_load(Path(TINY).read_text())
    spec["tenants"] += [{"name": "retrain-resnet", "kind": "continual-learning", "serves": "resnet", "model": "resnet50", "restart_s": 10.0,
                         "ekya": {"b0": 0.5, "b1": 2.0, "b2": 0.05}, "samples_per_unit": 3000, "drift_window_s": 120},
                        {"name": "tune-bert", "kind": "best-effort", "model": "bert-base", "restart_s": 8.0}]
    spec.pop("reference")
    path = tmp_path / "four-kinds.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_the_daemon_tenants_observer_adds_each_slot_per_tenant_kind_to_what_the_daemon_observer_sees(tmp_path):
    """Through ``daemon-tenants`` a slot's row is the ``daemon`` observer's, then per tenant kind
    its gain (summing to the slot's gain: the daemon objective apart by tenant) and the share
    of that kind's tenants it moves; on a node with every kind, over a 6-interval episode."""
    from rlsched.agents.ppo.candidate_env import DAEMON_CANDIDATE_FEATURES, FEATURE_LIMIT, OBSERVER_FEATURES, TENANT_KINDS, tenant_kind, tenant_moves

    scenario = four_kinds_scenario(tmp_path)
    kinds, plain = CandidateChoiceEnv(GpuShareEnv(scenario), observer="daemon-tenants"), CandidateChoiceEnv(GpuShareEnv(scenario), observer="daemon")
    wide, narrow = len(OBSERVER_FEATURES["daemon-tenants"]), len(DAEMON_CANDIDATE_FEATURES)
    assert kinds.observation_space.shape == (CANDIDATES * wide + len(GLOBAL_FEATURES),)
    assert [tenant_kind(t) for t in kinds.env.scenario.tenants] == ["high", "inference", "retraining", "best_effort"]
    seen, observed = (kinds.reset(seed=0)[0], plain.reset(seed=0)[0])
    weighed = 0
    done = False
    while not done:
        rows, narrow_rows = seen[: CANDIDATES * wide].reshape(CANDIDATES, wide), observed[: CANDIDATES * narrow].reshape(CANDIDATES, narrow)
        assert np.array_equal(rows[:, :narrow], narrow_rows) and np.array_equal(seen[CANDIDATES * wide:], observed[CANDIDATES * narrow:])
        offered = len(kinds.observer.candidates)
        gains, moved = rows[:, narrow: narrow + len(TENANT_KINDS)], rows[:, narrow + len(TENANT_KINDS):]
        gain = rows[:, DAEMON_CANDIDATE_FEATURES.index("gain")]
        unclipped = (np.abs(gains) < FEATURE_LIMIT).all(axis=1) & (np.abs(gain) < FEATURE_LIMIT)
        np.testing.assert_allclose(gains.sum(axis=1)[unclipped], gain[unclipped], rtol=1e-4, atol=1e-5)
        assert not rows[0, narrow:].any() and not rows[offered:].any()  # keeping moves no one and gains nothing
        names = [t.name for t in kinds.env.scenario.tenants]  # one per kind, in TENANT_KINDS' order
        assert np.array_equal(moved[:offered], [[tenant_moves(c, kinds.env.current, n) for n in names] for c in kinds.observer.candidates])
        weighed += int(unclipped[1:offered].sum())
        slot = kinds.planner_choice()
        assert plain.planner_choice() == slot
        seen, _, _, done, _ = kinds.step(slot)
        observed, *_ = plain.step(slot)
    assert weighed >= 5  # slots whose sum was checked


def test_the_high_priority_guard_offers_only_slots_as_good_for_the_high_priority_tenants_as_the_planner_s():
    """Under the guard a daemon observer's policy may choose an offered slot only if its
    ``gain_high`` (the feature ``daemon-tenants`` shows) is at least the planner's choice's:
    the planner's slot always, slots that restart the high-priority tenant where the planner
    does not, never. Without the guard every offered slot stays open. On ``default``, where the
    planner keeps resnet and many slots move it."""
    from rlsched.agents.ppo.candidate_env import DAEMON_CANDIDATE_FEATURES, OBSERVER_FEATURES

    guarded, open_ = (CandidateChoiceEnv(GpuShareEnv("default"), observer="daemon-tenants") for _ in range(2))
    column = len(DAEMON_CANDIDATE_FEATURES)  # gain_high, the first per-kind feature
    width = len(OBSERVER_FEATURES["daemon-tenants"])
    seen, _ = guarded.reset(seed=0)
    open_.reset(seed=0)
    guarded.observer.high_priority_guard = True
    closed = kept_open = 0
    for _ in range(8):
        offered = len(guarded.observer.candidates)
        gain_high = seen[: CANDIDATES * width].reshape(CANDIDATES, width)[:offered, column]
        slot = guarded.planner_choice()
        masks = guarded.action_masks()
        assert masks[slot] and not masks[offered:].any()
        assert np.array_equal(masks[:offered], gain_high >= gain_high[slot] - 1e-6)
        assert np.array_equal(open_.action_masks(), np.arange(CANDIDATES) < offered)
        closed += offered - int(masks.sum())
        kept_open += int(masks.sum()) - 1
        seen, *_ = guarded.step(slot)
        open_.step(slot)
    assert closed > 0 and kept_open > 0  # the guard closed some slots and left others beside the planner's
