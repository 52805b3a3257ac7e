"""`python -m deploy.launch`: start a router and N prefill + M decode + K mixed workers, serve until Ctrl-C.

    python -m deploy.launch [--model PATH] --prefill N --decode M [--mixed K] [--host H] [--port P]
        [--backend ray|local] [--kv-transport auto|ipc|nccl|tcp] [--routing prefix|round_robin]
        [--gpus-per-worker F] [--log-dir DIR] [--api-key KEY] [--protect-status] [engine flags]

Order: resolve the model (the default model when --model is absent) -> router subprocess (waits for
its ready file, which names the inbox) -> workers through the backend -> wait until /health is 200
and lists every worker live -> print "pdserve ready: URL/v1" once -> serve until SIGINT/SIGTERM (or
the router dies) -> stop the workers and the router (no process is left behind, see local_backend).
What is started, with which flags and GPU shares (mixed workers, validation), is planned in plan.py.
The launcher makes the cluster's CURVE keys (common/net/curve.py) and gives them to the router and every
worker through the environment (never argv, never a log), so only its own processes can join.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import signal
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from common.engine_args import add_engine_args, engine_overrides
from common.net.curve import CurveKeys
from common.net.flags import add_log_level
from deploy.base import WorkerBackend, WorkerHandle
from deploy.local_backend import signal_group, spawn, stop_processes
from deploy.passthrough import (
    ROUTER_PASSTHROUGH,
    WORKER_PASSTHROUGH,
    add_launcher_read_args,
    add_passthrough_args,
    launcher_read_values,
    passthrough_argv,
)
from deploy.placement import parse_ray_resources
from deploy.plan import BACKENDS, LaunchPlan, worker_specs
from deploy.ray_logs import use_readable_ray_logs
from router.access_log import LAUNCHER_AGENT
from router.config import API_KEY_ENV
from router.flags import ROUTER_FLAGS

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
    """The router process plus the backend's workers. `start()` returns the base URL once healthy;
    setting `stop` (e.g. from a signal handler) interrupts the start-up and ends `serve`."""

    def __init__(self, plan: LaunchPlan, backend: WorkerBackend, stop: threading.Event | None = None) -> None:
        self.plan = plan
        self.backend = backend
        self.stop = stop or threading.Event()
        self.router = None
        self.workers: list[WorkerHandle] = []
        self.url: str | None = None
        self.inbox: str | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="pdserve-launch-")
        self._secret_env: dict[str, str] = {}  # the cluster's CURVE keys, made by start()

    def start(self) -> str:
        deadline = time.monotonic() + self.plan.startup_timeout_s
        # The cluster's CURVE keys (common/net/curve.py): made here, handed over through environments only.
        self._secret_env = CurveKeys.generate().to_env()
        ready = self._start_router(deadline, self._secret_env)
        self.url, self.inbox = ready["http"], ready["inbox"]
        for spec in worker_specs(self.plan, ready["inbox"], count_gpus(self.plan, self.backend)):
            self.workers.append(self.backend.start(replace(spec, secret_env=self._secret_env)))
        self._wait_healthy(deadline)
        return self.url

    def _start_router(self, deadline: float, secret_env: dict[str, str]) -> dict:
        p = self.plan
        ready_file = Path(self._tmp.name) / "router-ready.json"
        launcher_set = {
            "model": p.model,
            "host": p.host,
            "port": p.port,
            "inbox_host": p.inbox_host,
            "ready_file": str(ready_file),
            "protect_status": p.protect_status,
            "block_size": p.engine.get("kvcache_block_size"),
        }
        argv = [sys.executable, "-m", "router", *ROUTER_FLAGS.argv(launcher_set), "--log-level", p.log_level]
        argv += list(p.router_argv)
        log_path = str(Path(p.log_dir) / "router.log") if p.log_dir else None
        if p.log_dir:
            Path(p.log_dir).mkdir(parents=True, exist_ok=True)
        # The key goes through the environment, not argv, which any user of the host can read (ps);
        # "" (no key) also overrides a PDSERVE_API_KEY the launcher itself inherited.
        self.router = spawn(argv, env={API_KEY_ENV: p.api_key or "", **secret_env}, log_path=log_path)
        while not ready_file.exists():
            # Workers are not checked: a restart may find one down, which is the router's to handle.
            self._check_alive(deadline, "router ready file", check_workers=False)
            time.sleep(0.05)
        return json.loads(ready_file.read_text())

    def restart_router(self, timeout_s: float = 120.0) -> None:
        """Kill the router (SIGKILL, as a crash would) and start a new one on the same HTTP port and
        inbox port; returns once it serves. The running workers' sockets reconnect on their own and
        they re-register within seconds (`healthy()` says when all have)."""
        if self.router is None or self.url is None or self.inbox is None:
            raise RuntimeError("restart_router needs a started cluster")
        signal_group(self.router, signal.SIGKILL)
        self.router.wait()
        stop_processes([self.router], grace_s=0.0)  # closes its log file; nothing left to signal
        argv = list(self.plan.router_argv)
        if "--inbox-port" not in argv:
            argv += ["--inbox-port", self.inbox.rsplit(":", 1)[1]]
        port = urllib.parse.urlsplit(self.url).port
        self.plan = dataclasses.replace(self.plan, port=port or self.plan.port, router_argv=tuple(argv))
        (Path(self._tmp.name) / "router-ready.json").unlink(missing_ok=True)
        self._start_router(time.monotonic() + timeout_s, self._secret_env)  # the workers' keys

    def _wait_healthy(self, deadline: float) -> None:
        while not self.healthy():
            self._check_alive(deadline, "/health == 200 with every worker live")
            time.sleep(0.25)

    def healthy(self) -> bool:
        """/health is 200 and lists every worker started as live (200 alone means one of each role)."""
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
        return {w.spec.worker_id for w in self.workers} <= live

    def _check_alive(self, deadline: float, waiting_for: str, check_workers: bool = True) -> None:
        if self.stop.is_set():
            raise Interrupted(waiting_for)
        if self.router is not None and self.router.poll() is not None:
            raise RuntimeError(f"the router exited with status {self.router.returncode}")
        dead = [w.spec.worker_id for w in self.workers if check_workers and not w.alive()]
        if dead:
            raise RuntimeError(f"worker(s) exited during start-up: {', '.join(dead)}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"timed out after {self.plan.startup_timeout_s:.0f}s waiting for {waiting_for}"
            )

    def serve(self) -> int:
        """Block until `stop` is set (0) or the router dies (1)."""
        while not self.stop.wait(0.5):
            if self.router.poll() is not None:
                log.error("the router exited with status %s", self.router.returncode)
                return 1
        return 0

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop the workers and the router together (neither needs the other to exit cleanly)."""
        if self.router is not None:
            signal_group(self.router, signal.SIGTERM)  # the router's own shutdown overlaps the workers'
        try:
            self.backend.shutdown()
        finally:
            if self.router is not None:
                stop_processes([self.router], grace_s)
            self._tmp.cleanup()


