"""Reordering worker messages and turning them into a sequence's output."""

from __future__ import annotations

import pytest

from common.wire.detokenizer import IncrementalDetokenizer
from common.wire.logprobs import TokenLogprob
from common.wire.messages import TokenOutput
from common.wire.sampling_params import SamplingParams
from router.token_stream import SequenceOutput, TokenReorderBuffer, joined


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
    first = out.apply_run([_out(0, ids[:1])])
    assert first.finish_reason is None and (out.num_prompt_tokens, out.cached_tokens) == (3, 16)
    last = out.apply_run([_out(1, ids[1:])])  # a worker overshooting max_tokens
    assert last.finish_reason == "length" and not last.finished_by_worker
    assert out.num_generated == 3 and out.text == " a b c"


def test_sequence_output_worker_finish_and_stop_token_text(tokenizer) -> None:
    dot = tokenizer.encode(".", add_special_tokens=False)[0]
    ids = tokenizer.encode(" end", add_special_tokens=False) + [dot]
    out = _output(tokenizer, max_tokens=10, stop_token_ids=[dot])
    update = out.apply_run([_out(0, ids, "stop")])
    assert update.finished_by_worker and update.text == " end" and out.num_generated == len(ids)


def test_include_stop_str_in_output_keeps_the_stop_token_text(tokenizer) -> None:
    dot = tokenizer.encode(".", add_special_tokens=False)[0]
    ids = tokenizer.encode(" end", add_special_tokens=False) + [dot]
    params = SamplingParams(max_tokens=10, stop_token_ids=[dot], include_stop_str_in_output=True)
    out = SequenceOutput(IncrementalDetokenizer(tokenizer.backend), params)
    assert out.apply_run([_out(0, ids, "stop")]).text == " end."


def test_sequence_output_stop_string_and_min_tokens(tokenizer) -> None:
    ids = tokenizer.encode(" x STOP y STOP z", add_special_tokens=False)
    out = _output(tokenizer, max_tokens=50, stop=["STOP"], min_tokens=3)
    text = ""
    for i, t in enumerate(ids):
        update = out.apply_run([_out(i, [t])])
        text += update.text
        if update.finish_reason:
            break
    assert update.finish_reason == "stop" and not update.finished_by_worker
    assert text == " x STOP y "  # the first STOP came before min_tokens


def _apply_all(output: SequenceOutput, runs: list[list[TokenOutput]]) -> tuple[str, list, str | None, bool]:
    """What a client ends up with: the updates' text and tokens, the finish and who finished it."""
    text, tokens, finish, by_worker = "", [], None, False
    for run in runs:
        u = output.apply_run(run)
        text, tokens, finish, by_worker = (
            text + u.text,
            tokens + u.token_ids,
            u.finish_reason,
            u.finished_by_worker,
        )
        if finish is not None:
            break
    return text, tokens, finish, by_worker


@pytest.mark.parametrize("byte_table", [False, True])
@pytest.mark.parametrize(
    ("sampling", "finish"),
    [
        ({"max_tokens": 50}, None),
        ({"max_tokens": 7}, None),
        ({"max_tokens": 50}, "stop"),
        ({"max_tokens": 50}, "length"),
    ],
)
def test_joined_messages_apply_as_the_messages_one_by_one(tokenizer, byte_table, sampling, finish) -> None:
    ids = tokenizer.encode(" naïve café 東京 🙂 ok", add_special_tokens=False)  # characters split over tokens
    outs = [_out(0, ids[:1])] + [_out(i, [t]) for i, t in enumerate(ids[1:], start=1)]
    if finish is not None:
        outs[-1] = _out(len(ids) - 1, [ids[-1]], finish)
    table = tokenizer.byte_table if byte_table else None

    def output() -> SequenceOutput:
        return SequenceOutput(
            IncrementalDetokenizer(tokenizer.backend, byte_table=table), SamplingParams(**sampling)
        )

    runs = joined(outs)
    assert [run[0].index for run in runs] == [0, 1]  # the first token alone, the rest as one run
    assert _apply_all(output(), runs) == _apply_all(output(), [[out] for out in outs])


def test_joined_keeps_apart_what_carries_more_than_tokens() -> None:
    timed = TokenOutput("r", "d", 3, [13], None, 3, 0, timings={"decode_admission": 0.1})
    moved = TokenOutput("r", "d", 5, [15], None, 3, 0, kv_transfer_bytes=64)
    with_logprobs = TokenOutput("r", "d", 6, [16], None, 3, 0, logprobs=[TokenLogprob(-0.5)])
    outs = [
        _out(1, [11]),
        _out(2, [12]),
        timed,
        _out(4, [14]),
        moved,
        with_logprobs,
        _out(7, [17], "stop"),
        _out(8, [18]),
    ]
    runs = joined(outs)
    assert [[m.index for m in run] for run in runs] == [
        [1, 2],
        [3, 4],  # stage timings start a run of their own; plain tokens join it
        [5],
        [6],  # logprobs do not join a message without them
        [7],
        [8],  # nothing joins a finished message
    ]


def test_a_stop_string_or_min_tokens_keeps_messages_apart(tokenizer) -> None:
    assert not _output(tokenizer, max_tokens=9, stop=["x"]).takes_joined
    pending = _output(tokenizer, max_tokens=9, min_tokens=2)
    assert not pending.takes_joined
    pending.apply_run([_out(0, [5, 6])])
    assert pending.takes_joined and _output(tokenizer, max_tokens=9).takes_joined
