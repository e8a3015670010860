"""Gymnasium environments of rlsched (installed as ``rlsched.envs``).

``gymnasium.make("rlsched/GpuShare-v0", scenario="default")`` builds
:class:`~rlsched.envs.gpushare.GpuShareEnv`; the time limit comes from the registration
(:data:`MAX_EPISODE_STEPS`: one hour of 10 s decisions, the default scenario's episode),
overridable with ``gymnasium.make(..., max_episode_steps=N)``.
"""

import gymnasium

#: Registered time limit, steps (truncation). The env also truncates when the scenario's
#: duration has been simulated, so shorter scenarios end on their own.
MAX_EPISODE_STEPS = 360

ENV_ID = "rlsched/GpuShare-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="rlsched.envs.gpushare:GpuShareEnv", max_episode_steps=MAX_EPISODE_STEPS)

__all__ = ["ENV_ID", "MAX_EPISODE_STEPS"]
