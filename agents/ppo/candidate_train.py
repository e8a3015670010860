"""Training ``candidate-ppo``: MaskablePPO on which candidate configuration a node applies (``rlsched train``).

A config with a ``candidate_choice:`` section (``configs/train/candidate_ppo.yaml``) runs here:

1. one :class:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv` per training scenario
   (node shapes, GPU types and traffic differ; the observation does not), each keeping its
   candidate library across episodes; every episode starts on a scenario drawn at random
   (:class:`ScenarioMixEnv`), ``n_envs`` of them stepped in parallel processes;
2. MaskablePPO with :class:`~rlsched.agents.ppo.candidate_policy.CandidateScorerPolicy`: its
   prior is the planner's predicted gain, so before any update the deterministic policy is the
   library planner (``planner-library``; with ``observer: daemon``, ``queue-slo-offered``), and
   PPO learns a residual;
3. before training, the validation episodes (the training scenarios at seeds not trained on)
   are run with ``migrator-ilp`` and ``static-best`` (the learning curve's reference lines);
   every ``eval_freq`` steps the deterministic policy runs them on the request-level
   simulator, the figures go to TensorBoard and the best model is kept (step 0 is the warm
   start, exported as ``<run>/warm_start.onnx`` for the ablation);
4. the best model is exported to ``<run>/policy.onnx`` with its metadata (PPO steps, training
   scenarios, the config), and the learning curve is drawn (``<run>/learning_curve.png``,
   also in TensorBoard).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import yaml
from stable_baselines3.common.callbacks import BaseCallback

from rlsched.agents.ppo.config import _section, read_yaml_config
from rlsched.agents.ppo.expert_train import (CONFIG_KEY, POLICY_FILE, STEPS_KEY, ChoiceRunConfig, PeriodicValidation, export_scorer, has_section,
                                             plot_curve, scorer_model)
from rlsched.errors import ConfigError
from rlsched.fileio import write_text_atomically

#: Seeds of the training episodes are drawn below this (validation seeds must not be).
TRAINING_SEED_RANGE = 1_000_000


@dataclass
class CandidateChoiceConfig:
    """What ``candidate-ppo`` is trained on and how (the ``candidate_choice:`` section)."""

    scenarios: tuple[str, ...] = ("default",)
    """training scenarios: bundled names or YAML paths, each optionally followed by
    ``@TENANT=TRACE[:SCALE[:WARP]]`` trace overrides; none may be a held-out one"""
    validation_seeds: tuple[int, ...] = (1_000_003,)
    """episodes per training scenario the periodic validation runs on (at or above
    :data:`TRAINING_SEED_RANGE`, so never trained on)"""
    prior_weight: float = 20.0
    """weight of the planner's predicted gain in each slot's score (fixed: PPO moves the policy
    through the per-slot residual only, state by state)"""
    hidden: int = 64
    """width of the scorer's per-slot MLP and of its critic"""
    paired_horizon: int = 0
    """> 0: paired advantages: every step departing from the library planner's choice gets
    the exact counterfactual advantage over this many intervals
    (:meth:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv.paired_advantage`), the
    others none (:class:`PairedCandidateAdvantages`); 0: PPO's own (GAE) estimate"""
    surrogate_episodes: int = 0
    """> 0: PPO trains on the tabulated surrogate
    (:class:`~rlsched.agents.ppo.surrogate.SurrogateChoiceEnv`), recorded first from this many
    episodes of each training scenario (``<run>/surrogate/``, reused when there); 0: on the
    request-level simulator. Validation runs on the request-level simulator either way."""
    surrogate_steps: int = 60
    """decisions per surrogate training episode, from a random start"""
    observer: str = "plain"
    """what the policy observes and chooses among (``plain``: the library planner's model and
    library, the warm start ``planner-library``; ``daemon``: the daemon planner's objective on
    ``queue-slo-offered``'s offered slots, the warm start ``queue-slo-offered``;
    ``daemon-tenants``: ``daemon`` with each slot described per tenant kind too; see
    :data:`~rlsched.agents.ppo.candidate_env.OBSERVERS`)"""
    choose_at: str = "every-decision"
    """where the policy chooses (:data:`~rlsched.agents.ppo.candidate_env.CHOOSE_AT`):
    ``every-decision``, or ``planner-moves`` (where the planner keeps, the policy keeps too:
    PPO then learns which move, or none, where the planner moves). Recorded in the file's
    ``choose_at`` metadata, so that deployment masks the same way."""
    expected_ppo: bool = False
    """PPO's clipped objective in expectation over every action, from every action's paired
    advantage over ``paired_horizon`` intervals (:class:`~rlsched.agents.ppo.expected_ppo.ExpectedPPO`),
    on the surrogate or, with ``choose_at: planner-moves``, on the request-level simulator
    (there a choice measures all its slots' branches: about 12 x ``paired_horizon`` intervals,
    at about 4% of intervals); False: MaskablePPO's one-sample estimate"""
    advantage_replay: int = 0
    """with ``expected_ppo``: each PPO update also trains on this many earlier rollouts' choices,
    with the advantages recorded there (:class:`~rlsched.agents.ppo.expected_ppo.ExpectedPPO`;
    with ``branch_follow: planner`` sound because those are the planner's advantages, whichever
    policy visited the state; with ``policy`` they are earlier policies'); 0: none"""
    branch_follow: str = "planner"
    """what each slot's branch follows after its first configuration
    (:data:`~rlsched.agents.ppo.candidate_env.BRANCH_FOLLOW`): ``planner`` (the observer's
    planner), or ``policy``: the policy being trained, as it stood at the rollout's start
    (its deterministic choice where it chooses; :class:`BranchPolicySync`). With ``policy`` a
    slot's advantage prices a departure as the policy would repeat it, and advantages replayed
    from earlier rollouts (``advantage_replay``) are those earlier policies'. Needs
    ``expected_ppo`` on the simulator with the daemon observer."""
    high_priority_guard: bool = False
    """with a daemon observer: the policy may choose only the slots the daemon objective rates
    as good for the high-priority tenants as the planner's choice
    (:class:`~rlsched.agents.ppo.candidate_env.DaemonObserver`), in training, validation and
    deployment alike (the file's ``high_priority_guard`` metadata)"""
    min_departure_probability: float = 0.0
    """in [0, 1): written into the file's ``min_departure_probability`` metadata, where
    deployment lets the planner take over from a departure the network gives less softmax
    probability than this (:class:`~rlsched.agents.candidate_ppo.CandidatePpo`); training and
    its validation do not read it. 0: the network's choice always stands"""
    choice_validation_seeds: tuple[int, ...] = ()
    """seeds (each at or above :data:`TRAINING_SEED_RANGE`) of one warm-start episode per
    training scenario whose choices (the planner's moves) are recorded once, with every offered
    slot's paired advantage (``<run>/choice_validation.npz``, :func:`record_choices`). Each
    validation then also scores the deterministic policy's slot at each of them
    (:func:`choice_scores`: ``validation/choice_advantage`` and the shares that depart and
    lose). Needs ``choose_at: planner-moves`` and ``paired_horizon`` > 0 on the simulator.
    Why: nine episodes' Goodput could not tell checkpoints apart (stop 85), while advantages on
    other seeds' recorded choices told what a fitted scorer had learned (stop 87)."""


