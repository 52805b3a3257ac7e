"""Run `python -m deploy.launch --backend local` as a subprocess and talk to the cluster it serves."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.integration.process_cluster import ProcessCluster, metric

REPO_ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"pdserve ready: (http://\S+)/v1")


@dataclass
class LaunchedCluster:
    proc: subprocess.Popen
    url: str  # base URL, without /v1
    log_dir: Path
    output: list[str] = field(default_factory=list)

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def settled_metrics(self, finished: int, timeout: float = 10.0) -> str:
        """/metrics once it counts `finished` finished requests. With several fronts a scrape adds the
        other fronts' snapshots, published about once a second (router/front_metrics.py), so a scrape
        right after the last answer can miss a front's last requests (seen on the GPU, where ten
        answers take under a second)."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.metrics()
            done = metric(text, "pdserve_e2e_request_latency_seconds_count") or 0
            if done >= finished or time.monotonic() > deadline:
                return text
            time.sleep(0.2)

    def debug_index(self) -> dict:
        return httpx.get(f"{self.url}/debug/index", timeout=10).json()

    def worker_pids(self) -> list[int]:
        return [w["pid"] for w in self.health()["workers"]]

    def logs(self) -> str:
        parts = [f"--- launcher ---\n{''.join(self.output)}"]
        for path in sorted(self.log_dir.glob("*.log")):
            parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM the launcher and wait for it; returns its exit status. The launcher's own shutdown is
        bounded at about 20 s (10 s of grace for the workers, then up to 10 more for the fronts), so the
        default leaves a loaded CI box's slow exits room; past it the error carries every log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"the launcher did not stop within {timeout:.0f}s:\n{self.logs()}") from None


LAUNCH_MODULE = ("-m", "deploy.launch")


def script_command() -> list[str]:
    """What pip's generated `pdserve` script runs: the entry point pyproject.toml declares."""
    target = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]["pdserve"]
    module, func = target.split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())"]


def launch(
    model: str, log_dir: Path, *extra: str, timeout: float = 180.0, entry: Sequence[str] = LAUNCH_MODULE
) -> LaunchedCluster:
    """Start a cluster; returns once the launcher printed its ready line (or raises with the logs).
    `entry` is what follows the interpreter on the command line (e.g. the `pdserve serve` script)."""
    cmd = [sys.executable, *entry, "--model", model, "--backend", "local", "--port", "0"]
    cmd += ["--log-dir", str(log_dir), "--log-level", "warning", "--startup-timeout", str(timeout), *extra]
    # One compute thread per worker: several processes share this machine's few cores.
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so a failed test can kill the launcher's whole group
    )
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []
    threading.Thread(target=_pump, args=(proc, lines, output), daemon=True).start()
    deadline = time.monotonic() + timeout + 30
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if line is None:
            break
        match = READY.search(line)
        if match:
            return LaunchedCluster(proc, match.group(1), log_dir, output)
    cluster = LaunchedCluster(proc, "", log_dir, output)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    raise RuntimeError(f"cluster did not become ready:\n{cluster.logs()}")


def complete(cluster: LaunchedCluster | ProcessCluster, prompt, max_tokens: int, **extra) -> dict:
    """A greedy /v1/completions answer from either kind of test cluster (asserting 200): what the
    cluster tests compare with the offline engine."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = httpx.post(f"{cluster.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@contextlib.contextmanager
def running(model: str, log_dir: Path, *extra: str) -> Iterator[LaunchedCluster]:
    """`launch`, and at the end a clean stop: the launcher must exit 0 (else the logs are shown)."""
    launched = launch(model, log_dir, *extra)
    try:
        yield launched
    finally:
        status = launched.stop()
        assert status == 0, launched.logs()


def _pump(proc: subprocess.Popen, lines: queue.Queue, output: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        output.append(line)
        lines.put(line)
    lines.put(None)