PROG = "python -m deploy.launch"


def parse_args(argv: Sequence[str] | None = None, prog: str = PROG) -> LaunchPlan:
    p = argparse.ArgumentParser(prog=prog, description="start a pdserve cluster")
    p.add_argument("--model", default=None, help="HF model directory (default: the default model)")
    p.add_argument("--prefill", type=int, default=1, help="number of prefill workers")
    p.add_argument("--decode", type=int, default=1, help="number of decode workers")
    p.add_argument("--mixed", type=int, default=0, help="number of mixed (prefill + decode) workers")
    p.add_argument("--advertise-host", default=None, help="address workers use to reach the router")
    p.add_argument("--backend", choices=BACKENDS, default="ray", help="Ray actors or local subprocesses")
    p.add_argument("--ray-address", default=None, help="Ray cluster to join (default: RAY_ADDRESS or local)")
    p.add_argument(
        "--ray-resources",
        action="append",
        default=[],
        metavar="[ROLE=]JSON",
        help="custom Ray resources each worker (of ROLE) reserves, e.g. 'decode={\"decode_node\": 1}'",
    )
    p.add_argument("--gpus-per-worker", type=float, default=None, help="GPU share per worker (default: even)")
    p.add_argument("--log-dir", default=None, help="write router and worker logs here (default: stdout)")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for /health")
    add_log_level(p)
    add_launcher_read_args(p)
    add_passthrough_args(p)
    add_engine_args(p)
    args = p.parse_args(argv)
    from common.tools.default_model import resolve_model
    from common.wire.generation_config import load_generation_defaults

    try:
        model = resolve_model(args.model)
        router_argv = passthrough_argv(args, ROUTER_PASSTHROUGH)
        generation_config = ROUTER_PASSTHROUGH.given(args).get("generation_config")
        if generation_config is not None:  # fail here, before anything starts, on a bad file
            load_generation_defaults(generation_config, model)
        return LaunchPlan(
            model=model,
            num_prefill=args.prefill,
            num_decode=args.decode,
            num_mixed=args.mixed,
            backend=args.backend,
            gpus_per_worker=args.gpus_per_worker,
            engine=engine_overrides(args),
            advertise_host=args.advertise_host,
            ray_address=args.ray_address,
            ray_resources=parse_ray_resources(args.ray_resources),
            log_dir=args.log_dir,
            log_level=args.log_level,
            startup_timeout_s=args.startup_timeout,
            router_argv=router_argv,
            worker_argv=passthrough_argv(args, WORKER_PASSTHROUGH),
            **launcher_read_values(args),
        )
    except ValueError as e:
        p.error(str(e))


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
