"""A man in the middle for the KV transfer's control and data path: real ZMQ sockets that relay
everything between receivers and one sender, letting a test rewrite what passes (a flipped byte on the
wire, a fetch redirected to another request's publication)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import msgpack
import zmq

from common.wire.handoff import HandOff

# (header map, the frames after the header) -> (header map, frames): what goes on instead.
Rewrite = Callable[[dict, list[bytes]], tuple[dict, list[bytes]]]


def _unchanged(header: dict, rest: list[bytes]) -> tuple[dict, list[bytes]]:
    return header, rest


class KVProxy:
    """Listens on an ephemeral loopback port and relays to `upstream` (a sender's address).
    `to_sender` rewrites receiver -> sender messages, `to_receiver` the replies."""

    def __init__(self, upstream: str, to_sender: Rewrite = _unchanged, to_receiver: Rewrite = _unchanged):
        self.upstream = upstream
        self.to_sender, self.to_receiver = to_sender, to_receiver
        self._ctx = zmq.Context()
        self._front = self._ctx.socket(zmq.ROUTER)
        self._front.setsockopt(zmq.LINGER, 0)
        port = self._front.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self._backs: dict[bytes, zmq.Socket] = {}  # receiver identity -> its socket to the sender
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-proxy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._front, zmq.POLLIN)
        while not self._stop.is_set():
            for sock, _ in poller.poll(20):
                if sock is self._front:
                    ident, *frames = sock.recv_multipart()
                    back = self._back(ident, poller)
                    back.send_multipart(_rewrite(frames, self.to_sender))
                else:
                    ident = next(i for i, s in self._backs.items() if s is sock)
                    frames = sock.recv_multipart()
                    self._front.send_multipart([ident, *_rewrite(frames, self.to_receiver)])

    def _back(self, ident: bytes, poller: zmq.Poller) -> zmq.Socket:
        if ident not in self._backs:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.upstream)
            poller.register(sock, zmq.POLLIN)
            self._backs[ident] = sock
        return self._backs[ident]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._ctx.destroy(linger=0)


def _rewrite(frames: list[bytes], rewrite: Rewrite) -> list[bytes]:
    header, rest = rewrite(msgpack.unpackb(frames[0]), list(frames[1:]))
    return [msgpack.packb(header, use_bin_type=True), *rest]


def flip_a_byte(header: dict, rest: list[bytes]) -> tuple[dict, list[bytes]]:
    """Flip one bit in the middle of every data frame (tcp), as a faulty link or NIC would."""
    if header.get("type") == "kv_data" and rest:
        frame = bytearray(rest[0])
        frame[len(frame) // 2] ^= 0x10
        rest = [bytes(frame), *rest[1:]]
    return header, rest


def swap_served_hashes(header: dict, rest: list[bytes]) -> tuple[dict, list[bytes]]:
    """Swap the hashes the sender reports for its first two served blocks (tcp): what a sender serving
    the publication's blocks out of order would report."""
    binding = header.get("binding")
    if header.get("type") == "kv_data" and binding:
        hashes = binding["hashes"]
        header = {**header, "binding": {**binding, "hashes": [hashes[1], hashes[0], *hashes[2:]]}}
    return header, rest


def redirect_fetch(to: HandOff, from_request: str) -> tuple[Rewrite, Rewrite]:
    """Rewrites that make fetches of `from_request` read the publication `to` (naming it as the sender
    knows it, and relabelling the replies, so the receiver takes them as its own): a transfer meant for
    another request."""

    def out(header: dict, rest: list[bytes]) -> tuple[dict, list[bytes]]:
        if header.get("request_id") == from_request and header.get("type") == "kv_fetch":
            header = {**header, "request_id": to.request_id, "nonce": to.nonce}
        return header, rest

    def back(header: dict, rest: list[bytes]) -> tuple[dict, list[bytes]]:
        if header.get("request_id") == to.request_id:
            header = {**header, "request_id": from_request}
        return header, rest

    return out, back
