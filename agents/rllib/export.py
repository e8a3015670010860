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

:func:`export_rllib_run` exports from a run folder's checkpoint (``rlsched export-policy
--run RUN`` on an RLlib run; needs ray); :func:`export_module` from a module in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from rlsched.agents.ppo.export import deployment_metadata, linear_layers, policy_graph
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


def is_rllib_run(run_dir: str | Path) -> bool:
    """Whether a run folder was trained by the RLlib engine (its config has ``rllib:``)."""
    import yaml

    from rlsched.agents.rllib.train import CONFIG_FILE

    path = Path(run_dir) / CONFIG_FILE
    return path.exists() and "rllib" in (yaml.safe_load(path.read_text()) or {})


def export_rllib_run(run_dir: str | Path, out: str | Path | None = None, which: str = "final", planner_takeover_probability: float | None = None,
                     reconfiguration_check_samples: int | None = None) -> Path:
    """Export the policy of an RLlib run folder's checkpoint to ONNX; returns the file.

    :param which: ``final`` (or ``best``: the RLlib engine keeps no best model, so the
        final one), or the step count of one of the run's ``checkpoints/rllib_<steps>_steps``
    :param planner_takeover_probability: as :func:`rlsched.agents.ppo.export.export_run`'s
    :param reconfiguration_check_samples: as :func:`rlsched.agents.ppo.export.export_run`'s
    """
    from rlsched.agents.rllib import require_ray
    from rlsched.agents.rllib.config import load_rllib_config
    from rlsched.agents.rllib.train import CHECKPOINT_DIR, CONFIG_FILE, FINAL_CHECKPOINT, MODULE_IN_CHECKPOINT, POLICY_FILE

    run_dir = Path(run_dir)
    config = load_rllib_config(run_dir / CONFIG_FILE)
    if which.isdigit():
        source = Path(CHECKPOINT_DIR) / f"rllib_{which}_steps"
    elif which in ("best", "final"):
        source = Path(FINAL_CHECKPOINT)
    else:
        raise ConfigError("--which", "--which", which, "allowed: final (best: the same), or the step count of a checkpoint")
    if not (run_dir / source / MODULE_IN_CHECKPOINT).exists():
        raise ConfigError(run_dir, "checkpoint", str(run_dir / source), "no such RLlib checkpoint in the run folder")
    require_ray()
    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(str((run_dir / source / MODULE_IN_CHECKPOINT).resolve()))
    observations = module.observation_space["observations"]  # the Dict space of the masking module
    return export_module(module, list(module.action_space.nvec), int(np.prod(observations.shape)), Path(out) if out else run_dir / POLICY_FILE,
                         {"scenario": config.scenario, "source": str(source), "config": config.to_yaml(),
                          **deployment_metadata(config, planner_takeover_probability, reconfiguration_check_samples)})
