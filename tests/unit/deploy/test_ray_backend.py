"""RayBackend with real processes: the supervisor in-process, then the whole backend on a local Ray.

Workers are the stand-in `tests.unit.deploy.sleeper_worker` (one JSON line per start, sleeps until
SIGTERM), so these tests do not depend on the real prefill/decode workers.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import ray

from deploy.base import WorkerSpec
from deploy.launch import count_gpus
from deploy.plan import LaunchPlan, worker_specs
from deploy.ray_backend import RayBackend, SupervisorConfig, _Supervisor

SLEEPER = "tests.unit.deploy.sleeper_worker"


def running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a container's pid 1 may never reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_until(cond, timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def records(path: Path, n: int, timeout_s: float = 30.0) -> list[dict]:
    """The first `n` start records the sleeper wrote to `path`, waiting for them to appear."""

    def lines() -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    wait_until(lambda: len(lines()) >= n, timeout_s, f"{n} start records in {path.name}")
    return [json.loads(line) for line in lines()[:n]]


def sleeper_spec(
    worker_id: str, out: Path, *extra: str, role: str = "decode", gpus: float = 0.0
) -> WorkerSpec:
    return WorkerSpec(
        role=role,
        worker_id=worker_id,
        argv=[str(out), *extra],
        num_gpus=gpus,
        env={"PDSERVE_TEST_MARK": worker_id},
        module_override=SLEEPER,
        secret_env={"PDSERVE_TEST_SECRET": f"secret-of-{worker_id}"},
    )


# --- pure parts -------------------------------------------------------------------------------


def test_module_override_replaces_role_module():
    assert WorkerSpec("prefill", "p0", []).module == "prefill_worker"
    assert WorkerSpec("decode", "d0", [], module_override=SLEEPER).module == SLEEPER


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"local_num_cpus": 0}, "local_num_cpus"),
        ({"local_num_gpus": -1}, "local_num_gpus"),
        ({"worker_num_cpus": -1}, "worker_num_cpus"),
        ({"max_restarts": -1}, "max_restarts"),
    ],
)
def test_backend_rejects_bad_settings_naming_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RayBackend(**kwargs)


def test_secrets_stay_out_of_reprs():
    config = SupervisorConfig(worker_id="w", command=["x"], secret_env={"PDSERVE_TEST_SECRET": "s3"})
    assert "s3" not in repr(config) and "s3" not in repr(sleeper_spec("w", Path("x")))


def test_supervisor_config_validation():
    with pytest.raises(ValueError, match="command"):
        SupervisorConfig(worker_id="w", command=[])
    with pytest.raises(ValueError, match="max_restarts"):
        SupervisorConfig(worker_id="w", command=["x"], max_restarts=-1)


# --- the supervisor in this process (no Ray) ------------------------------------------------------


def start_supervisor(out: Path, *extra: str, max_restarts: int = 3):
    config = SupervisorConfig(
        worker_id="w0",
        command=[sys.executable, "-m", SLEEPER, str(out), *extra],
        env={"PDSERVE_TEST_MARK": "w0"},  # no PYTHONPATH: the supervisor adds the source root
        max_restarts=max_restarts,
    )
    sup, result = _Supervisor(config), {}
    thread = threading.Thread(target=lambda: result.update(sup.run()), daemon=True)
    thread.start()
    return sup, thread, result


def test_supervisor_restarts_a_crashed_worker_and_stops_it(tmp_path):
    out = tmp_path / "starts.jsonl"
    sup, thread, result = start_supervisor(out)
    first = records(out, 1)[0]
    assert first["mark"] == "w0" and first["cuda"] == ""  # spec env applied; no GPU share, no GPU
    os.kill(first["pid"], signal.SIGKILL)
    second = records(out, 2)[1]
    assert second["pid"] != first["pid"] and running(second["pid"])
    assert sup.restarts() == 1 and sup.pid() == second["pid"]
    assert sup.stop(grace_s=5.0) == 0  # the sleeper exits 0 on SIGTERM
    thread.join(5.0)
    assert result == {"returncode": 0, "restarts": 1, "stopped": True}
    assert not running(second["pid"])


def test_supervisor_gives_up_after_max_restarts(tmp_path):
    out = tmp_path / "starts.jsonl"
    sup, thread, result = start_supervisor(out, max_restarts=1)
    os.kill(records(out, 1)[0]["pid"], signal.SIGKILL)
    os.kill(records(out, 2)[1]["pid"], signal.SIGKILL)
    thread.join(10.0)
    assert result == {"returncode": -signal.SIGKILL, "restarts": 1, "stopped": False}
    assert sup.pid() is None


def test_supervisor_kills_a_worker_that_ignores_sigterm(tmp_path):
    out = tmp_path / "starts.jsonl"
    sup, thread, _ = start_supervisor(out, "--ignore-sigterm")
    pid = records(out, 1)[0]["pid"]
    t0 = time.monotonic()
    assert sup.stop(grace_s=0.5) == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - t0 < 5.0
    thread.join(5.0)
    assert not thread.is_alive() and not running(pid)


# --- the backend on a local Ray -----------------------------------------------------------------


@pytest.mark.timeout(120)
def test_ray_backend_lifecycle(tmp_path, monkeypatch):
    if ray.is_initialized():
        pytest.skip("a Ray session is already open in this process")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # Two logical GPUs (this machine may have none): Ray's GPU bookkeeping is what is under test.
    backend = RayBackend(local_num_cpus=2, local_num_gpus=2, max_restarts=2)
    files = {name: tmp_path / f"{name}.jsonl" for name in ("d0", "p0", "d1")}
    pids: list[int] = []
    try:
        d0 = backend.start(sleeper_spec("d0", files["d0"], gpus=0.5))
        p0 = backend.start(sleeper_spec("p0", files["p0"], "--ignore-sigterm", role="prefill", gpus=0.5))
        d1 = backend.start(sleeper_spec("d1", files["d1"], gpus=1.0))
        assert backend.owns_ray and ray.is_initialized()
        first, p0_rec, d1_rec = (records(files[name], 1)[0] for name in ("d0", "p0", "d1"))
        pids += [first["pid"], p0_rec["pid"], d1_rec["pid"]]
        assert first["mark"] == "d0" and running(first["pid"]) and d0.alive()
        assert first["secret"] == "secret-of-d0"  # handed over as the actor's argument, then the environment
        # The worker is told the Ray node it was placed on (this one-node Ray: the driver's node).
        assert first["argv"][-2:] == ["--node-id", ray.get_runtime_context().get_node_id()]
        # Two half shares are packed onto one GPU, the whole GPU is the other one.
        assert first["cuda"] == p0_rec["cuda"] and {first["cuda"], d1_rec["cuda"]} == {"0", "1"}
        assert d0.pid() == first["pid"]

        os.kill(first["pid"], signal.SIGKILL)  # crash: the supervisor starts it again
        second = records(files["d0"], 2)[1]
        pids.append(second["pid"])
        assert second["pid"] != first["pid"] and running(second["pid"]) and d0.alive()
        assert d0.restarts() == 1

        t0 = time.monotonic()
        d0.stop(grace_s=5.0)
        assert time.monotonic() - t0 < 5.0 and not running(second["pid"]) and not d0.alive()
        d0.stop(grace_s=5.0)  # idempotent

        d1_pid = d1_rec["pid"]
        ray.kill(d1._actor)  # the actor dies without stopping its worker: the deathsig must take it
        wait_until(lambda: not running(d1_pid), 10.0, "the orphaned worker to die")
        wait_until(lambda: not d1.alive(), 10.0, "alive() to notice the dead actor")

        guest = RayBackend()  # Ray is open already: the guest uses the session and must not end it
        g0 = guest.start(sleeper_spec("g0", tmp_path / "g0.jsonl"))
        g0_rec = records(tmp_path / "g0.jsonl", 1)[0]
        pids.append(g0_rec["pid"])
        assert g0_rec["cuda"] == ""  # no GPU share: no GPU
        guest.shutdown(grace_s=2.0)
        assert not guest.owns_ray and ray.is_initialized() and not g0.alive()

        assert p0.alive() and running(p0_rec["pid"])
    finally:
        backend.shutdown(grace_s=1.0)  # p0 ignores SIGTERM: killed after the grace period
    assert not ray.is_initialized() and not backend.owns_ray
    assert [pid for pid in pids if running(pid)] == []


@pytest.mark.timeout(180)
def test_default_gpu_shares_count_every_node_of_the_ray_cluster(monkeypatch):
    """A 1-GPU head and a 3-GPU worker node: 1 prefill + 3 decode get a whole GPU each, not a
    quarter of the launcher's one GPU (Ray's GPU bookkeeping; the GPUs are logical)."""
    if ray.is_initialized():
        pytest.skip("a Ray session is already open in this process")
    from ray.cluster_utils import Cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1})
    try:
        cluster.add_node(num_cpus=1, num_gpus=3)
        cluster.wait_for_nodes()
        backend = RayBackend(address=cluster.address)
        plan = LaunchPlan(model="m", num_prefill=1, num_decode=3, backend="ray")
        specs = worker_specs(plan, "tcp://127.0.0.1:1", count_gpus(plan, backend))
        assert backend.cluster_gpus() == 4 and [s.num_gpus for s in specs] == [1.0] * 4
        cpu_plan = replace(plan, engine={"device": "cpu"})
        assert count_gpus(cpu_plan, backend) == 0
    finally:
        ray.shutdown()
        cluster.shutdown()
