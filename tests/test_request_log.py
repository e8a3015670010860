"""The frontend's request log on real GPUs: tailed each interval, mapped onto node time, bad lines skipped."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.daemon.config import DaemonConfig, validated
from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.envs.node_backends import NvmlNodeBackend
from rlsched.errors import ConfigError
from rlsched.hardware import parse_layout
from rlsched.node.fake_nvml import FakeNvml
from rlsched.node.sources import RequestLog, SourceError
from rlsched.simulator.testing import FakePerformanceModel
from rlsched.workloads.arrivals import PoissonArrivals
from rlsched.workloads.scenario import Scenario
from rlsched.workloads.tenants import InferenceTenant

GPU = "a100-40gb"
LAYOUT = parse_layout("3g@0,2g@4", GPU)
CONFIG = Configuration((LAYOUT,), ((SharingMode.MPS, SharingMode.MPS),), {"a": TenantPlacement(0, 0, 100, 8), "b": TenantPlacement(0, 1, 100, 8)})
SCENARIO = Scenario("logged", GPU, 1, 600.0, 10.0, [InferenceTenant(n, "toy-a", slo_ms=50, arrivals=PoissonArrivals(10.0)) for n in ("a", "b")], reference=CONFIG)


def test_the_log_is_tailed_and_bad_lines_are_skipped_and_counted(tmp_path):
    path = tmp_path / "requests.log"
    path.write_text("a,100.5\nb,100.25\n")
    log = RequestLog(path, SCENARIO)
    first = log.read()
    assert first["a"].tolist() == [100.5] and first["b"].tolist() == [100.25]
    with path.open("a") as f:
        f.write("a,101.0\nnobody,101.0\na,not-a-time\na,nan\n\nb,102.0\na,103")  # the last line is still being written
    second = log.read()
    assert second["a"].tolist() == [101.0] and second["b"].tolist() == [102.0] and log.skipped_lines == 3
    with path.open("a") as f:
        f.write(".5\n")
    assert log.read()["a"].tolist() == [103.5]
    path.write_text("b,200.0\n")  # rotated: shorter than what was read
    assert log.read()["b"].tolist() == [200.0]
    path.unlink()
    with pytest.raises(SourceError, match="requests.log"):
        log.read()


def test_a_node_reports_the_interval_s_logged_arrivals_in_node_time(tmp_path):
    path = tmp_path / "requests.log"
    fake = FakeNvml([GPU], layouts=["3g@0,2g@4"])
    wall0 = 1_700_000_000.0
    path.write_text(f"a,{wall0 - 5.0}\n")  # before the run: not its traffic
    backend = NvmlNodeBackend(SCENARIO, FakePerformanceModel(), nvml=fake, sleep=fake.sleep, clock=fake.clock, telemetry=False,
                              request_log=RequestLog(path, SCENARIO), wall_clock=lambda: wall0 + fake.clock())
    backend.reset(0, CONFIG)
    start = wall0 + fake.clock()
    with path.open("a") as f:
        f.write(f"a,{start + 2.5}\na,{start + 7.5}\nb,{start + 9.0}\nb,{start - 1.0}\n")  # the last one logged late
    backend.step(CONFIG)
    times = backend.arrival_times_s()
    assert np.allclose(times["a"], [2.5, 7.5]) and np.allclose(times["b"], [0.0, 9.0])
    with path.open("a") as f:
        f.write(f"a,{start + 12.0}\n")
    backend.step(CONFIG)
    times = backend.arrival_times_s()
    assert np.allclose(times["a"], [12.0]) and len(times["b"]) == 0
    assert NvmlNodeBackend(SCENARIO, FakePerformanceModel(), nvml=FakeNvml([GPU], layouts=["3g@0,2g@4"]), telemetry=False).arrival_times_s() is None


@pytest.mark.parametrize("value", [5, ""])
def test_a_bad_request_log_setting_is_a_config_error(value):
    with pytest.raises(ConfigError, match="request_log"):
        validated(DaemonConfig(observations={"source": "none", "request_log": value}))
