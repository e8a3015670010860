"""The request-level simulator: queueing theory, conservation, batching, reconfiguration,
sharing modes, continual learning, reproducibility and Goodput additivity.

Uses the deterministic toy performance model so the expected numbers are exact.
"""

import dataclasses
import math

import numpy as np
import pytest

from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.hardware import load_gpu, parse_layout
from rlsched.simulator import queueing as q
from rlsched.simulator.node import NodeSimulator
from rlsched.simulator.testing import FakePerformanceModel
from rlsched.goodput import GoodputWeights
from rlsched.workloads.arrivals import MmppArrivals, PoissonArrivals, TimestampArrivals
from rlsched.workloads.scenario import Scenario
from rlsched.workloads.tenants import BestEffortJob, ContinualLearningJob, EkyaCurve, InferenceTenant, Priority

GPU = "a100-40gb"


def config(layout: str, placements: dict, modes=None) -> Configuration:
    lay = parse_layout(layout, GPU)
    return Configuration((lay,), (tuple(modes or [SharingMode.MPS] * len(lay)),), placements)


def scenario(tenants, duration_s=100.0, interval_s=10.0, jitter=False, gpu_count=1, mbb=True) -> Scenario:
    return Scenario("test", GPU, gpu_count, duration_s, interval_s, tenants, service_jitter=jitter, make_before_break=mbb)


def check_conservation(sim: NodeSimulator, result, before: dict) -> None:
    for name, st in result.tenants.items():
        if st.kind == "inference":
            assert st.queued_at_end == before.get(name, 0) + st.arrived - st.completed - st.dropped, name
            before[name] = st.queued_at_end


# ------------------------------------------------------------------ queueing theory
def test_md1_mean_queueing_delay_matches_pollaczek_khinchine():
    """M/D/1 at 70% load: deterministic 1 ms service, Poisson arrivals at 700/s."""
    perf = FakePerformanceModel(base_ms=0.5, per_item_ms=0.5)  # 1 ms per request on 7g
    tenant = InferenceTenant("a", "toy-a", slo_ms=1000, arrivals=PoissonArrivals(700.0), max_batch=1, batch_timeout_ms=0, queue_capacity=100000)
    sim = NodeSimulator(scenario([tenant], duration_s=2000.0, interval_s=10.0), perf, seed=7)
    cfg = config("7g@0", {"a": TenantPlacement(0, 0, 100.0, 1)})
    latency_sum_ms = completed = 0
    while not sim.done:
        st = sim.step(cfg).tenants["a"]
        latency_sum_ms += st.latency_ms_mean * st.completed
        completed += st.completed
    service_ms, rho = 1.0, 0.7
    wait_ms = latency_sum_ms / completed - service_ms
    pk_ms = rho * service_ms / (2 * (1 - rho))  # Pollaczek-Khinchine: W_q = rho S / (2 (1 - rho))
    assert wait_ms == pytest.approx(pk_ms, rel=0.05)


def test_kernel_conserves_requests_under_overload_and_drops_at_the_bound():
    rng = np.random.default_rng(0)
    cap, batch = 50, 4
    wait_buf, flight_buf, state = np.zeros(cap), np.zeros(batch), q.new_state()
    hist, out = np.zeros(q.HIST_BINS, dtype=np.int64), np.zeros(q.OUT_SIZE)
    mean = np.array([0.0, 0.01, 0.012, 0.014, 0.016])  # ~250 req/s at batch 4
    for k in range(20):
        arrivals = np.sort(rng.uniform(k, k + 1, 400))  # 400 req/s
        q.serve_interval(arrivals, k, k + 1.0, k, wait_buf, flight_buf, state, mean, np.zeros(5), batch, 0.001, 0.1, rng, hist, out)
        in_system = state[q.S_WAITING] + state[q.S_FLIGHT_N]
        assert out[q.O_ARRIVED] == out[q.O_COMPLETED] + out[q.O_DROPPED] + in_system
        assert state[q.S_WAITING] <= cap
    assert out[q.O_DROPPED] > 0
    assert hist.sum() == out[q.O_COMPLETED]


def test_dynamic_batching_waits_for_the_timeout_or_a_full_batch():
    rng = np.random.default_rng(0)
    wait_buf, flight_buf, state = np.zeros(100), np.zeros(4), q.new_state()
    hist, out = np.zeros(q.HIST_BINS, dtype=np.int64), np.zeros(q.OUT_SIZE)
    mean = np.array([0.0, 0.001, 0.001, 0.001, 0.001])
    # Two requests: the batch starts at the first one's timeout (5 ms) and ends 1 ms later.
    q.serve_interval(np.array([0.0, 0.002]), 0.0, 1.0, 0.0, wait_buf, flight_buf, state, mean, np.zeros(5), 4, 0.005, 1.0, rng, hist, out)
    assert out[q.O_BATCHES] == 1 and out[q.O_LATENCY_SUM_S] == pytest.approx(0.006 + 0.004)
    # Four requests by 3 ms: the batch is full at the fourth arrival and starts then.
    out[:] = 0
    q.serve_interval(np.array([2.0, 2.001, 2.002, 2.003]), 1.0, 3.0, 1.0, wait_buf, flight_buf, state, mean, np.zeros(5), 4, 0.005, 1.0, rng, hist, out)
    assert out[q.O_BATCHES] == 1 and out[q.O_LATENCY_SUM_S] == pytest.approx(0.004 + 0.003 + 0.002 + 0.001)


