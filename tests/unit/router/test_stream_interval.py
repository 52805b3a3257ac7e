"""--stream-interval K: a stream sends its first tokens at once, then one chunk per K tokens, and its
finish at once; the text is the same as with K = 1."""

from __future__ import annotations

import asyncio
import json

import pytest

from common.wire.sampling_params import FinishReason
from router.token_stream import SequenceUpdate, StreamInterval
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

REPLY_TEXT = " one two three four five six seven eight nine ten"


def _update(i: int, finish: FinishReason | None = None) -> SequenceUpdate:
    return SequenceUpdate(f"t{i}", [i], None, finish)


def test_holds_until_k_tokens_then_sends_them_merged():
    interval = StreamInterval(3)
    sent = [interval.push(0, _update(i)) for i in range(5)]
    sent.append(interval.push(0, _update(5, FinishReason.LENGTH)))
    shown = [None if u is None else (u.text, u.token_ids, u.finish_reason) for u in sent]
    assert shown == [
        ("t0", [0], None),  # the first tokens: at once
        None,
        None,
        ("t1t2t3", [1, 2, 3], None),
        None,
        ("t4t5", [4, 5], FinishReason.LENGTH),  # the finish: at once, with what was held
    ]


def test_choices_are_held_apart_and_one_passes_everything():
    interval = StreamInterval(2)
    assert interval.push(0, _update(0)) is not None and interval.push(1, _update(10)) is not None
    assert interval.push(0, _update(1)) is None and interval.push(1, _update(11)) is None
    assert interval.push(0, _update(2)).token_ids == [1, 2]
    assert all(StreamInterval(1).push(0, _update(i)) is not None for i in range(3))
    with pytest.raises(ValueError, match="stream_interval"):
        StreamInterval(0)


@pytest.mark.parametrize("k", [1, 4])
def test_router_streams_one_chunk_per_k_tokens(model_dir, tokenizer, k):
    reply = tokenizer.encode(REPLY_TEXT, add_special_tokens=False)
    specs = [("p0", "prefill", Script(reply=reply)), ("d0", "decode", Script(reply=reply, token_delay=0.01))]

    async def main() -> list[dict]:
        async with running_router(model_dir, tokenizer, specs, stream_interval=k) as h:
            body = {"prompt": "count", "max_tokens": len(reply), "stream": True}
            r = await h.client.post("/v1/completions", json=body)
            assert r.status_code == 200
            blocks = [b[len("data: ") :] for b in r.text.split("\n\n") if b.strip()]
            assert blocks[-1] == "[DONE]"
            return [json.loads(b) for b in blocks[:-1]]

    chunks = asyncio.run(main())
    texts = [c["choices"][0]["text"] for c in chunks]
    assert "".join(texts) == tokenizer.decode(reply)
    # the first tokens alone, then at least k per chunk (tokens that arrive together may share one
    # chunk even with k = 1); the decode worker's pauses keep k = 1 at a chunk per token or two
    bound = 1 + -(-(len(reply) - 1) // k)
    assert len(chunks) <= bound if k > 1 else len(chunks) >= len(reply) // 2
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
