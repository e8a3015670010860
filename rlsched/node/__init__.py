"""A real node, below the environment: MIG through NVML, MPS shares, telemetry, mig-parted, probing.

``nvml_backend`` reads and changes MIG layouts through NVML; ``fake_nvml`` is the in-memory
NVML the tests (and demos) run it against; ``mps`` restarts tenants' clients with their MPS
share; ``mig_parted_backend`` writes mig-parted configs and the Kubernetes node label;
``sources`` reads per-tenant measurements (Prometheus) and NVML telemetry; ``probe``
reports what NVML sees. :mod:`rlsched.envs.node_backends` drives them as an environment
backend, which the daemon (:mod:`rlsched.daemon`) runs.
"""
