"""The environment rlsched/GpuShare-v0: API checkers, executable actions, reward = objective."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import rlsched.envs
from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.envs.actions import BATCH_LEVELS, COMPONENTS
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.hardware import parse_layout
from rlsched.solver import feasibility_problems
from rlsched.workloads.scenario import scenarios_dir

TINY = str(Path(__file__).parent / "data" / "env_tiny.yaml")


@pytest.fixture(scope="module")
def env() -> GpuShareEnv:
    return GpuShareEnv(TINY, perf_model="calibrated")


def test_make_by_name_registers_time_limit_and_spaces():
    env = gym.make(rlsched.envs.ENV_ID, scenario="default")
    assert env.spec.max_episode_steps == rlsched.envs.MAX_EPISODE_STEPS
    inner = env.unwrapped
    tenants = len(inner.scenario.tenants)
    assert env.action_space.shape == (tenants * len(COMPONENTS),)
    obs, info = env.reset(seed=1)
    assert env.observation_space.contains(obs) and obs.dtype == np.float32
    assert info["layout"] == ("2g.10gb@0,2g.10gb@2,2g.10gb@4,1g.5gb@6",)  # the scenario's reference


@pytest.mark.parametrize("name", sorted(p.stem for p in scenarios_dir().glob("*.yaml")))
def test_every_shipped_scenario_runs_random_actions(name):
    env = GpuShareEnv(name)
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(2):
        obs, reward, _, _, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs) and math.isfinite(reward)
        assert info["configuration"].problems(env.tenant_names) == []


def test_make_by_yaml_path():
    env = gym.make(rlsched.envs.ENV_ID, scenario=TINY)
    assert env.unwrapped.scenario.name == "env-tiny"


@pytest.mark.parametrize("scenario", ["default", TINY])
def test_gymnasium_checker_zero_warnings(scenario):
    """The env as users build it, with wall-clock repair timings running (they are kept out
    of ``info``, which the checker compares between two steps from one seed)."""
    from gymnasium.utils.env_checker import check_env

    # Unwrapped, made by gym.make so that it has its spec (the checker needs it to test the
    # render modes) ...
    env = gym.make(rlsched.envs.ENV_ID, scenario=scenario)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        check_env(env.unwrapped, skip_render_check=False)
    assert [str(w.message) for w in record] == []
    # ... and wrapped: the checker's one warning then is that it was given a wrapper.
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=False)
    assert [str(w.message) for w in record if "is different from the unwrapped version" not in str(w.message)] == []


@pytest.mark.parametrize("scenario", ["default", TINY])
def test_sb3_checker_zero_warnings(scenario):
    from stable_baselines3.common.env_checker import check_env

    env = gym.make(rlsched.envs.ENV_ID, scenario=scenario)
    for candidate in (env.unwrapped, env):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            check_env(candidate, warn=True)
        assert [str(w.message) for w in record] == []


def test_repair_wall_time_is_kept_beside_info():
    env = GpuShareEnv(TINY)
    env.reset(seed=0)
    _, _, _, _, info = env.step(env.action_space.sample())
    assert not any("ms" in key.split("_") for key in info)  # no timing in info
    first = env.last_repair_ms
    env.step_configuration(env.scenario.reference)
    count, sum_ms, max_ms = env.take_repair_timing()
    assert first > 0.0 and count == 2 and sum_ms == pytest.approx(first + env.last_repair_ms) and max_ms == max(first, env.last_repair_ms)
    assert env.take_repair_timing() == (0, 0.0, 0.0)


def _random_actions_are_applied(env: GpuShareEnv, count: int, seed: int) -> None:
    env.action_space.seed(seed)
    env.reset(seed=seed)
    names = env.tenant_names
    for _ in range(count):
        action = env.action_space.sample()
        _, reward, terminated, truncated, info = env.step(action)
        config = info["configuration"]
        assert config.problems(names) == []
        assert config is env.backend.simulator._config  # applied, exactly this one
        problem = env.codec.with_smallest_batches(env.codec.decode(action).problem) if info["repair_fallback"] else env.codec.decode(action).problem
        assert feasibility_problems(config, problem) == []  # memory and shares fit too
        assert math.isfinite(reward) and not terminated
        if truncated:
            env.reset()


def test_ten_thousand_random_actions_all_feasible(env):
    # Each action is repaired (about 1 ms with the exact layout search): 10,000 take ~11 s.
    # scripts/bench_env.py runs the 100,000 of the benchmark.
    _random_actions_are_applied(env, 10_000, seed=11)


def test_reward_sum_is_the_episode_objective():
    env = gym.make(rlsched.envs.ENV_ID, scenario=TINY)
    env.reset(seed=3)
    env.action_space.seed(3)
    total, steps, truncated = 0.0, 0, False
    while not truncated:
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert not terminated
        terms = info["goodput/goodput"] + info["goodput/best_effort_progress"] - info["goodput/slo_penalty"] - info["goodput/reconfiguration_cost"]
        assert reward == pytest.approx(terms) == pytest.approx(info["goodput/total"])
        total += reward
        steps += 1
    assert steps == env.unwrapped.scenario.steps == 6  # the scenario's duration ends the episode
    assert total == pytest.approx(env.unwrapped.objective, rel=1e-12)
    assert total != 0.0


def test_seeding_is_deterministic():
    def rollout(seed: int) -> tuple[list[np.ndarray], list[float]]:
        env = GpuShareEnv(TINY)
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(0)
        observations, rewards = [obs], []
        for _ in range(4):
            obs, reward, *_ = env.step(env.action_space.sample())
            observations.append(obs)
            rewards.append(reward)
        return observations, rewards

    a, b, c = rollout(5), rollout(5), rollout(6)
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0], strict=True)) and a[1] == b[1]
    assert a[1] != c[1]  # another seed, other arrivals


def test_backend_seed_replays_an_episode():
    a, b = GpuShareEnv(TINY), GpuShareEnv(TINY)
    a.reset(seed=9)
    b.reset(seed=1, options={"backend_seed": a.backend_seed})
    action = np.zeros(a.action_space.shape, dtype=np.int64)
    assert [a.step(action)[1] for _ in range(3)] == [b.step(action)[1] for _ in range(3)]
    with pytest.raises(ConfigError, match="backend_seed"):
        a.reset(options={"backend_seed": "x"})


def test_masks_cover_every_level_and_masked_levels_still_execute(env):
    masks = env.action_masks()
    assert masks.shape == (int(env.action_space.nvec.sum()),) and masks.dtype == bool
    # resnet (tenant 0) has max_batch 16: batch levels 32 and 64 are masked, bert's 64 too.
    nvec = env.codec.nvec_per_tenant
    resnet_batch = masks[int(nvec[:4].sum()) : int(nvec.sum())]
    assert resnet_batch.tolist() == [b <= 16 for b in BATCH_LEVELS]
    env.reset(seed=0)
    action = np.zeros(env.action_space.shape, dtype=np.int64)
    action[4] = len(BATCH_LEVELS) - 1  # batch 64 for resnet: masked
    _, _, _, _, info = env.step(action)
    assert info["clamped"] == {"resnet": ["batch"]} and info["repaired"]
    assert info["placements"]["resnet"]["batch_size"] == 16


def test_exact_feasible_configuration_is_applied_unrepaired(env):
    env.reset(seed=0)
    reference = env.scenario.reference
    _, _, _, _, info = env.step_configuration(reference)
    assert not info["repaired"] and info["repair_distance"] == 0.0 and info["configuration"] == reference
    # Both tenants at 80% of one GI: shares sum to 160%, the ILP repairs it.
    layout = parse_layout("7g.40gb@0", "a100-40gb")
    crowded = Configuration((layout,), ((SharingMode.MPS,),), {n: TenantPlacement(0, 0, 80.0, 8) for n in env.tenant_names})
    _, _, _, _, info = env.step_configuration(crowded)
    assert info["repaired"] and info["configuration"].problems(env.tenant_names) == []


@pytest.mark.parametrize(
    ("action", "field"),
    [
        (np.zeros(3, dtype=np.int64), "shape"),
        (np.full(10, np.nan), "[0] (tenant 'resnet', size)"),
        (np.array([0, 0, 0, 0, 99, 0, 0, 0, 0, 0]), "[4] (tenant 'resnet', batch)"),
        (np.array([0, 0, 0, 0, 0, 0, 0, -1, 0, 0]), "[7] (tenant 'bert', gpu)"),
    ],
)
def test_bad_action_names_field_and_value(env, action, field):
    env.reset(seed=0)
    with pytest.raises(ConfigError) as excinfo:
        env.step(action)
    assert excinfo.value.field == field


def test_unknown_scenario_and_backend_are_clear_errors():
    with pytest.raises(ConfigError, match="no-such-scenario"):
        GpuShareEnv("no-such-scenario")
    with pytest.raises(ConfigError, match="backend.*'gpu9'"):
        GpuShareEnv(TINY, backend="gpu9")


def test_maskable_ppo_learns_a_few_steps():
    from sb3_contrib import MaskablePPO

    env = GpuShareEnv(TINY)
    model = MaskablePPO("MlpPolicy", env, n_steps=12, batch_size=12, n_epochs=1, policy_kwargs={"net_arch": [8]}, seed=0, device="cpu")
    model.learn(total_timesteps=12)
    action, _ = model.predict(env.reset(seed=0)[0], action_masks=env.action_masks())
    assert env.action_space.contains(action)


def test_policy_outputs_with_missing_or_unknown_tenants_are_clear_errors(env):
    env.reset(seed=0)
    reference = env.scenario.reference
    partial = Configuration(reference.layouts, reference.modes, {"resnet": reference.placements["resnet"]})
    with pytest.raises(ConfigError, match="'bert'.*every tenant needs a placement"):
        env.step_configuration(partial)
    extra = Configuration(reference.layouts, reference.modes, {**reference.placements, "ghost": reference.placements["bert"]})
    with pytest.raises(ConfigError, match="'ghost'.*unknown tenant"):
        env.step_configuration(extra)
    with pytest.raises(ConfigError, match="'resnet'.*every tenant needs a request"):
        env.step_requests({})


def test_load_features_are_arrival_rates_in_whole_gpus(env):
    from rlsched.workloads.tenants import InferenceTenant

    env.reset(seed=0)
    observation, *_ = env.step(env.action_space.sample())
    names = env.encoder.names()
    measured = env.backend.observe()
    checked = 0
    for t in env.scenario.tenants:
        if not isinstance(t, InferenceTenant):
            continue
        capacity = env.backend.perf_model.predict(env.scenario.gpu, t.model, t.max_batch).throughput_per_s
        assert capacity > 0
        for feature, key in (("load", "arrival_rate_rps"), ("load_ewma", "arrival_rate_ewma_rps")):
            expected = min(1.0, measured[t.name][key] / capacity)
            assert observation[names.index(f"{t.name}/{feature}")] == pytest.approx(expected, rel=1e-5, abs=1e-6)
            checked += expected > 0
    assert checked > 0  # some tenant saw arrivals


def test_repaired_configuration_is_what_the_step_applies_without_applying_it():
    env = GpuShareEnv(TINY, perf_model="toy")
    env.reset(seed=0)
    env.action_space.seed(0)
    for action in [env.action_space.sample() for _ in range(3)] + [np.zeros(env.action_space.shape, dtype=np.int64)]:
        running = env.current
        preview = env.repaired_configuration(action)
        assert env.current == running  # nothing applied
        env.step(action)
        assert env.current == preview
    configuration = env.current
    assert env.repaired_configuration(configuration) == configuration  # an executable configuration stays as it is


def test_activity_windows_show_in_info_and_leave_the_observation_vector_alone():
    """The shipped policy reads a fixed-size vector: a tenant's activity is in ``info`` and the
    backend's measurements, never an extra feature."""
    import dataclasses

    from rlsched.workloads.scenario import load_scenario

    plain = load_scenario(TINY)
    tenants = [dataclasses.replace(t, active_windows_s=((20.0, 40.0),)) if t.name == "bert" else t for t in plain.tenants]
    env = GpuShareEnv(dataclasses.replace(plain, tenants=tenants))
    assert env.observation_space == GpuShareEnv(plain).observation_space
    env.reset(seed=0)
    reference = env.scenario.reference
    active, measured = [], []
    for _ in range(5):
        _, _, _, _, info = env.step_configuration(reference)
        active.append(info["active_tenants"])
        measured.append(env.backend.observe()["bert"]["active"])
    # After each step: the tenants active at its end, i.e. at the next decision (10 s .. 50 s).
    assert active == [["resnet"], ["resnet", "bert"], ["resnet", "bert"], ["resnet"], ["resnet"]]
    assert measured == [0.0, 1.0, 1.0, 0.0, 0.0]
