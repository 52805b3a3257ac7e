"""`python -m deploy.launch`: start a router and N prefill + M decode + K mixed workers, serve until Ctrl-C.

    python -m deploy.launch [--model PATH] --prefill N --decode M [--mixed K] [--host H] [--port P]
        [--backend ray|local] [--kv-transport auto|ipc|nccl|tcp] [--routing prefix|round_robin]
        [--gpus-per-worker F] [--mps] [--log-dir DIR] [--api-key KEY] [--protect-status] [engine flags]

Order: resolve the model (the default model when --model is absent) -> router subprocess (while it
starts, count the GPUs; then wait for its ready file, which names the inbox) -> workers through the
backend -> wait until /health is 200 and lists every worker live -> print "pdserve ready: URL/v1"
once -> serve until SIGINT/SIGTERM (or the router dies) -> stop the workers and the router (no
process is left behind, see local_backend).
What is started, with which flags and GPU shares (mixed workers, validation), is planned in plan.py.
The launcher makes the cluster's CURVE keys (common/net/curve.py) and gives them to the router and every
worker through the environment (never argv, never a log), so only its own processes can join.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import replace

from common.net.curve import CurveKeys
from deploy.base import WorkerBackend, WorkerHandle
from deploy.fronts import Front, Fronts
from deploy.launch_args import PROG, parse_args
from deploy.mps import MPSDaemon
from deploy.plan import LaunchPlan, multiplexes, worker_specs
from deploy.ray_logs import use_readable_ray_logs
from router.access_log import LAUNCHER_AGENT

log = logging.getLogger("deploy.launch")


def make_backend(plan: LaunchPlan) -> WorkerBackend:
    if plan.backend == "local":
        from deploy.local_backend import LocalBackend

        return LocalBackend(plan.log_dir)
    use_readable_ray_logs(sys.stdout.isatty())  # before `import ray`, which reads these settings
    try:
        from deploy.ray_backend import RayBackend
    except ImportError as e:
        raise RuntimeError(f"the Ray backend is not available ({e}); use --backend local") from e
    return RayBackend(plan.ray_address)


def count_gpus(plan: LaunchPlan, backend: WorkerBackend) -> int:
    """The GPUs the default shares split: none with `--device cpu`, else all the backend can reach."""
    return 0 if plan.engine.get("device") == "cpu" else backend.cluster_gpus()


class Interrupted(Exception):
    """`stop` was set while the cluster was starting."""


class Cluster:
    """The router fronts (deploy/fronts.py) plus the backend's workers. `start()` returns the base URL
    once healthy; setting `stop` (e.g. from a signal handler) interrupts the start-up and ends `serve`."""

    def __init__(self, plan: LaunchPlan, backend: WorkerBackend, stop: threading.Event | None = None) -> None:
        self.plan = plan
        self.backend = backend
        self.stop = stop or threading.Event()
        self.workers: list[WorkerHandle] = []
        self.url: str | None = None
        self.inbox: str | None = None  # every front's inbox, comma-separated (the workers' --router-addr)
        self._tmp = tempfile.TemporaryDirectory(prefix="pdserve-launch-")
        self.fronts: Fronts | None = None  # made by start(), with the cluster's CURVE keys
        self._healthy_fronts: set[int | None] = set()
        self.mps: MPSDaemon | None = None  # --mps: started before the workers, stopped after them

    @property
    def router(self):
        """Front 0's process (the only one with --api-servers 1)."""
        return self.fronts.fronts[0].proc if self.fronts and self.fronts.fronts else None

    def start(self) -> str:
        deadline = time.monotonic() + self.plan.startup_timeout_s
        # The cluster's CURVE keys (common/net/curve.py): made here, handed over through environments only.
        self.fronts = Fronts(self.plan, self._tmp.name, CurveKeys.generate().to_env())
        num_gpus = self.fronts.start(self._front_check(deadline), lambda: count_gpus(self.plan, self.backend))
        self.url, self.inbox = self.fronts.url, self.fronts.inboxes
        secret_env = self.fronts.secret_env
        if multiplexes(self.plan, num_gpus):
            log.info("one GPU: prefill and decode run multiplexed in one worker (--no-pd-multiplex: two)")
        mps_env = self._start_mps(num_gpus)
        for spec in worker_specs(self.plan, self.inbox, num_gpus):
            spec = replace(spec, env={**spec.env, **mps_env}, secret_env=secret_env)
            self.workers.append(self.backend.start(spec))
        self._wait_healthy(deadline)
        return self.url

    def _start_mps(self, num_gpus: int) -> dict[str, str]:
        """--mps: the daemon runs before any worker makes its CUDA context; its environment for them."""
        if not self.plan.mps:
            return {}
        if num_gpus == 0:
            raise RuntimeError("--mps shares a GPU between workers, and this host has none")
        self.mps = MPSDaemon(f"{self._tmp.name}/mps")
        self.mps.start()
        return self.mps.worker_env()

    def restart_router(self, timeout_s: float = 120.0, index: int = 0) -> None:
        """Kill front `index` (SIGKILL, as a crash would) and start a new one on the same HTTP port and
        inbox port; returns once it serves. The running workers' sockets reconnect on their own and
        they re-register within seconds (`healthy()` says when all have)."""
        if self.fronts is None or not self.fronts.fronts:
            raise RuntimeError("restart_router needs a started cluster")
        self._restart_front(self.fronts.fronts[index], time.monotonic() + timeout_s, kill=True)

    def _restart_front(self, front: Front, deadline: float, kill: bool = False) -> None:
        assert self.fronts is not None
        self._healthy_fronts.discard(front.index if self.fronts.several else None)
        self.fronts.restart(front, self._front_check(deadline), kill=kill)

    def _front_check(self, deadline: float) -> Callable[[str], None]:
        # Workers are not checked: a restart may find one down, which is the router's to handle.
        return lambda waiting_for: self._check_alive(deadline, waiting_for, check_workers=False)

    def _wait_healthy(self, deadline: float) -> None:
        while not self.healthy():
            self._check_alive(deadline, "/health == 200 with every worker live")
            time.sleep(0.25)

    def healthy(self) -> bool:
        """/health is 200 and lists every worker started as live (200 alone means one of each role);
        with several fronts, every front has answered so since it (re)started (each poll is a new
        connection, which the kernel gives to any of the fronts)."""
        # The User-Agent keeps these polls out of the router's access log (router/access_log.py).
        headers = {"User-Agent": LAUNCHER_AGENT}
        if self.plan.api_key:
            headers["Authorization"] = f"Bearer {self.plan.api_key}"
        try:
            request = urllib.request.Request(f"{self.url}/health", headers=headers)
            with urllib.request.urlopen(request, timeout=2) as resp:
                report = json.loads(resp.read())
        except (OSError, ValueError):  # URLError / HTTPError (503 while workers join) / refused / garbage
            return False
        live = {w.get("worker_id") for w in report.get("workers", []) if w.get("state") == "live"}
        if not {w.spec.worker_id for w in self.workers} <= live:
            return False
        self._healthy_fronts.add(report.get("front"))
        return len(self._healthy_fronts) >= self.plan.api_servers

    def _check_alive(self, deadline: float, waiting_for: str, check_workers: bool = True) -> None:
        if self.stop.is_set():
            raise Interrupted(waiting_for)
        dead = self.fronts.dead() if self.fronts is not None else []
        if dead:
            raise RuntimeError(f"the router exited with status {dead[0].proc.returncode}")
        dead = [w.spec.worker_id for w in self.workers if check_workers and not w.alive()]
        if dead:
            raise RuntimeError(f"worker(s) exited during start-up: {', '.join(dead)}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"timed out after {self.plan.startup_timeout_s:.0f}s waiting for {waiting_for}"
            )

    def serve(self) -> int:
        """Block until `stop` is set (0) or the router dies (1). With several fronts a front that dies
        is started again instead (its clients lost their streams; the others serve on)."""
        assert self.fronts is not None
        while not self.stop.wait(0.5):
            for front in self.fronts.dead():
                log.error("router front %d exited with status %s", front.index, front.proc.returncode)
                if not self.fronts.several:
                    return 1
                try:
                    self._restart_front(front, time.monotonic() + self.plan.startup_timeout_s)
                except RuntimeError as e:  # it could not start again: try once more on the next turn
                    log.error("could not restart router front %d: %s", front.index, e)
        return 0

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop the workers and the router together (neither needs the other to exit cleanly)."""
        if self.fronts is not None:
            self.fronts.signal_all(signal.SIGTERM)  # the fronts' own shutdown overlaps the workers'
        try:
            self.backend.shutdown()
        finally:
            if self.fronts is not None:
                self.fronts.stop(grace_s)
            if self.mps is not None:  # after the workers: its clients are gone
                self.mps.stop()
            self._tmp.cleanup()


def _catch_stop_signals(stop: threading.Event) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """`prog`: the command the usage line names (`pdserve serve` when run through the console script)."""
    plan = parse_args(argv, prog)
    logging.basicConfig(level=plan.log_level.upper(), format="%(asctime)s %(levelname)s launch: %(message)s")
    stop = threading.Event()
    _catch_stop_signals(stop)
    cluster = Cluster(plan, make_backend(plan), stop)
    try:
        url = cluster.start()
        _catch_stop_signals(stop)  # again: ray.init installs its own SIGTERM handler
        print(f"pdserve ready: {url}/v1", flush=True)
        return cluster.serve()
    except Interrupted:
        log.info("interrupted during start-up")
        return 0
    except RuntimeError as e:
        log.error("%s", e)
        return 1
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
