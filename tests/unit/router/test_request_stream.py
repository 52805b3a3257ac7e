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
        assert isinstance(await s.get(), RequestFailed)

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
            await s.get()
        other = RequestStream()
        other.expire_after(0.01)
        other.close()  # the request ended first: its timer is gone
        await asyncio.sleep(0.03)
        other.put(_tok(0))
        assert (await other.get()).index == 0

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
