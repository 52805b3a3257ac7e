"""Run a request's sequences (prompts x n) concurrently and merge their updates into one stream.

Each sequence runs in its own task; updates come out tagged with the choice index in arrival order.
If one sequence fails, or the consumer goes away (client disconnect), every other sequence is
cancelled, which makes each of them abort its workers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from router.request_lifecycle import ChoiceUpdate, RequestLifecycle, SequenceRequest

_DONE = object()


def run_sequences(lifecycle: RequestLifecycle, seqs: list[SequenceRequest]) -> AsyncGenerator[ChoiceUpdate]:
    if len(seqs) == 1:  # the common case needs no tasks, nor a generator of its own (one per token)
        return lifecycle.generate(seqs[0])
    return _fan_out(lifecycle, seqs)


async def _fan_out(lifecycle: RequestLifecycle, seqs: list[SequenceRequest]) -> AsyncGenerator[ChoiceUpdate]:
    queue: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.create_task(_pump(lifecycle, i, seq, queue)) for i, seq in enumerate(seqs)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _pump(lifecycle: RequestLifecycle, index: int, seq: SequenceRequest, queue: asyncio.Queue) -> None:
    try:
        async with contextlib.aclosing(lifecycle.generate(seq, index)) as updates:
            async for update in updates:
                queue.put_nowait(update)
    except Exception as e:  # handed to the consumer, which cancels the siblings
        queue.put_nowait(e)
    finally:
        queue.put_nowait(_DONE)