@dataclass
class CandidateTrainConfig(ChoiceRunConfig):
    """One ``candidate-ppo`` training run (``rlsched train --config FILE``)."""

    candidate_choice: CandidateChoiceConfig = field(default_factory=CandidateChoiceConfig)
    """the training scenarios and the policy's shape"""
    n_envs: int = 2
    """environments stepped in parallel, one process each (1: in this process)"""


def is_candidate_config(path: str | Path) -> bool:
    """True when the training config at ``path`` is a ``candidate-ppo`` one (has ``candidate_choice:``)."""
    return has_section(path, "candidate_choice")


def load_candidate_config(path: str | Path) -> CandidateTrainConfig:
    """Read and check a ``candidate-ppo`` training config (errors name the file, field and value)."""
    from rlsched.agents.experts import scenario_of
    from rlsched.agents.ppo.candidate_env import BRANCH_FOLLOW, CHOOSE_AT, DAEMON_OBSERVERS, OBSERVERS

    path = Path(path)
    config: CandidateTrainConfig = _section(str(path), "", CandidateTrainConfig, read_yaml_config(path))
    config.check(path)
    choice = config.candidate_choice
    if not choice.scenarios:
        raise ConfigError(path, "candidate_choice.scenarios", [], "name at least one training scenario")
    if not choice.validation_seeds:
        raise ConfigError(path, "candidate_choice.validation_seeds", [], f"name at least one, each >= {TRAINING_SEED_RANGE}")
    for field in ("validation_seeds", "choice_validation_seeds"):
        seeds = list(getattr(choice, field))
        if any(s < TRAINING_SEED_RANGE for s in seeds):
            raise ConfigError(path, f"candidate_choice.{field}", seeds, f"each must be >= {TRAINING_SEED_RANGE} (training episodes draw their seeds below it)")
    if choice.paired_horizon < 0:
        raise ConfigError(path, "candidate_choice.paired_horizon", choice.paired_horizon, "must be >= 0 (0: GAE)")
    if choice.surrogate_episodes < 0:
        raise ConfigError(path, "candidate_choice.surrogate_episodes", choice.surrogate_episodes, "must be >= 0 (0: train on the simulator)")
    if choice.surrogate_steps <= 0:
        raise ConfigError(path, "candidate_choice.surrogate_steps", choice.surrogate_steps, "must be > 0")
    if choice.expected_ppo and not (choice.paired_horizon and (choice.surrogate_episodes or choice.choose_at == "planner-moves")):
        raise ConfigError(path, "candidate_choice.expected_ppo", True,
                          "needs paired_horizon > 0, and the surrogate (surrogate_episodes > 0) or choose_at planner-moves "
                          "(on the simulator at every decision each step would measure every slot's branches)")
    if choice.advantage_replay < 0:
        raise ConfigError(path, "candidate_choice.advantage_replay", choice.advantage_replay, "expected an integer >= 0")
    if choice.advantage_replay and not choice.expected_ppo:
        raise ConfigError(path, "candidate_choice.advantage_replay", choice.advantage_replay,
                          "needs expected_ppo: true (only every action's advantages stay true under a later policy)")
    if choice.choice_validation_seeds and (choice.choose_at != "planner-moves" or not choice.paired_horizon or choice.surrogate_episodes):
        raise ConfigError(path, "candidate_choice.choice_validation_seeds", list(choice.choice_validation_seeds),
                          "needs choose_at planner-moves and paired_horizon > 0 on the simulator (surrogate_episodes 0)")
    if choice.observer not in OBSERVERS:
        raise ConfigError(path, "candidate_choice.observer", choice.observer, f"expected one of {', '.join(OBSERVERS)}")
    if choice.observer != "plain" and choice.surrogate_episodes:
        raise ConfigError(path, "candidate_choice.surrogate_episodes", choice.surrogate_episodes,
                          f"the surrogate tabulates the plain observer only; set 0 with observer {choice.observer}")
    if choice.branch_follow not in BRANCH_FOLLOW:
        raise ConfigError(path, "candidate_choice.branch_follow", choice.branch_follow, f"expected one of {', '.join(BRANCH_FOLLOW)}")
    if choice.branch_follow == "policy" and not (choice.expected_ppo and choice.observer in DAEMON_OBSERVERS and not choice.surrogate_episodes):
        raise ConfigError(path, "candidate_choice.branch_follow", choice.branch_follow,
                          f"needs expected_ppo: true and observer {' or '.join(DAEMON_OBSERVERS)} on the simulator (surrogate_episodes 0)")
    if choice.high_priority_guard and choice.observer not in DAEMON_OBSERVERS:
        raise ConfigError(path, "candidate_choice.high_priority_guard", choice.high_priority_guard,
                          f"needs observer {' or '.join(DAEMON_OBSERVERS)}, not {choice.observer}")
    if not 0.0 <= choice.min_departure_probability < 1.0:
        raise ConfigError(path, "candidate_choice.min_departure_probability", choice.min_departure_probability, "expected a number in [0, 1)")
    if choice.choose_at not in CHOOSE_AT:
        raise ConfigError(path, "candidate_choice.choose_at", choice.choose_at, f"expected one of {', '.join(CHOOSE_AT)}")
    if choice.choose_at != "every-decision" and choice.surrogate_episodes:
        raise ConfigError(path, "candidate_choice.surrogate_episodes", choice.surrogate_episodes,
                          f"the surrogate's masks are every decision's; set 0 with choose_at {choice.choose_at}")
    if choice.prior_weight <= 0:
        raise ConfigError(path, "candidate_choice.prior_weight", choice.prior_weight, "must be > 0 (the warm start is the planner's choice)")
    for spec in choice.scenarios:
        scenario_of(spec, f"{path}: candidate_choice.scenarios")  # bad scenarios and traces fail before any work
    return config


