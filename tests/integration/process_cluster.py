"""A cluster started process by process (router, then each worker), for fault tests.

`deploy.launch` does not forward router flags (--request-timeout, --heartbeat-timeout,
--max-running-requests) nor worker flags (--kv-lease-s), and fault tests need them short; so this
helper starts `python -m router` and `python -m {prefill,decode}_worker` itself, the way the launcher's
local backend does (own process group, killed with the test process).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from deploy.local_backend import spawn, stop_processes

# One compute thread per process: several workers share this machine's few cores.
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@dataclass
class ProcessCluster:
    model: str
    log_dir: Path
    router_flags: list[str] = field(default_factory=list)
    worker_flags: list[str] = field(default_factory=list)
    url: str = ""
    inbox: str = ""
    procs: dict[str, object] = field(default_factory=dict)  # name -> Popen

    def start(self, num_prefill: int, num_decode: int, timeout: float = 180.0) -> ProcessCluster:
        deadline = time.monotonic() + timeout
        self._start_router(deadline)
        for role, count in (("prefill", num_prefill), ("decode", num_decode)):
            for i in range(count):
                self._start_worker(role, f"{role}-{i}")
        while not self._all_live():
            self._check(deadline, "every worker live in /health")
            time.sleep(0.25)
        return self

    def _start_router(self, deadline: float) -> None:
        ready = self.log_dir / "router-ready.json"
        argv = [sys.executable, "-m", "router", "--model", self.model, "--port", "0"]
        argv += ["--ready-file", str(ready), "--log-level", "warning", *self.router_flags]
        self.procs["router"] = spawn(argv, ENV, str(self.log_dir / "router.log"))
        while not ready.exists():
            self._check(deadline, "the router's ready file")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        self.url, self.inbox = info["http"], info["inbox"]

    def _start_worker(self, role: str, worker_id: str) -> None:
        argv = [sys.executable, "-m", f"{role}_worker", "--model", self.model, "--router-addr", self.inbox]
        argv += ["--host", "127.0.0.1", "--worker-id", worker_id, "--kv-transport", "tcp"]
        argv += ["--log-level", "warning", *self.worker_flags]
        self.procs[worker_id] = spawn(argv, ENV, str(self.log_dir / f"{worker_id}.log"))

    def _all_live(self) -> bool:
        try:
            workers = httpx.get(f"{self.url}/health", timeout=5).json()["workers"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        live = {w["worker_id"] for w in workers if w["state"] == "live"}
        return set(self.procs) - {"router"} <= live

    def _check(self, deadline: float, waiting_for: str) -> None:
        dead = [name for name, p in self.procs.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(f"waiting for {waiting_for}; exited: {dead}\n{self.logs()}")

    def stop(self) -> None:
        stop_processes(list(self.procs.values()), grace_s=10.0)

    def logs(self) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    # ---- views ---------------------------------------------------------------------------------

    def health(self) -> httpx.Response:
        return httpx.get(f"{self.url}/health", timeout=10)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def workers(self) -> dict[str, dict]:
        """worker id -> its /debug/index entry (state, pid, kv_cache_usage, load figures)."""
        entries = httpx.get(f"{self.url}/debug/index", timeout=10).json()["workers"]
        return {w["worker_id"]: w for w in entries}

    def kill(self, worker_id: str, sig: int = signal.SIGKILL) -> None:
        """Signal the worker by the pid /health reports (what an operator would see)."""
        pid = self.workers()[worker_id]["pid"]
        os.kill(pid, sig)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of the Prometheus exposition `text` (None if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for match in re.finditer(rf"^{name}(?:\{{([^}}]*)\}})? (\S+)$", text, re.MULTILINE):
        got = ",".join(sorted((match.group(1) or "").split(",")))
        if got == want:
            return float(match.group(2))
    return None
