"""Readable: waiting for a ZMQ socket's messages through one registered descriptor, on real sockets."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
import zmq

from common.net.readable import Readable


def _pair(ctx: zmq.Context) -> tuple[zmq.Socket, zmq.Socket]:
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    return pull, push


def _drain(pull: zmq.Socket) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(pull.recv(zmq.NOBLOCK))
        except zmq.Again:
            return got


def test_every_message_sent_from_another_thread_is_woken_for():
    """Bursts and gaps from a sender thread: the waiter never sleeps past a queued message (a lost
    edge would hang here until the timeout) and every message arrives in order."""
    ctx = zmq.Context()
    pull, push = _pair(ctx)
    count = 3_000

    def sender() -> None:
        rng = random.Random(7)
        for i in range(count):
            push.send(str(i).encode())
            if rng.random() < 0.05:
                time.sleep(rng.random() / 1000)

    async def receive() -> list[bytes]:
        readable = Readable(pull)
        readable.open()
        got: list[bytes] = []
        try:
            threading.Thread(target=sender, daemon=True).start()
            while len(got) < count:
                await asyncio.wait_for(readable.wait(), timeout=5)
                got += _drain(pull)
        finally:
            readable.close()
        return got

    try:
        got = asyncio.run(receive())
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()
    assert got == [str(i).encode() for i in range(count)]


def test_wait_returns_at_once_for_a_queued_message_and_sleeps_without_one():
    ctx = zmq.Context()
    pull, push = _pair(ctx)

    async def main() -> None:
        readable = Readable(pull)
        with pytest.raises(RuntimeError, match="open"):
            await readable.wait()
        readable.open()
        try:
            push.send(b"first")
            await asyncio.wait_for(readable.wait(), timeout=5)
            assert _drain(pull) == [b"first"]
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(readable.wait(), timeout=0.05)
            asyncio.get_running_loop().call_later(0.01, push.send, b"second")
            await asyncio.wait_for(readable.wait(), timeout=5)
            assert _drain(pull) == [b"second"]
        finally:
            readable.close()

    try:
        asyncio.run(main())
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()