class ScenarioMixEnv(gym.Env[np.ndarray, np.int64]):
    """Several candidate-choice environments behind one: each episode runs on one of them,
    drawn at random. Their observation and action spaces are the same whatever the node."""

    metadata = {"render_modes": []}

    def __init__(self, specs: tuple[str, ...], paired_horizon: int = 0, observer: str = "plain", choose_at: str = "every-decision",
                 action_advantages: bool = False, high_priority_guard: bool = False) -> None:
        from rlsched.agents.experts import scenario_of
        from rlsched.agents.ppo.candidate_env import ACTION_ADVANTAGES_KEY, CandidateChoiceEnv
        from rlsched.envs.gpushare import GpuShareEnv

        #: what the callbacks read (PairedCandidateAdvantages, ActionAdvantages); the rest stays here
        self.info_keys = ("paired_advantage", "planner_keeps", ACTION_ADVANTAGES_KEY)
        # Choosing at the planner's moves, a step runs on to the next choice: the decisions
        # without one would fill a rollout with samples PPO cannot learn from.
        self.envs = [CandidateChoiceEnv(GpuShareEnv(scenario_of(spec, "candidate_choice.scenarios")), keep_library=True,
                                        paired_horizon=paired_horizon, observer=observer, choose_at=choose_at,
                                        choices_only=choose_at == "planner-moves", action_advantages=action_advantages,
                                        high_priority_guard=high_priority_guard)
                     for spec in specs]
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self.active = self.envs[0]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.active = self.envs[int(self.np_random.integers(len(self.envs)))]
        return self.active.reset(seed=int(self.np_random.integers(TRAINING_SEED_RANGE)), options=options)

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.active.step(action)
        return observation, reward, terminated, truncated, {key: info[key] for key in self.info_keys if key in info}

    def action_masks(self) -> np.ndarray:
        """The running episode's masks."""
        return self.active.action_masks()

    def set_branch_policy(self, policy: Any) -> None:
        """Every scenario's training branches follow ``policy`` (None: the observer's planner;
        :meth:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv.set_branch_policy`)."""
        for env in self.envs:
            env.set_branch_policy(policy)