def test_a_queue_timeout_rejects_the_requests_that_outwaited_it_and_serves_the_rest_on_time():
    rng = np.random.default_rng(0)
    mean = np.array([0.0, 0.01, 0.01, 0.01, 0.01])  # 10 ms a batch of up to 4: 400 req/s

    def serve(queue_timeout_s):
        wait_buf, flight_buf, state = np.zeros(1000), np.zeros(4), q.new_state()
        hist, out = np.zeros(q.HIST_BINS, dtype=np.int64), np.zeros(q.OUT_SIZE)
        # 1 s of 200 req/s while the server is down (until t = 1 s), then 1 s more at that rate.
        arrivals = np.arange(0.0, 2.0, 0.005)
        q.serve_interval(arrivals, 0.0, 3.0, 1.0, wait_buf, flight_buf, state, mean, np.zeros(5), 4, 0.001, 0.05, rng, hist, out,
                         queue_timeout_s)
        return out

    fifo, rejecting = serve(math.inf), serve(0.03)
    for out in (fifo, rejecting):
        assert out[q.O_ARRIVED] == 400 and out[q.O_COMPLETED] + out[q.O_DROPPED] == 400
    # FIFO serves the 200 queued requests first, and the backlog makes later arrivals late too.
    assert fifo[q.O_DROPPED] == 0 and fifo[q.O_ON_TIME] < 200 - 50
    # With a 30 ms timeout the server rejects, on its return, what waited longer (all but the
    # last 30 ms of the downtime's arrivals) and serves every later arrival within the SLO.
    assert 190 <= rejecting[q.O_DROPPED] <= 195
    assert rejecting[q.O_ON_TIME] == rejecting[q.O_COMPLETED] >= 200


def test_histogram_bins_and_percentiles_are_within_two_percent():
    edges_ms = q.histogram_edges_ms()
    assert np.all(np.diff(edges_ms) > 0) and np.max(edges_ms[1:] / edges_ms[:-1]) <= 1 + 1 / 64 + 1e-12
    latencies_s = np.random.default_rng(3).lognormal(np.log(0.02), 0.8, 20000)
    hist = np.zeros(q.HIST_BINS, dtype=np.int64)
    for x in latencies_s:
        k = q.histogram_bin(x)
        assert (edges_ms[k - 1] if k else 0.0) <= x * 1000 < edges_ms[k]
        hist[k] += 1
    for p in (50, 99):
        exact = np.percentile(latencies_s * 1000, p)
        assert exact <= q.percentile_ms(hist, p) <= exact * (1 + 1 / 64) + 1e-9


# ------------------------------------------------------------------ node simulator
def four_tenants(rate=150.0, capacity=4096):
    return [
        InferenceTenant(f"t{i}", "toy-a", slo_ms=50, arrivals=MmppArrivals([rate / 2, rate * 3], [20, 5]) if i % 2 else PoissonArrivals(rate),
                        max_batch=16, batch_timeout_ms=2, queue_capacity=capacity, restart_s=3.0)
        for i in range(4)
    ]


LAYOUT = "2g@0,2g@2,2g@4,1g@6"


def spread(batch=8, mps=100.0):
    return {f"t{i}": TenantPlacement(0, i, mps, batch) for i in range(4)}


