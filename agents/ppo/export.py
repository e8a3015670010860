"""ONNX export of a trained MaskablePPO policy, observation normalization and masked argmax included.

The graph is written node by node with ``onnx.helper`` (the policy is a small MLP), so it
needs no exporter beyond the ``onnx`` package and computes exactly what SB3's
``predict(normalized_obs, deterministic=True, action_masks=mask)`` does:

1. ``clip((observation - mean) / sqrt(var + 1e-8), -clip_obs, clip_obs)`` (VecNormalize's
   statistics, folded in as constants; skipped when the run did not normalize observations);
2. the policy MLP (``mlp_extractor.policy_net`` then ``action_net``): the logits of every
   level of every MultiDiscrete component;
3. masked levels get the logit -1e8 (sb3-contrib's value), then an argmax per component;
4. the log-probability of that action under the policy's distribution: the sum over
   components of the chosen level's log-softmax (how sure the policy is; the planner takes
   over below the file's ``planner_takeover_probability``, see :mod:`rlsched.agents.onnx_policy`).

Inputs: ``observation`` float32 ``[batch, obs_dim]``, ``action_mask`` bool
``[batch, sum(nvec)]``. Outputs: ``action`` int64 ``[batch, len(nvec)]``,
``action_log_prob`` float32 ``[batch]``. The metadata holds ``nvec`` and ``obs_dim`` (JSON)
and any extra items given (a run's export adds the scenario, the run config,
``planner_takeover_probability`` and ``reconfiguration_check_samples``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rlsched.agents.onnx_policy import CHECK_KEY, TAKEOVER_KEY, check_samples, takeover_probability
from rlsched.errors import ConfigError
from rlsched.fileio import write_bytes_atomically

#: sb3-contrib's logit for a masked level (MaskableCategorical).
MASKED_LOGIT = -1e8
#: VecNormalize's epsilon under the square root.
VECNORMALIZE_EPSILON = 1e-8
#: ONNX opset of the exported graph.
OPSET = 17
#: ONNX IR version: 8 (opset 17's), which any onnxruntime >= 1.14 loads; onnx would write its newest.
IR_VERSION = 8


def deployment_metadata(config: object, probability: float | None = None, samples: int | None = None) -> dict[str, str]:
    """The metadata items of how the policy is deployed: the planner-takeover probability
    (``probability``, or the run config's ``planner_takeover_probability`` when None; checked
    to lie in [0, 1]) and the reconfiguration check's random streams (``samples``, or the run
    config's ``reconfiguration_check_samples`` when None; an integer >= 0)."""
    probability = config.planner_takeover_probability if probability is None else probability  # type: ignore[attr-defined]
    samples = config.reconfiguration_check_samples if samples is None else samples  # type: ignore[attr-defined]
    return {TAKEOVER_KEY: json.dumps(takeover_probability(probability, "--planner-takeover-probability", TAKEOVER_KEY)),
            CHECK_KEY: json.dumps(check_samples(samples, "--reconfiguration-check-samples", CHECK_KEY))}


def linear_layers(modules: list[object]) -> list[tuple[np.ndarray, np.ndarray, str | None]]:
    """(weight, bias, activation op after it) of each Linear in a list of torch modules."""
    import torch

    layers: list[tuple[np.ndarray, np.ndarray, str | None]] = []
    for child in modules:
        if isinstance(child, torch.nn.Linear):
            layers.append((child.weight.detach().cpu().numpy().astype(np.float32), child.bias.detach().cpu().numpy().astype(np.float32), None))
        elif isinstance(child, torch.nn.Tanh | torch.nn.ReLU) and layers:
            weight, bias, _ = layers[-1]
            layers[-1] = (weight, bias, "Tanh" if isinstance(child, torch.nn.Tanh) else "Relu")
        else:
            raise ConfigError("policy", "net_arch", type(child).__name__, "only Linear, Tanh and ReLU layers can be exported")
    return layers