class BranchPolicySync(BaseCallback):
    """At each rollout's start, hands a copy of the policy being trained to every training
    environment, whose branches then follow it (``branch_follow: policy``)."""

    def _on_rollout_start(self) -> None:
        # Built anew and loaded, not deep-copied: after an update the policy holds tensors that
        # are not graph leaves, which refuse deepcopy.
        model = self.model
        policy = model.policy_class(model.observation_space, model.action_space, model.lr_schedule, **model.policy_kwargs)
        policy.load_state_dict(model.policy.state_dict())
        policy.optimizer = None  # the environments only predict
        policy.set_training_mode(False)
        self.training_env.env_method("set_branch_policy", policy)

    def _on_step(self) -> bool:
        return True


def validate(specs: tuple[str, ...], seeds: tuple[int, ...], choose: Any, desc: str, progress: bool, observer: str = "plain",
             choose_at: str = "every-decision", high_priority_guard: bool = False) -> np.ndarray:
    """Goodput of each validation episode (scenario x seed, request-equivalents) choosing with
    ``choose(env, observation) -> slot`` on the request-level simulator, each from the seed
    library, observing through ``observer``, choosing where ``choose_at`` says (under the
    ``high_priority_guard``)."""
    from tqdm import tqdm

    from rlsched.agents.experts import scenario_of
    from rlsched.agents.ppo.candidate_env import CandidateChoiceEnv
    from rlsched.envs.gpushare import GpuShareEnv

    earned = []
    for spec, seed in tqdm([(s, k) for s in specs for k in seeds], desc=desc, unit="episode", disable=not progress, leave=False):
        env = CandidateChoiceEnv(GpuShareEnv(scenario_of(spec, "candidate_choice.scenarios")), observer=observer, choose_at=choose_at,
                                 high_priority_guard=high_priority_guard)
        observation, _ = env.reset(seed=seed)
        truncated = terminated = False
        while not (truncated or terminated):
            observation, _, terminated, truncated, _ = env.step(choose(env, observation))
        earned.append(env.env.objective)
    return np.array(earned)


