"""LocalBackend with stand-in workers (a fake interpreter that just sleeps), process-group stops,
SIGTERM -> SIGKILL escalation, no orphans when the launcher is killed; and the launcher's pure planning
functions (GPU shares, worker command lines)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from common.net.process import process_alive
from deploy.base import WorkerSpec
from deploy.local_backend import REPO_ROOT, LocalBackend, child_env
from deploy.plan import LaunchPlan, gpu_layout, worker_specs

pytestmark = pytest.mark.timeout(60)


def fake_python(tmp_path: Path, ignore_term: bool = False) -> str:
    """An 'interpreter' that records its argv and environment, then sleeps (optionally deaf to SIGTERM)."""
    script = tmp_path / ("stubborn" if ignore_term else "sleeper")
    trap = "trap '' TERM\n" if ignore_term else ""
    script.write_text(
        f'#!/bin/sh\n{trap}echo "$@" > "{tmp_path}/argv.$$"\n'
        f'echo "$MARK $SECRET_MARK" > "{tmp_path}/env.$$"\nsleep 60 &\nwait\n'
    )
    script.chmod(0o755)
    return str(script)


def gone(pid: int) -> bool:
    return not process_alive(pid)


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_start_runs_the_role_module_with_argv_and_env(tmp_path) -> None:
    backend = LocalBackend(log_dir=str(tmp_path / "logs"), python=fake_python(tmp_path))
    spec = WorkerSpec(
        "decode",
        "decode-0",
        ["--worker-id", "decode-0"],
        env={"MARK": "hello"},
        secret_env={"SECRET_MARK": "s3"},
    )
    assert "s3" not in repr(spec)  # secrets (the cluster's CURVE keys) never show in a repr
    worker = backend.start(spec)
    try:
        assert worker.alive() and os.getpgid(worker.pid) == worker.pid  # its own process group
        argv_file = tmp_path / f"argv.{worker.pid}"
        assert wait_until(argv_file.exists)
        assert argv_file.read_text().split() == ["-m", "decode_worker", "--worker-id", "decode-0"]
        env_file = tmp_path / f"env.{worker.pid}"
        assert wait_until(lambda: env_file.exists() and env_file.read_text().strip() == "hello s3")
        assert (tmp_path / "logs" / "decode-0.log").exists()
    finally:
        backend.shutdown()
    assert not worker.alive()
    worker.stop()  # idempotent


def test_stop_reaches_the_whole_group_and_escalates(tmp_path) -> None:
    backend = LocalBackend(python=fake_python(tmp_path, ignore_term=True))
    worker = backend.start(WorkerSpec("prefill", "prefill-0", []))
    assert wait_until(lambda: (tmp_path / f"argv.{worker.pid}").exists())
    t0 = time.monotonic()
    worker.stop(grace_s=0.5)
    assert not worker.alive() and 0.4 < time.monotonic() - t0 < 5
    # the shell's `sleep` child was in the same group and went with it
    assert wait_until(
        lambda: subprocess.run(["pgrep", "-g", str(worker.pid)], capture_output=True).returncode
    )


def test_killed_launcher_takes_its_workers_along(tmp_path) -> None:
    launcher = textwrap.dedent(f"""
        import sys, time
        from deploy.base import WorkerSpec
        from deploy.local_backend import LocalBackend
        worker = LocalBackend(python={fake_python(tmp_path)!r}).start(WorkerSpec("prefill", "p0", []))
        print(worker.pid, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT
    )
    try:
        pid = int(proc.stdout.readline())
        assert not gone(pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert wait_until(lambda: gone(pid)), "worker outlived its launcher"
    finally:
        proc.kill()
        proc.wait()


def test_children_import_this_checkout() -> None:
    env = child_env({"X": "1"})
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT) and env["X"] == "1"


# ---- launcher planning ----------------------------------------------------------------------------


def test_gpu_layout() -> None:
    assert gpu_layout(3, 0, None) == [(0.0, None)] * 3
    assert gpu_layout(3, 1, None) == [(1 / 3, 0)] * 3  # all share one GPU
    assert gpu_layout(2, 4, None) == [(1.0, 0), (1.0, 1)]  # a GPU each
    assert gpu_layout(3, 2, None) == [(0.5, 0), (0.5, 1), (0.5, 0)]
    assert gpu_layout(2, 1, 0.25) == [(0.25, 0), (0.25, 0)]


