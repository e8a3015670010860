"""Workloads: tenants (inference services, continual-learning jobs, best-effort jobs), their
arrival processes (synthetic and replayed traces) and the scenarios that combine them."""
