"""The one socket helper (common/net/sockets.py) on real ZMQ sockets: options applied, CURVE on and off,
IPv6 literals, SUB taking every topic, failed binds and dials leaving no socket behind."""

from __future__ import annotations

import socket

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from common.net.addresses import bracket, tcp_endpoint
from common.net.curve import CurveKeys
from common.net.sockets import SocketOptions, last_endpoint, open_sockets

pytestmark = pytest.mark.timeout(60)
WAIT_MS = 10_000  # a safety net only: every wait below ends on an event


@pytest.fixture
def pair():
    opened = []

    def make(keys: CurveKeys | None, owner: str = "test"):
        sockets = open_sockets(keys, owner)
        opened.append(sockets)
        return sockets

    yield make
    for sockets in opened:
        sockets.close()


def _round_trip(server, client) -> None:
    pull = server.bind(zmq.PULL, "127.0.0.1")
    push = client.dial(zmq.PUSH, last_endpoint(pull))
    push.send(b"hello")
    assert pull.poll(WAIT_MS) and pull.recv() == b"hello"


def test_plain_sockets_carry_messages_with_every_option_set(pair) -> None:
    server, client = pair(None), pair(None)
    pull = server.bind(zmq.PULL, "127.0.0.1", options=SocketOptions(recv_hwm=7, max_message_bytes=1 << 20))
    address = last_endpoint(pull)
    assert address.startswith("tcp://127.0.0.1:") and not address.endswith(":0")
    options = SocketOptions(send_hwm=5, extra={zmq.IMMEDIATE: 1})
    push = client.dial(zmq.PUSH, address, options)
    assert [push.getsockopt(o) for o in (zmq.LINGER, zmq.SNDHWM, zmq.IMMEDIATE, zmq.IPV6)] == [0, 5, 1, 0]
    assert [pull.getsockopt(o) for o in (zmq.LINGER, zmq.RCVHWM, zmq.MAXMSGSIZE, zmq.IPV6)] == [
        0,
        7,
        1 << 20,
        0,
    ]
    assert push.getsockopt(zmq.MECHANISM) == zmq.NULL
    push.send(b"hello")
    assert pull.poll(WAIT_MS) and pull.recv() == b"hello"


def test_curve_sockets_admit_only_the_cluster_keys(pair) -> None:
    keys = CurveKeys.generate()
    server, client = pair(keys), pair(keys)
    _round_trip(server, client)
    pull = server.bind(zmq.PULL, "127.0.0.1")
    assert pull.getsockopt(zmq.MECHANISM) == zmq.CURVE and pull.getsockopt(zmq.CURVE_SERVER) == 1
    for outsider in (pair(CurveKeys.generate()), pair(None)):  # other keys, no keys
        push = outsider.dial(zmq.PUSH, last_endpoint(pull))
        push.send(b"rogue")  # queued: it would go out once a handshake succeeded
        # A refused peer retries its handshake on every reconnect, so the monitor sees a failure even
        # when it starts after the first attempt.
        assert _first_handshake_event(push) != zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert not pull.poll(0)


def _first_handshake_event(sock: zmq.Socket) -> int:
    handshakes = (
        zmq.EVENT_HANDSHAKE_SUCCEEDED,
        zmq.EVENT_HANDSHAKE_FAILED_AUTH,
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
    )
    monitor = sock.get_monitor_socket()
    try:
        while monitor.poll(WAIT_MS):
            event = recv_monitor_message(monitor)["event"]
            if event in handshakes:
                return event
        raise AssertionError("no handshake event")
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this host")
@pytest.mark.parametrize("keys", [None, CurveKeys.generate()], ids=["plain", "curve"])
def test_ipv6_literals_bind_and_dial_with_brackets(pair, keys) -> None:
    server, client = pair(keys), pair(keys)
    pull = server.bind(zmq.PULL, "::1")
    address = last_endpoint(pull)
    assert address.startswith("tcp://[::1]:") and pull.getsockopt(zmq.IPV6) == 1
    push = client.dial(zmq.PUSH, address)
    assert push.getsockopt(zmq.IPV6) == 1
    push.send(b"six")
    assert pull.poll(WAIT_MS) and pull.recv() == b"six"


def test_the_bracket_rule() -> None:
    assert [bracket(h) for h in ("::1", "[::1]", "10.0.0.1", "node-3")] == [
        "[::1]",
        "[::1]",
        "10.0.0.1",
        "node-3",
    ]
    assert tcp_endpoint("fe80::1", 5) == "tcp://[fe80::1]:5" and tcp_endpoint("h") == "tcp://h:*"


def test_a_sub_socket_takes_every_topic(pair) -> None:
    server, client = pair(None), pair(None)
    pub = server.bind(zmq.PUB, "127.0.0.1")
    sub = client.dial(zmq.SUB, last_endpoint(pub))
    # A subscription reaches the publisher some time after connect: publish until one arrives.
    for _ in range(WAIT_MS // 10):
        pub.send(b"any topic")
        if sub.poll(10):
            break
    assert sub.recv() == b"any topic"


def test_failed_binds_and_dials_raise_and_leave_no_socket(pair) -> None:
    sockets = pair(None)
    taken = sockets.bind(zmq.PULL, "127.0.0.1")
    port = int(last_endpoint(taken).rsplit(":", 1)[1])
    with pytest.raises(zmq.ZMQError):
        sockets.bind(zmq.PULL, "127.0.0.1", port)
    with pytest.raises(zmq.ZMQError):
        sockets.dial(zmq.PUSH, "tcp://no port")
    assert [s for s in sockets.context._sockets if not s.closed] == [taken]


def test_options_are_validated_naming_the_field() -> None:
    for name, value in (("send_hwm", -1), ("recv_hwm", 1.5), ("max_message_bytes", True)):
        with pytest.raises(ValueError, match=name):
            SocketOptions(**{name: value})
