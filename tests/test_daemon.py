"""The daemon (``rlsched serve``): loop, fallbacks, state and restart, monitoring, nvml backend, sources."""

from __future__ import annotations

import http.server
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import gymnasium as gym
import numpy as np
import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

import rlsched.envs
from rlsched.agents.baselines import Policy, make_policy
from rlsched.cli.main import main
from rlsched.daemon.config import DaemonConfig, load_daemon_config
from rlsched.node.fake_nvml import FakeNvml
from rlsched.daemon.loop import Daemon
from rlsched.node.sources import Endpoint, PrometheusSource, parse_triton
from rlsched.daemon.state import DaemonState
from rlsched.errors import ConfigError
from rlsched.workloads.scenario import load_scenario

DATA = Path(__file__).parent / "data"
TINY = str(DATA / "env_tiny.yaml")
RLSCHED = [sys.executable, "-m", "rlsched.cli.main"]
TRITON = [(DATA / f"triton_metrics_{i}.txt").read_text() for i in range(2)]


def tiny_config(tmp_path: Path, **fields) -> DaemonConfig:
    base = dict(scenario=TINY, backend="sim", policy="migrator-ilp", cycles=5, metrics_addr=None, perf_model="calibrated", source=str(tmp_path / "daemon.yaml"))
    base.update(fields)
    return DaemonConfig(**base)


# ---------------------------------------------------------------------- the acceptance command