def test_worker_specs_forward_engine_flags_and_gpu_shares() -> None:
    plan = LaunchPlan(
        "/m",
        num_prefill=1,
        num_decode=2,
        backend="local",
        kv_transport="tcp",
        engine={"num_kvcache_blocks": 64, "gpu_memory_utilization": 0.6},
    )
    specs = worker_specs(plan, "tcp://127.0.0.1:5000", num_gpus=1)
    assert [(s.role, s.worker_id) for s in specs] == [
        ("prefill", "prefill-0"),
        ("decode", "decode-0"),
        ("decode", "decode-1"),
    ]
    argv = specs[1].argv
    assert argv[argv.index("--router-addr") + 1] == "tcp://127.0.0.1:5000"
    assert argv[argv.index("--kv-transport") + 1] == "tcp" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--num-kvcache-blocks") + 1] == "64"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.2"  # 0.6 shared three ways
    assert specs[1].num_gpus == pytest.approx(1 / 3) and specs[1].env == {"CUDA_VISIBLE_DEVICES": "0"}
    two = worker_specs(plan, "tcp://127.0.0.1:5000", num_gpus=2)
    # Each worker's own GPU comes first; the peer stays visible for CUDA IPC and NCCL peer-to-peer.
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in two] == ["0,1", "1,0", "0,1"]
    cpu = worker_specs(plan, "tcp://127.0.0.1:5000", num_gpus=0)
    # On the CPU the three workers split the cores (unless OMP_NUM_THREADS is set by the user).
    threads = os.environ.get("OMP_NUM_THREADS")
    expected_env = {} if threads else {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // 3))}
    assert cpu[0].num_gpus == 0 and cpu[0].env == expected_env
    assert cpu[0].argv[cpu[0].argv.index("--gpu-memory-utilization") + 1] == "0.6"  # as given
    ray = worker_specs(LaunchPlan("/m", backend="ray"), "tcp://10.0.0.1:5000", num_gpus=0)
    assert ray[0].argv[ray[0].argv.index("--host") + 1] == "auto"  # each node finds its own address


def test_mixed_workers_are_decode_workers_with_their_own_role_and_gpu_share() -> None:
    plan = LaunchPlan("/m", num_prefill=1, num_decode=1, num_mixed=2, backend="local")
    specs = worker_specs(plan, "tcp://127.0.0.1:5000", num_gpus=2)
    assert [(s.role, s.worker_id, s.module) for s in specs] == [
        ("prefill", "prefill-0", "prefill_worker"),
        ("decode", "decode-0", "decode_worker"),
        ("mixed", "mixed-0", "decode_worker"),
        ("mixed", "mixed-1", "decode_worker"),
    ]
    assert [s.argv[s.argv.index("--role") + 1] for s in specs] == ["prefill", "decode", "mixed", "mixed"]
    per_gpu: dict[str, float] = {}
    for s in specs:
        util = float(s.argv[s.argv.index("--gpu-memory-utilization") + 1])
        own_gpu = s.env["CUDA_VISIBLE_DEVICES"].split(",")[0]  # the worker's own GPU comes first
        per_gpu[own_gpu] = per_gpu.get(own_gpu, 0.0) + util
        assert s.num_gpus == 0.5
    assert per_gpu == pytest.approx({"0": 0.9, "1": 0.9})  # each GPU's shares sum to the default 0.9
    alone = worker_specs(LaunchPlan("/m", num_prefill=0, num_decode=0, num_mixed=2), "tcp://h:1", 0)
    assert [s.worker_id for s in alone] == ["mixed-0", "mixed-1"]


def test_launch_plan_validation() -> None:
    with pytest.raises(ValueError, match="num_decode"):
        LaunchPlan("/m", num_decode=0)
    with pytest.raises(ValueError, match="could decode"):
        LaunchPlan("/m", num_prefill=2, num_decode=0, num_mixed=0)
    for bad in ({"num_mixed": -1}, {"num_prefill": -1}, {"num_decode": 1.5}, {"num_mixed": True}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be a non-negative int"):
            LaunchPlan("/m", **bad)
    assert LaunchPlan("/m", num_prefill=0, num_decode=1).roles == ["decode"]  # decode workers prefill too
    with pytest.raises(ValueError, match="backend"):
        LaunchPlan("/m", backend="k8s")
    with pytest.raises(ValueError, match="gpus_per_worker"):
        LaunchPlan("/m", gpus_per_worker=1.5)
    assert LaunchPlan("/m", host="0.0.0.0").inbox_host == "127.0.0.1"
    assert LaunchPlan("/m", host="0.0.0.0", advertise_host="10.0.0.2").inbox_host == "10.0.0.2"
