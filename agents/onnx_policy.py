"""A trained PPO policy exported to ONNX (:mod:`rlsched.agents.ppo.export`), run by onnxruntime.

``OnnxPolicy.load(path).act(observation, action_mask) -> action`` is all a caller needs (the
daemon); :class:`PpoPolicy` adapts it to the baselines' :class:`Policy` interface so that
``rlsched eval --policies ppo`` runs it like any baseline. No torch import: inference only
needs numpy and onnxruntime.

``ppo`` names the shipped default policy (:data:`SHIPPED_POLICY`, package data);
``ppo:PATH`` an ``.onnx`` file or a training run folder (its ``policy.onnx``, exported on
first use when missing).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rlsched.agents.baselines.base import Policy
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError

#: The shipped default policy (trained on the default scenario family; see its README).
SHIPPED_POLICY = Path(__file__).parent / "policies" / "default" / "policy.onnx"


class OnnxPolicy:
    """An exported policy: normalization, MLP and masked argmax in one ONNX graph.

    :param path: the .onnx file
    """

    def __init__(self, path: str | Path) -> None:
        import onnxruntime

        self.path = Path(path)
        if not self.path.exists():
            raise ConfigError(self.path, "file", str(self.path), "no such ONNX policy file")
        options = onnxruntime.SessionOptions()
        # One decision per interval: a single thread is fastest and leaves the cores to the simulator.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        try:
            self.session = onnxruntime.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types for a bad file
            raise ConfigError(self.path, "file", str(self.path), f"not a loadable ONNX model: {exc}") from None
        meta = self.session.get_modelmeta().custom_metadata_map
        if "nvec" not in meta or "obs_dim" not in meta:
            raise ConfigError(self.path, "metadata", sorted(meta), "not an rlsched policy export (needs nvec and obs_dim)")
        self.nvec = np.array(json.loads(meta["nvec"]), dtype=np.int64)
        self.obs_dim = int(json.loads(meta["obs_dim"]))
        self.metadata = dict(meta)

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
        obs = np.asarray(observation, dtype=np.float32)
        single = obs.ndim == 1
        obs = obs.reshape(1, -1) if single else obs
        if obs.shape[1] != self.obs_dim:
            raise ConfigError(self.path, "observation", obs.shape, f"expected {self.obs_dim} features (the policy's scenario family)")
        mask = np.ones((obs.shape[0], int(self.nvec.sum())), dtype=bool) if action_mask is None else np.asarray(action_mask, dtype=bool)
        mask = mask.reshape(obs.shape[0], -1)
        if mask.shape[1] != int(self.nvec.sum()):
            raise ConfigError(self.path, "action_mask", mask.shape, f"expected {int(self.nvec.sum())} levels")
        (action,) = self.session.run(["action"], {"observation": obs, "action_mask": mask})
        return action[0] if single else action


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


class PpoPolicy(Policy):
    """A PPO policy as a baseline-style :class:`Policy` (``rlsched eval --policies ppo``).

    :param spec: ``ppo`` or ``ppo:PATH`` (see :func:`resolve_policy_path`)
    """

    name = "ppo"

    def __init__(self, spec: str = "ppo") -> None:
        self.onnx = OnnxPolicy.load(resolve_policy_path(spec))

    def reset(self, env: GpuShareEnv) -> None:
        if env.action_space.shape != self.onnx.nvec.shape or not np.array_equal(env.action_space.nvec, self.onnx.nvec):
            raise ConfigError(self.onnx.path, "nvec", self.onnx.nvec.tolist(), f"the policy's action space does not match scenario {env.scenario.name}'s {env.action_space.nvec.tolist()}")

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> np.ndarray:
        return self.onnx.act(observation, env.action_masks())
