"""Ray worker backend: each pdserve worker is a Ray actor that supervises the worker as a child process.

Design choice: the actor (`_Supervisor`) does not call the worker's `main(argv)` in its own process; it
launches `python -m {spec.module} {argv}` as a child and supervises it. Why:
- `main` blocks until shutdown and installs a SIGTERM handler. A blocking actor method leaves the actor
  deaf to `stop` unless the actor is threaded, and in a threaded actor methods run off the main thread,
  where `signal.signal` is refused (and Ray's own signal handling would compete with the worker's).
- stopping means exactly what the local backend does: SIGTERM, a grace period, then SIGKILL of the
  process group (tensor-parallel ranks included). A fresh process per (re)start also means a fresh
  CUDA context, and GPU memory is returned when it exits, not when Ray recycles its worker process.
- the child inherits the actor's stdout/stderr, so Ray streams the worker's log to the driver.
The actor reserves the worker's GPU share (`num_gpus`, fractional so several workers share a GPU) and
its custom resources (deploy/placement.py, which pick the node); the child sees the GPU(s) Ray assigned
through CUDA_VISIBLE_DEVICES, and gets `--node-id` with the Ray node it runs on, which it reports at
registration, so the router's /health shows where each worker was placed.

Restarts: a child that exits non-zero or by a signal, while not being stopped, is spawned again up to
`max_restarts` times in all (backoff 0.5 s doubling to 10 s). It then registers with the router again
(same worker_id, new pid: the router treats that as a restart and fails its old requests retryably).
Exit status 0 is a deliberate shutdown (e.g. the router's Shutdown message) and is not restarted. The
actor itself has max_restarts=0: if its node dies, the worker stays down and the router routes around it.

No orphans: the child gets PR_SET_PDEATHSIG=SIGKILL, so when the actor process dies (ray.kill, a
crashed raylet) the kernel kills the child. The signal fires when the *thread* that forked the child
exits, so every spawn happens on the thread that runs `_Supervisor.run`, which outlives its children.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import ray

from deploy.base import WorkerBackend, WorkerSpec
from deploy.ray_handle import RayWorkerHandle, stop_all

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 10.0
# The directory that holds the `deploy` package: the child must import the same pdserve tree as the
# actor did, whether pdserve is pip-installed or run from a source checkout.
_SOURCE_ROOT = str(Path(__file__).resolve().parents[1])


@dataclass(frozen=True)
class SupervisorConfig:
    worker_id: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)  # applied last: overrides what Ray set
    num_gpus: float = 0.0
    max_restarts: int = 3
    # The cluster's CURVE keys. They reach the actor as its constructor argument (Ray passes it to the
    # actor process, it is not a command line, a log line or a runtime_env, which Ray shows in its
    # dashboard and state API) and the worker as its environment; repr=False keeps them out of errors.
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("command must not be empty")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")


def _set_pdeathsig(parent_pid: int, libc: ctypes.CDLL) -> None:
    """Runs in the forked child before exec: die with the parent, even if it is already gone."""
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died between fork and prctl: the signal will not come
        os._exit(1)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # nothing left in the group
        os.killpg(pgid, signal.SIGKILL)


class _Supervisor:
    """Actor body: runs one worker process, restarts it after a crash, stops it on request."""

    def __init__(self, config: SupervisorConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._restarts = 0

    def __repr__(self) -> str:
        # Ray prefixes the actor's log lines (the worker's output too) with "(REPR pid=ACTOR_PID)": say
        # that this pid is the actor's; the worker process's pid is the one the router logs.
        return f"ray actor of {self._config.worker_id}"

    def run(self) -> dict:
        """Spawn the worker, re-spawn it after crashes; return when it has exited for good."""
        command, env = self._command(), self._child_env()
        delay = _FIRST_BACKOFF_S
        returncode = None
        while (proc := self._spawn(command, env)) is not None:
            returncode = proc.wait()
            _kill_group(proc.pid)  # a worker's own children must not outlive it
            if self._stopping.is_set() or returncode == 0 or self._restarts >= self._config.max_restarts:
                break
            log.warning("worker %s exited with %s; restarting", self._config.worker_id, returncode)
            if self._stopping.wait(delay):
                break
            delay = min(2 * delay, _MAX_BACKOFF_S)
            self._restarts += 1
        return {"returncode": returncode, "restarts": self._restarts, "stopped": self._stopping.is_set()}

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the worker, SIGKILL its process group after `grace_s`; no restart afterwards."""
        with self._lock:
            self._stopping.set()
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            return proc.wait()

    def pid(self) -> int | None:
        """The pid of the current worker process (None before the first spawn or once it has exited)."""
        proc = self._proc
        return None if proc is None or proc.poll() is not None else proc.pid

    def restarts(self) -> int:
        return self._restarts

    def _command(self) -> list[str]:
        """The worker's command line, naming the node Ray placed it on (the router shows it in /health)."""
        if not ray.is_initialized():  # run() called outside an actor (the supervisor's own tests)
            return list(self._config.command)
        return [*self._config.command, "--node-id", ray.get_runtime_context().get_node_id()]

    def _spawn(self, command: list[str], env: dict[str, str]) -> subprocess.Popen | None:
        libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork: the child only calls into it
        parent = os.getpid()
        with self._lock:  # under the lock so that a concurrent stop() never misses a fresh child
            if self._stopping.is_set():
                return None
            self._proc = subprocess.Popen(
                command,
                env=env,
                start_new_session=True,  # own process group: stop can kill the worker's children too
                preexec_fn=lambda: _set_pdeathsig(parent, libc),
            )
            # print, not log: Ray forwards the actor's stdout to the launcher; its loggers stop at WARNING.
            print(f"{self._config.worker_id}: worker process pid {self._proc.pid} started", flush=True)
            return self._proc

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self._config.num_gpus > 0:
            gpu_ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        else:
            # Ray leaves the variable alone for actors without GPUs; a worker that reserved no GPU
            # share must not take one that another worker reserved.
            env["CUDA_VISIBLE_DEVICES"] = ""
        # Ray forces OMP_NUM_THREADS=1 on actors reserving < 1 CPU; the worker sizes its own threads.
        env.pop("OMP_NUM_THREADS", None)
        # The worker's stdout is a file Ray tails: unbuffered, its lines reach the launcher as written.
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_SOURCE_ROOT, env.get("PYTHONPATH")) if p)
        env.update(self._config.env)
        env.update(self._config.secret_env)
        return env


