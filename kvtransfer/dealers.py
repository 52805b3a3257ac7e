"""The receiver's sockets to its senders: one DEALER per sender address, dialled on first use and
registered with the I/O thread's poller, plus the outbox through which other threads queue control
frames for a sender (only the I/O thread touches the sockets).
"""

from __future__ import annotations

import logging
import queue

import zmq

from common.net.sockets import SocketOptions, Sockets
from common.net.waker import Waker

logger = logging.getLogger(__name__)

# RCVHWM 0: a bounded queue would stall the sender's data frames; IPV6 on: senders may advertise host
# names that resolve to IPv6 addresses.
DEALER_OPTIONS = SocketOptions(recv_hwm=0, ipv6=True)


class SenderDealers:
    def __init__(self, sockets: Sockets[zmq.Socket], poller: zmq.Poller, waker: Waker) -> None:
        self._sockets = sockets
        self._poller = poller
        self._waker = waker
        self._dealers: dict[str, zmq.Socket] = {}  # I/O thread only
        self._outbox: queue.SimpleQueue[tuple[str, list[bytes]]] = queue.SimpleQueue()  # (address, frames)

    def post(self, address: str, frames: list[bytes]) -> None:
        """Queue control frames for a sender (any thread; the I/O thread sends them when woken)."""
        self._outbox.put((address, frames))
        self._waker.wake()

    def send_posted(self) -> None:
        """Send what `post` queued (I/O thread)."""
        while True:
            try:
                address, frames = self._outbox.get_nowait()
            except queue.Empty:
                return
            try:
                send(self.dealer(address), frames)
            except zmq.ZMQError as e:  # the sender then releases at lease expiry instead
                logger.debug("kvtransfer receiver: cannot reach %s: %s", address, e)

    def dealer(self, address: str) -> zmq.Socket:
        """The socket to the sender at `address` (dialled now if there is none yet)."""
        sock = self._dealers.get(address)
        if sock is None:
            sock = self._sockets.dial(zmq.DEALER, address, DEALER_OPTIONS)
            self._poller.register(sock, zmq.POLLIN)
            self._dealers[address] = sock
        return sock

    def drop(self, address: str) -> None:
        """Close the socket to `address`, if any (a dead sender's would keep reconnecting forever)."""
        sock = self._dealers.pop(address, None)
        if sock is not None:
            self._poller.unregister(sock)
            sock.close(linger=0)

    def close_all(self) -> None:
        for sock in self._dealers.values():
            sock.close(linger=0)
        self._dealers.clear()


def send(sock: zmq.Socket | None, frames: list) -> bool:
    """Send without blocking; False when the frames did not go out (the caller decides what that means)."""
    if sock is None:  # the job never got a connection: nobody to tell
        return False
    try:
        sock.send_multipart(frames, flags=zmq.NOBLOCK)
        return True
    except zmq.ZMQError as e:
        logger.debug("kvtransfer receiver: send failed: %s", e)
        return False
