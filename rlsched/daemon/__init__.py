"""The hardware-facing half of the daemon: MIG through NVML, MPS shares, mig-parted, probing.

``nvml_backend`` reads and changes MIG layouts through NVML; ``fake_nvml`` is the in-memory
NVML the tests (and demos) run it against; ``mps`` restarts tenants' clients with their MPS
share; ``mig_parted_backend`` writes mig-parted configs and the Kubernetes node label;
``probe`` reports what NVML sees.
"""
