"""Training hyper-parameters: a typed dataclass per section, read from YAML (``configs/train/``).

Every field has a docstring (CleanRL style). An unknown field, a wrong type or a value out
of range raises :class:`~rlsched.errors.ConfigError` naming the file, the field and the value.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlsched.errors import ConfigError


@dataclass
class TracePoolConfig:
    """Other real traces a tenant may replay instead of its own, so that training sees more
    kinds of traffic than the scenario's few traces (:mod:`rlsched.agents.ppo.family`)."""

    files: tuple[str, ...] = ()
    """trace files, relative to ``configs/traces`` (or absolute); none may be held out"""
    tenants: tuple[str, ...] = ()
    """inference tenants of the scenario that may swap their arrivals for a pool trace"""
    probability: float = 0.0
    """chance, per listed tenant per episode, of replaying a pool trace (drawn uniformly),
    scaled to the tenant's own mean rate and started at a random point of the trace"""
    time_warp: float = 24.0
    """trace seconds replayed per simulated second (24: a one-day trace in one hour)"""


@dataclass
class RandomizationConfig:
    """Domain randomization of the training scenarios (:mod:`rlsched.agents.ppo.family`).

    Ranges are ``[low, high]``; ``[1.0, 1.0]`` turns a randomization off.
    """

    rate_scale: tuple[float, float] = (0.7, 1.3)
    """multiplies each tenant's arrival rate, drawn log-uniformly per tenant per episode"""
    burstiness: tuple[float, float] = (0.5, 1.5)
    """scales the spread of MMPP state rates around their mean (0: Poisson, 1: as written)"""
    slo_scale: tuple[float, float] = (0.8, 1.25)
    """multiplies each inference tenant's SLO, drawn log-uniformly per tenant per episode"""
    priority_shuffle_probability: float = 0.0
    """probability that an episode permutes the priority classes among the tenants (tenant mix)"""
    gpus: tuple[str, ...] = ()
    """GPU types drawn uniformly per episode (empty: the scenario's); all must offer the
    same GI sizes so the action space keeps its shape"""
    trace_train_fraction: float = 0.7
    """trace replays start at a random offset such that the episode stays within this
    leading fraction of the trace (the rest is held out for evaluation)"""
    held_out_traces: tuple[str, ...] = ("servegen_mm_image_client0.csv",)
    """trace file names never replayed in training (checked against the scenario and the pool)"""
    trace_pool: TracePoolConfig = field(default_factory=TracePoolConfig)
    """other traces replayed in place of a tenant's own (off by default)"""


