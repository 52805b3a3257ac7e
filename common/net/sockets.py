"""Every ZMQ socket of the cluster is made here: LINGER, IPV6, high-water marks, message-size limits and
CURVE are set in this one place, so the router, the workers and the KV transports cannot drift apart.

The rules, for every socket:
- LINGER 0: closing never waits on unsent messages to a peer that may be dead;
- IPV6 on exactly when the endpoint names an IPv6 literal (brackets, common/net/addresses.py): with
  IPV6 on, an IPv4 bind reports an IPv4-mapped address ("[::ffff:...]") that IPv4-only peers cannot
  dial; an owner that dials host *names* which may resolve to IPv6 passes `ipv6=True`;
- with the cluster's CURVE keys (common/net/curve.py) a socket that binds is a CURVE server behind the
  context's ZAP guard (started before the first bind), and a socket that dials is a CURVE client;
- a SUB socket takes every topic (the cluster never filters by topic).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import zmq

from common.net import curve
from common.net.addresses import names_ipv6_literal, tcp_endpoint
from common.net.curve import CurveKeys

if TYPE_CHECKING:
    import zmq.asyncio

SocketT = TypeVar("SocketT", bound=zmq.Socket)


@dataclass(frozen=True)
class SocketOptions:
    """What differs between sockets; None leaves ZMQ's default. `ipv6=None` applies the literal rule.
    `extra`: other integer options by ZMQ constant (e.g. zmq.ROUTER_MANDATORY)."""

    send_hwm: int | None = None
    recv_hwm: int | None = None
    max_message_bytes: int | None = None
    ipv6: bool | None = None
    extra: Mapping[int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("send_hwm", "recv_hwm", "max_message_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")


DEFAULTS = SocketOptions()


class Sockets(Generic[SocketT]):
    """The sockets of one owner (the router, a worker, a KV endpoint): one ZMQ context, its ZAP guard
    when it binds with keys, and `close` for all of it. Make one with `open_sockets` (threads) or
    `open_async_sockets` (asyncio). The context may make sockets from any thread; each socket then
    belongs to the thread that uses it."""

    def __init__(self, context: zmq.Context[SocketT], keys: CurveKeys | None, owner: str) -> None:
        self.context = context
        self.keys = keys
        self.owner = owner  # named in the guard's refusal logs
        self._guard: curve.CurveGuard | None = None

    def bind(self, kind: int, host: str, port: int = 0, options: SocketOptions = DEFAULTS) -> SocketT:
        """A socket bound on `host` (`port` 0: an ephemeral one; see `last_endpoint`)."""
        endpoint = tcp_endpoint(host, port or "*")
        if self.keys is not None and self._guard is None:
            self._guard = curve.CurveGuard(self.context, self.keys, self.owner)
        sock = self._socket(kind, endpoint, options)
        curve.serve(sock, self.keys)
        return _open(sock, sock.bind, endpoint)

    def dial(self, kind: int, address: str, options: SocketOptions = DEFAULTS) -> SocketT:
        """A socket connecting to `address` (ZMQ keeps reconnecting on its own)."""
        sock = self._socket(kind, address, options)
        curve.dial(sock, self.keys)
        if kind == zmq.SUB:
            sock.setsockopt(zmq.SUBSCRIBE, b"")
        return _open(sock, sock.connect, address)

    def close(self) -> None:
        """Stop the guard and close every socket of the context at once, dropping unsent messages."""
        curve.close_guard(self._guard)
        self._guard = None
        self.context.destroy(linger=0)

    def _socket(self, kind: int, endpoint: str, options: SocketOptions) -> SocketT:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        ipv6 = names_ipv6_literal(endpoint) if options.ipv6 is None else options.ipv6
        sock.setsockopt(zmq.IPV6, int(ipv6))
        for option, value in (
            (zmq.SNDHWM, options.send_hwm),
            (zmq.RCVHWM, options.recv_hwm),
            (zmq.MAXMSGSIZE, options.max_message_bytes),
            *(options.extra or {}).items(),
        ):
            if value is not None:
                sock.setsockopt(option, value)
        return sock


def _open(sock: SocketT, attach: Callable[[str], object], endpoint: str) -> SocketT:
    """`attach(endpoint)` (bind or connect); a socket that cannot is closed before the error goes up."""
    try:
        attach(endpoint)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    return sock


def open_sockets(keys: CurveKeys | None, owner: str) -> Sockets[zmq.Socket]:
    return Sockets(zmq.Context(), keys, owner)


def open_async_sockets(keys: CurveKeys | None, owner: str) -> Sockets[zmq.asyncio.Socket]:
    import zmq.asyncio

    return Sockets(zmq.asyncio.Context(), keys, owner)


def last_endpoint(sock: zmq.Socket) -> str:
    """The endpoint a socket bound last, with its real port: the address to hand to peers."""
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)
