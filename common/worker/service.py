"""One worker process: engine + role + channels, and the engine loop.

The loop (in the caller's thread) only touches queues and the engine:
    take commands (blocking briefly only when idle) -> role.poll() -> deadlines -> engine.step()
    -> role.on_step() -> role.after_iteration() -> post the load figures for heartbeats.
Nothing a peer sends can stop it: malformed frames are dropped by the I/O thread, a bad command is
logged, and an engine error fails the requests in flight rather than the process.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import NamedTuple

from common.core.step_records import SequencesFailed
from common.host import host_cores
from common.multiplex.step_classes import StepClassifier
from common.net.addresses import resolve_host, split_addresses
from common.wire import request_log
from common.wire.cache_messages import SnapshotRequest
from common.wire.hashing import probe_hash
from common.wire.messages import Abort, Message, Shutdown, WorkerRegister, WorkRequest
from common.wire.probe_messages import KVProbe, KVProbeRequest
from common.worker.aborts import AbortBook
from common.worker.channels import BoundAddresses, WorkerChannels
from common.worker.config import WorkerConfig, resolve_worker_io
from common.worker.engine_factory import build_engine
from common.worker.fronts import FrontStatus
from common.worker.io_process import ChannelSpec, ProcessChannels
from common.worker.role import WorkerContext, WorkerRole
from common.worker.stats_log import StatsLog

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05  # longest blocking wait for a command: bounds how late stop and deadlines are seen
DEADLINE_CHECK_S = 0.1
# The load figures only travel in heartbeats (every `heartbeat_interval_s`, 0.5 s by default): posting
# them every loop turn cost ~50 us per step (a pass over the running batch) for nothing.
LOAD_POST_S = 0.05


class TurnTimes(NamedTuple):
    """Seconds of one loop turn outside `engine.step`, for the stats line."""

    commands_s: float  # taking commands while the engine was busy (idle waits count 0)
    role_s: float  # the role turning the step's result into messages


class WorkerService:
    def __init__(self, config: WorkerConfig, role: WorkerRole) -> None:
        if role.name != config.role:
            raise ValueError(f"role {role.name!r} does not match engine.role {config.role!r}")
        self.config = config
        self.role = role
        self.aborts = AbortBook()
        self.lost_fronts: set[str] = set()  # fronts whose link is down: their requests are not taken
        self.engine = None
        self.channels: WorkerChannels | None = None
        self._stop = threading.Event()
        self._next_deadline_check = 0.0
        self._next_load_post = 0.0
        self.stats = StatsLog(config.log_stats_interval_s)
        self._classifier: StepClassifier | None = None  # `_step_classifier`

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Load the engine, bind the sockets, start the role's KV side, then register."""
        cfg = self.config
        self.engine = build_engine(cfg.engine)
        host = resolve_host(cfg.host, split_addresses(cfg.router_addr)[0])
        self.channels = self._channels(host)
        addresses = self.channels.start()
        kv_endpoint = self.role.start(WorkerContext(cfg, self.engine, self.channels, host))
        self._post_load()
        self.channels.register(self._registration(host, addresses, kv_endpoint))
        log.info("%s worker %s ready: commands on %s", cfg.role, cfg.worker_id, addresses.command_addr)

    def _channels(self, host: str) -> WorkerChannels | ProcessChannels:
        cfg = self.config
        args = (cfg.worker_id, cfg.router_addr, host, self.role.publishes_events)
        timers = (cfg.heartbeat_interval_s, cfg.register_interval_s)
        io = resolve_worker_io(cfg.worker_io, host_cores())
        log.info("worker I/O: %s (--worker-io %s)", io, cfg.worker_io)
        if io == "process":
            level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
            return ProcessChannels(ChannelSpec(*args, *timers, level, cfg.curve))
        return WorkerChannels(*args, *timers, cfg.curve)

    def stop(self) -> None:
        """Ask the loop to end (thread- and signal-handler-safe)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self.role.close()
        if self.channels is not None:
            self.channels.close()

    def run(self) -> None:
        """The engine loop, until `stop()` or a Shutdown message; closes everything on the way out."""
        try:
            while not self._stop.is_set():
                self.run_once()
        finally:
            self.close()

    # ---- the loop ------------------------------------------------------------------------------

    def run_once(self) -> None:
        # The turn's messages go to the I/O thread in one wake at its end (see `hold_wakes`).
        self.channels.hold_wakes()
        try:
            turn = self._turn()
        finally:
            began = time.perf_counter()
            self.channels.release_wakes()
        self.stats.record_loop(turn.commands_s, turn.role_s, time.perf_counter() - began)

    def _turn(self) -> TurnTimes:
        """One loop turn; returns where its time went besides the engine step."""
        wait_s = self._wait_s()
        began = time.perf_counter()
        self._take_commands(wait_s)
        commands_s = time.perf_counter() - began if wait_s == 0 else 0.0
        self.role.poll()
        now = time.time()
        if now >= self._next_deadline_check:
            self._next_deadline_check = now + DEADLINE_CHECK_S
            self.role.expire(now)
            self.aborts.expire(now)
        role_s = self._step() if self.engine.has_unfinished else 0.0
        self.role.after_iteration()
        if now >= self._next_load_post:
            self._next_load_post = now + LOAD_POST_S
            self._post_load()
        self.stats.maybe_log(self.engine.load_report)
        return TurnTimes(commands_s, role_s)

    def _wait_s(self) -> float:
        if self.engine.has_unfinished:
            return 0.0
        interval = self.role.poll_interval()
        return IDLE_WAIT_S if interval is None else min(interval, IDLE_WAIT_S)

    def _take_commands(self, wait_s: float) -> None:
        inbox = self.channels.inbox
        try:
            msg = inbox.get(timeout=wait_s) if wait_s > 0 else inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle_safely(msg)
            try:
                msg = inbox.get_nowait()
            except queue.Empty:
                return

    def _handle_safely(self, msg: Message) -> None:
        try:
            self.handle(msg)
        except Exception:  # one bad command must not take the worker down
            log.exception("error handling %s", msg.TYPE)

    def handle(self, msg: Message | FrontStatus) -> None:
        if isinstance(msg, FrontStatus):
            self._on_front(msg)
        elif isinstance(msg, Abort):
            self.aborts.remember(msg.request_id, time.time())
            self.role.abort(msg.request_id)
        elif isinstance(msg, WorkRequest):
            with request_log.bound(msg.log_name):  # what the role logs while taking it names the request
                self._take(msg)
        elif isinstance(msg, SnapshotRequest):
            self.role.snapshot(msg)
        elif isinstance(msg, KVProbeRequest | KVProbe):
            self.role.probe(msg)
        elif isinstance(msg, Shutdown):
            log.info("shutdown requested: %s", msg.reason or "no reason given")
            self.stop()
        else:
            log.warning("ignoring unexpected %s on the command socket", msg.TYPE)

    def _on_front(self, status: FrontStatus) -> None:
        if status.up:
            self.lost_fronts.discard(status.addr)
            return
        self.lost_fronts.add(status.addr)
        dropped = self.role.drop_front(status.addr)
        log.warning("router front %s is gone: dropped its %d request(s)", status.addr, len(dropped))

    def _take(self, msg: WorkRequest) -> None:
        if not isinstance(msg, self.role.request_types):
            log.warning("ignoring unexpected %s on the command socket", msg.TYPE)
        elif msg.reply_to is not None and msg.reply_to in self.lost_fronts:
            log.info("dropping %s: the front that admitted it is gone", msg.request_id)
        elif self.aborts.was_aborted(msg.request_id, time.time()):
            log.info("dropping %s: already aborted", msg.request_id)
        else:
            log.debug("taking %s %s", msg.TYPE, msg.request_id)
            self.role.submit(msg)

    def _step_classifier(self) -> StepClassifier | None:
        """The classifier of the engine's steps while the stats line, their only reader, is on; made at
        the first step (the engine's mode)."""
        if self.stats.interval_s <= 0:
            return None
        if self._classifier is None:
            self._classifier = StepClassifier(self.engine.multiplexer)
        return self._classifier

    def _step(self) -> float:
        """One engine step and the role's messages for it; returns the seconds the role took."""
        began = time.perf_counter()
        failed: SequencesFailed | None = None
        classifier = self._step_classifier()
        if classifier is not None:
            classifier.before()
        try:
            result = self.engine.step()
        except SequencesFailed as e:  # some requests alone: the step's other work still counts
            log.error("engine step failed for %d request(s), failing them alone: %s", len(e.request_ids), e)
            result, failed = e.result, e
        except Exception as e:
            log.exception("engine step failed; failing the requests in flight")
            try:
                self.role.fail_all(f"engine error: {type(e).__name__}: {e}")
            except Exception:  # the engine's state may be what broke; keep serving new requests
                log.exception("could not clean up after the failed step")
            return 0.0
        stepped = time.perf_counter()
        step_class = None if classifier is None else classifier.after(result.num_prefill_tokens)
        self.stats.record(
            self.engine.timings, result.num_prefill_tokens, len(result.updates), stepped - began, step_class
        )
        for rejected in result.rejected:  # refused after admission (a grammar built aside)
            self.role.reject(rejected.seq.request_id, rejected.error)
        self.role.on_step(result)
        if failed is not None:
            for request_id in failed.request_ids:
                self.role.fail_request(request_id, f"engine error: {failed}")
        return time.perf_counter() - stepped

    def _post_load(self) -> None:
        self.channels.load = self.role.load()

    def _registration(self, host: str, addresses: BoundAddresses, kv_endpoint: dict) -> WorkerRegister:
        cfg, engine = self.config, self.engine
        block_size = engine.block_size
        return WorkerRegister(
            worker_id=cfg.worker_id,
            role=cfg.role,
            host=host,
            pid=os.getpid(),
            command_addr=addresses.command_addr,
            events_addr=addresses.events_addr,
            kv_endpoint=kv_endpoint,
            block_size=block_size,
            probe_hash=probe_hash(block_size),
            num_kv_blocks=engine.load_report().num_total_blocks,
            max_model_len=engine.max_model_len,
            max_num_batched_tokens=cfg.engine.max_num_batched_tokens,
            model_name=cfg.served_model_name,
            node_id=cfg.node_id,
        )
