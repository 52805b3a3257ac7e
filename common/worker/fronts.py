"""A worker's links to the router fronts: one PUSH socket per front inbox, each watched by a ZMQ
monitor, owned by the worker's I/O thread (common/worker/channels.py).

A worker registers and heartbeats with every front it was started with (`--router-addr A,B,...`) and
sends a request's tokens, failures and finish to the front named in the request's `reply_to` (a front
it was not started with is dialled on first use). When an established link breaks (the front process
died: its socket closed) the worker hears of it at once through the monitor and is told
`FrontStatus(addr, up=False)` (once per break); it then drops that front's requests and frees their
KV, since nobody is left to read their tokens. A link that connects again (the front was restarted on
its inbox port) is `FrontStatus(addr, up=True)`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from common.net.sockets import SocketOptions, Sockets

log = logging.getLogger(__name__)
WATCHED_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED


@dataclass(frozen=True)
class FrontStatus:
    """I/O thread -> engine thread (never on the wire): the link to the front at `addr` broke (up=False)
    or came back (up=True)."""

    addr: str
    up: bool


class FrontLinks:
    """PUSH sockets to the fronts, by inbox address; `registered` are the fronts to register with."""

    def __init__(self, sockets: Sockets[zmq.Socket], registered: list[str], options: SocketOptions) -> None:
        if not registered:
            raise ValueError("registered must name at least one router front")
        self._sockets, self._options = sockets, options
        self.registered = list(registered)
        self._links: dict[str, zmq.Socket] = {}
        self._monitors: dict[zmq.Socket, str] = {}  # monitor socket -> front address
        self.poller_additions: list[zmq.Socket] = []  # monitors made since the I/O thread last looked
        self._down: set[str] = set()  # fronts whose link broke and has not connected again

    def connect_registered(self) -> None:
        for addr in self.registered:
            self.socket(addr)

    @property
    def primary(self) -> zmq.Socket:
        """Where messages that belong to no front go (malformed commands' failures)."""
        return self.socket(self.registered[0])

    def socket(self, addr: str) -> zmq.Socket:
        sock = self._links.get(addr)
        if sock is None:
            sock = self._links[addr] = self._sockets.dial(zmq.PUSH, addr, self._options)
            monitor = sock.get_monitor_socket(WATCHED_EVENTS)
            self._monitors[monitor] = addr
            self.poller_additions.append(monitor)
        return sock

    def registered_sockets(self) -> list[zmq.Socket]:
        return [self.socket(addr) for addr in self.registered]

    def is_monitor(self, sock: object) -> bool:
        return sock in self._monitors

    def read_monitor(self, monitor: zmq.Socket) -> list[FrontStatus]:
        """The link changes the monitor has queued (non-blocking)."""
        out = []
        addr = self._monitors[monitor]
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return out
            if event["event"] == zmq.EVENT_DISCONNECTED and addr not in self._down:
                log.warning("lost the link to router front %s", addr)
                self._down.add(addr)
                out.append(FrontStatus(addr, up=False))
            elif event["event"] == zmq.EVENT_CONNECTED and addr in self._down:
                log.info("the link to router front %s is back", addr)
                self._down.discard(addr)
                out.append(FrontStatus(addr, up=True))
