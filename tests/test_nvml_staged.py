"""Make-before-break on the NVML path: the staged sequence (create GI/CI, start the new
client, switch, stop the old, destroy) against the fake NVML, with a fault at every call."""

import pynvml
import pytest

from rlsched.node.fake_nvml import FakeNvml
from rlsched.node.mps import MpsManager, TenantClient
from rlsched.envs.node_backends import ApplyError, NvmlNodeBackend
from rlsched.node.nvml_backend import BackendError
from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.hardware import parse_layout
from rlsched.simulator.testing import FakePerformanceModel
from rlsched.workloads.arrivals import PoissonArrivals
from rlsched.workloads.scenario import Scenario
from rlsched.workloads.tenants import InferenceTenant

GPU = "a100-40gb"
RESTART_S = {"a": 2.0, "b": 3.0}


def _config(spec: str, placements: dict) -> Configuration:
    layout = parse_layout(spec, GPU)
    return Configuration((layout,), ((SharingMode.MPS,) * len(layout),), placements)


OLD = _config("3g@0,2g@4", {"a": TenantPlacement(0, 0, 100, 8), "b": TenantPlacement(0, 1, 100, 8)})
#: b moves to a new 1g on the free slice 6 and a's share changes in its kept 3g: both staged.
NEW = _config("3g@0,1g@6", {"a": TenantPlacement(0, 0, 50, 8), "b": TenantPlacement(0, 1, 100, 8)})


class _Process:
    def __init__(self, clients: "FakeClients", tenant: str, pid: int) -> None:
        self.clients, self.tenant, self.pid = clients, tenant, pid
        self.ready_s = clients.fake.clock() + RESTART_S[tenant]
        self.stopped_s: float | None = None

    def stop(self, grace_s: float) -> None:
        self.clients.fake.stop_process(self.pid)
        self.stopped_s = self.clients.fake.clock()


class FakeClients:
    """An MPS runner whose clients are processes on the fake's MIG devices (a GI with a
    client is busy: IN_USE on destroy), ready ``RESTART_S`` after they start."""

    def __init__(self, fake: FakeNvml) -> None:
        self.fake, self.processes = fake, []

    def run(self, argv, env, input_text=None) -> int:
        return 0

    def start(self, argv, env) -> _Process:
        where = self.fake.instance_of_uuid(env["CUDA_VISIBLE_DEVICES"])
        assert where is not None, "a client started on a MIG device that does not exist"
        process = _Process(self, argv[-1], self.fake.start_process(*where))
        self.processes.append(process)
        return process

    def longest_gap_s(self, tenant: str, since_s: float, until_s: float) -> float:
        """Longest time in [since, until] with no ready, running client of ``tenant``."""
        up = sorted((p.ready_s, p.stopped_s if p.stopped_s is not None else until_s) for p in self.processes if p.tenant == tenant)
        gap, covered = 0.0, since_s
        for start, stop in up:
            if stop <= covered:
                continue
            gap = max(gap, start - covered)
            covered = max(covered, stop)
        return max(gap, until_s - covered)


def node(fault=None, make_before_break=True, steps=None):
    """A node in OLD with both clients ready, then the step to NEW (``fault``: (call, code,
    after_effect); ``steps``: a list the two steps' results are appended to)."""
    tenants = [InferenceTenant(n, "toy-a", slo_ms=50, arrivals=PoissonArrivals(10.0), restart_s=RESTART_S[n]) for n in ("a", "b")]
    scenario = Scenario("staged", GPU, 1, 600.0, 10.0, tenants, reference=OLD, make_before_break=make_before_break)
    fake = FakeNvml([GPU], layouts=["3g@0,2g@4"])
    runner = FakeClients(fake)
    clients = {n: TenantClient(("serve", n), restart_s=RESTART_S[n]) for n in RESTART_S}
    backend = NvmlNodeBackend(scenario, FakePerformanceModel(), nvml=fake, apply=True, mps=MpsManager(clients, runner=runner, base_env={}),
                              sleep=fake.sleep, clock=fake.clock, telemetry=False)
    first = backend.step(OLD)
    if steps is not None:
        steps.append(first)
    started, calls = fake.clock(), len(fake.calls)
    if fault is not None:
        fake.inject_fault(fault[0], fault[1], after_effect=fault[2])
    error = None
    try:
        result = backend.step(NEW)
        if steps is not None:
            steps.append(result)
    except (ApplyError, BackendError) as exc:
        error = exc
    return fake, runner, backend, started, len(fake.calls) - calls, error


CALLS = node()[4]


def test_a_staged_change_switches_every_tenant_without_downtime():
    fake, runner, backend, started, calls, error = node()
    assert error is None and fake.layout(0) == NEW.layouts[0] and calls > 20
    for tenant in RESTART_S:
        assert runner.longest_gap_s(tenant, started, fake.clock()) == 0.0
    # Each tenant's new client started before its old one stopped: 2 + 2 processes, 2 running.
    assert len(runner.processes) == 4 and sum(p.stopped_s is None for p in runner.processes) == 2
    b_old, b_new = [p for p in runner.processes if p.tenant == "b"]
    assert b_new.ready_s <= b_old.stopped_s
    # The old 2g went only after b switched (a busy GI cannot be destroyed).
    assert fake.instance_of_uuid(backend.mps.running["b"][0].device_uuid) == (0, 6)
    assert backend.mps.running["a"][0].mps_pct == 50


