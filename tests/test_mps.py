"""MPS share changes: exact argv and env, restart only what changed, never a shell."""

import subprocess
from pathlib import Path

import pytest

from rlsched.node.mps import (
    MPS_CONTROL,
    ClientTarget,
    MpsError,
    MpsManager,
    SubprocessRunner,
    TenantClient,
    client_targets,
)
from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.hardware import parse_layout

MIG_A, MIG_B = "MIG-aaaa", "MIG-bbbb"


class Recorder:
    """A runner that records what it is asked to run and runs nothing."""

    def __init__(self, status: int = 0) -> None:
        self.status = status
        self.ran: list[tuple[list[str], dict, str | None]] = []
        self.started: list[tuple[list[str], dict]] = []
        self.stopped: list[int] = []

    def run(self, argv, env, input_text=None):
        self.ran.append((list(argv), dict(env), input_text))
        return self.status

    def start(self, argv, env):
        self.started.append((list(argv), dict(env)))
        recorder, pid = self, 100 + len(self.started)

        class Handle:
            def __init__(self):
                self.pid = pid

            def stop(self, grace_s):
                recorder.stopped.append(self.pid)

        return Handle()


@pytest.fixture
def manager(tmp_path: Path):
    clients = {
        "resnet": TenantClient(("python", "-m", "serve", "--model", "resnet 50"), {"MODEL_DIR": "/m"}, restart_s=8.0),
        "bert": TenantClient(("python", "-m", "serve", "--model", "bert"), restart_s=12.0),
    }
    recorder = Recorder()
    mps = MpsManager(clients, recorder, pipe_root=tmp_path / "pipe", log_root=tmp_path / "log", base_env={"PATH": "/usr/bin"})
    return mps, recorder, tmp_path


def test_a_share_starts_the_daemon_of_the_mig_instance_and_the_client_with_its_percentage(manager):
    mps, recorder, root = manager
    report = mps.apply({"resnet": ClientTarget(MIG_A, 30.0), "bert": ClientTarget(MIG_A, 70.0)}, dry_run=False)
    pipe, log = str(root / "pipe" / MIG_A), str(root / "log" / MIG_A)
    assert recorder.ran == [([MPS_CONTROL, "-d"], {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": MIG_A, "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}, None)]
    assert Path(pipe).is_dir() and Path(log).is_dir()
    bert, resnet = recorder.started  # sorted by tenant name
    assert bert == (["python", "-m", "serve", "--model", "bert"], {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": MIG_A, "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "70"})
    assert resnet[0][-1] == "resnet 50" and resnet[1]["MODEL_DIR"] == "/m" and resnet[1]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert report.restarted == ["bert", "resnet"] and report.estimated_restart_s == 12.0


def test_changing_one_share_restarts_only_that_client(manager):
    mps, recorder, _ = manager
    mps.apply({"resnet": ClientTarget(MIG_A, 30.0), "bert": ClientTarget(MIG_A, 70.0)}, dry_run=False)
    recorder.ran.clear()
    report = mps.apply({"resnet": ClientTarget(MIG_A, 50.0), "bert": ClientTarget(MIG_A, 70.0)}, dry_run=False)
    assert report.restarted == ["resnet"] and recorder.stopped == [102]  # resnet was the second start
    assert recorder.started[-1][1]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert recorder.ran == []  # the daemon keeps running
    assert mps.apply({"resnet": ClientTarget(MIG_A, 50.0), "bert": ClientTarget(MIG_A, 70.0)}).steps == []


def test_moving_away_quits_the_unused_daemon_through_its_pipe(manager):
    mps, recorder, _ = manager
    mps.apply({"resnet": ClientTarget(MIG_A, 100.0)}, dry_run=False)
    mps.apply({"resnet": ClientTarget(MIG_B, None)}, dry_run=False)  # time slicing on another instance
    assert recorder.started[-1][1] == {"PATH": "/usr/bin", "MODEL_DIR": "/m", "CUDA_VISIBLE_DEVICES": MIG_B}
    assert recorder.ran[-1] == ([MPS_CONTROL], {"PATH": "/usr/bin", **mps.daemon_env(MIG_A)}, "quit\n")
    assert mps.daemons == set()


