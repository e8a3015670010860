"""ONNX export of an RLlib policy into the format of :mod:`rlsched.agents.ppo.export`.

RLlib's default PPO module with separate networks (``vf_share_layers: false``) holds the
same policy path as SB3's ``MlpPolicy``: ``encoder.actor_encoder`` (Linear + activation
per hidden layer) then the ``pi`` head (one Linear to the logits of every level of every
MultiDiscrete component). The graph is therefore the same one, built by the same code;
what differs: no observation normalization node (the engine trains on raw observations),
and masking. RLlib adds ``log(mask)`` clamped at ``FLOAT_MIN`` to the logits where the
graph uses -1e8: the argmax is the same (masked levels lose against any allowed one).
:meth:`OnnxPolicy.act <rlsched.agents.onnx_policy.OnnxPolicy.act>`, the daemon and
``rlsched eval --policies ppo:PATH`` load the result unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from rlsched.agents.ppo.export import linear_layers, policy_graph
from rlsched.errors import ConfigError
from rlsched.fileio import write_bytes_atomically


def module_layers(module: object) -> list[tuple[np.ndarray, np.ndarray, str | None]]:
    """The policy MLP of an RLlib PPO torch module, from observation to logits."""
    encoder = getattr(module, "encoder", None)
    actor = getattr(encoder, "actor_encoder", None)
    pi = getattr(module, "pi", None)
    if actor is None or pi is None:
        raise ConfigError("policy", "rl_module", type(module).__name__, "only RLlib's default PPO module with vf_share_layers false can be exported")
    return linear_layers([*actor.net.mlp.children(), *pi.net.mlp.children()])


def export_module(module: object, nvec: list[int], obs_dim: int, path: str | Path, metadata: Mapping[str, str] = {}) -> Path:
    """Write ``module``'s policy (masked argmax, no normalization) to ``path`` atomically."""
    model = policy_graph(module_layers(module), [int(n) for n in nvec], int(obs_dim), None, None, 0.0, {"engine": "rllib", **metadata})
    path = Path(path)
    write_bytes_atomically(path, model.SerializeToString())
    return path
