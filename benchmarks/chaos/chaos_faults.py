"""The chaos soak's fault side: random (seeded) faults on a running `deploy.launch.Cluster` (local
backend), and the supervision the local backend lacks. See benchmarks/chaos/chaos.py for the whole soak.

Faults (`FAULT_KINDS`):
  kill_prefill / kill_decode   SIGKILL a worker; restarted `restart_delay_s` later with the same spec
                               (same worker id, new pid), as Ray's supervisor (deploy/ray_backend.py)
                               would. Only a worker whose role has another one alive is killed.
  stop_prefill / stop_decode   SIGSTOP a worker for up to `stop_max_s`, then SIGCONT (past the router's
                               heartbeat timeout it is declared down meanwhile, then comes back).
  router_restart               SIGKILL the router (with several fronts, `--api-servers N`, one front
                               drawn at random) and start a new one on the same ports
                               (`Cluster.restart_router`); the workers re-register on their own and
                               drop the dead front's requests; the other fronts keep serving.
  disconnect                   the next streamed request leaves after a few events (chaos_load).
Dropped and delayed KV transfers are not scheduled here: the decode workers inject them themselves
(kvtransfer/faults.py, PDSERVE_KV_FAULTS), and chaos.py counts them from the worker logs.

Every process is spawned from one long-lived thread (`_spawner`): the local backend ties a child's life
to the thread that forked it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from deploy.launch import Cluster

FAULT_KINDS = ("kill_prefill", "kill_decode", "stop_prefill", "stop_decode", "router_restart", "disconnect")
ROUTER_DOWN_GRACE_S = 1.0  # connection errors surface a moment after the new router serves


@dataclass(frozen=True)
class FaultConfig:
    every_s: float  # mean seconds between faults (exponential gaps)
    kinds: tuple[str, ...] = FAULT_KINDS
    stop_max_s: float = 5.0
    restart_delay_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.every_s > 0:
            raise ValueError(f"every_s must be > 0, got {self.every_s}")
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"kinds must be a non-empty subset of {FAULT_KINDS}, got {self.kinds}")
        if not self.stop_max_s > 0 or self.restart_delay_s < 0:
            raise ValueError("stop_max_s must be > 0 and restart_delay_s >= 0")


class Chaos:
    def __init__(self, cluster: Cluster, config: FaultConfig, rng: random.Random) -> None:
        self.cluster = cluster
        self.config = config
        self.rng = rng
        self.counts: Counter[str] = Counter()  # injected faults by kind ("skipped_*": no victim)
        self.router_down: list[tuple[float, float]] = []  # monotonic windows
        self.stopped: set[str] = set()  # worker ids under SIGSTOP now
        self.restarting: set[str] = set()  # worker ids killed and not started again yet
        self.pending_disconnects = 0
        self._deck: list[str] = []
        self._tasks: set[asyncio.Task] = set()
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="chaos-spawn")

    # ---- the loop ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, live_workers) -> None:
        """Inject faults until `stop`; `live_workers()` -> the worker ids the router lists live now."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.expovariate(1.0 / self.config.every_s))
            if stop.is_set():
                break
            kind = self._next_kind()
            try:
                await self.inject(kind, await live_workers())
            except Exception as e:  # a fault that could not be injected is reported, not fatal
                self.counts[f"failed_{kind}"] += 1
                print(f"chaos: injecting {kind} failed: {type(e).__name__}: {e}", flush=True)

    def _next_kind(self) -> str:
        """Kinds come from a shuffled deck, so every kind occurs once per len(kinds) faults (a short
        run still covers them all) while the order stays random."""
        if not self._deck:
            self._deck = list(self.config.kinds)
            self.rng.shuffle(self._deck)
        return self._deck.pop()

    async def inject(self, kind: str, live: set[str]) -> None:
        if kind == "disconnect":
            self.pending_disconnects += 1
        elif kind == "router_restart":
            await self._restart_router()
        else:
            action, role = kind.split("_")
            victim = self._victim(role, live if action == "kill" else None)
            if victim is None:
                self.counts[f"skipped_{kind}"] += 1
                return
            self._spawn_task(self._kill(victim) if action == "kill" else self._pause(victim))
        self.counts[kind] += 1

    def take_disconnect(self) -> bool:
        """Whether the caller's next request should be a stream that leaves early."""
        if self.pending_disconnects:
            self.pending_disconnects -= 1
            return True
        return False

    # ---- faults --------------------------------------------------------------------------------

    def _victim(self, role: str, spares_from: set[str] | None):
        """A worker of `role` to fault, or None. With `spares_from` (the ids live in the router), only
        while another worker of the role is live and not paused, so the role keeps serving."""
        busy = self.stopped | self.restarting
        usable = [w for w in self.cluster.workers if w.spec.role == role and w.alive()]
        usable = [w for w in usable if w.spec.worker_id not in busy]
        if not usable:
            return None
        victim = self.rng.choice(usable)
        if spares_from is not None:
            spares = {w.spec.worker_id for w in usable} & spares_from - {victim.spec.worker_id}
            if not spares:
                return None
        return victim

    async def _kill(self, handle) -> None:
        worker_id = handle.spec.worker_id
        self.restarting.add(worker_id)
        try:
            os.kill(handle.pid, signal.SIGKILL)
            await self._in_spawner(handle.stop, 5.0)  # reaps it (and anything left in its group)
            await asyncio.sleep(self.config.restart_delay_s)
            fresh = await self._in_spawner(self.cluster.backend.start, handle.spec)
            self.cluster.workers[self.cluster.workers.index(handle)] = fresh
        finally:
            self.restarting.discard(worker_id)

    async def _pause(self, handle) -> None:
        worker_id = handle.spec.worker_id
        self.stopped.add(worker_id)
        try:
            os.kill(handle.pid, signal.SIGSTOP)
            await asyncio.sleep(self.rng.uniform(0.2, self.config.stop_max_s))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.pid, signal.SIGCONT)
            self.stopped.discard(worker_id)

    async def _restart_router(self) -> None:
        started = time.monotonic()
        index = self.rng.randrange(len(self.cluster.fronts.fronts))
        self.counts[f"front_{index}_killed"] += 1
        try:
            await self._in_spawner(self.cluster.restart_router, 120.0, index)
        finally:
            self.router_down.append((started, time.monotonic() + ROUTER_DOWN_GRACE_S))

    # ---- plumbing ------------------------------------------------------------------------------

    def _spawn_task(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.counts["failed_worker_fault"] += 1
            print(f"chaos: a worker fault failed: {task.exception()!r}", flush=True)

    async def _in_spawner(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._spawner, fn, *args)

    async def settle(self) -> None:
        """Wait for every pause to end and every killed worker to be started again."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def close(self) -> None:
        """After the cluster has stopped: the spawner thread may go (its children are gone)."""
        self._spawner.shutdown(wait=True)

    def pids(self) -> dict[str, int]:
        """Process name -> pid of every process of the cluster now (for RSS sampling)."""
        out = {w.spec.worker_id: w.pid for w in self.cluster.workers if w.alive()}
        for front in self.cluster.fronts.fronts if self.cluster.fronts else []:
            if front.proc.poll() is None:
                out["router" if front.index == 0 else f"router-{front.index}"] = front.proc.pid
        return out