_SupervisorActor = ray.remote(max_restarts=0, max_concurrency=4)(_Supervisor)


class RayBackend(WorkerBackend):
    """Places each worker as a Ray actor with its GPU share, on a Ray cluster or a local Ray instance.

    Joins `address` (or $RAY_ADDRESS, e.g. "auto" on a cluster's head node) when given, reuses a Ray
    session the caller already opened, and otherwise starts a local Ray instance that `shutdown` ends
    (`local_num_cpus` / `local_num_gpus` size it; by default Ray counts the machine's own).
    `worker_num_cpus` is the CPU each worker reserves: 0 by default because GPU shares place the
    workers, and on a small CPU-only host a whole CPU each would leave workers unscheduled.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        local_num_cpus: int | None = None,
        local_num_gpus: int | None = None,
        worker_num_cpus: float = 0.0,
        max_restarts: int = 3,
    ) -> None:
        if local_num_cpus is not None and local_num_cpus < 1:
            raise ValueError(f"local_num_cpus must be >= 1, got {local_num_cpus}")
        if local_num_gpus is not None and local_num_gpus < 0:
            raise ValueError(f"local_num_gpus must be >= 0, got {local_num_gpus}")
        if worker_num_cpus < 0:
            raise ValueError(f"worker_num_cpus must be >= 0, got {worker_num_cpus}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        self.address = address
        self.local_num_cpus = local_num_cpus
        self.local_num_gpus = local_num_gpus
        self.worker_num_cpus = worker_num_cpus
        self.max_restarts = max_restarts
        self.owns_ray = False
        self._handles: list[RayWorkerHandle] = []

    def start(self, spec: WorkerSpec) -> RayWorkerHandle:
        self._connect()
        config = SupervisorConfig(
            worker_id=spec.worker_id,
            command=[sys.executable, "-m", spec.module, *spec.argv],
            env=dict(spec.env),
            num_gpus=spec.num_gpus,
            max_restarts=self.max_restarts,
            secret_env=dict(spec.secret_env),
        )
        options = {"num_cpus": self.worker_num_cpus, "num_gpus": spec.num_gpus, "resources": spec.resources}
        actor = _SupervisorActor.options(**options).remote(config)
        handle = RayWorkerHandle(spec, actor, actor.run.remote())
        self._handles.append(handle)
        return handle

    def cluster_gpus(self) -> int:
        """The GPUs of every live node of the Ray cluster, not only the launcher's (on a `ray up`
        cluster the head may have one GPU, or none, and the workers' nodes the rest)."""
        self._connect()
        return int(ray.cluster_resources().get("GPU", 0))

    def shutdown(self, grace_s: float = 10.0) -> None:
        if ray.is_initialized():
            stop_all(self._handles, grace_s)
        self._handles.clear()
        if self.owns_ray:
            ray.shutdown()
            self.owns_ray = False

    def _connect(self) -> None:
        if ray.is_initialized():
            return  # the caller's session (or ours from an earlier start): use it, do not own it
        address = self.address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address)
            return
        # "local": a private instance, even if another `ray start` cluster runs on this host.
        ray.init(
            address="local",
            num_cpus=self.local_num_cpus,
            num_gpus=self.local_num_gpus,
            include_dashboard=False,
        )
        self.owns_ray = True
