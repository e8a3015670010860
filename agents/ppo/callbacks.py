"""TensorBoard callbacks of the training loop: the :mod:`rlsched.metrics` names during
rollouts, and at each evaluation the same metrics (``eval/...``) plus a partition timeline image."""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Image
from stable_baselines3.common.vec_env import VecEnv

from rlsched.fileio import write_bytes_atomically
from rlsched.hardware import load_gpu, parse_layout
from rlsched.metrics import STEPS_PER_S, MetricAggregator


def take_repair_timings(venv: VecEnv, indices: Sequence[int] | None = None) -> list[tuple[int, float, float]]:
    """Per environment of ``venv``, the repair wall time since the last collection
    (``(count, sum_ms, max_ms)``; timings are not in ``info``, see :mod:`rlsched.metrics`);
    none for environments that do not keep one. One call per rollout, not per step: the
    environments may live in other processes."""
    try:
        return list(venv.env_method("take_repair_timing", indices=indices))
    except AttributeError:
        return []


class RolloutMetricsCallback(BaseCallback):
    """Aggregates the step ``info`` of every training environment over each rollout and
    records :mod:`rlsched.metrics` (``goodput/*``, ``slo/*``, ``reconfig/*``, ``repair/*``,
    ``perf/steps_per_s``: environment steps per wall second, rollout and update included)."""

    def __init__(self, once: dict[str, float] | None = None) -> None:
        """:param once: values recorded with the first rollout (e.g. ``pretrain/*``)"""
        super().__init__()
        self.once = dict(once or {})
        self.aggregator = MetricAggregator()
        self._last_time = time.perf_counter()
        self._last_steps = 0

    def _on_training_start(self) -> None:
        self._last_time = time.perf_counter()
        self._last_steps = self.num_timesteps

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            self.aggregator.add(info)
        return True

    def _on_rollout_end(self) -> None:
        for timing in take_repair_timings(self.training_env):
            self.aggregator.add_repair_timing(*timing)
        for name, value in self.once.items():
            self.logger.record(name, value)
        self.once = {}
        for name, value in self.aggregator.summary().items():
            self.logger.record(name, value)
        now = time.perf_counter()
        if now > self._last_time and self.num_timesteps > self._last_steps:
            self.logger.record(STEPS_PER_S, (self.num_timesteps - self._last_steps) / (now - self._last_time))
        self._last_time, self._last_steps = now, self.num_timesteps
        self.aggregator.reset()


def partition_timeline_png(layouts: Sequence[Sequence[str]], gpu: str, interval_s: float, title: str) -> bytes:
    """A PNG of the MIG layout over time: per GPU, one bar per GI over its memory slices,
    coloured by compute size.

    :param layouts: per decision step, the layout spec of each GPU (``info["layout"]``)
    :param gpu: catalog name of the GPU type (to read each profile's memory slices)
    :param interval_s: decision interval, seconds (the x axis is simulated time)
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = load_gpu(gpu)
    gpus = len(layouts[0]) if layouts else 1
    slices = max(spec.memory_slices, 1)
    fig, ax = plt.subplots(figsize=(8, 1.0 + 1.2 * gpus))
    cmap = plt.get_cmap("viridis")
    sizes = sorted({p.compute_slices for p in spec.profiles.values()}) or [1]
    for g in range(gpus):
        start_step = 0
        for step in range(1, len(layouts) + 1):
            if step < len(layouts) and layouts[step][g] == layouts[start_step][g]:
                continue
            text = layouts[start_step][g]
            for gi in (parse_layout(text, spec).instances if text else ()):
                profile = spec.profiles[gi.profile]
                y = g * (slices + 1) + gi.start
                color = cmap(sizes.index(profile.compute_slices) / max(len(sizes) - 1, 1))
                ax.broken_barh([(start_step * interval_s, (step - start_step) * interval_s)], (y + 0.05, profile.memory_slices - 0.1),
                               color=color, edgecolor="black", linewidth=0.3)
            start_step = step
    handles = [matplotlib.patches.Patch(color=cmap(i / max(len(sizes) - 1, 1)), label=f"{s}g") for i, s in enumerate(sizes)]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="GI size")
    ax.set_xlabel("simulated time, s")
    ax.set_ylabel("memory slice (per GPU)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


class MetricsEvalCallback(MaskableEvalCallback):
    """MaskableEvalCallback that also records the :mod:`rlsched.metrics` of the evaluation
    episodes as ``eval/<name>``, saves the VecNormalize statistics next to the best model,
    and draws the first evaluation episode's partition timeline (``timelines/step_N.png``
    in the run folder, and the TensorBoard image ``eval/partition_timeline``).

    :param gpu: catalog name of the evaluation scenario's GPU type
    :param interval_s: its decision interval, seconds
    :param timeline_dir: folder of the timeline PNGs
    """

    def __init__(self, *args: Any, gpu: str, interval_s: float, timeline_dir: str | Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gpu = gpu
        self.interval_s = interval_s
        self.timeline_dir = Path(timeline_dir)
        self.aggregator = MetricAggregator()
        self.layouts: list[tuple[str, ...]] = []
        self._first_episode_done = False

    def _on_training_start(self) -> None:
        # A fresh run is evaluated before its first update too: with a warm start, that
        # is the imitated policy, kept as the best model unless PPO improves on it.
        if self.model.num_timesteps == 0:
            self._on_step()

    def _log_success_callback(self, locals_: dict[str, Any], globals_: dict[str, Any]) -> None:
        super()._log_success_callback(locals_, globals_)
        if locals_["i"] != 0:
            return  # timeline and metrics from the first evaluation environment
        info = locals_["info"]
        self.aggregator.add(info)
        if not self._first_episode_done and "layout" in info:
            self.layouts.append(tuple(info["layout"]))
        if locals_["done"]:
            self._first_episode_done = True

    def _on_step(self) -> bool:
        evaluating = self.eval_freq > 0 and self.n_calls % self.eval_freq == 0
        if not evaluating:
            return super()._on_step()
        self.aggregator.reset()
        self.layouts = []
        self._first_episode_done = False
        best_before = self.best_mean_reward
        started = time.perf_counter()
        take_repair_timings(self.eval_env, [0])  # forget steps taken outside this evaluation
        keep_going = super()._on_step()
        for timing in take_repair_timings(self.eval_env, [0]):  # the first environment's, like the other metrics
            self.aggregator.add_repair_timing(*timing)
        if self.best_mean_reward > best_before and self.best_model_save_path is not None:
            normalize = self.model.get_vec_normalize_env()
            if normalize is not None:
                normalize.save(str(Path(self.best_model_save_path) / "vecnormalize.pkl"))
        for name, value in self.aggregator.summary(time.perf_counter() - started).items():
            self.logger.record(f"eval/{name}", value)
        if self.layouts:
            png = partition_timeline_png(self.layouts, self.gpu, self.interval_s, f"evaluation at step {self.num_timesteps}")
            write_bytes_atomically(self.timeline_dir / f"step_{self.num_timesteps}.png", png)
            import matplotlib.image

            image = (matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3] * 255).astype(np.uint8)
            self.logger.record("eval/partition_timeline", Image(image, "HWC"), exclude=("stdout", "log", "json", "csv"))
        self.logger.dump(self.num_timesteps)
        return keep_going