def test_each_step_reports_the_downtime_of_the_clients_it_stopped_and_started_again():
    """What a policy reads to tell a restart's late answers from its tenant's own
    (``BurstRates``): the first deployment and a full restart report each restarted client's
    restart (plus its GPU's time without instances where its GI is new); a staged switch none."""
    steps = []
    node(steps=steps)
    deployed, staged = steps
    for tenant, restart_s in RESTART_S.items():
        assert deployed.tenants[tenant].downtime_s >= restart_s
        assert staged.tenants[tenant].downtime_s == 0.0
    steps = []
    node(make_before_break=False, steps=steps)
    restarted = steps[1].tenants
    assert restarted["a"].downtime_s == RESTART_S["a"]  # a new share in its kept 3g: the client's restart
    assert restarted["b"].downtime_s > RESTART_S["b"]  # a new 1g: created (and the 2g destroyed) first


@pytest.mark.parametrize("after_effect", [False, True], ids=["before-effect", "lost-reply"])
@pytest.mark.parametrize("call_index", range(CALLS))
def test_a_fault_at_any_call_loses_no_instance_and_no_tenant_waits_longer_than_its_restart(call_index, after_effect):
    fake, runner, backend, started, _, error = node((call_index, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, after_effect))
    state = fake.layout(0)
    assert state in (OLD.layouts[0], NEW.layouts[0]) and not fake.gis_without_ci(0)
    # A failed change is rolled back; a read that fails after the layout changed raises too
    # (the daemon retries the next interval), with every client already on the new layout.
    assert error is not None or state == NEW.layouts[0]
    goal = NEW if state == NEW.layouts[0] else OLD
    for tenant in RESTART_S:
        # Exactly one client per tenant, on its instance of the configuration in place.
        target, _ = backend.mps.running[tenant]
        p = goal.placements[tenant]
        assert fake.instance_of_uuid(target.device_uuid) == (0, goal.layouts[0].instances[p.instance_index].start)
        assert sum(q.tenant == tenant and q.stopped_s is None for q in runner.processes) == 1
        assert runner.longest_gap_s(tenant, started, fake.clock()) <= RESTART_S[tenant] + 1e-9
    assert not backend.mps.staging


@pytest.mark.parametrize("staged", [True, False], ids=["make-before-break", "full-restart"])
def test_the_daemon_serving_with_apply_performs_a_staged_change_end_to_end(tmp_path, staged):
    """`rlsched serve --backend nvml --apply` against the fake: the first cycle deploys OLD, the
    second decides NEW, and the daemon's apply stages it (no tenant without a ready client);
    with the scenario's switch off, b stops before its new client is ready."""
    from rlsched.agents.baselines import Policy
    from rlsched.daemon.config import DaemonConfig
    from rlsched.daemon.loop import Daemon

    scenario = tmp_path / "staged.yaml"
    scenario.write_text(f"""name: staged
gpu: {GPU}
duration_s: 600
decision_interval_s: 10
reconfiguration: {{make_before_break: {str(staged).lower()}}}
tenants:
  - {{name: a, model: resnet50, slo_ms: 50, restart_s: {RESTART_S["a"]}, arrivals: {{kind: poisson, rate_rps: 10}}}}
  - {{name: b, model: alexnet, slo_ms: 30, restart_s: {RESTART_S["b"]}, arrivals: {{kind: poisson, rate_rps: 10}}}}
reference:
  layouts: ["3g.20gb@0,2g.10gb@4"]
  placements: {{a: {{instance: 0, batch_size: 8}}, b: {{instance: 1, batch_size: 8}}}}
""")
    fake = FakeNvml([GPU], layouts=["3g@0,2g@4"])

    class Scripted(Policy):
        """OLD at the first cycle, NEW from the second on (remembering when NEW was decided)."""

        name = "scripted"
        decided_new_s: float | None = None

        def act(self, observation, env):
            if self.decided_new_s is None and getattr(self, "deployed", False):
                self.decided_new_s = fake.clock()
            self.deployed = True
            return NEW if self.decided_new_s is not None else OLD

    runner = FakeClients(fake)
    clients = {n: TenantClient(("serve", n), restart_s=RESTART_S[n]) for n in RESTART_S}
    config = DaemonConfig(scenario=str(scenario), backend="nvml", apply=True, cycles=2, policy="migrator-ilp", metrics_addr=None,
                          observation_tolerance=1e9, source=str(tmp_path / "daemon.yaml"))
    seen: list[str] = []
    daemon = Daemon(config, backend_options={"nvml": fake, "sleep": fake.sleep, "clock": fake.clock, "telemetry": False,
                                             "mps": MpsManager(clients, runner=runner, base_env={})},
                    on_cycle=lambda d: seen.append(fake.layout(0).spec()))
    daemon.guard.policy = scripted = Scripted()
    assert daemon.run() == 0 and daemon.fallbacks == 0
    assert seen == ["3g.20gb@0,2g.10gb@4", "3g.20gb@0,1g.5gb@6"]
    gaps = {tenant: runner.longest_gap_s(tenant, scripted.decided_new_s, fake.clock()) for tenant in RESTART_S}
    if staged:
        assert gaps == {"a": 0.0, "b": 0.0}  # every tenant always had a ready client
        b_old, b_new = [p for p in runner.processes if p.tenant == "b"]
        assert b_new.ready_s <= b_old.stopped_s and b_new.stopped_s is None
    else:
        assert gaps["b"] >= RESTART_S["b"]  # stopped, then restarted on its new GI
