"""Worker configuration (a validated frozen dataclass, no I/O) and the shared worker command line.

python -m {prefill,decode}_worker --router-addr tcp://H:P [--role ROLE] [--model PATH] [--host H|auto]
    [--worker-id ID] [--kv-transport auto|tcp|ipc|nccl] [--kv-lease-s S] [engine flags]

`--role` picks among the roles a worker module serves: prefill_worker serves "prefill",
decode_worker serves "decode" (the default) and "mixed" (see decode_worker/role.py).
"""

from __future__ import annotations

import argparse
import math
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from common.config import EngineConfig
from common.engine_args import add_engine_args, engine_config_from_args
from common.net.addresses import WILDCARD_HOSTS, split_addresses
from common.net.curve import CurveKeys
from common.net.flags import Flag, FlagTable, add_log_level
from common.net.transports import KV_TRANSPORT_CHOICES

# Where the worker's sockets live (common/worker/io_process.py): an I/O thread of the engine process,
# a channel process of their own, or "auto": the process where the worker may use at least
# PROCESS_IO_MIN_CORES cores. Measured on the H200 host (16 cores, docs/benchmarks.md): the process
# served 1.22x the thread's tokens/s; on a 2-core box the extra process competes with the engine.
WORKER_IO_CHOICES = ("auto", "thread", "process")
PROCESS_IO_MIN_CORES = 4


def resolve_worker_io(choice: str, cores: int) -> str:
    """ "thread" or "process" for a `worker_io` choice on a host with `cores` usable cores."""
    if choice not in WORKER_IO_CHOICES:
        raise ValueError(f"worker_io must be one of {WORKER_IO_CHOICES}, got {choice!r}")
    if choice != "auto":
        return choice
    return "process" if cores >= PROCESS_IO_MIN_CORES else "thread"


@dataclass(frozen=True)
class WorkerConfig:
    """Everything one worker process needs besides its role's code.

    `host` is the interface the worker binds and advertises (its ports are always ephemeral); "auto"
    means the local address this machine uses to reach the router. `kv_lease_s` bounds how long a
    prefill worker keeps handed-off blocks pinned without an acknowledgement; `kv_fetch_timeout_s`
    bounds one transfer on the decode side (after it, the decode worker recomputes the prompt).
    `curve`: the cluster's CURVE keys (common/net/curve.py), taken from the environment, never the command
    line; None: plain sockets.
    """

    worker_id: str
    router_addr: str
    engine: EngineConfig
    host: str = "auto"
    kv_transport: str = "auto"
    kv_lease_s: float = 60.0
    kv_fetch_timeout_s: float = 30.0
    heartbeat_interval_s: float = 0.5
    register_interval_s: float = 2.0
    log_stats_interval_s: float = 10.0  # the periodic stats line (common/worker/stats_log.py); 0: off
    worker_io: str = "auto"  # WORKER_IO_CHOICES
    model_name: str | None = None
    node_id: str | None = None  # the cluster node the worker runs on (reported at registration)
    curve: CurveKeys | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.worker_id, str) or not self.worker_id:
            raise ValueError("worker_id must be a non-empty string")
        addrs = split_addresses(self.router_addr) if isinstance(self.router_addr, str) else []
        if not addrs or not all(a.startswith("tcp://") for a in addrs):
            raise ValueError(
                f"router_addr must look like tcp://host:port[,tcp://host:port...], got {self.router_addr!r}"
            )
        if self.host in WILDCARD_HOSTS:
            raise ValueError(f"host must be an address peers can dial (or 'auto'), got {self.host!r}")
        if self.curve is not None and not isinstance(self.curve, CurveKeys):
            raise ValueError("curve must be CurveKeys or None")
        if self.worker_io not in WORKER_IO_CHOICES:
            raise ValueError(f"worker_io must be one of {WORKER_IO_CHOICES}, got {self.worker_io!r}")
        if self.kv_transport not in KV_TRANSPORT_CHOICES:
            raise ValueError(f"kv_transport must be one of {KV_TRANSPORT_CHOICES}, got {self.kv_transport!r}")
        for name in ("kv_lease_s", "kv_fetch_timeout_s", "heartbeat_interval_s", "register_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        every = self.log_stats_interval_s
        if isinstance(every, bool) or not isinstance(every, int | float) or not 0 <= every < math.inf:
            raise ValueError(f"log_stats_interval_s must be a finite number of seconds >= 0, got {every!r}")

    @property
    def role(self) -> str:
        return self.engine.role

    @property
    def served_model_name(self) -> str:
        return self.model_name or os.path.basename(os.path.normpath(self.engine.model))


# WorkerConfig's fields as flags (common/net/flags.py); the launcher derives its worker flags from here
# (deploy/passthrough.py). Not flags: `engine` (the engine flags), `register_interval_s`, `curve`.
WORKER_FLAGS = FlagTable(
    "worker",
    (
        Flag(
            "router_addr",
            str,
            "the router's inbox, tcp://host:port (several fronts: their inboxes, comma-separated)",
            required=True,
        ),
        Flag("host", str, "address to bind and advertise ('auto': the route to the router)"),
        Flag("worker_id", str, "unique id (default: ROLE-HOSTNAME-PID)"),
        Flag("kv_transport", str, "how KV blocks move", KV_TRANSPORT_CHOICES),
        Flag("kv_lease_s", float, "prefill: pin handed-off blocks this long"),
        Flag("kv_fetch_timeout_s", float, "decode: give up a transfer after"),
        Flag("heartbeat_interval_s", float, "seconds between heartbeats", option="--heartbeat-interval"),
        Flag(
            "log_stats_interval_s",
            float,
            "seconds between the worker's stats lines (0: none)",
            option="--log-stats-interval",
        ),
        Flag(
            "worker_io",
            str,
            "where the worker's sockets run: an I/O thread beside the engine, a process of their own, or "
            f"auto (a process where the worker may use >= {PROCESS_IO_MIN_CORES} cores)",
            WORKER_IO_CHOICES,
        ),
        Flag("model_name", str, "model name reported at registration", option="--served-model-name"),
        Flag("node_id", str, "the cluster node it runs on, shown in /health (Ray: the node id)"),
    ),
)


def build_worker_parser(roles: Sequence[str]) -> argparse.ArgumentParser:
    """The command line of a worker module serving `roles` (the first is the default)."""
    module = f"{roles[0]}_worker"
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=f"pdserve {'/'.join(roles)} worker")
    p.add_argument("--role", choices=roles, default=roles[0], help="the role this worker serves")
    p.add_argument("--model", default=None, help="HF model directory (default: the default model)")
    WORKER_FLAGS.add_to(p)
    add_log_level(p)
    add_engine_args(p)
    return p


def parse_worker_args(argv: Sequence[str] | None, roles: Sequence[str]) -> tuple[WorkerConfig, str]:
    """(WorkerConfig, log level) for a worker module serving `roles`; exits with status 2 on a bad value."""
    from common.tools.default_model import resolve_model

    parser = build_worker_parser(roles)
    args = parser.parse_args(argv)
    role = args.role
    values = WORKER_FLAGS.config_values(args)
    if not values.get("worker_id"):
        values["worker_id"] = f"{role}-{socket.gethostname()}-{os.getpid()}"
    try:
        args.model = resolve_model(args.model)
        config = WorkerConfig(
            engine=engine_config_from_args(args, role),
            curve=CurveKeys.from_env(pop=True),  # out of the environment: children do not inherit it
            **values,
        )
    except ValueError as e:
        parser.error(str(e))
    return config, args.log_level