def build_onnx(model: object, obs_mean: np.ndarray | None, obs_var: np.ndarray | None, clip_obs: float, metadata: Mapping[str, str] = {}) -> onnx.ModelProto:
    """The ONNX model of a MaskablePPO policy (``model.policy``) with its normalization.

    :param model: a trained ``sb3_contrib.MaskablePPO``
    :param obs_mean: VecNormalize running mean (None: the run did not normalize observations)
    :param obs_var: VecNormalize running variance
    :param clip_obs: VecNormalize's clipping of normalized observations
    :param metadata: extra string items stored in the model's metadata
    """
    policy = model.policy  # type: ignore[attr-defined]
    nvec = [int(n) for n in policy.action_space.nvec]
    obs_dim = int(np.prod(policy.observation_space.shape))
    if not policy.share_features_extractor or type(policy.features_extractor).__name__ != "FlattenExtractor":
        raise ConfigError("policy", "features_extractor", type(policy.features_extractor).__name__, "only the default shared FlattenExtractor can be exported")
    layers = linear_layers([*policy.mlp_extractor.policy_net.children(), policy.action_net])
    return policy_graph(layers, nvec, obs_dim, obs_mean, obs_var, clip_obs, metadata)


def policy_graph(layers: list[tuple[np.ndarray, np.ndarray, str | None]], nvec: list[int], obs_dim: int, obs_mean: np.ndarray | None,
                 obs_var: np.ndarray | None, clip_obs: float, metadata: Mapping[str, str] = {}) -> onnx.ModelProto:
    """The ONNX graph of any policy MLP (SB3's here, RLlib's in :mod:`rlsched.agents.rllib.export`).

    :param layers: the MLP from observation to the logits of every level, as
        :func:`linear_layers` lists it
    :param nvec: levels of each MultiDiscrete component
    :param obs_dim: observation features
    :param obs_mean: running mean of the observation normalization (None: none)
    :param obs_var: its running variance
    :param clip_obs: clipping of normalized observations
    :param metadata: extra string items stored in the model's metadata
    """
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    x = "observation"
    if obs_mean is not None and obs_var is not None:
        std = np.sqrt(np.asarray(obs_var, dtype=np.float64) + VECNORMALIZE_EPSILON)
        nodes.append(helper.make_node("Sub", [x, const("obs_mean", np.asarray(obs_mean, dtype=np.float32))], ["centered"]))
        nodes.append(helper.make_node("Div", ["centered", const("obs_std", std.astype(np.float32))], ["scaled"]))
        nodes.append(helper.make_node("Clip", ["scaled", const("clip_low", np.float32(-clip_obs)), const("clip_high", np.float32(clip_obs))], ["normalized"]))
        x = "normalized"
    for i, (weight, bias, activation) in enumerate(layers):
        out = f"linear_{i}"
        nodes.append(helper.make_node("Gemm", [x, const(f"weight_{i}", weight), const(f"bias_{i}", bias)], [out], transB=1))
        x = out
        if activation:
            nodes.append(helper.make_node(activation, [x], [f"hidden_{i}"]))
            x = f"hidden_{i}"
    nodes.append(helper.make_node("Where", ["action_mask", x, const("masked_logit", np.float32(MASKED_LOGIT))], ["masked_logits"]))
    starts = np.concatenate([[0], np.cumsum(nvec)])
    picks = []
    for k, n in enumerate(nvec):
        nodes.append(helper.make_node("Slice", ["masked_logits", const(f"start_{k}", np.array([starts[k]], dtype=np.int64)),
                                                const(f"end_{k}", np.array([starts[k] + n], dtype=np.int64)), const(f"axis_{k}", np.array([1], dtype=np.int64))], [f"logits_{k}"]))
        nodes.append(helper.make_node("ArgMax", [f"logits_{k}"], [f"pick_{k}"], axis=1, keepdims=1))
        picks.append(f"pick_{k}")
        # The argmax level's log-softmax is the component's largest one.
        nodes.append(helper.make_node("LogSoftmax", [f"logits_{k}"], [f"log_probs_{k}"], axis=1))
        nodes.append(helper.make_node("ReduceMax", [f"log_probs_{k}"], [f"pick_log_prob_{k}"], axes=[1], keepdims=0))
    nodes.append(helper.make_node("Concat", picks, ["action"], axis=1))
    nodes.append(helper.make_node("Sum", [f"pick_log_prob_{k}" for k in range(len(nvec))], ["action_log_prob"]))
    graph = helper.make_graph(
        nodes, "rlsched_ppo_policy",
        [helper.make_tensor_value_info("observation", TensorProto.FLOAT, ["batch", obs_dim]),
         helper.make_tensor_value_info("action_mask", TensorProto.BOOL, ["batch", int(sum(nvec))])],
        [helper.make_tensor_value_info("action", TensorProto.INT64, ["batch", len(nvec)]),
         helper.make_tensor_value_info("action_log_prob", TensorProto.FLOAT, ["batch"])],
        inits,
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="rlsched", ir_version=IR_VERSION)
    items = {"nvec": json.dumps(nvec), "obs_dim": json.dumps(obs_dim), **metadata}
    for key, value in items.items():
        onnx_model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(onnx_model)
    return onnx_model


