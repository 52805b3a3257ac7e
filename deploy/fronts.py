"""The launcher's router fronts: `--api-servers N` HTTP front processes (`python -m router`) on one port.

Front 0 binds the launcher's `--port` (0: a free one); fronts 1..N-1 then bind the port it got. With
N > 1 every front binds with SO_REUSEPORT (`--reuse-port`), so the kernel spreads connections between
them, and each front has its own ZMQ inbox: workers register with every inbox (`--router-addr
A,B,...`) and send a request's tokens to the inbox of the front that admitted it (`reply_to`, see
docs/protocol.md). Each front keeps its own replica of the prefix index and the load picture, fed by
the workers' cache events (every front subscribes) and heartbeats (sent to every front).

With N > 1 the fronts also share a directory (`fronts/` in the launcher's run directory, named to each
by `--fronts-dir`): the launcher creates one in-flight slot per front there, so `--max-running-requests`
bounds all fronts together (router/front_slots.py: up to N - 1 over when fronts race on the last
place), and each front publishes its metrics snapshot there, so /metrics on any front sums all of them
(router/front_metrics.py).

A front that dies is started again on the same HTTP port and the same inbox port (`restart`), so the
workers' sockets reconnect to it on their own; the other fronts keep serving meanwhile. With N = 1
nothing changes from a single router: no front index, no SO_REUSEPORT, the ready file `router-ready.json`
and the log `router.log`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from deploy.local_backend import signal_group, spawn, stop_processes
from deploy.plan import LaunchPlan
from router.config import API_KEY_ENV
from router.flags import ROUTER_FLAGS
from router.front_slots import create_slots, reset_slot

T = TypeVar("T")

# How many fronts the launcher starts when `--api-servers` is not given: one per CORES_PER_FRONT cores,
# at most MAX_DEFAULT_FRONTS. Their CPU is taken from the workers' host. Measured on the H200 host (16
# cores, docs/benchmarks.md, 2026-12-03): 4 fronts against 1 in front of one mixed worker cut TTFT p50
# 3-7x and the inter-token p99 from 354-512 ms to 25-50 ms at the same throughput (1.02-1.06x); more
# than 4 were not measured serving, hence the cap. A 2-core box gets 1.
CORES_PER_FRONT = 4
MAX_DEFAULT_FRONTS = 4


def default_api_servers(cores: int) -> int:
    """The launcher's default front count on a host with `cores` usable cores."""
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be a positive int, got {cores!r}")
    return max(1, min(MAX_DEFAULT_FRONTS, cores // CORES_PER_FRONT))


@dataclass
class Front:
    index: int
    proc: subprocess.Popen
    ready: dict  # the front's ready file: {"http": url, "inbox": addr, ...}


class Fronts:
    """Start, watch, restart and stop the fronts. `check(waiting_for)` is called while waiting for a
    ready file; it raises to give up (stop asked, a deadline, a process that died)."""

    def __init__(self, plan: LaunchPlan, state_dir: str, secret_env: dict[str, str]) -> None:
        self.plan = plan
        self._dir = Path(state_dir)
        self.secret_env = secret_env
        self.fronts: list[Front] = []

    @property
    def several(self) -> bool:
        return self.plan.api_servers > 1

    @property
    def url(self) -> str:
        return self.fronts[0].ready["http"]

    @property
    def inboxes(self) -> str:
        """Every front's inbox, comma-separated: the workers' `--router-addr`."""
        return ",".join(front.ready["inbox"] for front in self.fronts)

    @property
    def shared_dir(self) -> Path | None:
        """The directory the fronts share (their in-flight slots and metrics snapshots); None with one."""
        return self._dir / "fronts" if self.several else None

    def start(self, check: Callable[[str], None], meanwhile: Callable[[], T]) -> T:
        """Start every front, one after another (the others join the port front 0 got); `meanwhile`
        runs while front 0 starts (work that needs no front: the launcher counts GPUs, which imports
        torch, ~1.3 s of a CPU box's start-up) and its result is returned."""
        if self.shared_dir is not None:
            create_slots(self.shared_dir, self.plan.api_servers)
        self.fronts.append(self._spawn(0, self.plan.port, None))
        result = meanwhile()
        self._wait_ready(self.fronts[0], check)
        port = _port_of(self.fronts[0].ready["http"])
        for index in range(1, self.plan.api_servers):
            self.fronts.append(self._spawn(index, port, None))
            self._wait_ready(self.fronts[index], check)
        return result

    def dead(self) -> list[Front]:
        return [front for front in self.fronts if front.proc.poll() is not None]

    def restart(self, front: Front, check: Callable[[str], None], kill: bool = False) -> Front:
        """Start `front` again on its HTTP port and inbox port (killing it first when `kill`)."""
        if kill:
            signal_group(front.proc, signal.SIGKILL)
        front.proc.wait()
        if self.shared_dir is not None:  # its requests died with it: the others may use its share now
            reset_slot(self.shared_dir, front.index)
        stop_processes([front.proc], grace_s=0.0)  # closes its log file; nothing left to signal
        inbox_port = int(front.ready["inbox"].rsplit(":", 1)[1])
        new = self.fronts[front.index] = self._spawn(front.index, _port_of(front.ready["http"]), inbox_port)
        new.ready = front.ready  # until the new ready file comes: a failed start can be retried
        self._wait_ready(new, check)
        return new

    def signal_all(self, sig: int) -> None:
        for front in self.fronts:
            signal_group(front.proc, sig)

    def stop(self, grace_s: float) -> None:
        stop_processes([front.proc for front in self.fronts], grace_s)

    def _name(self, index: int) -> str:
        return f"router-{index}" if self.several else "router"

    def _ready_file(self, index: int) -> Path:
        return self._dir / f"{self._name(index)}-ready.json"

    def argv(self, index: int, port: int, inbox_port: int | None) -> list[str]:
        """Front `index`'s command line (no I/O: the files it names are made by `start` and `_spawn`)."""
        p = self.plan
        launcher_set = {
            "model": p.model,
            "host": p.host,
            "port": port,
            "inbox_host": p.inbox_host,
            "ready_file": str(self._ready_file(index)),
            "protect_status": p.protect_status,
            "block_size": p.engine.get("kvcache_block_size"),
            "front": index if self.several else None,
            "reuse_port": self.several,
            "fronts_dir": str(self.shared_dir) if self.shared_dir is not None else None,
        }
        argv = [sys.executable, "-m", "router", *ROUTER_FLAGS.argv(launcher_set), "--log-level", p.log_level]
        argv += list(p.router_argv)
        if inbox_port is not None and "--inbox-port" not in p.router_argv:
            argv += ["--inbox-port", str(inbox_port)]
        return argv

    def _spawn(self, index: int, port: int, inbox_port: int | None) -> Front:
        p = self.plan
        name = self._name(index)
        self._ready_file(index).unlink(missing_ok=True)
        argv = self.argv(index, port, inbox_port)
        log_path = None
        if p.log_dir:
            os.makedirs(p.log_dir, exist_ok=True)
            log_path = str(Path(p.log_dir) / f"{name}.log")
        # The key goes through the environment, not argv, which any user of the host can read (ps);
        # "" (no key) also overrides a PDSERVE_API_KEY the launcher itself inherited.
        proc = spawn(argv, env={API_KEY_ENV: p.api_key or "", **self.secret_env}, log_path=log_path)
        return Front(index, proc, {})

    def _wait_ready(self, front: Front, check: Callable[[str], None]) -> None:
        ready_file = self._ready_file(front.index)
        while not ready_file.exists():
            check(f"{self._name(front.index)} ready file")  # raises when this front (or another) exited
            time.sleep(0.05)
        front.ready = json.loads(ready_file.read_text())


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].rstrip("/"))
