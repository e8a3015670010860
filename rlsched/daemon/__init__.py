"""The policy daemon (``rlsched serve``): every interval, observe the node, decide (the
guarded policy, the planner as its fallback), repair and apply, and report.

It sits at the top of the package: it drives :class:`rlsched.envs.gpushare.GpuShareEnv`
with a node backend (:mod:`rlsched.envs.node_backends`) and a policy from
:mod:`rlsched.agents`; the hardware-facing parts (NVML, MPS, telemetry) are in
:mod:`rlsched.node`.
"""