def reference_goodput(specs: tuple[str, ...], seeds: tuple[int, ...], policy: str, progress: bool) -> np.ndarray:
    """Goodput of ``policy`` on each validation episode (the learning curve's reference lines)."""
    from tqdm import tqdm

    from rlsched.agents.evaluation import run_episode
    from rlsched.agents.experts import scenario_of
    from rlsched.envs.gpushare import GpuShareEnv

    jobs = [(s, k) for s in specs for k in seeds]
    return np.array([run_episode(GpuShareEnv(scenario_of(spec, "candidate_choice.scenarios")), policy, seed).goodput
                     for spec, seed in tqdm(jobs, desc=f"validation episodes, {policy}", unit="episode", disable=not progress, leave=False)])


#: Where a run keeps its recorded choices (:func:`record_choices`).
CHOICES_FILE = "choice_validation.npz"


def _record_choices_one(job: tuple[str, int, str, int, bool]) -> dict[str, np.ndarray]:
    """One warm-start episode's choices (a worker process's job): (scenario spec, seed, observer, paired horizon, high-priority guard)."""
    from rlsched.agents.experts import scenario_of
    from rlsched.agents.ppo.candidate_env import ACTION_ADVANTAGES_KEY, CANDIDATES, CandidateChoiceEnv
    from rlsched.envs.gpushare import GpuShareEnv

    spec, seed, observer, horizon, guard = job
    env = CandidateChoiceEnv(GpuShareEnv(scenario_of(spec, "candidate_choice.scenarios")), paired_horizon=horizon, observer=observer,
                             choose_at="planner-moves", choices_only=True, action_advantages=True, high_priority_guard=guard)
    observation, _ = env.reset(seed=seed)
    rows: dict[str, list[np.ndarray]] = {"observations": [], "masks": [], "advantages": [], "planner": []}
    done = any(env.ended_before_a_choice)
    while not done:
        planner = env.planner_choice()
        rows["observations"].append(observation)
        rows["masks"].append(env.action_masks())
        rows["planner"].append(np.array(planner))
        observation, _, terminated, truncated, info = env.step(planner)
        rows["advantages"].append(info[ACTION_ADVANTAGES_KEY])
        done = terminated or truncated
    width = {"observations": env.observation_space.shape, "masks": (CANDIDATES,), "advantages": (CANDIDATES,), "planner": ()}
    return {k: np.array(v).reshape(len(v), *width[k]) for k, v in rows.items()}


def record_choices(specs: tuple[str, ...], seeds: tuple[int, ...], observer: str, paired_horizon: int, path: Path,
                   progress: bool, high_priority_guard: bool = False) -> dict[str, np.ndarray]:
    """The choices of warm-start episodes (the observer's planner choosing throughout) on each
    scenario in ``specs`` at each of ``seeds``: at each of the planner's moves the observation,
    the masks, the planner's slot and every offered slot's paired advantage over it on
    ``paired_horizon`` intervals (node requests per interval), one process per core. Saved to
    ``path`` and read back from there when it exists (a resumed run)."""
    import io
    import os
    from concurrent.futures import ProcessPoolExecutor

    from tqdm import tqdm

    from rlsched.fileio import write_bytes_atomically

    if path.exists():
        with np.load(path) as stored:
            return dict(stored)
    jobs = [(spec, seed, observer, paired_horizon, high_priority_guard) for spec in specs for seed in seeds]
    with ProcessPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, len(jobs)))) as pool:
        parts = list(tqdm(pool.map(_record_choices_one, jobs), total=len(jobs), desc="recording validation choices", unit="episode",
                          disable=not progress))
    record = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
    buffer = io.BytesIO()
    np.savez(buffer, **record)
    write_bytes_atomically(path, buffer.getvalue())
    return record


def choice_scores(model: Any, record: dict[str, np.ndarray]) -> dict[str, float]:
    """How the deterministic policy of ``model`` chooses at recorded choices (:func:`record_choices`):
    the mean paired advantage of its slots over the planner's (node requests per interval;
    0 for the warm start), and the shares of choices where it departs from the planner's
    configuration and where it loses by it (empty record: all 0)."""
    if not len(record["planner"]):
        return {"choice_advantage": 0.0, "choice_departures": 0.0, "choice_losses": 0.0}
    actions, _ = model.predict(record["observations"], deterministic=True, action_masks=record["masks"])
    chosen = record["advantages"][np.arange(len(actions)), actions]
    # a slot holding the planner's configuration has advantage 0 exactly; a departing one almost never
    departs = (actions != record["planner"]) & (chosen != 0.0)
    return {"choice_advantage": float(chosen.mean()), "choice_departures": float(departs.mean()), "choice_losses": float((chosen < 0.0).mean())}


