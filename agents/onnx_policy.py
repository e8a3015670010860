"""A trained PPO policy exported to ONNX (:mod:`rlsched.agents.ppo.export`), run by onnxruntime.

``OnnxPolicy.load(path).act(observation, action_mask) -> action`` is all a caller needs (the
daemon); :class:`PpoPolicy` adapts it to the baselines' :class:`Policy` interface so that
``rlsched eval --policies ppo`` runs it like any baseline. No torch import: inference only
needs numpy and onnxruntime.

``ppo`` names the shipped default policy (:data:`SHIPPED_POLICY`, package data);
``ppo:PATH`` an ``.onnx`` file or a training run folder (its ``policy.onnx``, exported on
first use when missing). A suffix ``@P`` (``ppo@0``, ``ppo:PATH@0.4``) overrides the file's
planner-takeover probability with P, e.g. to compare thresholds in one ``rlsched eval``.

The planner takes over when the policy is unsure: a file whose metadata sets
``planner_takeover_probability`` p > 0 hands every step whose chosen action the network gives
a probability below p to the Goodput-MILP planner (``migrator-ilp``), in ``rlsched eval`` and
in the daemon alike; the episode report counts those steps.

Reconfigurations are checked in the simulator: a file whose metadata sets
``reconfiguration_check_samples`` n > 0 applies a decision that changes the running
configuration only if :class:`~rlsched.simulator.lookahead.ReconfigurationCheck` (n random
streams of arrivals replaying the rates measured in the recent intervals, from the observed
state) predicts it earns more than keeping the running one; otherwise the running
configuration is kept. The report counts both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.agents.baselines.base import Policy, intervals_left, measured_arrival_rates, observed_load
from rlsched.agents.baselines.planners import MigratorIlp
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError
from rlsched.simulator.lookahead import ReconfigurationCheck

#: The shipped default policy (trained on the default scenario family; see its README).
SHIPPED_POLICY = Path(__file__).parent / "policies" / "default" / "policy.onnx"
#: Metadata key naming a choice-policy file's kind (``hedge-ppo``, ``candidate-ppo``; absent in a ``ppo`` file).
KIND_KEY = "kind"
#: Metadata key of the probability below which the planner takes over (JSON number; absent: never).
TAKEOVER_KEY = "planner_takeover_probability"
#: Metadata key of the random streams of the simulated check of reconfigurations (JSON integer; absent or 0: no check).
CHECK_KEY = "reconfiguration_check_samples"


def takeover_probability(value: object, source: object, field: str, reason: str = "must be a number within [0, 1]", shown: object = None) -> float:
    """``value`` as a planner-takeover probability; a :class:`ConfigError` naming ``source``,
    ``field`` and ``shown`` (default: ``value``) unless it is a number within [0, 1]."""
    try:
        probability = float(value)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        probability = math.nan
    if not 0.0 <= probability <= 1.0:
        raise ConfigError(source, field, value if shown is None else shown, reason)
    return probability


def check_samples(value: object, source: object, field: str) -> int:
    """``value`` as the number of random streams of the reconfiguration check; a
    :class:`ConfigError` naming ``source``, ``field`` and ``value`` unless it is an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value != int(value) or value < 0:
        raise ConfigError(source, field, value, "must be an integer >= 0 (0: no check)")
    return int(value)


def _metadata_value(meta: dict[str, str], key: str) -> object:
    """A metadata item as JSON (absent: 0), or its raw text when it is not JSON (for the error)."""
    text = meta.get(key, "0")
    try:
        return json.loads(text)
    except ValueError:
        return text


