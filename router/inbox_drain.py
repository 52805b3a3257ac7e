"""How the router reads its inbox: in batches, one event-loop wakeup per batch, not a future per message.

Kept apart from router/cluster_client.py, which decides what each message means: how the socket is
read (its readiness, the synchronous shadow it is drained through, when the loop yields) does not
depend on what the messages say.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio

from common.net.readable import Readable

# Inbox messages taken per event-loop turn before request tasks run. Large on purpose: a router that
# falls behind then hands each request several tokens at once, which become one SSE chunk (the
# per-chunk cost, not the per-token one, is what saturates the router); an idle router takes each
# message as it comes. 2048 messages are ~30 ms of work at worst.
INBOX_BATCH = 2048


async def drain_inbox(inbox: zmq.asyncio.Socket, take: Callable[[bytes], Awaitable[None]]) -> None:
    """Wait until the inbox is readable (common/net/readable.py: its descriptor registered once, not
    a poller per wait), then take what is there (up to INBOX_BATCH) without suspending: one
    event-loop wakeup per batch instead of a future per message. Token messages are routed
    synchronously; after a full batch the loop yields so request tasks keep up (after a drained
    socket, waiting yields anyway: no extra loop turn per message on an idle front)."""
    drain: zmq.Socket[bytes] = zmq.Socket.shadow(inbox.underlying)
    readable = Readable(drain)
    readable.open()
    try:
        while True:
            await readable.wait()
            for _ in range(INBOX_BATCH):
                try:
                    data = drain.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                await take(data)
            else:
                await asyncio.sleep(0)
    finally:
        readable.close()