#: The run's validation record (the references, the warm start and every validation's
#: episodes), rewritten after each validation: what a resumed run continues from.
VALIDATION_FILE = "validation.json"


def _prepare_run(config_path: str | Path | None, run: Path, resume: bool) -> CandidateTrainConfig:
    """The run's config: read and written to ``run/config.yaml`` (a new run), or the stored one
    (``resume``; a ``config_path`` given too must say the same)."""
    stored = run / "config.yaml"
    if resume:
        if not (stored.exists() and (run / VALIDATION_FILE).exists() and _newest_checkpoint(run) is not None):
            raise ConfigError(run, "--out", str(run), f"--resume needs a run folder with its config.yaml, {VALIDATION_FILE} and a checkpoint")
        config = load_candidate_config(stored)
        if config_path is not None and load_candidate_config(config_path).to_dict() != config.to_dict():
            raise ConfigError(config_path, "file", str(config_path), f"differs from the run's {stored}; resume without --config or start a new run")
        return config
    if config_path is None:
        raise ConfigError("--config", "--config", None, "a new run needs a config file (configs/train/*.yaml)")
    config = load_candidate_config(config_path)
    if _newest_checkpoint(run) is not None:
        raise ConfigError(run, "--out", str(run), "already holds a run; use --resume or another folder")
    run.mkdir(parents=True, exist_ok=True)
    write_text_atomically(stored, yaml.safe_dump(config.to_dict(), sort_keys=False))
    return config


def _newest_checkpoint(run: Path) -> Path | None:
    """The newest ``run/checkpoints/model_<steps>_steps.zip`` (one is saved per validation), or None."""
    found = {int(p.name.split("_")[1]): p for p in (run / "checkpoints").glob("model_*_steps.zip") if p.name.split("_")[1].isdigit()}
    return found[max(found)] if found else None


