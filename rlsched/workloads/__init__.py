"""Workloads: tenants (inference services, continual-learning jobs, best-effort jobs), their
arrival processes (synthetic and replayed traces) and the scenarios that combine them."""

from rlsched.workloads.scenario import Scenario, load_scenario, with_trace_overrides
from rlsched.workloads.tenants import BestEffortJob, ContinualLearningJob, EkyaCurve, InferenceTenant, Priority

__all__ = ["BestEffortJob", "ContinualLearningJob", "EkyaCurve", "InferenceTenant", "Priority", "Scenario", "load_scenario", "with_trace_overrides"]
