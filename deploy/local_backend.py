"""Workers as plain subprocesses of the launcher (no Ray): `python -m {role}_worker {argv}`.

Each child runs in its own process group (so a stop reaches anything it spawned) and, on Linux, asks
the kernel to SIGKILL it when the launcher dies (prctl PR_SET_PDEATHSIG), so even `kill -9` of the
launcher leaves no orphans. The kernel sends that signal when the *thread* that forked the child exits,
so call `start` from a thread that lives as long as the cluster (the launcher's main thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from deploy.base import WorkerBackend, WorkerHandle, WorkerSpec

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[1]
PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    """Runs in the child between fork and exec: own process group, die with the parent."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher's environment plus `extra`, with this checkout first on PYTHONPATH so children import
    the same code as the launcher whatever their working directory."""
    env = dict(os.environ)
    env.update(extra or {})
    paths = [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def spawn(argv: Sequence[str], env: Mapping[str, str] | None = None, log_path: str | None = None):
    """Start `argv` in its own process group, tied to this process's life; returns the Popen."""
    out: IO | None = open(log_path, "ab") if log_path else None  # noqa: SIM115 (closed by the handle)
    try:
        proc = subprocess.Popen(
            list(argv),
            env=child_env(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            preexec_fn=_child_setup,  # prctl has no Popen option; the hook only makes two syscalls
            close_fds=True,
        )
    except BaseException:
        if out:
            out.close()
        raise
    proc.log_file = out  # type: ignore[attr-defined]
    return proc


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the child's process group (its pgid is its pid); gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_processes(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every group at once, wait up to `grace_s` in total, SIGKILL whatever is left.

    Idempotent: a process already stopped is skipped, so its (maybe reused) pid is never signalled."""
    procs = [p for p in procs if not getattr(p, "pdserve_stopped", False)]
    for proc in procs:
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
    for proc in procs:
        if proc.poll() is None:
            log.warning("pid %d ignored SIGTERM for %.1fs: killing it", proc.pid, grace_s)
        signal_group(proc, signal.SIGKILL)  # also reaps grandchildren left in the group
        proc.wait()
        proc.pdserve_stopped = True  # type: ignore[attr-defined]
        log_file = getattr(proc, "log_file", None)
        if log_file is not None:
            log_file.close()


class LocalWorker(WorkerHandle):
    def __init__(self, spec: WorkerSpec, proc: subprocess.Popen) -> None:
        self.spec = spec
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        stop_processes([self.proc], grace_s)


class LocalBackend(WorkerBackend):
    """`log_dir`: write each worker's output to `{log_dir}/{worker_id}.log` (default: inherit ours)."""

    name = "local"

    def __init__(self, log_dir: str | None = None, python: str = sys.executable) -> None:
        self.log_dir = log_dir
        self.python = python
        self.workers: list[LocalWorker] = []

    def start(self, spec: WorkerSpec) -> LocalWorker:
        log_path = os.path.join(self.log_dir, f"{spec.worker_id}.log") if self.log_dir else None
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
        env = {**spec.env, **spec.secret_env}  # the environment: never on the command line
        proc = spawn([self.python, "-m", spec.module, *spec.argv], env, log_path)
        worker = LocalWorker(spec, proc)
        self.workers.append(worker)
        log.info("started %s (pid %d)", spec.worker_id, proc.pid)
        return worker

    def shutdown(self, grace_s: float = 10.0) -> None:
        stop_processes([w.proc for w in self.workers], grace_s)