def train_candidate_choice(config_path: str | Path | None, out: str | Path, resume: bool = False) -> Path:
    """Run the whole pipeline of the module docstring; returns the run folder.

    ``resume``: continue a stopped run (``config_path`` may be None) from its newest
    checkpoint: the model with its optimizer and step count, the references and the warm
    start's validation from ``run/validation.json``; the environments are reseeded from the
    config's seed plus the steps done, so the resumed part does not replay the episodes of the
    first. ``summary.json`` then says where it resumed and times the resumed part only."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from rlsched.agents.candidate_ppo import CANDIDATE_CHOICE_KIND, CHOOSE_AT_KEY, GUARD_KEY, MIN_DEPARTURE_KEY, OBSERVER_KEY
    from rlsched.agents.onnx_policy import KIND_KEY
    from rlsched.agents.ppo.candidate_env import DAEMON_OBSERVERS
    from rlsched.agents.ppo.candidate_policy import CANDIDATE_LAYOUTS
    from rlsched.agents.ppo.expected_ppo import ExpectedPPO

    run = Path(out)
    config = _prepare_run(config_path, run, resume)
    choice = config.candidate_choice
    specs, seeds, progress = choice.scenarios, choice.validation_seeds, config.progress_bar
    if resume:
        record = json.loads((run / VALIDATION_FILE).read_text())
        planner, fixed_best = np.array(record["migrator-ilp"]), np.array(record["static-best"])
    else:
        planner = reference_goodput(specs, seeds, "migrator-ilp", progress)
        fixed_best = reference_goodput(specs, seeds, "static-best", progress)
        record = {"episodes": [f"{s} seed {k}" for s in specs for k in seeds], "migrator-ilp": planner.tolist(), "static-best": fixed_best.tolist(), "warm_start": None, "per_validation": []}

    torch.manual_seed(config.seed)
    if choice.surrogate_episodes:
        from rlsched.agents.ppo.surrogate import SurrogateChoiceEnv, SurrogateEpisode

        tables = [SurrogateEpisode.load(p) for p in record_surrogate(specs, choice.surrogate_episodes, config.seed, run / "surrogate", progress)]
        factories = [lambda: Monitor(SurrogateChoiceEnv(tables, choice.surrogate_steps, choice.paired_horizon, choice.expected_ppo))
                     for _ in range(config.n_envs)]
        venv = DummyVecEnv(factories)  # microseconds per step: processes would cost more than they share
        # One thread: the network is small, and a second thread competing with the environment's
        # loop on two shared cores cut training from 1,650 to under 100 steps/s (measured).
        torch.set_num_threads(1)
    else:
        factories = [lambda: Monitor(ScenarioMixEnv(specs, choice.paired_horizon, choice.observer, choice.choose_at, choice.expected_ppo,
                                                      choice.high_priority_guard))
                     for _ in range(config.n_envs)]
        venv = SubprocVecEnv(factories) if config.n_envs > 1 else DummyVecEnv(factories)
    if resume:
        model = (ExpectedPPO if choice.expected_ppo else MaskablePPO).load(_newest_checkpoint(run), env=venv, device="cpu", tensorboard_log=str(run / "tb"))
    else:
        model = scorer_model(config, venv, run, normalize_advantage=not choice.paired_horizon,  # paired ones are exact, mostly zero: keep their scale
                             policy_kwargs={"hidden": choice.hidden, "prior_weight": choice.prior_weight, "learn_prior": False,
                                            "layout": CANDIDATE_LAYOUTS[choice.observer]},
                             expected=choice.expected_ppo, advantage_replay=choice.advantage_replay)
    resumed_at = model.num_timesteps
    venv.seed(config.seed + resumed_at)
    choices = (record_choices(specs, choice.choice_validation_seeds, choice.observer, choice.paired_horizon, run / CHOICES_FILE, progress,
                              choice.high_priority_guard)
               if choice.choice_validation_seeds else None)
    metadata = {KIND_KEY: CANDIDATE_CHOICE_KIND, CONFIG_KEY: json.dumps(config.to_dict()), "training_scenarios": json.dumps(list(specs)),
                OBSERVER_KEY: choice.observer, CHOOSE_AT_KEY: choice.choose_at, GUARD_KEY: json.dumps(choice.high_priority_guard),
                MIN_DEPARTURE_KEY: json.dumps(choice.min_departure_probability)}

    def evaluate(model: Any, steps: int, logger: Any) -> float:
        def learned(env: Any, observation: np.ndarray) -> int:
            action, _ = model.predict(observation, deterministic=True, action_masks=env.action_masks())
            return int(action)

        earned = validate(specs, seeds, learned, f"validation at {steps} steps", progress, choice.observer, choice.choose_at,
                          choice.high_priority_guard)
        if record["warm_start"] is None:
            record["warm_start"] = earned.tolist()  # step 0: the warm start, the library planner itself (up to ties)
        scores = choice_scores(model, choices) if choices is not None else {}
        for name, value in scores.items():
            logger.record(f"validation/{name}", value)
        record["per_validation"].append({"num_timesteps": steps, "goodput": earned.tolist(), **scores})
        write_text_atomically(run / VALIDATION_FILE, json.dumps(record, indent=2) + "\n")
        # Ratios of the summed Goodput: an episode's own ratio explodes where a policy earns
        # near zero (the planner on the Azure trace).
        ratio = float(earned.sum() / sum(record["warm_start"]))
        logger.record("validation/x_warm_start", ratio)
        logger.record("validation/x_planner", float(earned.sum() / planner.sum()))
        logger.record("validation/x_static_best", float(earned.sum() / fixed_best.sum()))
        return ratio

    started = time.perf_counter()
    # ExpectedPPO collects its own advantages (every action's); MaskablePPO takes the paired ones in place of GAE's
    paired = [PairedCandidateAdvantages()] if choice.paired_horizon and not choice.expected_ppo else []
    follow_policy = [BranchPolicySync()] if choice.branch_follow == "policy" else []
    callbacks = [PeriodicValidation(run, config.eval_freq, metadata, evaluate, resumed=resume), *paired, *follow_policy]
    model.learn(max(config.total_timesteps - resumed_at, 0), callback=callbacks, progress_bar=progress, reset_num_timesteps=not resume)
    seconds = time.perf_counter() - started
    venv.close()
    model.save(run / "final_model")
    best = MaskablePPO.load(run / "best_model", device="cpu")
    steps = json.loads((run / "best.json").read_text())["num_timesteps"]
    export_scorer(best.policy, run / POLICY_FILE, {**metadata, STEPS_KEY: str(steps)})
    warm = np.array(record["warm_start"])
    curve = [(v["num_timesteps"], float(np.sum(v["goodput"]) / warm.sum())) for v in record["per_validation"]]
    summary = {"train_seconds": seconds, "steps_per_s": (model.num_timesteps - resumed_at) / seconds, "resumed_at": resumed_at,
               "best_num_timesteps": steps, "curve": curve, "validation": record}
    write_text_atomically(run / "summary.json", json.dumps(summary, indent=2) + "\n")
    warm_label = "warm start (queue-slo-offered)" if choice.observer in DAEMON_OBSERVERS else "warm start (the library planner)"
    plot_curve(curve, planner, fixed_best, warm, run / "learning_curve.png", model.logger, policy_label="candidate-ppo (validation)",
               warm_label=warm_label, ylabel="Goodput summed over validation, x the warm start", summed=True)
    return run


def _record_one(job: tuple[str, int, str]) -> str:
    """Record and save one surrogate episode (a worker process's job): (scenario spec, seed, file)."""
    from rlsched.agents.experts import scenario_of
    from rlsched.agents.ppo.surrogate import record_episode
    from rlsched.envs.gpushare import GpuShareEnv

    spec, seed, path = job
    record_episode(GpuShareEnv(scenario_of(spec, "candidate_choice.scenarios")), seed, f"{spec} seed {seed}").save(Path(path))
    return path


def record_surrogate(specs: tuple[str, ...], episodes: int, seed: int, folder: Path, progress: bool) -> list[Path]:
    """Record ``episodes`` surrogate episodes of each scenario in ``specs`` into ``folder``
    (training seeds drawn below :data:`TRAINING_SEED_RANGE` from ``seed``), one process per
    core; a file already there is kept (a stopped run resumes). Returns the files."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    from tqdm import tqdm

    folder.mkdir(parents=True, exist_ok=True)
    seeds = np.random.default_rng(seed).integers(TRAINING_SEED_RANGE, size=(len(specs), episodes))
    jobs = [(spec, int(seeds[i, k]), str(folder / f"{i:02d}-{k:03d}.npz")) for i, spec in enumerate(specs) for k in range(episodes)]
    todo = [job for job in jobs if not Path(job[2]).exists()]
    with ProcessPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, len(todo) or 1))) as pool:
        for _ in tqdm(pool.map(_record_one, todo), total=len(todo), desc="recording surrogate episodes", unit="episode", disable=not progress):
            pass
    return [Path(job[2]) for job in jobs]


class PairedCandidateAdvantages(BaseCallback):
    """Replaces PPO's advantage estimates by the environments' paired ones (``info["paired_advantage"]``:
    0 where the policy chose as the library planner, the exact counterfactual advantage of
    the departure otherwise). PPO's update is then a step of policy improvement over the
    planner; the clipped objective, the masks and the value loss are MaskablePPO's.

    It logs the departures apart by what the planner chose (``info["planner_keeps"]``): where
    it keeps, a departure is a move the planner did not make; where it moves, a move skipped or
    changed. One scorer learns from both, so a lesson of the first kind (moving is mostly
    worse) can become a bias against the planner's own moves."""

    def _on_rollout_start(self) -> None:
        self.rows: list[list[float]] = []
        self.keeps: list[list[bool]] = []

    def _on_step(self) -> bool:
        self.rows.append([float(info.get("paired_advantage", 0.0)) for info in self.locals["infos"]])
        self.keeps.append([bool(info.get("planner_keeps", False)) for info in self.locals["infos"]])
        return True

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer
        advantages = np.array(self.rows, dtype=buffer.advantages.dtype).reshape(buffer.advantages.shape)
        buffer.advantages[:] = advantages
        departures = advantages != 0.0
        self.logger.record("paired/departures", float(departures.mean()))
        self.logger.record("paired/positive", float((advantages > 0).sum() / max(departures.sum(), 1)))
        self.logger.record("paired/mean_departure_advantage", float(advantages[departures].mean()) if departures.any() else 0.0)
        keeps = np.array(self.keeps, dtype=bool).reshape(advantages.shape)
        self.logger.record("paired/departures_where_planner_keeps", float((departures & keeps).sum() / max(departures.sum(), 1)))
        for label, where in (("keeps", departures & keeps), ("moves", departures & ~keeps)):
            self.logger.record(f"paired/mean_departure_advantage_where_planner_{label}", float(advantages[where].mean()) if where.any() else 0.0)
