"""A worker's ZMQ sockets, all owned by one I/O thread (ZMQ sockets must not be shared between threads).

Engine thread -> I/O thread: `to_front` / `to_peer` / `publish` queue (destination, message) and wake
the thread through a pipe; messages are encoded there. `to_front(reply_to, msg)` sends a request's
messages to the router front that admitted it (common/worker/fronts.py; None: the first front).
I/O thread -> engine thread: commands decoded from the PULL socket land on `inbox`; malformed frames
are logged and dropped here, so the engine loop only ever sees valid messages (a malformed request
that still names its request id is failed back to the router, not retryable: another worker would get
the same bytes). The I/O thread also sends the registration (at once, then every
`register_interval_s`: that is how a restarted router re-learns running workers) and a heartbeat every
`heartbeat_interval_s` built from the latest `load` the engine thread posted, to every front in
`router_addr` (comma-separated inboxes). A broken or restored link to a front lands on `inbox` as a
`FrontStatus`. With the cluster's CURVE keys (common/net/curve.py) the command and events sockets admit
only holders of the keys, and the router and peer sockets authenticate with them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import zmq

from common.net.addresses import split_addresses
from common.net.curve import CurveKeys
from common.net.sockets import SocketOptions, last_endpoint, open_sockets
from common.net.waker import Waker
from common.wire.messages import (
    Message,
    MessageError,
    RequestFailed,
    WorkerHeartbeat,
    WorkerRegister,
    decode,
    encode,
)
from common.worker.fronts import FrontLinks, FrontStatus
from common.worker.role import LoadReport

log = logging.getLogger(__name__)

# Outbox destinations: the first front, the events socket, a front by inbox (FRONT + address); any other
# destination is a peer's command address.
ROUTER, EVENTS, FRONT = "\0router", "\0events", "\0front:"
# Bigger command frames are dropped by ZMQ before they reach memory.
COMMAND_OPTIONS = SocketOptions(max_message_bytes=256 << 20)
# Queued messages while the router (or a peer) is unreachable, then sends are dropped.
OUTBOUND_OPTIONS = SocketOptions(send_hwm=100_000)


@dataclass(frozen=True)
class BoundAddresses:
    command_addr: str
    events_addr: str | None


class WorkerChannels:
    def __init__(
        self,
        worker_id: str,
        router_addr: str,
        host: str,
        with_events: bool,
        heartbeat_interval_s: float = 0.5,
        register_interval_s: float = 2.0,
        curve: CurveKeys | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.curve = curve  # None: plain sockets (see common/net/curve.py)
        self.router_addr = router_addr
        self.host = host
        self.with_events = with_events
        self.heartbeat_interval_s = heartbeat_interval_s
        self.register_interval_s = register_interval_s
        self.inbox: queue.Queue[Message | FrontStatus] = queue.Queue()
        self.load = LoadReport()  # replaced (never mutated) by the engine thread
        self._outbox: queue.SimpleQueue[tuple[str, Message]] = queue.SimpleQueue()
        self._holder: int | None = None  # the thread whose sends wait for `release_wakes` (see there)
        self._held = False  # the holder queued something since `hold_wakes`
        self._registration: WorkerRegister | None = None
        self._peers: dict[str, zmq.Socket] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- any thread ----------------------------------------------------------------------------

    def start(self) -> BoundAddresses:
        """Bind the command (and events) socket, connect to the router, start the I/O thread."""
        if self._thread is not None:
            raise RuntimeError("WorkerChannels can be started once")
        self._sockets = open_sockets(self.curve, self.worker_id)
        self._waker = Waker()
        self._commands = self._sockets.bind(zmq.PULL, self.host, options=COMMAND_OPTIONS)
        self._fronts = FrontLinks(self._sockets, split_addresses(self.router_addr), OUTBOUND_OPTIONS)
        self._fronts.connect_registered()
        self._events = self._sockets.bind(zmq.PUB, self.host) if self.with_events else None
        bound = BoundAddresses(last_endpoint(self._commands), self._events and last_endpoint(self._events))
        # Sockets made here move to the I/O thread; Thread.start() is the memory barrier ZMQ asks for.
        self._thread = threading.Thread(target=self._run, name=f"{self.worker_id}-io", daemon=True)
        self._thread.start()
        return bound

    def register(self, registration: WorkerRegister) -> None:
        """Send `registration` now and re-send it periodically from then on."""
        self._registration = registration
        self._waker.wake()

    def to_front(self, reply_to: str | None, msg: Message) -> None:
        """Send a request's message to the front that admitted it (`reply_to`; None: the first front)."""
        self._put(ROUTER if reply_to is None else FRONT + reply_to, msg)

    def to_peer(self, command_addr: str, msg: Message) -> None:
        self._put(command_addr, msg)

    def publish(self, msg: Message) -> None:
        self._put(EVENTS, msg)

    def send_to(self, destination: str, msg: Message) -> None:
        """Queue `msg` for an outbox destination as the three above name it (the channel process of
        `--worker-io process` replays the worker's sends through this)."""
        self._put(destination, msg)

    def hold_wakes(self) -> None:
        """From now until `release_wakes()`, sends queued by this thread wake the I/O thread once, at the
        release. Each wake hands the GIL to the I/O thread for a pass of its loop, which the engine
        thread then waits out: one pass per engine loop turn instead of one per message. Sends from
        other threads still wake it at once."""
        self._holder = threading.get_ident()

    def release_wakes(self) -> None:
        """Wake the I/O thread for what this thread queued while holding (nothing queued: no wake)."""
        self._holder = None
        if self._held:
            self._held = False
            self._waker.wake()

    def close(self) -> None:
        """Stop the thread, drop unsent messages and close every socket at once (linger 0)."""
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._waker.wake()
        self._thread.join(timeout=5.0)
        self._sockets.close()
        self._waker.close()

    def _put(self, destination: str, msg: Message) -> None:
        self._outbox.put((destination, msg))
        if self._holder is not None and self._holder == threading.get_ident():
            self._held = True
        else:
            self._waker.wake()

    # ---- I/O thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._commands, zmq.POLLIN)
        poller.register(self._waker.fd, zmq.POLLIN)
        monitors: list[zmq.Socket] = []
        timers = _Timers(self.heartbeat_interval_s, self.register_interval_s)
        while not self._stop.is_set():
            try:
                self._watch_new_fronts(poller, monitors)
                ready = dict(poller.poll(timers.wait_ms() if self._registration else 1000))
                for monitor in monitors:
                    if monitor in ready:
                        for status in self._fronts.read_monitor(monitor):
                            self.inbox.put(status)
                            self._introduce(status)
                if self._commands in ready:
                    self._receive_commands()
                if self._waker.fd in ready:
                    self._waker.drain()
                self._flush_outbox()
                self._send_periodic(timers)
            except Exception:  # the I/O thread must outlive any one bad message or send
                log.exception("worker I/O loop error")
                time.sleep(0.05)

    def _introduce(self, status: FrontStatus) -> None:
        """A front whose link came back (a restarted front) gets this worker's registration and load at
        once: waiting for the periodic ones would leave it answering 503 (no workers) for up to
        `register_interval_s` while its peers serve."""
        if not status.up or self._registration is None:
            return
        sock = self._fronts.socket(status.addr)
        self._send_on(sock, ROUTER, self._registration)
        self._send_on(sock, ROUTER, self._heartbeat())

    def _watch_new_fronts(self, poller: zmq.Poller, monitors: list[zmq.Socket]) -> None:
        for monitor in self._fronts.poller_additions:
            poller.register(monitor, zmq.POLLIN)
            monitors.append(monitor)
        self._fronts.poller_additions.clear()

    def _receive_commands(self) -> None:
        while True:
            try:
                data = self._commands.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self.inbox.put(decode(data))
            except MessageError as e:
                log.warning("dropping malformed command (%d bytes): %s", len(data), e)
                if e.request_id is not None:
                    failed = RequestFailed(e.request_id, self.worker_id, f"malformed request: {e}", False)
                    self._send(ROUTER, failed)

    def _flush_outbox(self) -> None:
        while True:
            try:
                destination, msg = self._outbox.get_nowait()
            except queue.Empty:
                return
            self._send(destination, msg)

    def _send_periodic(self, timers: _Timers) -> None:
        reg = self._registration
        if reg is None:
            return  # heartbeats only make sense once the router knows this worker
        now = time.monotonic()
        if timers.register_due(now):
            for sock in self._fronts.registered_sockets():
                self._send_on(sock, ROUTER, reg)
        if timers.heartbeat_due(now):
            beat = self._heartbeat()
            for sock in self._fronts.registered_sockets():
                self._send_on(sock, ROUTER, beat)

    def _heartbeat(self) -> WorkerHeartbeat:
        load = self.load
        return WorkerHeartbeat(
            self.worker_id,
            load.num_free_blocks,
            load.num_total_blocks,
            load.num_waiting,
            load.num_running,
            load.queued_prefill_tokens,
            time.time(),
        )

    def _send(self, destination: str, msg: Message) -> None:
        sock = self._socket_for(destination)
        if sock is None:
            log.warning("no events socket: dropping %s", msg.TYPE)
            return
        self._send_on(sock, destination, msg)

    def _send_on(self, sock: zmq.Socket, destination: str, msg: Message) -> None:
        try:
            sock.send(encode(msg), zmq.NOBLOCK)
        except zmq.Again:  # the peer is gone or not reading: dropping beats blocking the worker
            log.warning("send queue to %s is full: dropping %s", destination.lstrip("\0"), msg.TYPE)
        except (zmq.ZMQError, MessageError) as e:
            log.warning("cannot send %s to %s: %s", msg.TYPE, destination.lstrip("\0"), e)

    def _socket_for(self, destination: str) -> zmq.Socket | None:
        if destination == ROUTER:
            return self._fronts.primary
        if destination.startswith(FRONT):
            return self._fronts.socket(destination[len(FRONT) :])
        if destination == EVENTS:
            return self._events
        sock = self._peers.get(destination)
        if sock is None:
            sock = self._peers[destination] = self._sockets.dial(zmq.PUSH, destination, OUTBOUND_OPTIONS)
        return sock


class _Timers:
    """When the next registration refresh and heartbeat are due (the first of each: at once)."""

    def __init__(self, heartbeat_s: float, register_s: float) -> None:
        self.heartbeat_s, self.register_s = heartbeat_s, register_s
        self.next_heartbeat = self.next_register = 0.0

    def register_due(self, now: float) -> bool:
        if now < self.next_register:
            return False
        self.next_register = now + self.register_s
        return True

    def heartbeat_due(self, now: float) -> bool:
        if now < self.next_heartbeat:
            return False
        self.next_heartbeat = now + self.heartbeat_s
        return True

    def wait_ms(self) -> int:
        wait = min(self.next_heartbeat, self.next_register) - time.monotonic()
        return max(1, min(int(wait * 1000) + 1, 1000))
