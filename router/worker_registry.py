"""Which workers exist, whether they are live, and how loaded they are. Pure state: no sockets.

Invariants:
- Every registered worker passed the parity check: its block size equals the cluster's (fixed by
  `--block-size` or by the first accepted worker) and its probe hash equals `probe_hash(block_size)`
  computed here, so router and worker hash blocks identically; a worker that names its KV cache dtype
  (`kv_endpoint["kv_dtype"]`) names the cluster's (the first accepted worker's), so every prefill
  worker's blocks fit every decode worker's cache (fp8 and bf16 caches cannot hand off). Rejected
  workers are remembered (for /health and /debug) but never routed to.
- A worker is LIVE while its last message (register or heartbeat) is younger than `heartbeat_timeout`
  on the router's monotonic clock (worker clocks are not trusted), DOWN otherwise.
- Load figures combine the last heartbeat with what the router dispatched since (see `LoadTracker`).
- Roles: prefill workers take PrefillRequests; decode and mixed workers are decode targets and, as
  the `--disagg` mode allows (router/disagg.py), prefill requests themselves. The cluster can serve
  when some path is open: a live prefill worker with a live decode target, or a live local worker.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import NamedTuple

from common.wire.hashing import probe_hash
from common.wire.messages import WorkerHeartbeat, WorkerRegister
from router.disagg import DECODE_TARGET_ROLES, DEFAULT_DISAGG, check_mode, local_roles, remote_allowed
from router.load_tracker import LoadTracker
from router.policy import DecodeLoad, PrefillLoad


class WorkerState(enum.Enum):
    LIVE = "live"
    DOWN = "down"


class RegistrationOutcome(enum.Enum):
    NEW = "new"
    REFRESHED = "refreshed"  # same worker re-sent the same registration: nothing changes
    REPLACED = "replaced"  # same id, different process or address: a restart
    REJECTED = "rejected"


class Registration(NamedTuple):
    outcome: RegistrationOutcome
    reason: str = ""


class HeartbeatOutcome(enum.Enum):
    OK = "ok"
    REVIVED = "revived"  # the worker was DOWN and is back: its cache view must be refreshed
    UNKNOWN = "unknown"  # never registered (e.g. the router restarted): ignored until it registers


class RoutingLoads(NamedTuple):
    """The live workers a route may use, each load built once: `locals_` are the decode targets the
    `--disagg` mode lets prefill a request themselves (the same objects as in `targets`)."""

    prefills: list[PrefillLoad]
    targets: list[DecodeLoad]
    locals_: list[DecodeLoad]


@dataclass
class WorkerInfo:
    reg: WorkerRegister
    last_seen: float
    state: WorkerState = WorkerState.LIVE
    heartbeat: WorkerHeartbeat | None = None
    registered_at: float = field(default=0.0)

    @property
    def worker_id(self) -> str:
        return self.reg.worker_id

    @property
    def role(self) -> str:
        return self.reg.role

    def kv_usage(self) -> float:
        hb = self.heartbeat
        if hb is None or hb.num_total_blocks == 0:
            return 0.0
        return 1.0 - hb.num_free_blocks / hb.num_total_blocks


class WorkerRegistry:
    def __init__(
        self, heartbeat_timeout: float, block_size: int | None = None, disagg: str = DEFAULT_DISAGG
    ) -> None:
        if heartbeat_timeout <= 0:
            raise ValueError(f"heartbeat_timeout must be positive, got {heartbeat_timeout}")
        self.heartbeat_timeout = heartbeat_timeout
        self.disagg = check_mode(disagg)
        self.block_size = block_size
        self.kv_dtype: str | None = None  # the KV cache dtype of the first accepted worker naming one
        self.loads = LoadTracker()
        self._workers: dict[str, WorkerInfo] = {}
        self._by_id: list[WorkerInfo] | None = None  # `_workers` sorted by id; None after a change
        self.rejected: dict[str, str] = {}  # worker id -> why

    def register(self, reg: WorkerRegister, now: float) -> Registration:
        reason = self._parity_problem(reg)
        if reason:
            self.rejected[reg.worker_id] = reason
            return Registration(RegistrationOutcome.REJECTED, reason)
        self.rejected.pop(reg.worker_id, None)
        if self.block_size is None:
            self.block_size = reg.block_size
        if self.kv_dtype is None:
            self.kv_dtype = reg.kv_endpoint.get("kv_dtype")
        old = self._workers.get(reg.worker_id)
        if old is not None and old.reg == reg:
            old.last_seen, old.state = now, WorkerState.LIVE
            return Registration(RegistrationOutcome.REFRESHED)
        self._workers[reg.worker_id] = WorkerInfo(reg, last_seen=now, registered_at=now)
        self._by_id = None
        return Registration(RegistrationOutcome.NEW if old is None else RegistrationOutcome.REPLACED)

    def _parity_problem(self, reg: WorkerRegister) -> str:
        if self.block_size is not None and reg.block_size != self.block_size:
            return f"block_size {reg.block_size} != cluster block_size {self.block_size}"
        try:
            expected = probe_hash(reg.block_size)
        except ValueError as e:
            return str(e)
        if reg.probe_hash != expected:
            return f"probe_hash {reg.probe_hash} != {expected}: the worker hashes blocks differently"
        kv_dtype = reg.kv_endpoint.get("kv_dtype")
        if kv_dtype is not None and self.kv_dtype is not None and kv_dtype != self.kv_dtype:
            return (
                f"KV cache dtype {kv_dtype} != the cluster's {self.kv_dtype}: every worker needs the same "
                "--dtype and --kv-cache-dtype"
            )
        return ""

    def heartbeat(self, hb: WorkerHeartbeat, now: float) -> HeartbeatOutcome:
        info = self._workers.get(hb.worker_id)
        if info is None:
            return HeartbeatOutcome.UNKNOWN
        revived = info.state is WorkerState.DOWN
        info.heartbeat, info.last_seen, info.state = hb, now, WorkerState.LIVE
        self.loads.heartbeat_received(hb.worker_id)
        return HeartbeatOutcome.REVIVED if revived else HeartbeatOutcome.OK

    def sweep(self, now: float) -> list[str]:
        """Mark silent workers DOWN; returns the ids that went down just now."""
        gone = []
        for info in self._workers.values():
            if info.state is WorkerState.LIVE and now - info.last_seen > self.heartbeat_timeout:
                info.state = WorkerState.DOWN
                gone.append(info.worker_id)
        return gone

    def remove(self, worker_id: str) -> WorkerInfo | None:
        self._by_id = None
        return self._workers.pop(worker_id, None)

    def get(self, worker_id: str) -> WorkerInfo | None:
        return self._workers.get(worker_id)

    def workers(self) -> list[WorkerInfo]:
        return list(self._sorted())

    def live(self, *roles: str) -> list[WorkerInfo]:
        return [w for w in self._sorted() if w.role in roles and w.state is WorkerState.LIVE]

    def _sorted(self) -> list[WorkerInfo]:
        # Sorted once per change of membership, not per request: every route plan walks it.
        if self._by_id is None:
            self._by_id = sorted(self._workers.values(), key=lambda w: w.worker_id)
        return self._by_id

    def can_serve(self) -> bool:
        """Some path is open (see the module docstring)."""
        return self.max_model_len() is not None

    def is_healthy(self) -> bool:
        """Requests can be served and no registered worker is down."""
        if any(w.state is not WorkerState.LIVE for w in self._workers.values()):
            return False
        return self.can_serve()

    def routing_loads(
        self, excluded: Collection[str] = (), cached_blocks: Callable[[str], int] | None = None
    ) -> RoutingLoads:
        """The live workers not in `excluded`, with their loads; `cached_blocks(worker_id)` fills in
        what the prefix index says each one caches (0 without it)."""
        local = local_roles(self.disagg)
        prefills: list[PrefillLoad] = []
        targets: list[DecodeLoad] = []
        locals_: list[DecodeLoad] = []
        for w in self._sorted():
            if w.state is not WorkerState.LIVE or w.worker_id in excluded:
                continue
            cached = 0 if cached_blocks is None else cached_blocks(w.worker_id)
            if w.role == "prefill":
                prefills.append(self._prefill_load(w, cached))
            elif w.role in DECODE_TARGET_ROLES:
                load = self._decode_load(w, cached)
                targets.append(load)
                if w.role in local:
                    locals_.append(load)
        return RoutingLoads(prefills, targets, locals_)

    def prefill_loads(self) -> list[PrefillLoad]:
        return [self._prefill_load(w, 0) for w in self.live("prefill")]

    def decode_loads(self, roles: tuple[str, ...] = DECODE_TARGET_ROLES) -> list[DecodeLoad]:
        """Live workers of `roles` (default: every decode target) with their decode and prefill load."""
        return [self._decode_load(w, 0) for w in self.live(*roles)]

    def _prefill_load(self, w: WorkerInfo, cached_blocks: int) -> PrefillLoad:
        reported = w.heartbeat.queued_prefill_tokens if w.heartbeat else 0
        # The heartbeat and the router's own tally count the same queued work from two sides;
        # the larger is the fresher view (the heartbeat lags dispatches, the tally lags progress).
        queued = max(reported, self.loads.outstanding_prefill_tokens(w.worker_id))
        return PrefillLoad(w.worker_id, queued, self.loads.in_flight(w.worker_id), cached_blocks)

    def _decode_load(self, w: WorkerInfo, cached_blocks: int) -> DecodeLoad:
        hb, tally = w.heartbeat, self.loads
        total = hb.num_total_blocks if hb else w.reg.num_kv_blocks
        free = (hb.num_free_blocks if hb else total) - tally.blocks_since_heartbeat(w.worker_id)
        reported = (hb.num_running + hb.num_waiting) if hb else 0
        in_flight = tally.in_flight(w.worker_id)
        queued = max(hb.queued_prefill_tokens if hb else 0, tally.outstanding_prefill_tokens(w.worker_id))
        return DecodeLoad(
            w.worker_id,
            free,
            total,
            max(reported, in_flight),
            w.reg.block_size,
            w.reg.max_model_len,
            queued_prefill_tokens=queued,
            in_flight=in_flight,
            cached_blocks=cached_blocks,
        )

    def max_model_len(self) -> int | None:
        """The longest sequence some open path can take (None: no path is open)."""
        lengths = [w.reg.max_model_len for w in self.live(*local_roles(self.disagg))]
        prefill = [w.reg.max_model_len for w in self.live("prefill")]
        decode = [w.reg.max_model_len for w in self.live(*DECODE_TARGET_ROLES)]
        if remote_allowed(self.disagg) and prefill and decode:
            lengths.append(min(max(prefill), max(decode)))
        return max(lengths) if lengths else None