def test_conservation_every_step_through_reconfigurations_and_drops():
    sim = NodeSimulator(scenario(four_tenants(rate=400.0, capacity=200), duration_s=300.0), FakePerformanceModel(p99_ratio=1.5), seed=1)
    plans = [config(LAYOUT, spread()), config("7g@0", {f"t{i}": TenantPlacement(0, 0, 25.0, 16) for i in range(4)}),
             config("3g@0,3g@4", {"t0": TenantPlacement(0, 0), "t1": TenantPlacement(0, 1, 50, 4), "t2": TenantPlacement(0, 1, 50, 4), "t3": TenantPlacement(0, 0, 100, 2)})]
    before: dict = {}
    dropped = 0
    for k in range(30):
        result = sim.step(plans[(k // 3) % 3])
        check_conservation(sim, result, before)
        dropped += sum(st.dropped for st in result.tenants.values())
    assert dropped > 0  # the small queues did overflow
    totals = sim.summary()
    for entry in totals.values():
        assert entry["arrived"] == entry["completed"] + entry["dropped"] + entry["queued_at_end"]


def _merge_two_2g_into_a_4g(mbb: bool):
    """(simulator, step result) of t0 (2g@0) and t1 (2g@2) moving into a new 4g@0."""
    sim = NodeSimulator(scenario(four_tenants(), mbb=mbb), FakePerformanceModel(), seed=2)
    start = config(LAYOUT, spread())
    sim.reset(2, configuration=start)
    sim.step(start)
    new = config("4g@0,2g@4,1g@6", {"t0": TenantPlacement(0, 0, 50, 8), "t1": TenantPlacement(0, 0, 50, 8), "t2": TenantPlacement(0, 1, 100, 8), "t3": TenantPlacement(0, 2, 100, 8)})
    return sim, sim.step(new)


def test_layout_change_costs_gi_time_plus_restart_and_requests_keep_queueing():
    tenants = four_tenants()
    # Merge the first two 2g instances into a 4g: t0 and t1 move; t2 and t3 keep their instances.
    sim, result = _merge_two_2g_into_a_4g(mbb=False)
    spec = load_gpu(GPU)
    gi_s = 2 * spec.profiles["2g.10gb"].destroy_s + spec.profiles["4g.20gb"].create_s
    assert result.gpu_reconfiguration_s[0] == pytest.approx(gi_s)
    for name in ("t0", "t1"):
        st = result.tenants[name]
        assert st.restarted and st.downtime_s == pytest.approx(gi_s + 3.0)
        # Nothing is served during ~3.4 s of the 10 s interval.
        assert st.utilization < 1.0 - (gi_s + 3.0) / 10 + 1e-6
    for name in ("t2", "t3"):
        assert not result.tenants[name].restarted and result.tenants[name].downtime_s == 0
    # A tenant down for the whole interval only queues.
    sim2 = NodeSimulator(scenario([dataclasses.replace(tenants[0], restart_s=25.0)], mbb=False), FakePerformanceModel(), seed=2)
    a = config("7g@0", {"t0": TenantPlacement(0, 0, 100, 8)})
    sim2.reset(2, configuration=a)
    down = sim2.step(config("7g@0", {"t0": TenantPlacement(0, 0, 50, 8)})).tenants["t0"]  # MPS share change: restart
    assert down.restarted and down.completed == 0 and down.queued_at_end == down.arrived


def test_a_queue_timeout_leaves_no_backlog_late_after_a_restart():
    """The tenant's ``queue_timeout_ms`` reaches the server: after a 5 s restart a FIFO server
    answers the next interval late while it drains the backlog; one that rejects what waited
    longer than its SLO serves that interval on time."""
    after_restart = {}
    for timeout_ms in (None, 50.0):
        tenant = InferenceTenant("a", "toy-a", slo_ms=50, arrivals=PoissonArrivals(600.0), max_batch=16, batch_timeout_ms=2,
                                 queue_timeout_ms=timeout_ms, restart_s=5.0)
        sim = NodeSimulator(scenario([tenant], mbb=False), FakePerformanceModel(), seed=3)
        sim.reset(3, configuration=config("7g@0", {"a": TenantPlacement(0, 0, 100, 16)}))
        down = sim.step(config("7g@0", {"a": TenantPlacement(0, 0, 50, 16)})).tenants["a"]  # share change: restart
        assert down.restarted
        after_restart[timeout_ms] = sim.step(config("7g@0", {"a": TenantPlacement(0, 0, 50, 16)})).tenants["a"]
        if timeout_ms is not None:
            assert down.dropped > 0.9 * 600 * 4.95  # what arrived while down, but its last 50 ms
    assert after_restart[None].slo_attainment < 0.5
    assert after_restart[50.0].slo_attainment > 0.98 and after_restart[50.0].dropped < 10


def test_make_before_break_new_gi_on_free_slices_costs_no_downtime():
    # t0..t2 in 2g GIs, slices 6-7 free: t2 moves to a new 1g@6 while its 2g@4 keeps serving.
    tenants = four_tenants()[:3]
    spec = load_gpu(GPU)
    start = config("2g@0,2g@2,2g@4", {f"t{i}": TenantPlacement(0, i, 100, 8) for i in range(3)})
    new = config("2g@0,2g@2,1g@6", {"t0": TenantPlacement(0, 0, 100, 8), "t1": TenantPlacement(0, 1, 100, 8), "t2": TenantPlacement(0, 2, 100, 8)})
    results = {}
    for mbb in (True, False):
        sim = NodeSimulator(scenario(tenants, mbb=mbb), FakePerformanceModel(), seed=5)
        sim.reset(5, configuration=start)
        sim.step(start)
        results[mbb] = sim.step(new)
    (change,) = results[True].changes
    ready_s = spec.profiles["1g.5gb"].create_s + 3.0
    assert (change.tenant, change.kind, change.mechanism) == ("t2", "move", "make-before-break")
    assert change.downtime_s == 0.0 and change.old_served_s == pytest.approx(ready_s)
    assert results[True].tenants["t2"].downtime_s == 0.0 and results[True].tenants["t2"].restarted
    # Without make-before-break the same change stops t2 for the GI time plus its restart.
    (full,) = results[False].changes
    gi_s = spec.profiles["2g.10gb"].destroy_s + spec.profiles["1g.5gb"].create_s
    assert (full.mechanism, full.old_served_s) == ("full-restart", 0.0) and full.downtime_s == pytest.approx(gi_s + 3.0)
    # Staged, t2 serves the whole interval; restarted, it loses ~3.4 s of it.
    assert results[True].tenants["t2"].utilization > results[False].tenants["t2"].utilization
    assert results[True].tenants["t2"].queued_at_end < results[False].tenants["t2"].queued_at_end


def test_make_before_break_serves_on_the_old_instance_until_the_new_one_is_ready():
    # t0 (700 req/s) is overloaded on a 1g (190 req/s at batch 8) and on the new 3g (571 req/s) it moves to on free
    # slices: until the 3g's server is ready it still serves at the 1g's speed, not the 3g's.
    spec = load_gpu(GPU)
    t0 = InferenceTenant("t0", "toy-a", slo_ms=10_000, arrivals=PoissonArrivals(700.0), max_batch=8, batch_timeout_ms=2,
                         queue_capacity=100_000, restart_s=3.0)
    start = config("1g@6", {"t0": TenantPlacement(0, 0, 100, 8)})
    new = config("3g@0,1g@6", {"t0": TenantPlacement(0, 0, 100, 8)})
    sim = NodeSimulator(scenario([t0]), FakePerformanceModel(), seed=3)
    sim.reset(3, configuration=start)
    sim.step(start)
    result = sim.step(new)
    (change,) = result.changes
    ready_s = spec.profiles["3g.20gb"].create_s + 3.0
    assert (change.mechanism, change.downtime_s) == ("make-before-break", 0.0) and change.old_served_s == pytest.approx(ready_s)
    per_batch_s = (2.0 + 0.5 * 8) / 1000.0  # the toy model's batch of 8 on the whole GPU
    old_rps, new_rps = 8 / (per_batch_s * 7 / 1), 8 / (per_batch_s * 7 / 3)
    expected = old_rps * ready_s + new_rps * (10.0 - ready_s)
    assert result.tenants["t0"].completed == pytest.approx(expected, rel=0.01)
    # The interval after runs on the 3g alone.
    assert sim.step(new).tenants["t0"].completed == pytest.approx(new_rps * 10.0, rel=0.01)


def test_make_before_break_job_works_at_the_old_instance_speed_until_the_switch():
    spec = load_gpu(GPU)
    job = BestEffortJob("be", "toy-b", restart_s=2.0)
    on_1g = config("1g@6", {"be": TenantPlacement(0, 0, 100, 8)})
    on_3g = config("3g@0,1g@6", {"be": TenantPlacement(0, 0, 100, 8)})

    def progress(first, second):
        sim = NodeSimulator(scenario([job]), FakePerformanceModel(), seed=1)
        sim.reset(1, configuration=first)
        sim.step(first)
        return sim.step(second).tenants["be"].best_effort_progress_s

    ready_s = spec.profiles["3g.20gb"].create_s + 2.0
    # Steady progress on each instance over a whole interval, then the switch interval.
    per_s_1g, per_s_3g = progress(on_1g, on_1g) / 10.0, progress(on_3g, on_3g) / 10.0
    assert per_s_3g > 2 * per_s_1g
    assert progress(on_1g, on_3g) == pytest.approx(per_s_1g * ready_s + per_s_3g * (10.0 - ready_s), rel=1e-6)


def test_staged_plan_destroys_the_gi_of_a_leaving_tenant_first():
    # A best-effort job leaves its 4g@0; t0 moves from 3g@4 into a new 2g@0 on the freed slices.
    t0 = four_tenants()[0]
    job = BestEffortJob("be", "toy-b", restart_s=2.0)
    spec = load_gpu(GPU)
    sim = NodeSimulator(scenario([t0, job]), FakePerformanceModel(), seed=6)
    start = config("4g@0,3g@4", {"be": TenantPlacement(0, 0, 100, 8), "t0": TenantPlacement(0, 1, 100, 8)})
    sim.reset(6, configuration=start)
    sim.step(start)
    result = sim.step(config("2g@0,2g@2,3g@4", {"t0": TenantPlacement(0, 0, 100, 8)}))
    (change,) = result.changes
    assert (change.tenant, change.mechanism, change.downtime_s) == ("t0", "make-before-break", 0.0)
    assert change.old_served_s == pytest.approx(spec.profiles["4g.20gb"].destroy_s + spec.profiles["2g.10gb"].create_s + 3.0)


def test_staged_plan_that_must_break_charges_only_the_wait_of_each_tenant():
    # Merging 2g@0 + 2g@2 into 4g@0 needs both slices: the tenants stop one destroy apart.
    sim, result = _merge_two_2g_into_a_4g(mbb=True)
    spec = load_gpu(GPU)
    destroy, create = spec.profiles["2g.10gb"].destroy_s, spec.profiles["4g.20gb"].create_s
    records = {c.tenant: c for c in result.changes}
    assert set(records) == {"t0", "t1"} and {c.mechanism for c in records.values()} == {"ordered-restart"}
    assert records["t0"].downtime_s == pytest.approx(2 * destroy + create + 3.0)  # stopped first
    assert records["t1"].downtime_s == pytest.approx(destroy + create + 3.0)
    assert records["t1"].old_served_s == pytest.approx(destroy)
    assert result.tenants["t0"].downtime_s == records["t0"].downtime_s
    assert sim.summary()["t0"]["changes"] == 1 and sim.summary()["t0"]["staged_changes"] == 0


@pytest.mark.parametrize("memory_gib, downtime_s", [(2.0, 0.0), (3.0, 3.0)])
def test_share_change_starts_the_new_client_next_to_the_old_one_when_memory_holds_both(memory_gib, downtime_s):
    # 1g.5gb holds 5 GiB: two clients of 2.08 GiB fit, two of 3.08 GiB do not.
    sim = NodeSimulator(scenario(four_tenants()), FakePerformanceModel(memory_gib_per_model=memory_gib), seed=3)
    base = config(LAYOUT, spread())
    sim.reset(3, configuration=base)
    sim.step(base)
    placements = spread()
    placements["t3"] = TenantPlacement(0, 3, 60.0, 8)
    (change,) = sim.step(config(LAYOUT, placements)).changes
    assert (change.tenant, change.kind) == ("t3", "share")
    assert change.downtime_s == downtime_s and change.old_served_s == (3.0 if downtime_s == 0 else 0.0)


def test_mps_share_change_restarts_batch_change_does_not():
    sim = NodeSimulator(scenario(four_tenants()), FakePerformanceModel(), seed=3)
    base = config(LAYOUT, spread(batch=8, mps=100))
    sim.reset(3, configuration=base)
    sim.step(base)
    result = sim.step(config(LAYOUT, spread(batch=16, mps=100)))
    assert not any(st.restarted for st in result.tenants.values())
    placements = spread(batch=16)
    placements["t2"] = TenantPlacement(0, 2, 60.0, 16)
    result = sim.step(config(LAYOUT, placements))
    assert [n for n, st in result.tenants.items() if st.restarted] == ["t2"]


def test_priority_fill_keeps_the_high_priority_latency_and_fills_gaps():
    # A lightly loaded high-priority tenant, so that its latency is mostly service time.
    hi = InferenceTenant("hi", "toy-a", slo_ms=50, arrivals=PoissonArrivals(20.0), priority=Priority.HIGH, max_batch=8, batch_timeout_ms=1)
    lo = InferenceTenant("lo", "toy-b", slo_ms=1000, arrivals=PoissonArrivals(300.0), priority=Priority.LOW, max_batch=8, batch_timeout_ms=1)
    perf = FakePerformanceModel()
    both = {"hi": TenantPlacement(0, 0, 100, 8), "lo": TenantPlacement(0, 0, 100, 8)}
    sim = NodeSimulator(scenario([hi, lo], duration_s=200.0), perf, seed=4)
    results = [sim.step(config("3g@0", both, [SharingMode.PRIORITY_FILL])) for _ in range(20)]
    alone = NodeSimulator(scenario([hi], duration_s=200.0), perf, seed=4)
    solo = [alone.step(config("3g@0", {"hi": both["hi"]})) for _ in range(20)]
    hi_latency = np.mean([r.tenants["hi"].latency_ms_mean for r in results])
    solo_latency = np.mean([r.tenants["hi"].latency_ms_mean for r in solo])
    assert hi_latency <= solo_latency * 1.05 * 1.02  # FIKIT: at most 5% overhead (2% noise)
    hi_util = np.mean([r.tenants["hi"].utilization for r in results])
    lo_util = np.mean([r.tenants["lo"].utilization for r in results])
    assert 0 < hi_util < 1 and lo_util > 0
    # The filler is slowed by 1 / (idle fraction): its batches take longer than solo ones.
    lo_alone = NodeSimulator(scenario([lo], duration_s=200.0), perf, seed=4)
    lo_solo = [lo_alone.step(config("3g@0", {"lo": both["lo"]})) for _ in range(20)]
    assert np.mean([r.tenants["lo"].latency_ms_mean for r in results]) > np.mean([r.tenants["lo"].latency_ms_mean for r in lo_solo])


def test_priority_fill_fillers_split_the_idle_time_rather_than_each_taking_all_of_it():
    # Two always-busy jobs filling a high-priority service's idle time together progress no
    # faster than one alone does: the idle time is the GI's to give once (before, each ran
    # at its solo speed times the whole idle fraction: together twice what it holds).
    hi = InferenceTenant("hi", "toy-a", slo_ms=50, arrivals=PoissonArrivals(200.0), priority=Priority.HIGH, max_batch=8, batch_timeout_ms=1)
    jobs = [BestEffortJob("be1", "toy-c"), BestEffortJob("be2", "toy-c")]
    perf = FakePerformanceModel()

    def progress(tenants, placements) -> dict[str, float]:
        sim = NodeSimulator(scenario(tenants, duration_s=100.0), perf, seed=4)
        steps = [sim.step(config("7g@0", placements, [SharingMode.PRIORITY_FILL])) for _ in range(10)]
        return {t.name: sum(r.tenants[t.name].best_effort_progress_s for r in steps) for t in tenants[1:]}, np.mean([r.tenants["hi"].utilization for r in steps])

    one, busy_one = progress([hi, jobs[0]], {"hi": TenantPlacement(0, 0, 50, 8), "be1": TenantPlacement(0, 0, 50, 1)})
    two, busy_two = progress([hi, *jobs], {"hi": TenantPlacement(0, 0, 34, 8), "be1": TenantPlacement(0, 0, 33, 1), "be2": TenantPlacement(0, 0, 33, 1)})
    assert busy_one == pytest.approx(busy_two) and 0.05 < busy_one < 0.95  # the same idle time to fill
    assert one["be1"] > 0 and two["be1"] == pytest.approx(two["be2"])
    assert two["be1"] + two["be2"] <= one["be1"] * 1.001
    # Among themselves the fillers run as MPS clients at equal shares (toy model: half the
    # speed each, less the co-location slowdown).
    assert two["be1"] == pytest.approx(one["be1"] / 2 / (1 + perf.colocation_slowdown), rel=1e-6)


def test_time_slicing_and_mps_use_the_performance_model_with_co_runners():
    tenants = four_tenants(rate=1.0)[:2]  # so light that nobody queues: latency = service time
    perf = FakePerformanceModel()
    results = {}
    for mode in (SharingMode.MPS, SharingMode.TIME_SLICE):
        sim = NodeSimulator(scenario(tenants), perf, seed=5)
        placements = {"t0": TenantPlacement(0, 0, 50, 1), "t1": TenantPlacement(0, 0, 50, 1)}
        results[mode] = sim.step(config("7g@0", placements, [mode])).tenants["t0"].latency_ms_mean
    # Toy model: MPS at 50% with one co-runner -> 2.5 ms / 0.5 * 1.1; time slicing -> 2.5 ms * 2.
    assert results[SharingMode.MPS] == pytest.approx(5.5, rel=0.05)
    assert results[SharingMode.TIME_SLICE] == pytest.approx(5.0, rel=0.05)


def test_out_of_memory_instance_serves_nothing():
    perf = FakePerformanceModel(memory_gib_per_model=3.0)  # two models need 6 GiB, a 1g has 5
    tenants = four_tenants(rate=50.0)[:2]
    sim = NodeSimulator(scenario(tenants), perf, seed=6)
    result = sim.step(config("1g@0", {"t0": TenantPlacement(0, 0, 50, 1), "t1": TenantPlacement(0, 0, 50, 1)}))
    assert all(st.out_of_memory and st.completed == 0 for st in result.tenants.values())


def test_same_seed_reproduces_and_rewards_add_up_to_the_totals():
    def episode(seed):
        sim = NodeSimulator(scenario(four_tenants(), duration_s=100.0, jitter=True), FakePerformanceModel(p99_ratio=1.4), seed=seed)
        rewards = [sim.step(config(LAYOUT, spread())).reward for _ in range(10)]
        return rewards, sim
    a, sim = episode(11)
    b, _ = episode(11)
    c, _ = episode(12)
    assert a == b and a != c
    assert sum(a) == pytest.approx(sim.totals.total)
    assert sum(e["objective"] for e in sim.summary().values()) == pytest.approx(sim.totals.total)
    sim.reset(11)
    assert [sim.step(config(LAYOUT, spread())).reward for _ in range(10)] == a  # reset(seed) replays


def test_arrivals_depend_on_the_seed_only_not_on_the_decisions():
    """Common random numbers: two policies on one seed meet the same requests, although their
    different configurations draw different amounts of service jitter."""
    plans = [config(LAYOUT, spread()), config("7g@0", {f"t{i}": TenantPlacement(0, 0, 25.0, 16) for i in range(4)})]

    def arrivals(policy):
        sim = NodeSimulator(scenario(four_tenants(rate=300.0), duration_s=100.0, jitter=True), FakePerformanceModel(p99_ratio=1.4), seed=5)
        return [tuple(st.arrived for st in sim.step(policy(k)).tenants.values()) for k in range(10)], sim.totals.total

    fixed, fixed_total = arrivals(lambda k: plans[0])
    switching, switching_total = arrivals(lambda k: plans[k % 2])
    assert fixed == switching
    assert fixed_total != switching_total  # the decisions did matter


def test_continual_learning_accuracy_drops_at_drift_and_recovers_with_training():
    serve = InferenceTenant("svc", "toy-a", slo_ms=100, arrivals=PoissonArrivals(100.0), max_batch=8)
    job = ContinualLearningJob("cl", serves="svc", model="toy-b", curve=EkyaCurve(0.5, 2.0, 0.05), samples_per_unit=1000, drift_window_s=50)
    be = BestEffortJob("be", "toy-c")
    sim = NodeSimulator(scenario([serve, job, be], duration_s=200.0), FakePerformanceModel(), seed=8)
    cfg = config("3g@0,3g@4", {"svc": TenantPlacement(0, 0, 100, 8), "cl": TenantPlacement(0, 1, 50, 32), "be": TenantPlacement(0, 1, 50, 16)})
    accuracy = [sim.step(cfg).tenants["svc"].accuracy for _ in range(10)]
    assert accuracy[1] > accuracy[0] and accuracy[4] > accuracy[1]  # training raises it
    assert accuracy[5] < accuracy[4]  # drift at t = 50 s
    obs = sim.observation()
    assert set(obs["svc"]) >= {"arrival_rate_rps", "queue_length", "p99_over_slo", "slo_attainment", "accuracy"}
    # Without the CL job placed, accuracy stays at the post-drift level.
    idle = NodeSimulator(scenario([serve, job, be], duration_s=200.0), FakePerformanceModel(), seed=8)
    flat = [idle.step(config("3g@0,3g@4", {"svc": TenantPlacement(0, 0, 100, 8)})).tenants["svc"].accuracy for _ in range(3)]
    assert flat == [job.curve.accuracy(0)] * 3
    result = sim.step(cfg)
    assert result.tenants["be"].best_effort_progress_s > 0 and result.terms.best_effort_progress > 0


def test_multi_gpu_node():
    tenants = four_tenants()
    sim = NodeSimulator(scenario(tenants, gpu_count=2), FakePerformanceModel(), seed=9)
    lay = (parse_layout("7g@0", GPU), parse_layout("3g@0,3g@4", GPU))
    cfg = Configuration(lay, ((SharingMode.TIME_SLICE,), (SharingMode.MPS, SharingMode.MPS)),
                        {"t0": TenantPlacement(0, 0), "t1": TenantPlacement(0, 0), "t2": TenantPlacement(1, 0), "t3": TenantPlacement(1, 1)})
    result = sim.step(cfg)
    assert all(st.completed > 0 for st in result.tenants.values())
    with pytest.raises(ValueError, match="instance 2 does not exist"):
        sim.step(dataclasses.replace(cfg, placements={**cfg.placements, "t3": TenantPlacement(1, 2)}))


def test_unknown_model_is_rejected():
    bad = InferenceTenant("x", "no-such-model", 50, PoissonArrivals(1.0))
    with pytest.raises(ValueError, match="no-such-model"):
        NodeSimulator(scenario([bad]), FakePerformanceModel())
    assert math.isfinite(FakePerformanceModel().train_step_s(GPU, "toy-a", 8))


def test_gpu_without_mig_is_one_instance_shared_by_mps():
    tenants = four_tenants(rate=50.0)[:2]
    sim = NodeSimulator(Scenario("v100", "v100-16gb", 1, 100.0, 10.0, tenants, service_jitter=False), FakePerformanceModel(), seed=10)
    empty = parse_layout("", "v100-16gb")
    cfg = Configuration((empty,), ((SharingMode.MPS,),), {"t0": TenantPlacement(0, 0, 50, 4), "t1": TenantPlacement(0, 0, 50, 4)})
    result = sim.step(cfg)
    assert all(st.completed > 0 and st.out_of_memory is False for st in result.tenants.values())


def test_simulators_sharing_a_scenario_do_not_share_arrival_state():
    s = scenario(four_tenants(), duration_s=100.0)
    cfg = config(LAYOUT, spread())
    alone = NodeSimulator(s, FakePerformanceModel(), seed=21)
    expected = [alone.step(cfg).tenants["t1"].arrived for _ in range(5)]  # t1 is an MMPP
    a, b = NodeSimulator(s, FakePerformanceModel(), seed=21), NodeSimulator(s, FakePerformanceModel(), seed=99)
    interleaved = []
    for _ in range(5):
        interleaved.append(a.step(cfg).tenants["t1"].arrived)
        b.step(cfg)
    assert interleaved == expected


# ------------------------------------------------------------------ activity windows
def every_tenth_second():
    """One request every 0.1 s (a replayed timestamp trace): exact counts per interval."""
    return TimestampArrivals(np.arange(1000) / 10.0, period_s=100.0)


def test_arrivals_outside_the_activity_windows_never_exist():
    windowed = InferenceTenant("a", "toy-a", slo_ms=100, arrivals=every_tenth_second(), max_batch=4, active_windows_s=((15.0, 35.0), (70.0, 80.0)))
    sim = NodeSimulator(scenario([windowed]), FakePerformanceModel(), seed=0)
    cfg = config("7g@0", {"a": TenantPlacement(0, 0, 100, 4)})
    arrived = [sim.step(cfg).tenants["a"].arrived for _ in range(10)]
    assert arrived == [0, 50, 100, 50, 0, 0, 0, 100, 0, 0]
    summary = sim.summary()["a"]
    assert summary["arrived"] == 300 and summary["dropped"] == 0  # discarded requests are not drops
    assert summary["arrived"] == summary["completed"] + summary["queued_at_end"]


def test_arrivals_inside_the_windows_are_those_of_the_always_active_tenant():
    """The arrival Generator is consumed whatever the windows: inside them a windowed tenant
    meets exactly the requests of the always-active one on the same seed, and the other
    tenants' requests do not change at all."""
    def arrivals(windows):
        tenants = [InferenceTenant("a", "toy-a", slo_ms=100, arrivals=MmppArrivals([50.0, 400.0], [20, 5]), max_batch=8, active_windows_s=windows),
                   InferenceTenant("b", "toy-b", slo_ms=100, arrivals=PoissonArrivals(200.0), max_batch=8)]
        sim = NodeSimulator(scenario(tenants), FakePerformanceModel(p99_ratio=1.3), seed=3)
        cfg = config("3g@0,3g@4", {"a": TenantPlacement(0, 0, 100, 8), "b": TenantPlacement(0, 1, 100, 8)})
        steps = [sim.step(cfg).tenants for _ in range(10)]
        return [s["a"].arrived for s in steps], [(s["b"].arrived, s["b"].completed, s["b"].latency_ms_mean) for s in steps]

    always_a, always_b = arrivals(())
    windowed_a, windowed_b = arrivals(((20.0, 50.0), (70.0, 90.0)))
    assert windowed_a == [0, 0, *always_a[2:5], 0, 0, *always_a[7:9], 0]
    assert all(n > 0 for n in always_a)
    assert windowed_b == always_b


@pytest.mark.parametrize("kind", ["continual-learning", "best-effort"])
def test_a_job_progresses_in_proportion_to_its_active_seconds(kind):
    serve = InferenceTenant("svc", "toy-a", slo_ms=100, arrivals=PoissonArrivals(10.0))
    windows = ((5.0, 25.0), (42.0, 44.0))

    def progress(active):
        if kind == "best-effort":
            job = BestEffortJob("job", "toy-c", active_windows_s=active)
        else:
            job = ContinualLearningJob("job", serves="svc", model="toy-b", curve=EkyaCurve(0.5, 2.0, 0.05), samples_per_unit=1000,
                                       drift_window_s=1000, active_windows_s=active)
        sim = NodeSimulator(scenario([serve, job], duration_s=60.0), FakePerformanceModel(), seed=1)
        cfg = config("3g@0,3g@4", {"svc": TenantPlacement(0, 0, 100, 8), "job": TenantPlacement(0, 1, 100, 16)})
        steps = [sim.step(cfg).tenants["job"] for _ in range(6)]
        return [st.training_samples + st.best_effort_progress_s for st in steps], [st.utilization for st in steps]

    always, _ = progress(())
    windowed, utilization = progress(windows)
    active_s = [5.0, 10.0, 5.0, 0.0, 2.0, 0.0]
    assert always[0] > 0 and windowed == pytest.approx([a * s / 10.0 for a, s in zip(always, active_s, strict=True)])
    assert utilization == pytest.approx([s / 10.0 for s in active_s])


def test_becoming_active_while_placed_costs_the_restart_from_the_activation():
    tenants = [InferenceTenant("a", "toy-a", slo_ms=100, arrivals=every_tenth_second(), max_batch=1, batch_timeout_ms=0, restart_s=3.0,
                               active_windows_s=((0.0, 10.0), (25.0, 60.0))),
               BestEffortJob("be", "toy-c", restart_s=2.0, active_windows_s=((34.0, 100.0),))]
    s = dataclasses.replace(scenario(tenants), weights=GoodputWeights(reconfiguration_per_s=7.0))
    sim = NodeSimulator(s, FakePerformanceModel(), seed=0)
    cfg = config("3g@0,3g@4", {"a": TenantPlacement(0, 0, 100, 1), "be": TenantPlacement(0, 1, 100, 1)})
    steps = [sim.step(cfg).tenants for _ in range(5)]
    # Active from the episode's start: deployed already, like an always-active tenant.
    assert (steps[0]["a"].downtime_s, steps[0]["a"].restarted) == (0.0, False)
    # Back at 25 s: the server cold-starts until 28 s, so the request of 25.0 s waits 3 s.
    assert (steps[2]["a"].downtime_s, steps[2]["a"].restarted) == (3.0, True)
    assert steps[2]["a"].terms.reconfiguration_cost == pytest.approx(7.0 * 3.0)
    assert steps[2]["a"].arrived == 50 and steps[2]["a"].latency_ms_p99 >= 2900
    assert steps[3]["a"].downtime_s == 0.0 and steps[3]["a"].latency_ms_p99 < 100
    # The job activates at 34 s and is up from 36 s: 4 s of work in the interval, not 6.
    assert (steps[3]["be"].downtime_s, steps[3]["be"].utilization) == (2.0, pytest.approx(0.4))
    assert steps[4]["be"].utilization == 1.0


def test_moving_an_inactive_tenant_restarts_nothing():
    tenant = InferenceTenant("a", "toy-a", slo_ms=100, arrivals=every_tenth_second(), restart_s=3.0, active_windows_s=((0.0, 15.0), (40.0, 100.0)))
    sim = NodeSimulator(scenario([tenant]), FakePerformanceModel(), seed=0)
    here, there = (config("3g@0,3g@4", {"a": TenantPlacement(0, instance, 100, 8)}) for instance in (0, 1))
    steps = [sim.step(cfg).tenants["a"] for cfg in (here, here, there, there, there)]
    assert [(st.downtime_s, st.restarted) for st in steps] == [(0.0, False), (0.0, False), (0.0, False), (0.0, False), (3.0, True)]
    assert [st.arrived for st in steps] == [100, 50, 0, 0, 100]


def test_the_backlog_left_when_the_window_closes_is_dropped():
    tenant = InferenceTenant("a", "toy-a", slo_ms=1000, arrivals=every_tenth_second(), max_batch=1, active_windows_s=((0.0, 15.0),))
    sim = NodeSimulator(scenario([tenant]), FakePerformanceModel(base_ms=200.0, per_item_ms=0.0), seed=0)  # 5 requests/s for 10 arriving
    cfg = config("7g@0", {"a": TenantPlacement(0, 0, 100, 1)})
    first, closing, gone, after = (sim.step(cfg).tenants["a"] for _ in range(4))
    # The server drains until the interval's end (it holds its instance for the interval) ...
    assert (closing.arrived, closing.completed) == (50, 50) and closing.queued_at_end == 150 - first.completed - 50 > 0
    # ... and is gone at the next decision: what it held is dropped, and nothing arrives.
    assert (gone.arrived, gone.dropped, gone.completed, gone.queued_at_end) == (0, closing.queued_at_end, 0, 0)
    assert (after.arrived, after.dropped) == (0, 0)


def test_an_inactive_co_runner_holds_no_memory_and_does_not_interfere():
    def a_in_interval(perf, layout, b_windows):
        tenants = [InferenceTenant("a", "toy-a", slo_ms=100, arrivals=every_tenth_second(), max_batch=1, batch_timeout_ms=0),
                   InferenceTenant("b", "toy-b", slo_ms=100, arrivals=every_tenth_second(), max_batch=1, batch_timeout_ms=0, active_windows_s=b_windows)]
        sim = NodeSimulator(scenario(tenants), perf, seed=0)
        cfg = config(layout, {"a": TenantPlacement(0, 0, 50, 1), "b": TenantPlacement(0, 0, 50, 1)})
        return [sim.step(cfg).tenants["a"] for _ in range(4)]

    # Interference: at 50% MPS the toy model serves a request in 2.5 / 0.5 = 5 ms alone, 10% more
    # with one co-runner; b is active in the second and fourth intervals only.
    steps = a_in_interval(FakePerformanceModel(), "7g@0", ((10.0, 20.0), (30.0, 40.0)))
    assert [st.latency_ms_mean for st in steps] == pytest.approx([5.0, 5.5, 5.0, 5.5])
    # Memory: two 3 GiB models do not fit a 1g.5gb instance, one does.
    steps = a_in_interval(FakePerformanceModel(memory_gib_per_model=3.0), "1g@0", ((10.0, 20.0),))
    assert [st.out_of_memory for st in steps] == [False, True, False, False]
    assert steps[0].completed == 100 and steps[1].completed == 0


def test_snapshot_and_restore_replay_the_same_future_and_frozen_arrivals_are_the_seed_s():
    """What the hindsight search stands on: a restored state runs exactly as the original,
    and the recorded arrivals are the ones the seed draws."""
    tenants = four_tenants(rate=300.0)
    tenants[3] = dataclasses.replace(tenants[3], active_windows_s=((30.0, 70.0),))
    plans = [config(LAYOUT, spread()), config("7g@0", {f"t{i}": TenantPlacement(0, 0, 25.0, 16) for i in range(4)})]

    def run(sim, steps):
        return [(r.reward, tuple(st.arrived for st in r.tenants.values())) for r in (sim.step(plans[k % 2]) for k in range(steps))]

    sim = NodeSimulator(scenario(tenants, duration_s=120.0, jitter=True), FakePerformanceModel(p99_ratio=1.4), seed=9)
    whole = run(sim, 12)
    sim.reset(9)
    head = run(sim, 4)
    state = sim.snapshot()
    tail = run(sim, 8)
    assert head + tail == whole
    sim.restore(state)
    assert run(sim, 8) == tail  # twice from one snapshot: it is not consumed
    sim.restore(state)
    assert sim.step(plans[1]).reward != tail[0][0]  # another decision from the restored state: another future
    sim.reset(9)
    sim.freeze_arrivals()
    assert sim.upcoming_rates_rps(1)[0]["t0"] == whole[0][1][0] / 10.0  # in hindsight, the realised rate
    assert run(sim, 12) == whole