def export_run(run_dir: str | Path, out: str | Path | None = None, which: str = "best", planner_takeover_probability: float | None = None,
               reconfiguration_check_samples: int | None = None) -> Path:
    """Export a run folder's policy to ONNX (atomically); returns the file written.

    :param run_dir: a run folder of :func:`rlsched.agents.ppo.train.train`
    :param out: the .onnx file (default: ``<run_dir>/policy.onnx``)
    :param which: ``best`` (the best evaluation; the final model if none), ``final``, or a
        step count naming one of the run's checkpoints
    :param planner_takeover_probability: stored in the metadata: the planner decides the
        steps whose chosen action has a lower probability (None: the run config's
        ``planner_takeover_probability``; 0: never)
    :param reconfiguration_check_samples: stored in the metadata: random streams of the
        simulated check of every reconfiguration (None: the run config's; 0: no check)
    """
    import pickle

    from sb3_contrib import MaskablePPO

    from rlsched.agents.ppo.config import load_config
    from rlsched.agents.ppo.train import BEST_DIR, CHECKPOINT_DIR, CHECKPOINT_PREFIX, CONFIG_FILE, MODEL_FILE, VECNORMALIZE_FILE

    run_dir = Path(run_dir)
    config = load_config(run_dir / CONFIG_FILE)
    best = run_dir / BEST_DIR / "best_model.zip"
    if which.isdigit():
        model_path = run_dir / CHECKPOINT_DIR / f"{CHECKPOINT_PREFIX}_{which}_steps.zip"
        stats_path = run_dir / CHECKPOINT_DIR / f"{CHECKPOINT_PREFIX}_vecnormalize_{which}_steps.pkl"
    elif which == "best" and best.exists() and (run_dir / BEST_DIR / VECNORMALIZE_FILE).exists():
        model_path, stats_path = best, run_dir / BEST_DIR / VECNORMALIZE_FILE
    elif which in ("best", "final"):
        model_path, stats_path = run_dir / MODEL_FILE, run_dir / VECNORMALIZE_FILE
    else:
        raise ConfigError("--which", "--which", which, "allowed: best, final, or the step count of a checkpoint")
    if not model_path.exists():
        raise ConfigError(run_dir, "model", str(model_path), "no such model in the run folder (train it first, or pick an existing checkpoint)")
    model = MaskablePPO.load(model_path, device="cpu")
    mean = var = None
    clip = config.clip_obs
    if config.normalize_obs:
        if not stats_path.exists():
            raise ConfigError(run_dir, VECNORMALIZE_FILE, str(stats_path), "missing: the run normalized observations")
        with open(stats_path, "rb") as handle:
            stats = pickle.load(handle)
        mean, var, clip = stats.obs_rms.mean, stats.obs_rms.var, float(stats.clip_obs)
    onnx_model = build_onnx(model, mean, var, clip, {"scenario": config.scenario, "source": str(model_path.relative_to(run_dir)),
                                                       "num_timesteps": str(model.num_timesteps), "config": config.to_yaml(),
                                                       **deployment_metadata(config, planner_takeover_probability, reconfiguration_check_samples)})
    path = Path(out) if out is not None else run_dir / "policy.onnx"
    write_bytes_atomically(path, onnx_model.SerializeToString())
    return path