def test_serve_sim_50_cycles_writes_tensorboard_state_and_exits_0(tmp_path):
    logdir, state = tmp_path / "tb", tmp_path / "state.json"
    run = subprocess.run([*RLSCHED, "serve", "--backend", "sim", "--cycles", "50", "--metrics-addr", "127.0.0.1:0",
                          "--logdir", str(logdir), "--state", str(state)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    events = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    assert events[0]["event"] == "start" and events[0]["metrics"].startswith("127.0.0.1:")
    assert events[0]["policy"] == "migrator-pf-held" and events[0]["fallback"] == "migrator-queue-slo"  # what `auto` runs, and the planner behind it
    assert events[-1]["event"] == "stop" and events[-1]["cycle"] == 50
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"goodput/total", "repair/ms_mean", "reconfig/rate", "perf/steps_per_s", "daemon/fallbacks", "slo/resnet/attainment", "slo/attainment_high"} <= tags
    assert len(acc.Scalars("goodput/total")) == 50
    assert json.loads(state.read_text())["cycle"] == 50


def test_metrics_endpoint_is_scraped_while_serving(tmp_path):
    scraped: list[str] = []

    def scrape(daemon: Daemon) -> None:
        if daemon.cycle == 3:
            with urllib.request.urlopen(f"http://127.0.0.1:{daemon.exporter.port}/metrics", timeout=5) as response:
                scraped.append(response.read().decode())

    daemon = Daemon(tiny_config(tmp_path, metrics_addr="127.0.0.1:0"), on_cycle=scrape)
    assert daemon.run() == 0
    families = {f.name: f for f in text_string_to_metric_families(scraped[0])}
    assert families["rlsched_daemon_cycles"].samples[0].value == 3
    info = families["rlsched_gpu_instance_info"].samples
    assert info and all({"gpu", "GPU_I_PROFILE", "GPU_I_ID", "mode"} <= s.labels.keys() for s in info)
    assert {s.labels["GPU_I_PROFILE"] for s in info} <= {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}
    used = families["rlsched_gpu_instance_fb_used_bytes"].samples
    assert used and any(s.value > 0 for s in used)  # empty instances use none
    assert {s.labels["tenant"] for s in families["rlsched_tenant_slo_attainment_ratio"].samples} == {"resnet", "bert"}
    assert {s.labels["tenant"] for s in families["rlsched_tenant_latency_p99_ms"].samples} == {"resnet", "bert"}
    assert "rlsched_repair_duration_ms" in families and "rlsched_daemon_fallbacks" in families
    # migrator-ilp solved a planner MILP each cycle, none stopped at the time limit
    milps = {s.labels["outcome"]: s.value for s in families["rlsched_planner_milps"].samples if s.name.endswith("_total")}
    assert milps["solved"] >= 3 and milps["time_limited"] == 0
    # The port is released when serve ends.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{daemon.exporter.port}/metrics", timeout=2)


# ---------------------------------------------------------------------- fallbacks


class BadPolicy(Policy):
    """Returns one kind of broken output per cycle, in turn."""

    name = "bad"

    def __init__(self) -> None:
        self.calls = 0

    def act(self, observation, env):
        self.calls += 1
        kind = self.calls % 4
        if kind == 0:
            raise RuntimeError("model crashed")
        action = env.codec.encode(env.current)
        if kind == 1:
            return action.astype(float) * np.nan
        if kind == 2:
            return action[:-1]
        action[4] = 99  # batch level out of range
        return action


def test_invalid_policy_outputs_and_errors_fall_back_to_the_planner(tmp_path, caplog):
    daemon = Daemon(tiny_config(tmp_path, cycles=8, observation_tolerance=1e9, log_level="debug"))
    daemon.guard.policy = BadPolicy()
    with caplog.at_level("WARNING", logger="rlsched.daemon"):
        assert daemon.run() == 0
    reasons = [r.fields["reason"] for r in caplog.records if r.getMessage() == "fallback"]
    assert reasons.count("policy-error") == 2 and reasons.count("invalid-output") == 6
    assert daemon.fallbacks == 8 and daemon.cycle == 8
    details = " ".join(r.fields["detail"] for r in caplog.records if r.getMessage() == "fallback")
    assert "model crashed" in details and "integer level" in details and "shape" in details and "allowed levels" in details


class CrashesAtCycle(Policy):
    """``migrator-ilp`` that raises at one cycle of the daemon."""

    name = "crashes-at-cycle"

    def __init__(self, daemon: Daemon, cycle: int) -> None:
        self.daemon, self.cycle, self.planner = daemon, cycle, make_policy("migrator-ilp")

    def reset(self, env):
        self.planner.reset(env)

    def act(self, observation, env):
        if self.daemon.cycle == self.cycle:
            raise RuntimeError("model crashed")
        return self.planner.act(observation, env)


def test_the_fallback_planner_observes_every_cycle_the_policy_decides(tmp_path, caplog):
    # The fallback (migrator-queue-slo) forecasts from its own history of measured rates and
    # forecast errors: the cycle it takes over must find that history as current as if it had
    # decided all along.
    daemon = Daemon(tiny_config(tmp_path, cycles=6, observation_tolerance=1e9))
    fallback = daemon.guard.fallback
    assert fallback.name == "migrator-queue-slo"
    observed, errors_known = [], []
    observe, act = fallback.observe, fallback.act
    fallback.observe = lambda env: (observed.append(daemon.cycle), observe(env))
    fallback.act = lambda obs, env: (errors_known.append(len(fallback.residuals["resnet"])), act(obs, env))[1]
    daemon.guard.policy = CrashesAtCycle(daemon, cycle=5)
    with caplog.at_level("WARNING", logger="rlsched.daemon"):
        assert daemon.run() == 0
    assert observed == [0, 1, 2, 3, 4]
    assert [r.fields["reason"] for r in caplog.records if r.getMessage() == "fallback"] == ["policy-error"]
    # it takes over knowing the errors of its forecasts of intervals 2-4 (the forecast of
    # interval 1 was the declared mean: nothing had been measured); without observing it
    # would know none
    assert errors_known == [3]


def test_observations_outside_the_training_range_fall_back(tmp_path, caplog):
    daemon = Daemon(tiny_config(tmp_path, cycles=3, observation_tolerance=0.0))
    daemon.guard.out_of_range = lambda env: "resnet/p99_over_slo=3 outside [0, 1] (1 features)"
    with caplog.at_level("WARNING", logger="rlsched.daemon"):
        daemon.run()
    assert [r.fields["reason"] for r in caplog.records if r.getMessage() == "fallback"] == ["out-of-range"] * 3


def test_raw_observation_out_of_box_is_detected(tmp_path):
    daemon = Daemon(tiny_config(tmp_path))
    daemon.env.reset(seed=0)
    daemon.env.raw_observation = daemon.env.raw_observation.copy()
    assert daemon.guard.out_of_range(daemon.env) is None
    names = daemon.env.encoder.names()
    # p99 / SLO saturates by design ("four times over or worse"): inside the trained domain.
    daemon.env.raw_observation[names.index(names[0].split("/")[0] + "/p99_over_slo")] = 1.5
    assert daemon.guard.out_of_range(daemon.env) is None
    daemon.env.raw_observation[0] = 1.5  # an arrival rate beyond what training drew
    assert "arrival_rate=1.5 outside [0, 1]" in daemon.guard.out_of_range(daemon.env)
    daemon.env.raw_observation[0] = 0.5
    daemon.env.raw_observation[names.index(names[0].split("/")[0] + "/p99_over_slo")] = float("nan")
    assert "p99_over_slo=nan" in daemon.guard.out_of_range(daemon.env)


# ---------------------------------------------------------------------- configuration


def test_bad_config_names_file_field_and_value_and_exits_2(tmp_path, capsys):
    path = tmp_path / "d.yaml"
    path.write_text("backend: gpu-magic\n")
    with pytest.raises(ConfigError, match="backend.*gpu-magic"):
        load_daemon_config(path)
    assert main(["serve", "--config", str(path)]) == 2
    assert str(path) in capsys.readouterr().err
    path.write_text("cycle: 5\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert main(["serve", "--backend", "sim", "--metrics-addr", "localhost:99999", "--cycles", "1"]) == 2


def test_auto_runs_the_held_out_best_planner_on_every_node_shape(tmp_path):
    # The default node is the shipped PPO policy's shape; it runs only when named (--policy ppo).
    assert Daemon(tiny_config(tmp_path, scenario="default", policy="auto")).guard.policy.name == "migrator-pf-held"
    assert Daemon(tiny_config(tmp_path, scenario="default", policy="ppo")).guard.policy.name == "ppo"
    other = Daemon(tiny_config(tmp_path, policy="auto", cycles=2))  # the tiny node: two tenants
    assert other.guard.policy.name == "migrator-pf-held"
    assert other.run() == 0 and other.cycle == 2 and other.fallbacks == 0


@pytest.mark.parametrize("policy", ["static-best", "hindsight"])
def test_policies_that_need_the_episode_in_hindsight_are_refused(policy, capsys):
    assert main(["serve", "--backend", "sim", "--policy", policy, "--cycles", "1"]) == 2
    assert "in hindsight" in capsys.readouterr().err


def test_bundled_daemon_configs_load():
    root = Path(rlsched.envs.__file__).parents[1] / "configs" / "daemon"
    for path in sorted(root.glob("*.yaml")):
        config = load_daemon_config(path)
        assert config.metrics_host_port()[0] == "127.0.0.1"


# ---------------------------------------------------------------------- state and restart


def test_state_round_trip_and_refuses_garbage(tmp_path):
    scenario = load_scenario(TINY)
    state = DaemonState(cycle=7, scenario=scenario.name, backend="sim", last_good=scenario.reference, fallbacks=2)
    path = tmp_path / "s.json"
    state.save(path)
    loaded = DaemonState.load(path)
    assert loaded.cycle == 7 and loaded.last_good == scenario.reference and loaded.fallbacks == 2
    assert json.loads(path.read_text())["layouts"] == ["4g.20gb@0,3g.20gb@4"]
    path.write_text('{"version": 1, "cycle": -3}')
    with pytest.raises(ConfigError, match="cycle"):
        DaemonState.load(path)


def _events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_kill_9_then_restart_resumes_at_the_saved_cycle_without_gi_operations(tmp_path):
    state = tmp_path / "state.json"
    config = tmp_path / "daemon.yaml"
    # static-equal asks for the same whole-GPU layout every cycle; a huge tolerance keeps the
    # planner out, so any GI operation after the restart would be a needless reconfiguration.
    config.write_text(f"scenario: {TINY}\nbackend: sim\npolicy: static-equal\nobservation_tolerance: 1.0e+9\nmetrics_addr: null\nlog_level: debug\n")
    first = subprocess.Popen([*RLSCHED, "serve", "--config", str(config), "--state", str(state)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if state.exists() and json.loads(state.read_text())["cycle"] >= 20:
                break
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        _, stderr = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL
    before = _events(stderr)
    assert before[1]["event"] == "cycle" and before[1]["gi_operations"] > 0  # 4g+3g -> 7g
    saved = json.loads(state.read_text())["cycle"]
    assert saved >= 20
    second = subprocess.run([*RLSCHED, "serve", "--config", str(config), "--state", str(state), "--cycles", "10"], capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    after = _events(second.stderr)
    assert after[0]["event"] == "start" and after[0]["cycle"] == saved and after[0]["resumed"] is True
    cycles = [e for e in after if e["event"] == "cycle"]
    assert [e["cycle"] for e in cycles] == list(range(saved + 1, saved + 11))
    assert all(e["gi_operations"] == 0 for e in cycles)
    assert json.loads(state.read_text())["cycle"] == saved + 10


# ---------------------------------------------------------------------- observation sources


class _Payloads(http.server.BaseHTTPRequestHandler):
    payloads: list[str] = []
    served = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = self.payloads[min(type(self).served, len(self.payloads) - 1)].encode()
        type(self).served += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def triton_server():
    """A Triton-like metrics endpoint on 127.0.0.1 serving the recorded payloads in turn."""
    handler = type("Handler", (_Payloads,), {"payloads": TRITON, "served": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.timeout = 1
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_parse_triton_sums_versions_per_model():
    per_model = parse_triton(TRITON[1])
    assert per_model["resnet50"]["nv_inference_request_success"] == 3000
    assert per_model["bert-base"]["nv_inference_pending_request_count"] == 2
    assert "nv_gpu_utilization" not in per_model.get("resnet50", {})


def test_prometheus_source_rates_from_counter_deltas(triton_server):
    scenario = load_scenario(TINY)
    now = [100.0]
    source = PrometheusSource(scenario, [Endpoint(triton_server, {"resnet": "resnet50", "bert": "bert-base"})], clock=lambda: now[0])
    first = source.measure()
    assert first["resnet"]["arrival_rate_rps"] == 0.0  # the baseline
    now[0] += 10.0
    m = source.measure()
    r = m["resnet"]
    assert r["arrival_rate_rps"] == pytest.approx(201.0)  # (2000 ok + 10 failed) / 10 s
    assert r["latency_ms_mean"] == pytest.approx(10.0)  # (4e6 queue + 16e6 compute) us / 2000
    assert r["on_time"] == 2000 and r["dropped"] == 10 and r["slo_attainment"] == pytest.approx(2000 / 2010)
    assert r["utilization"] == pytest.approx(0.2)  # 8 ms per request x 250 executions / 10 s
    assert r["queue_length"] == 5
    assert m["bert"]["p99_over_slo"] == pytest.approx(0.42)
    with pytest.raises(ConfigError, match="nobody"):
        PrometheusSource(scenario, [Endpoint(triton_server, {"nobody": "x"})])


# ---------------------------------------------------------------------- the nvml backend in the env


def test_gym_make_nvml_backend_applies_layouts_waits_and_reads_prometheus(triton_server):
    fake = FakeNvml(["a100-40gb"], layouts=["3g@0,3g@4"])
    scenario = load_scenario(TINY)
    source = PrometheusSource(scenario, [Endpoint(triton_server, {"resnet": "resnet50", "bert": "bert-base"})], clock=fake.clock)
    env = gym.make(rlsched.envs.ENV_ID, scenario=TINY, backend="nvml",
                   backend_options={"nvml": fake, "apply": True, "sleep": fake.sleep, "clock": fake.clock, "source": source})
    inner = env.unwrapped
    env.reset(seed=0)
    _, reward, _, _, info = inner.step_configuration(scenario.reference)
    assert fake.layout(0).spec() == "4g.20gb@0,3g.20gb@4" and info["layout"] == ("4g.20gb@0,3g.20gb@4",)
    assert reward > 0 and inner.last_step.tenants["resnet"].on_time == 2000
    # At least the interval passed (virtual clock); here the GI changes alone took longer.
    assert fake.clock() >= 10.0
    assert inner.backend.observe()["resnet"]["arrival_rate_rps"] > 150  # exact rates: test_prometheus_source_...
    busy = fake.clock()
    inner.step_configuration(scenario.reference)
    assert fake.clock() == pytest.approx(busy + 10.0)  # nothing to change: exactly one interval
    calls = len(fake.calls)
    inner.step_configuration(scenario.reference)  # already right: NVML only read
    assert inner.backend.last_gi_operations == 0
    assert not {"nvmlGpuInstanceDestroy", "nvmlDeviceCreateGpuInstanceWithPlacement"} & set(fake.calls[calls:])
    inner.backend.close()


def test_nvml_backend_dry_run_changes_nothing():
    fake = FakeNvml(["a100-40gb"], layouts=["3g@0,3g@4"])
    env = rlsched.envs.gpushare.GpuShareEnv(TINY, backend="nvml", backend_options={"nvml": fake, "sleep": fake.sleep, "clock": fake.clock})
    env.reset(seed=0)
    env.step_configuration(env.scenario.reference)
    assert fake.layout(0).spec() == "3g.20gb@0,3g.20gb@4" and env.backend.gi_operations == 0
    env.backend.close()


# ---------------------------------------------------------------------- faults at the daemon level


class FlakyNvml(FakeNvml):
    """The fake NVML whose next call of a named function fails (once per count)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail: dict[str, int] = {}

    def _call(self, name: str):
        if self.fail.get(name):
            self.fail[name] -= 1
            self.calls.append(name)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return super()._call(name)


@pytest.mark.parametrize("failing", ["nvmlGpuInstanceDestroy", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance"])
def test_faults_during_serve_apply_leave_old_or_new_layout_and_the_daemon_retries(tmp_path, caplog, failing):
    fake = FlakyNvml(["a100-40gb"], layouts=["3g@0,3g@4"])
    old, new = "3g.20gb@0,3g.20gb@4", "7g.40gb@0"  # static-equal: one whole-GPU instance
    seen: list[str] = []
    state = tmp_path / "state.json"
    config = tiny_config(tmp_path, backend="nvml", apply=True, cycles=4, policy="static-equal", observation_tolerance=1e9, state=str(state))
    daemon = Daemon(config, backend_options={"nvml": fake, "sleep": fake.sleep, "clock": fake.clock}, on_cycle=lambda d: seen.append(fake.layout(0).spec()))
    fake.fail[failing] = 1
    with caplog.at_level("WARNING", logger="rlsched.daemon"):
        assert daemon.run() == 0
    assert daemon.cycle == 4
    assert seen[0] == old and seen[1:] == [new] * 3  # rolled back, then retried and applied
    assert not fake.gis_without_ci(0)
    fallbacks = [r.fields for r in caplog.records if r.getMessage() == "fallback"]
    assert fallbacks[0]["reason"] == "apply-failed" and "rolled-back" in fallbacks[0]["detail"] and fallbacks[0]["cycle"] == 0
    assert json.loads(state.read_text())["layouts"] == [new]


@pytest.mark.parametrize("policy", ["migrator-ilp", "ppo"])
def test_planner_decides_on_real_gpus_before_any_tenant_is_measured(tmp_path, policy, caplog):
    # No observation source: the backend has measured no tenant, so the planner plans for the
    # scenario's declared rates instead of failing (the shipped ppo hands it unsure cycles).
    fake = FakeNvml(["a100-40gb"], layouts=["3g@0,3g@4"])
    config = tiny_config(tmp_path, scenario="default", backend="nvml", apply=True, cycles=2, policy=policy, observation_tolerance=1e9, log_level="debug")
    daemon = Daemon(config, backend_options={"nvml": fake, "sleep": fake.sleep, "clock": fake.clock})
    assert daemon.env.backend.observe() == {}
    with caplog.at_level("DEBUG", logger="rlsched.daemon"):
        assert daemon.run() == 0
    cycles = [r.fields for r in caplog.records if r.getMessage() == "cycle"]
    assert len(cycles) == 2 and daemon.fallbacks == 0
    assert "migrator-ilp" in {c["policy"] for c in cycles}  # the planner decided at least once, unmeasured
    assert fake.layout(0).spec() != "3g.20gb@0,3g.20gb@4"  # and its layout for the declared load was applied


def test_auto_on_real_gpus_plans_mps_only_on_the_declared_rates(tmp_path, caplog):
    # No observation source: the planner plans on the declared rates, and its decisions are
    # applied through NVML. rlsched starts no priority-fill scheduler on a real node, so `auto`
    # runs a method that plans MPS only there: without a request log (rates only), the hedge
    # whose planner and fixed layouts are MPS only.
    fake = FakeNvml(["a100-40gb"], layouts=["7g@0"])
    config = tiny_config(tmp_path, backend="nvml", apply=True, cycles=3, policy="auto", observation_tolerance=1e9, log_level="debug")
    daemon = Daemon(config, backend_options={"nvml": fake, "sleep": fake.sleep, "clock": fake.clock})
    assert daemon.guard.policy.name == "migrator-hedge-mps"
    assert not daemon.scenario.priority_fill_scheduler and not daemon.env.scenario.priority_fill_scheduler  # the policies are told
    with caplog.at_level("DEBUG", logger="rlsched.daemon"):
        assert daemon.run() == 0
    cycles = [r.fields for r in caplog.records if r.getMessage() == "cycle"]
    assert len(cycles) == 3 and daemon.fallbacks == 0 and {c["policy"] for c in cycles} == {"migrator-hedge-mps"}
    assert fake.layout(0).spec() == daemon.env.current.layouts[0].spec()  # the decided layout is on the GPU
    assert not [r for r in caplog.records if r.getMessage() == "priority fill without a scheduler"]


def test_auto_on_real_gpus_with_a_request_log_runs_migrator_queue(tmp_path, caplog):
    # With the frontend's request log the node measures each tenant's arrival variability,
    # which migrator-queue's value model prices: `auto` runs it, and it decides and applies
    # MPS-only layouts through NVML.
    fake = FakeNvml(["a100-40gb"], layouts=["7g@0"])
    log = tmp_path / "requests.log"
    log.write_text("")
    config = tiny_config(tmp_path, backend="nvml", apply=True, cycles=3, policy="auto", observation_tolerance=1e9, log_level="debug",
                         observations={"source": "none", "request_log": str(log)})
    daemon = Daemon(config, backend_options={"nvml": fake, "sleep": fake.sleep, "clock": fake.clock})
    assert daemon.guard.policy.name == "migrator-queue"
    with caplog.at_level("DEBUG", logger="rlsched.daemon"):
        assert daemon.run() == 0
    cycles = [r.fields for r in caplog.records if r.getMessage() == "cycle"]
    assert len(cycles) == 3 and daemon.fallbacks == 0 and {c["policy"] for c in cycles} == {"migrator-queue"}
    assert fake.layout(0).spec() == daemon.env.current.layouts[0].spec()
    assert not daemon.env.current.uses_priority_fill()


def test_priority_fill_on_a_real_node_is_reported_as_unscheduled_once_per_tenant_set(tmp_path, caplog):
    # FIKIT's fixed rule puts the tenants in priority fill; nothing on the node schedules it.
    fake = FakeNvml(["a100-40gb"], layouts=["7g@0"])
    config = tiny_config(tmp_path, backend="nvml", apply=True, cycles=3, policy="fikit", observation_tolerance=1e9)
    daemon = Daemon(config, backend_options={"nvml": fake, "sleep": fake.sleep, "clock": fake.clock})
    with caplog.at_level("INFO", logger="rlsched.daemon"):
        assert daemon.run() == 0
    warnings = [r.fields for r in caplog.records if r.getMessage() == "priority fill without a scheduler"]
    assert len(warnings) == 1 and warnings[0]["tenants"] and "time-slice" in warnings[0]["detail"]
    current = daemon.env.current
    placed = {n for n, p in current.placements.items() if current.modes[p.gpu_index][p.instance_index].value == "priority-fill"}
    assert set(warnings[0]["tenants"]) == placed
    # The simulator models priority fill as FIKIT schedules it: no warning there.
    caplog.clear()
    with caplog.at_level("INFO", logger="rlsched.daemon"):
        assert Daemon(tiny_config(tmp_path, policy="fikit", cycles=2)).run() == 0
    assert not [r for r in caplog.records if r.getMessage() == "priority fill without a scheduler"]


# ---------------------------------------------------------------------- soak

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench_daemon.py"


def _bench(*args: str) -> str:
    run = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_short_soak_keeps_memory_bounded():
    out = _bench("--cycles", "800", "--warmup", "200", "--scenario", TINY, "--policy", "migrator-ilp")
    ratio = float(out.split("ratio: ")[1].split()[0])
    assert ratio < 1.10 and "cycles/s" in out


@pytest.mark.slow
def test_soak_10000_cycles_keeps_memory_bounded():
    out = _bench("--cycles", "10000", "--warmup", "500")
    assert float(out.split("ratio: ")[1].split()[0]) < 1.10


def test_deployment_files_are_valid_and_keep_their_promises():
    import yaml

    root = Path(__file__).resolve().parents[1] / "deploy"
    docs = list(yaml.safe_load_all((root / "kubernetes" / "daemonset.yaml").read_text()))
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(v.get("hostPath", {}).get("path") == "/var/lib/rlsched" for v in pod["volumes"])
    container = pod["containers"][0]
    assert container["ports"][0]["containerPort"] == 9400 and "0.0.0.0" not in " ".join(container["args"])
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["node.yaml"])
    assert config["state"] == "/var/lib/rlsched/state.json" and config["backend"] == "nvml"
    unit = (root / "rlsched.service").read_text()
    assert "ExecStart=" in unit and "rlsched serve" in unit and "--state" in unit


def test_nvml_telemetry_reads_per_instance_memory_from_the_fake():
    from rlsched.node.fake_nvml import FakeNvml
    from rlsched.node.sources import NvmlTelemetry

    fake = FakeNvml(["a100-40gb"], layouts=["3g@0,2g@4,1g@6"])
    fake.nvmlInit()
    fake.set_memory_used(0, 4, 3 * 2**30)
    samples = {s.gi_id: s for s in NvmlTelemetry(fake).read(gpu_count=1)}
    assert len(samples) == 3  # one MIG device per GI
    totals = sorted(s.memory_total_bytes for s in samples.values())
    assert totals == [5 * 2**30, 10 * 2**30, 20 * 2**30]  # the catalog's GI memory
    used = {s.memory_total_bytes: s.memory_used_bytes for s in samples.values()}
    assert used[10 * 2**30] == 3 * 2**30 and used[5 * 2**30] == 0
    assert all(s.gr_engine_active is None for s in samples.values())  # the fake has no GPM: skipped, not faked


def test_unsure_steps_are_decided_by_the_planner_and_are_no_fallbacks(tmp_path, caplog):
    from rlsched.agents.onnx_policy import SHIPPED_POLICY

    path = tmp_path / "policy.onnx"
    path.write_bytes(SHIPPED_POLICY.read_bytes())
    scraped: list[str] = []

    def scrape(daemon: Daemon) -> None:
        if daemon.cycle == 3:
            with urllib.request.urlopen(f"http://127.0.0.1:{daemon.exporter.port}/metrics", timeout=5) as response:
                scraped.append(response.read().decode())

    # ppo@1: never sure enough, the planner decides every cycle (the suffix applies to policy_path's file).
    config = tiny_config(tmp_path, scenario="default", policy="ppo@1", policy_path=str(path), cycles=3, log_level="debug",
                         logdir=str(tmp_path / "tb"), metrics_addr="127.0.0.1:0")
    daemon = Daemon(config, on_cycle=scrape)
    with caplog.at_level("DEBUG", logger="rlsched.daemon"):
        assert daemon.run() == 0
    cycles = [r.fields for r in caplog.records if r.getMessage() == "cycle"]
    assert [c["policy"] for c in cycles] == ["migrator-ilp"] * 3 and all(c["fallback"] is None for c in cycles)
    assert daemon.fallbacks == 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("daemon/planner_decided")] == [1.0] * 3
    families = {f.name: f for f in text_string_to_metric_families(scraped[0])}
    assert {s.labels["policy"]: s.value for s in families["rlsched_daemon_decisions"].samples if s.name.endswith("_total")} == {"migrator-ilp": 3}
    # The suffix keeps policy_path: a missing file is an error, not the shipped policy.
    with pytest.raises(ConfigError, match="no such"):
        Daemon(tiny_config(tmp_path, scenario="default", policy="ppo@0.5", policy_path=str(tmp_path / "missing.onnx")))


def test_planner_milps_stopped_at_their_time_limit_are_counted_in_tensorboard_and_prometheus(tmp_path, monkeypatch):
    # On a node whose CPUs are busy, the planner's wall-clock limit cuts solves short: the
    # daemon counts them from its own start (TensorBoard: cumulative; Prometheus: a counter by outcome).
    import rlsched.solver.planner as planner_module

    scraped: list[str] = []

    def scrape(daemon: Daemon) -> None:
        if daemon.cycle == 3:
            with urllib.request.urlopen(f"http://127.0.0.1:{daemon.exporter.port}/metrics", timeout=5) as response:
                scraped.append(response.read().decode())

    monkeypatch.setitem(planner_module.PLANNER_SOLVER_OPTIONS, "time_limit", 0.0)
    daemon = Daemon(tiny_config(tmp_path, cycles=3, logdir=str(tmp_path / "tb"), metrics_addr="127.0.0.1:0"), on_cycle=scrape)
    assert daemon.run() == 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    solved = [e.value for e in acc.Scalars("daemon/planner_milps")]
    limited = [e.value for e in acc.Scalars("daemon/planner_milps_time_limited")]
    assert len(solved) == 3 and solved == sorted(solved) and solved[0] >= 1 and limited == solved
    families = {f.name: f for f in text_string_to_metric_families(scraped[0])}
    milps = {s.labels["outcome"]: s.value for s in families["rlsched_planner_milps"].samples if s.name.endswith("_total")}
    assert milps == {"time_limited": solved[-1], "solved": 0.0}
