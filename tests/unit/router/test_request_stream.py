"""The per-request message stream: batches, one waiter, and a hard deadline."""

from __future__ import annotations

import asyncio
import time

import pytest

from common.wire.messages import RequestFailed, TokenOutput
from router.request_stream import RequestStream, StreamTimeout
from router.token_stream import SequenceUpdate


def _tok(index: int) -> TokenOutput:
    return TokenOutput("r", "w", index, [index + 5], None, 3, 0)


def test_get_batch_takes_everything_that_arrived() -> None:
    async def main():
        s = RequestStream()
        waiter = asyncio.ensure_future(s.get_batch())
        await asyncio.sleep(0)
        assert not waiter.done()  # nothing yet: it waits
        s.put(_tok(0))
        s.put(_tok(1))
        assert [m.index for m in await waiter] == [0, 1] and s.empty()
        s.put(RequestFailed("r", "w", "gone", True))
        assert [type(m) for m in await s.get_batch()] == [RequestFailed]

    asyncio.run(main())


def test_the_deadline_wins_even_over_a_stream_still_producing() -> None:
    async def main():
        s = RequestStream()
        s.expire_after(0.05)
        t0 = time.monotonic()
        with pytest.raises(StreamTimeout):
            await s.get_batch()
        assert 0.04 < time.monotonic() - t0 < 2
        s.put(_tok(0))
        with pytest.raises(StreamTimeout):
            await s.get_batch()
        other = RequestStream()
        other.expire_after(0.01)
        other.close()  # the request ended first: its timer is gone
        await asyncio.sleep(0.03)
        other.put(_tok(0))
        assert [m.index for m in await other.get_batch()] == [0]

    asyncio.run(main())


def test_updates_merge_into_one_chunk_until_a_finish() -> None:
    a = SequenceUpdate("Hel", [1], None)
    b = SequenceUpdate("lo", [2], None, "stop", True)
    merged = a.merged(b)
    assert merged == SequenceUpdate("Hello", [1, 2], None, "stop", True)
    assert a.can_merge(b) and not merged.can_merge(a)
    with_lp = SequenceUpdate("x", [3], [{"logprob": -1.0, "top": []}])
    assert not a.can_merge(with_lp)  # text-only and logprob updates are not mixed
    assert with_lp.merged(with_lp).logprobs == [{"logprob": -1.0, "top": []}] * 2


def test_wake_every_k_wakes_for_the_first_token_every_k_tokens_the_finish_and_failures() -> None:
    async def taken(s: RequestStream, *batches: tuple[TokenOutput | RequestFailed, ...]) -> list:
        """Put each batch of messages while one reader waits: whether it was awake after each batch,
        and the indexes (or types) it got."""
        reader = asyncio.ensure_future(s.get_batch())
        await asyncio.sleep(0)
        awake = []
        for batch in batches:
            for msg in batch:
                s.put(msg)
            await asyncio.sleep(0)
            awake.append(reader.done())
        got = [m.index if isinstance(m, TokenOutput) else "failed" for m in reader.result()]
        return [awake, got]

    async def main():
        s = RequestStream(wake_every=3)
        assert await taken(s, (_tok(0),)) == [[True], [0]]  # the first token: at once
        assert await taken(s, (_tok(1), _tok(2)), (_tok(3),)) == [[False, True], [1, 2, 3]]
        finish = TokenOutput("r", "w", 5, [9], "stop", 3, 0)
        assert await taken(s, (_tok(4),), (finish,)) == [[False, True], [4, 5]]  # the last: at once
        failed = RequestFailed("r", "w", "gone", True)
        assert await taken(s, (_tok(6),), (failed,)) == [[False, True], [6, "failed"]]
        several = TokenOutput("r", "w", 7, [1, 2, 3], None, 3, 0)  # tokens count, not messages
        assert await taken(s, (several,)) == [[True], [7]]

    asyncio.run(main())
    with pytest.raises(ValueError, match="wake_every"):
        RequestStream(wake_every=0)


def test_a_first_token_after_later_ones_is_not_held_behind_the_interval() -> None:
    """A stream whose decode tokens arrived before the prefill's index 0 still shows index 0 at once."""

    async def main():
        s = RequestStream(wake_every=4)
        s.put(_tok(1))  # out of order: held (not the first token)
        reader = asyncio.ensure_future(s.get_batch())
        await asyncio.sleep(0)
        assert [m.index for m in await reader] == [1]  # a reader that comes finds what is there
        reader = asyncio.ensure_future(s.get_batch())
        await asyncio.sleep(0)
        s.put(_tok(0))
        await asyncio.sleep(0)
        assert reader.done() and [m.index for m in reader.result()] == [0]

    asyncio.run(main())
