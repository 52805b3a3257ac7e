"""decode(data, trusted=...): the router's per-token path builds token messages without per-field checks,
but still with their meaning, their defaults and their tag and field names checked; and the sending
side's counterpart, build_checked_parts."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from common.wire import messages as m
from common.wire.codec import build_checked_parts
from common.wire.messages import MessageError, decode, encode
from common.wire.sampling_params import FinishReason, SamplingParams
from tests.unit.common.wire.message_examples import EXAMPLES

TOKENS = frozenset({m.TokenOutput, m.TokenBatch})
HEARTBEAT = m.WorkerHeartbeat("w", 1, 2, 0, 0, 0, 1.0)


def _token_output(**over) -> dict:
    fields = dict(request_id="r", worker_id="w", index=0, token_ids=[1], finish_reason=None)
    return {"type": "token_output", **fields, "num_prompt_tokens": 1, "cached_tokens": 0, **over}


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda msg: msg.TYPE)
def test_a_trusted_decode_means_what_a_checked_one_means(msg: m.Message) -> None:
    # every type, so that typed values (enums, records, unions of records, tuples) are all covered
    assert decode(encode(msg), trusted={type(msg)}) == msg


def test_typed_values_keep_their_types() -> None:
    out = decode(
        msgpack.packb(_token_output(finish_reason="stop", logprobs=[{"logprob": -0.5, "top": []}])), TOKENS
    )
    assert isinstance(out, m.TokenOutput) and out.finish_reason is FinishReason.STOP
    assert out.logprobs is not None and out.logprobs[0].logprob == -0.5 and out.kv_transfer_bytes == 0


def test_the_per_field_checks_are_skipped_for_trusted_types_only() -> None:
    data = msgpack.packb(_token_output(index=-1))
    out = decode(data, TOKENS)
    assert isinstance(out, m.TokenOutput) and out.index == -1
    with pytest.raises(MessageError, match="index"):
        decode(data)
    with pytest.raises(MessageError, match="num_free_blocks"):  # not a trusted type: checked in full
        decode(msgpack.packb(msgpack.unpackb(encode(HEARTBEAT)) | {"num_free_blocks": -1}), TOKENS)


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (_token_output(extra=1), "unknown field 'extra'"),
        ({k: v for k, v in _token_output().items() if k != "index"}, "missing field 'index'"),
        (_token_output(finish_reason="done"), "finish_reason must be one of"),
        ({"type": "nope"}, "unknown message type"),
        ([1, 2], "must be a msgpack map"),
    ],
)
def test_a_trusted_decode_still_checks_tag_names_and_typed_values(payload: object, error: str) -> None:
    with pytest.raises(MessageError, match=error):
        decode(msgpack.packb(payload), TOKENS)


def test_a_trusted_token_batch_still_means_its_rows() -> None:
    data = encode(m.TokenBatch("decode-0", ["r1", "r2"], [3, 1], [[8], [9, 10]], [3, 40]))
    batch = decode(data, TOKENS)
    assert isinstance(batch, m.TokenBatch)
    assert batch.outputs() == [
        m.TokenOutput("r1", "decode-0", 3, [8], None, 3, 0),
        m.TokenOutput("r2", "decode-0", 1, [9, 10], None, 40, 0),
    ]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda msg: msg.TYPE)
def test_a_message_built_from_checked_parts_equals_the_checked_build(msg: m.Message) -> None:
    fields = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    built = build_checked_parts(type(msg), **fields)
    assert type(built) is type(msg) and built == msg and decode(encode(built)) == msg


def test_built_from_parts_a_wrong_part_fails_at_the_receiver_naming_it() -> None:
    params = SamplingParams(temperature=0, max_tokens=4)
    request = build_checked_parts(
        m.GenerateRequest, request_id="r", prompt_token_ids=[1, -2], sampling=params, deadline=None
    )
    assert request.reply_to is None and request.log_id is None  # defaults filled in
    with pytest.raises(MessageError, match="prompt_token_ids") as e:
        decode(encode(request))
    assert e.value.request_id == "r"  # the worker fails that request rather than dropping it
    with pytest.raises(MessageError, match="unknown field 'prompt'"):
        build_checked_parts(m.GenerateRequest, request_id="r", prompt=[1], sampling=params, deadline=None)
    with pytest.raises(MessageError, match="missing field 'deadline'"):
        build_checked_parts(m.GenerateRequest, request_id="r", prompt_token_ids=[1], sampling=params)