def test_dry_run_prints_and_runs_nothing(manager):
    mps, recorder, _ = manager
    report = mps.apply({"resnet": ClientTarget(MIG_A, 25.0)})
    text = str(report)
    assert "start-daemon" in text and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in text and "'resnet 50'" in text
    assert recorder.ran == recorder.started == [] and mps.running == {}


def test_bad_input_and_failed_commands_are_reported(manager):
    mps, recorder, _ = manager
    with pytest.raises(ValueError, match="no client command for tenants ghost"):
        mps.plan({"ghost": ClientTarget(MIG_A, 10.0)})
    with pytest.raises(ValueError, match="outside"):
        mps.plan({"bert": ClientTarget(MIG_A, 0.0)})
    recorder.status = 1
    with pytest.raises(MpsError, match="nvidia-cuda-mps-control -d for MIG-aaaa exited with status 1"):
        mps.apply({"bert": ClientTarget(MIG_A, 10.0)}, dry_run=False)


def test_stop_tenants_before_their_instance_is_destroyed(manager):
    mps, recorder, _ = manager
    mps.apply({"resnet": ClientTarget(MIG_A, 50.0), "bert": ClientTarget(MIG_B, 50.0)}, dry_run=False)
    mps.stop_tenants(["bert", "nobody"])
    assert recorder.stopped == [101] and set(mps.running) == {"resnet"}


def test_client_targets_follow_the_configuration():
    layout = parse_layout("3g@0,3g@4", "a100-40gb")
    config = Configuration(
        (layout,), ((SharingMode.MPS, SharingMode.TIME_SLICE),),
        {"a": TenantPlacement(0, 0, mps_pct=40), "b": TenantPlacement(0, 1, mps_pct=40)},
    )
    uuids = [{layout.instances[0]: MIG_A, layout.instances[1]: MIG_B}]
    assert client_targets(config, uuids) == {"a": ClientTarget(MIG_A, 40), "b": ClientTarget(MIG_B, None)}


def test_the_real_runner_passes_argument_lists_without_a_shell(monkeypatch):
    seen = {}

    def fake_run(argv, **kwargs):
        seen.update(argv=argv, **kwargs)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert SubprocessRunner().run([MPS_CONTROL], {"A": "1"}, "quit\n") == 0
    assert seen["argv"] == [MPS_CONTROL] and seen["input"] == "quit\n" and not seen.get("shell")


def test_a_decision_applied_end_to_end_on_the_fake_node(tmp_path):
    """The daemon loop's order: stop tenants of destroyed instances, MIG, UUIDs, MPS."""
    from rlsched.node.fake_nvml import FakeNvml
    from rlsched.node.nvml_backend import NvmlMigBackend

    fake = FakeNvml(["a100-40gb"], layouts=["7g@0"])
    backend = NvmlMigBackend(fake, sleep=fake.sleep, clock=fake.clock)
    recorder = Recorder()
    mps = MpsManager({"a": TenantClient(("serve", "a")), "b": TenantClient(("serve", "b"))}, recorder, tmp_path / "p", tmp_path / "l", {})
    old_layout = backend.read_layouts()[0]
    mps.apply(client_targets(Configuration((old_layout,), ((SharingMode.MPS,),), {"a": TenantPlacement(0, 0, 50), "b": TenantPlacement(0, 0, 50)}), [backend.mig_device_uuids(0)]), dry_run=False)

    layout = parse_layout("4g@0,3g@4", "a100-40gb")
    config = Configuration((layout,), ((SharingMode.MPS, SharingMode.MPS),), {"a": TenantPlacement(0, 0, 100), "b": TenantPlacement(0, 1, 100)})
    plan = backend.plan([layout])
    on_destroyed = [t for t, p in mps.running.items() if any(gi.spec() == "7g.40gb@0" for gi in plan.gpus[0].change.destroyed)]
    mps.stop_tenants(on_destroyed)
    assert backend.apply([layout], dry_run=False).ok
    uuids = backend.mig_device_uuids(0)
    mps.apply(client_targets(config, [uuids]), dry_run=False)
    started = {env["CUDA_VISIBLE_DEVICES"] for _, env in recorder.started[-2:]}
    assert started == {uuids[layout.instances[0]], uuids[layout.instances[1]]}
    assert mps.daemons == set(uuids.values())  # the 7g's daemon was quit, one per new instance started
