"""Reordering worker messages and turning them into a sequence's output."""

from __future__ import annotations

from common.wire.detokenizer import IncrementalDetokenizer
from common.wire.messages import TokenOutput
from common.wire.sampling_params import SamplingParams
from router.token_stream import SequenceOutput, TokenReorderBuffer


def _out(index: int, tokens: list[int], finish: str | None = None, worker: str = "d") -> TokenOutput:
    return TokenOutput("r", worker, index, tokens, finish, 3, 16 if index == 0 else 0)


def test_reorder_buffer_releases_in_index_order() -> None:
    buf = TokenReorderBuffer()
    assert buf.push(_out(1, [11, 12])) == []
    assert buf.push(_out(3, [13], "stop")) == []
    assert buf.num_buffered == 2
    ready = buf.push(_out(0, [10], worker="p"))
    assert [m.index for m in ready] == [0, 1, 3] and buf.closed
    assert buf.push(_out(4, [14])) == []  # nothing after the finish


def test_reorder_buffer_drops_duplicates_and_accepts_empty_finish() -> None:
    buf = TokenReorderBuffer()
    assert len(buf.push(_out(0, [10]))) == 1
    assert buf.push(_out(0, [10])) == []
    ready = buf.push(_out(1, [], "abort"))
    assert ready[0].finish_reason == "abort" and buf.closed and buf.next_index == 1


def _output(tokenizer, **sampling) -> SequenceOutput:
    params = SamplingParams(**sampling)
    return SequenceOutput(IncrementalDetokenizer(tokenizer.backend, stop=params.stop), params)


def test_sequence_output_counts_and_truncates_at_max_tokens(tokenizer) -> None:
    ids = tokenizer.encode(" a b c d e", add_special_tokens=False)
    out = _output(tokenizer, max_tokens=3)
    first = out.apply(_out(0, ids[:1]))
    assert first.finish_reason is None and (out.num_prompt_tokens, out.cached_tokens) == (3, 16)
    last = out.apply(_out(1, ids[1:]))  # a worker overshooting max_tokens
    assert last.finish_reason == "length" and not last.finished_by_worker
    assert out.num_generated == 3 and out.text == " a b c"


def test_sequence_output_worker_finish_and_stop_token_text(tokenizer) -> None:
    dot = tokenizer.encode(".", add_special_tokens=False)[0]
    ids = tokenizer.encode(" end", add_special_tokens=False) + [dot]
    out = _output(tokenizer, max_tokens=10, stop_token_ids=[dot])
    update = out.apply(_out(0, ids, "stop"))
    assert update.finished_by_worker and update.text == " end" and out.num_generated == len(ids)


def test_sequence_output_stop_string_and_min_tokens(tokenizer) -> None:
    ids = tokenizer.encode(" x STOP y STOP z", add_special_tokens=False)
    out = _output(tokenizer, max_tokens=50, stop=["STOP"], min_tokens=3)
    text = ""
    for i, t in enumerate(ids):
        update = out.apply(_out(i, [t]))
        text += update.text
        if update.finish_reason:
            break
    assert update.finish_reason == "stop" and not update.finished_by_worker
    assert text == " x STOP y "  # the first STOP came before min_tokens
