"""router/command_outbox.py over real ZMQ sockets: commands go out together at the end of the loop turn,
in order; undeliverable ones are reported, and through the cluster client fail their request."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from common.wire.messages import Abort, GenerateRequest, Message, RequestFailed, decode
from common.wire.sampling_params import SamplingParams
from router.command_outbox import CommandOutbox
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router


def _sockets(ctx: zmq.asyncio.Context, hwm: int = 1000) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, hwm)
    push.connect(f"tcp://127.0.0.1:{port}")
    return pull, push


def test_commands_go_out_at_the_end_of_the_turn_in_order() -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        pull, push = _sockets(ctx)
        outbox = CommandOutbox(lambda worker_id, msg: None)
        outbox.add("w", push)
        assert not outbox.put("nobody", Abort("r0"))  # an unknown worker: nothing queued
        assert outbox.put("w", Abort("r1")) and outbox.put("w", Abort("r2"))
        # still queued: this turn has not ended (a blocking poll keeps the turn from ending)
        assert zmq.Socket.shadow(pull.underlying).poll(50) == 0
        await asyncio.sleep(0)
        got = [decode(await pull.recv()), decode(await pull.recv())]
        assert got == [Abort("r1"), Abort("r2")]
        ctx.destroy(linger=0)

    asyncio.run(main())


def test_undeliverable_commands_are_reported() -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        lost: list[tuple[str, Message]] = []
        outbox = CommandOutbox(lambda worker_id, msg: lost.append((worker_id, msg)))
        stuck = ctx.socket(zmq.PUSH)  # a worker that never reads, with room for one queued command
        stuck.setsockopt(zmq.SNDHWM, 1)
        stuck.connect("tcp://127.0.0.1:9")
        pull, gone = _sockets(ctx)
        outbox.add("stuck", stuck)
        outbox.add("gone", gone)
        request = GenerateRequest("r1", [1, 2], SamplingParams(), None)
        outbox.put("stuck", Abort("r0"))  # fills its queue
        outbox.put("stuck", request)
        outbox.put("gone", Abort("r2"))
        outbox.remove("gone")  # disconnected before the turn ended
        await asyncio.sleep(0)
        assert lost == [("stuck", request), ("gone", Abort("r2"))]
        ctx.destroy(linger=0)

    asyncio.run(main())


def test_an_undeliverable_request_command_fails_its_request(model_dir, tokenizer) -> None:
    async def main() -> None:
        specs = [("m0", "mixed", Script(reply=[5, 2]))]
        async with running_router(model_dir, tokenizer, specs) as h:
            cluster = h.router.cluster
            stream = cluster.open_stream("r1")
            assert await cluster.send("m0", GenerateRequest("r1", [1, 2], SamplingParams(), None))
            cluster._outbox.remove("m0")  # as if the worker's socket went away before the turn ended
            [failed] = await asyncio.wait_for(stream.get_batch(), 5)
            assert isinstance(failed, RequestFailed) and failed.retryable
            assert (failed.request_id, failed.worker_id) == ("r1", "m0")

    asyncio.run(main())