def single_thread_session(path: Path) -> Any:
    """An ONNX Runtime session on one thread, for every policy file rlsched runs. One decision
    per interval and a network of a few layers: a single thread is fastest and leaves the
    cores to the simulator and to a candidate library's worker."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxPolicy:
    """An exported policy: normalization, MLP and masked argmax in one ONNX graph.

    :param path: the .onnx file
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ConfigError(self.path, "file", str(self.path), "no such ONNX policy file")
        try:
            self.session = single_thread_session(self.path)
        except Exception as exc:  # onnxruntime raises its own exception types for a bad file
            raise ConfigError(self.path, "file", str(self.path), f"not a loadable ONNX model: {exc}") from None
        meta = self.session.get_modelmeta().custom_metadata_map
        if "nvec" not in meta or "obs_dim" not in meta:
            raise ConfigError(self.path, "metadata", sorted(meta), "not an rlsched policy export (needs nvec and obs_dim)")
        self.nvec = np.array(json.loads(meta["nvec"]), dtype=np.int64)
        self.obs_dim = int(json.loads(meta["obs_dim"]))
        self.metadata = dict(meta)
        self.outputs = [output.name for output in self.session.get_outputs()]
        self.takeover_probability = takeover_probability(_metadata_value(meta, TAKEOVER_KEY), self.path, TAKEOVER_KEY)
        self.check_samples = check_samples(_metadata_value(meta, CHECK_KEY), self.path, CHECK_KEY)

    @classmethod
    def load(cls, path: str | Path) -> OnnxPolicy:
        """The policy of an .onnx file."""
        return cls(path)

    def act(self, observation: np.ndarray, action_mask: np.ndarray | None = None) -> np.ndarray:
        """The deterministic action for one observation (or a batch: leading axis).

        :param observation: the env's observation, float32 ``[obs_dim]`` or ``[batch, obs_dim]``
        :param action_mask: ``env.action_masks()``, bool ``[sum(nvec)]`` (or batched); None: all allowed
        :returns: MultiDiscrete levels, int64 ``[len(nvec)]`` (or ``[batch, len(nvec)]``)
        """
        return self._run(["action"], observation, action_mask)[0]

    def act_with_log_prob(self, observation: np.ndarray, action_mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`act`'s action and its log-probability under the policy's (masked)
        distribution: float32, a scalar (or ``[batch]``)."""
        if "action_log_prob" not in self.outputs:
            raise ConfigError(self.path, "outputs", self.outputs, "no action_log_prob output (exported before it existed: export it again)")
        action, log_prob = self._run(["action", "action_log_prob"], observation, action_mask)
        return action, log_prob

    def _run(self, outputs: list[str], observation: np.ndarray, action_mask: np.ndarray | None) -> list[np.ndarray]:
        obs = np.asarray(observation, dtype=np.float32)
        single = obs.ndim == 1
        obs = obs.reshape(1, -1) if single else obs
        if obs.shape[1] != self.obs_dim:
            raise ConfigError(self.path, "observation", obs.shape, f"expected {self.obs_dim} features (the policy's scenario family)")
        mask = np.ones((obs.shape[0], int(self.nvec.sum())), dtype=bool) if action_mask is None else np.asarray(action_mask, dtype=bool)
        mask = mask.reshape(obs.shape[0], -1)
        if mask.shape[1] != int(self.nvec.sum()):
            raise ConfigError(self.path, "action_mask", mask.shape, f"expected {int(self.nvec.sum())} levels")
        results = self.session.run(outputs, {"observation": obs, "action_mask": mask})
        return [result[0] for result in results] if single else results


def split_takeover(spec: str) -> tuple[str, float | None]:
    """``ppo...@P`` -> (``ppo...``, P); a spec without the suffix -> (spec, None)."""
    base, at, text = spec.rpartition("@")
    if not at:
        return spec, None
    return base, takeover_probability(text, "--policies", "policy", "the suffix @P is a planner-takeover probability within [0, 1] (ppo@0: the network alone)", shown=spec)


def resolve_policy_path(spec: str) -> Path:
    """``ppo`` -> the shipped policy; ``ppo:FILE.onnx`` -> that file; ``ppo:RUN_DIR`` -> the
    run's ``policy.onnx`` (exported from its best model when missing)."""
    if spec == "ppo":
        if not SHIPPED_POLICY.exists():
            raise ConfigError("--policies", "ppo", str(SHIPPED_POLICY), "the shipped policy is missing from this installation")
        return SHIPPED_POLICY
    prefix, colon, rest = spec.partition(":")
    if prefix != "ppo" or not colon or not rest:
        raise ConfigError("--policies", "policy", spec, "expected ppo or ppo:PATH (an .onnx file or a training run folder)")
    path = Path(rest)
    if path.is_dir():
        exported = path / "policy.onnx"
        if not exported.exists():
            from rlsched.agents.ppo.export import export_run

            export_run(path, exported)
        return exported
    if not path.exists():
        raise ConfigError("--policies", spec, str(path), "no such .onnx file or run folder")
    return path


def open_choice_policy(spec: str, kind: str, observation_width: int | Callable[[dict[str, str]], int], how_to_make: str,
                       shipped: Path | None = None) -> tuple[Path, Any, dict[str, str]]:
    """A choice-policy file (``hedge-ppo``, ``candidate-ppo``) named ``KIND:FILE.onnx``,
    ``KIND:RUN_DIR`` (its ``policy.onnx``) or ``KIND`` alone (the ``shipped`` file): (path,
    onnxruntime session, metadata). A :class:`ConfigError` names the spec or file and what is
    wrong: not of that ``kind``, not loadable, or an observation of another width than this
    rlsched builds (``how_to_make`` tells how to get a file where none is named or shipped;
    ``observation_width`` may be a function of the file's metadata)."""
    prefix, colon, rest = spec.partition(":")
    if spec == kind and shipped is not None:
        rest = str(shipped)
    elif prefix != kind or not colon or not rest:
        raise ConfigError("--policies", "policy", spec, f"expected {kind}:PATH (an .onnx file or a training run folder; {how_to_make})")
    path = Path(rest) / "policy.onnx" if Path(rest).is_dir() else Path(rest)
    if not path.exists():
        raise ConfigError("--policies", spec, str(path), f"no such {kind} policy file")
    try:
        session = single_thread_session(path)
    except Exception as error:  # onnxruntime raises its own exception types
        raise ConfigError(path, "file", str(path), f"not a loadable ONNX policy ({error})") from None
    meta = session.get_modelmeta().custom_metadata_map
    if meta.get(KIND_KEY) != kind:
        raise ConfigError(path, KIND_KEY, meta.get(KIND_KEY), f"not a {kind} policy")
    width = session.get_inputs()[0].shape[1]
    if callable(observation_width):
        observation_width = observation_width(meta)
    if width != observation_width:
        raise ConfigError(path, "observation", width, f"the policy's observation has {width} features, this rlsched builds {observation_width}")
    return path, session, dict(meta)


class PpoPolicy(Policy):
    """A PPO policy as a baseline-style :class:`Policy` (``rlsched eval --policies ppo``),
    with the planner taking over when the network is unsure (see the module docstring).

    ``decider`` names who took the last decision (the daemon logs it); ``report`` counts an
    episode's steps, those the planner decided, and the changes the reconfiguration check
    looked at and kept out; ``last_check_gain`` is the last check's predicted gain (None:
    the last decision changed nothing, or there is no check).

    :param spec: ``ppo`` or ``ppo:PATH`` (see :func:`resolve_policy_path`), optionally with
        ``@P`` (see :func:`split_takeover`)
    """

    name = "ppo"

    def __init__(self, spec: str = "ppo") -> None:
        path_spec, override = split_takeover(spec)
        self.onnx = OnnxPolicy.load(resolve_policy_path(path_spec))
        self.takeover_probability = self.onnx.takeover_probability if override is None else override
        if self.takeover_probability > 0 and "action_log_prob" not in self.onnx.outputs:
            raise ConfigError(self.onnx.path, TAKEOVER_KEY, self.takeover_probability, "set, but the graph has no action_log_prob output (export it again)")
        self.planner = MigratorIlp() if self.takeover_probability > 0 else None
        self.check: ReconfigurationCheck | None = None
        self.report: dict[str, float] | None = None
        self.last_check_gain: float | None = None
        self.decider = self.name

    def mismatch(self, env: GpuShareEnv) -> str | None:
        """Why the network cannot decide for ``env``'s node (None: it can): it is made for one
        node shape, whose action and observation sizes it fixes."""
        if env.action_space.shape != self.onnx.nvec.shape or not np.array_equal(env.action_space.nvec, self.onnx.nvec):
            return f"the policy's action space does not match scenario {env.scenario.name}'s {env.action_space.nvec.tolist()}"
        if env.observation_space.shape != (self.onnx.obs_dim,):
            return f"the policy takes {self.onnx.obs_dim} observation features, scenario {env.scenario.name} has {env.observation_space.shape[0]}"
        return None

    def reset(self, env: GpuShareEnv) -> None:
        problem = self.mismatch(env)
        if problem is not None:
            raise ConfigError(self.onnx.path, "nvec", self.onnx.nvec.tolist(), problem)
        report: dict[str, float] = {"steps": 0}
        if self.planner is not None:
            self.planner.reset(env)
            report.update(planner_steps=0, planner_takeover_probability=self.takeover_probability)
        if self.onnx.check_samples:
            self.check = ReconfigurationCheck(env.scenario, env.backend.perf_model, samples=self.onnx.check_samples)
            report.update(checked_changes=0, kept_by_check=0)
        # The network alone has nothing to report (rlsched eval shows no report column then).
        self.report = report if len(report) > 1 else None

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> np.ndarray | Configuration:
        if self.report is not None:
            self.report["steps"] += 1
        decision = self._decide(observation, env)
        self.last_check_gain = None
        if self.check is None or env.current is None:
            return decision
        elapsed_s = 0.0
        if env.last_step is not None:
            elapsed_s = env.last_step.t_end_s
            # The check's forecast replays the measured rates: it must see every interval's,
            # including those whose decision changes nothing.
            measured = env.backend.observe()
            self.check.record(elapsed_s, measured_arrival_rates(measured))
        proposal = env.repaired_configuration(decision)
        if proposal == env.current:
            return decision
        self.last_check_gain = self.check.gain(proposal, env.current, elapsed_s, *observed_load(env), intervals_left=intervals_left(env, elapsed_s))
        self.report["checked_changes"] += 1
        if self.last_check_gain > 0.0:
            return decision
        self.report["kept_by_check"] += 1
        return env.current

    def _decide(self, observation: np.ndarray, env: GpuShareEnv) -> np.ndarray | Configuration:
        """The network's action, or the planner's configuration where the network is unsure."""
        if self.planner is None:
            return self.onnx.act(observation, env.action_masks())
        action, log_prob = self.onnx.act_with_log_prob(observation, env.action_masks())
        if float(log_prob) < math.log(self.takeover_probability):
            self.report["planner_steps"] += 1
            self.decider = self.planner.name
            return self.planner.act(observation, env)
        self.decider = self.name
        return action