@dataclass
class PpoConfig:
    """MaskablePPO hyper-parameters (sb3-contrib names)."""

    learning_rate: float = 3e-4
    """Adam step size"""
    n_steps: int = 512
    """steps collected per environment per rollout"""
    batch_size: int = 256
    """minibatch size, steps"""
    n_epochs: int = 10
    """passes over each rollout"""
    gamma: float = 0.95
    """discount per decision interval"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    clip_range: float = 0.2
    """PPO clipping of the probability ratio"""
    ent_coef: float = 0.0
    """entropy bonus weight"""
    vf_coef: float = 0.5
    """value loss weight"""
    max_grad_norm: float = 0.5
    """gradient clipping, L2 norm"""
    net_arch: tuple[int, ...] = (64, 64)
    """hidden layer widths of the policy and of the value network (separate networks)"""
    activation: str = "tanh"
    """hidden activation: tanh or relu"""


@dataclass
class PretrainConfig:
    """Behaviour-cloning warm start from a baseline (:mod:`rlsched.agents.ppo.pretrain`)."""

    teacher: str = ""
    """what to imitate before PPO: a baseline of ``rlsched eval``, family-static-best (the
    fixed configuration best on average over draws of the family), or planner-true-rates
    (the Goodput-MILP planner fed the true arrival rates of the coming windows: a teacher
    that sees the training draw's future, which the student cannot); empty: no warm start"""
    family_draws: int = 8
    """draws of the family that family-static-best chooses its configuration on"""
    episodes: int = 8
    """teacher episodes on draws of the training family"""
    perturbation: float = 0.0
    """probability that a teacher step executes a random action instead (labels stay the
    teacher's): shows the student the way back from states off the teacher's path"""
    epochs: int = 30
    """passes over the demonstrations"""
    learning_rate: float = 1e-3
    """Adam step size of the warm start"""
    batch_size: int = 256
    """minibatch size, steps"""
    dagger_iterations: int = 0
    """DAgger rounds after the first fit (Ross et al., AISTATS 2011): the student acts, the
    teacher labels the states it reaches, and the student is refitted on all labels so far"""
    dagger_episodes: int = 8
    """student episodes per DAgger round"""
    dagger_perturbation: float = 0.0
    """probability that a DAgger step executes a random action instead of the student's"""
    workers: int = 1
    """processes collecting episodes in parallel (a planner teacher takes ~50 ms a step)"""
    validation_episodes: int = 3
    """episodes of ``eval_scenario`` each fit's student is validated on; the best one is kept"""


@dataclass
class TrainConfig:
    """One training run (``rlsched train --config FILE``)."""

    scenario: str = "default"
    """base scenario of the training family: a bundled name or a YAML path"""
    eval_scenario: str = "default"
    """scenario of the periodic evaluation (no randomization)"""
    total_timesteps: int = 200_000
    """PPO environment steps to train for, all environments together (0: the warm start only)"""
    n_envs: int = 2
    """parallel environments"""
    vec_env: str = "subproc"
    """subproc (one process per environment) or dummy (all in this process)"""
    seed: int = 0
    """seeds the model, the environments (seed + index) and the evaluation"""
    max_episode_steps: int = 360
    """truncate training and evaluation episodes after this many decisions"""
    normalize_obs: bool = True
    """VecNormalize the observations (running mean/std, saved in vecnormalize.pkl)"""
    normalize_reward: bool = True
    """VecNormalize the rewards by the running std of the discounted return"""
    clip_obs: float = 10.0
    """clip normalized observations to [-clip_obs, clip_obs]"""
    eval_freq: int = 10_000
    """evaluate every this many steps, all environments together"""
    eval_episodes: int = 1
    """episodes per evaluation"""
    checkpoint_freq: int = 20_000
    """save a checkpoint (model + VecNormalize) every this many steps, all environments together"""
    progress_bar: bool = True
    """show a progress bar while training"""
    device: str = "cpu"
    """torch device (cpu: the networks are small; the environment is the bottleneck)"""
    planner_takeover_probability: float = 0.0
    """deployment, stored in the exported policy: the planner (migrator-ilp) decides every
    step whose chosen action the policy gives a probability below this (0: never)"""
    reconfiguration_check_samples: int = 0
    """deployment, stored in the exported policy: a decision that changes the running
    configuration is applied only if the simulator, run from the observed state on this many
    random streams, predicts it earns more than keeping the running one (0: no check)"""
    ppo: PpoConfig = field(default_factory=PpoConfig)
    """MaskablePPO hyper-parameters"""
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)
    """domain randomization of the training episodes"""
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    """behaviour-cloning warm start (off unless a teacher is named)"""

    def to_dict(self) -> dict[str, Any]:
        """Plain values (tuples as lists) for YAML."""
        return plain_values(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        """The config as YAML (what the run folder's ``config.yaml`` holds)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def plain_values(value: Any) -> Any:
    """``value`` with every tuple turned into a list, recursively (what YAML and JSON write)."""
    if isinstance(value, dict):
        return {k: plain_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_values(v) for v in value]
    return value


#: Allowed values of string fields.
CHOICES: dict[str, tuple[str, ...]] = {"vec_env": ("subproc", "dummy"), "ppo.activation": ("tanh", "relu")}
#: Fields that must be > 0 (others numeric must be >= 0).
POSITIVE = {"n_envs", "max_episode_steps", "eval_freq", "eval_episodes", "checkpoint_freq", "clip_obs",
            "ppo.learning_rate", "ppo.n_steps", "ppo.batch_size", "ppo.n_epochs", "ppo.clip_range", "ppo.max_grad_norm",
            "pretrain.episodes", "pretrain.family_draws", "pretrain.epochs", "pretrain.learning_rate", "pretrain.batch_size",
            "pretrain.dagger_episodes", "pretrain.workers", "pretrain.validation_episodes",
            "randomization.trace_pool.time_warp"}
#: Fields that are fractions in [0, 1].
FRACTIONS = {"pretrain.perturbation", "pretrain.dagger_perturbation", "ppo.gamma", "ppo.gae_lambda", "randomization.priority_shuffle_probability", "randomization.trace_train_fraction",
             "randomization.trace_pool.probability",
             "planner_takeover_probability"}


def _convert(source: str, name: str, hint: Any, value: Any) -> Any:
    """``value`` checked against the type hint ``hint`` (dataclass sections recurse)."""
    if dataclasses.is_dataclass(hint):
        return _section(source, name, hint, value)
    origin = typing.get_origin(hint)
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, list | tuple):
            raise ConfigError(source, name, value, "expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(source, f"{name}[{i}]", args[0], v) for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(source, name, value, f"expected a list of {len(args)} values")
        return tuple(_convert(source, f"{name}[{i}]", a, v) for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, name, value, "expected true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, name, value, "expected an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(source, name, value, "expected a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(source, name, value, "expected a string")
        return value
    raise TypeError(f"unsupported config type {hint!r} of {name}")  # a programming error, not user input


def _check_range(source: str, name: str, value: Any) -> None:
    if name in CHOICES and value not in CHOICES[name]:
        raise ConfigError(source, name, value, f"allowed: {', '.join(CHOICES[name])}")
    numbers = value if isinstance(value, tuple) else (value,)
    for v in numbers:
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if name in POSITIVE and not v > 0:
            raise ConfigError(source, name, value, "must be > 0")
        if name in FRACTIONS and not 0 <= v <= 1:
            raise ConfigError(source, name, value, "must be within [0, 1]")
        if v < 0:
            raise ConfigError(source, name, value, "must be >= 0")
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, float) for v in value) and value[0] > value[1]:
        raise ConfigError(source, name, value, "expected [low, high] with low <= high")


def _section(source: str, prefix: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(source, prefix or "file", raw, "expected a mapping of fields")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in raw.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ConfigError(source, name, value, f"unknown field (allowed: {', '.join(sorted(fields))})")
        hint = hints[key]
        if isinstance(hint, types.UnionType):
            raise TypeError(f"unsupported union type of {name}")
        values[key] = _convert(source, name, hint, value)
        _check_range(source, name, values[key])
    return cls(**values)


def config_from_dict(raw: Any, source: str = "<memory>", cls: type[TrainConfig] = TrainConfig) -> TrainConfig:
    """A checked :class:`TrainConfig` from plain values (missing fields take their defaults).

    :param cls: TrainConfig or a subclass adding sections (the RLlib engine's)
    """
    config = _section(source, "", cls, raw or {})
    from rlsched.agents.baselines import POLICIES

    if config.total_timesteps == 0 and not config.pretrain.teacher:
        raise ConfigError(source, "total_timesteps", 0, "0 PPO steps ships the warm start: name a pretrain.teacher, or train for > 0 steps")
    teachers = [*POLICIES, "family-static-best", "planner-true-rates"]
    if config.pretrain.teacher and config.pretrain.teacher not in teachers:
        raise ConfigError(source, "pretrain.teacher", config.pretrain.teacher, f"allowed: {', '.join(teachers)} (or empty: no warm start)")
    if config.ppo.batch_size > config.ppo.n_steps * config.n_envs:
        raise ConfigError(source, "ppo.batch_size", config.ppo.batch_size, f"must be <= n_steps x n_envs = {config.ppo.n_steps * config.n_envs}")
    return config


def read_yaml_config(path: Path) -> Any:
    """The plain values of the YAML file at ``path`` (a missing file or bad YAML names the file)."""
    if not path.exists():
        raise ConfigError(path, "file", str(path), "no such config file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(path, "file", str(path), f"not valid YAML: {exc}") from None


def load_config(path: str | Path, cls: type[TrainConfig] = TrainConfig) -> TrainConfig:
    """Read and check a training config file (``cls``: as in :func:`config_from_dict`)."""
    return config_from_dict(read_yaml_config(Path(path)), str(path), cls)
