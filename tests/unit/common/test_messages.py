"""Wire messages: round trips, strict validation, and no crash on arbitrary bytes."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import messages as m
from common.hashing import probe_hash
from common.messages import MessageError, decode, encode

EXAMPLES: list[m.Message] = [
    m.WorkerRegister(
        worker_id="prefill-0",
        role="prefill",
        host="node1",
        pid=123,
        command_addr="tcp://127.0.0.1:5000",
        events_addr="tcp://127.0.0.1:5001",
        kv_endpoint={"transport": "tcp", "addr": "tcp://127.0.0.1:5002"},
        block_size=16,
        probe_hash=probe_hash(16),
        num_kv_blocks=1000,
        max_model_len=8192,
        max_num_batched_tokens=4096,
        model_name="smol",
    ),
    m.WorkerHeartbeat("decode-0", 10, 20, 1, 2, 300, 1700000000.5),
    m.PrefillRequest("r1", [1, 2, 3], {"temperature": 0.0, "max_tokens": 4}, "decode-0", "tcp://h:1", None),
    m.GenerateRequest("r1", [1, 2, 3], {"temperature": 0.0, "max_tokens": 4}, 12.5),
    m.DecodeRequest("r1", [1, 2, 3], 7, {"max_tokens": 4}, {"transport": "tcp"}, [4, 5], "prefill-0", 12.5),
    m.TokenOutput("r1", "prefill-0", 0, [7], None, 3, 0),
    m.TokenOutput(
        "r1", "decode-0", 1, [8, 9], "stop", 3, 0, logprobs=[{"logprob": -0.1, "top": [[8, -0.1]]}] * 2
    ),
    m.RequestFailed("r1", "decode-0", "out of blocks", True),
    m.Abort("r1"),
    m.KVEventBatch(
        "prefill-0",
        1,
        [m.stored_event([1, 2**64 - 1], None), m.removed_event([1]), m.cleared_event()],
    ),
    m.SnapshotRequest("prefill-0"),
    m.Snapshot("prefill-0", 0, [5, 6]),
    m.Shutdown(),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda msg: msg.TYPE)
def test_round_trip(msg: m.Message) -> None:
    assert decode(encode(msg)) == msg


def test_every_type_has_an_example() -> None:
    assert {msg.TYPE for msg in EXAMPLES} == set(m.MESSAGE_TYPES)


def test_wire_format_is_a_tagged_map() -> None:
    payload = msgpack.unpackb(encode(m.Abort("x")))
    assert payload == {"type": "abort", "request_id": "x"}


def test_int_widens_to_float() -> None:
    msg = decode(msgpack.packb({"type": "worker_heartbeat", **_heartbeat_fields(sent_at=3)}))
    assert isinstance(msg.sent_at, float) and msg.sent_at == 3.0


def test_optional_fields_take_defaults() -> None:
    fields = {"request_id": "r", "worker_id": "w", "index": 0, "token_ids": [1], "finish_reason": None}
    msg = decode(
        msgpack.packb({"type": "token_output", **fields, "num_prompt_tokens": 1, "cached_tokens": 0})
    )
    assert msg.logprobs is None and msg.kv_transfer_bytes == 0


def _heartbeat_fields(**over) -> dict:
    base = dict(
        worker_id="w",
        num_free_blocks=1,
        num_total_blocks=2,
        num_waiting=0,
        num_running=0,
        queued_prefill_tokens=0,
        sent_at=1.0,
    )
    return {**base, **over}


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"type": "nope"}, "type"),
        ({"request_id": "x"}, "type"),
        ({"type": "abort"}, "request_id"),
        ({"type": "abort", "request_id": 5}, "request_id"),
        ({"type": "abort", "request_id": "x", "extra": 1}, "extra"),
        ({"type": "worker_heartbeat", **_heartbeat_fields(num_free_blocks=True)}, "num_free_blocks"),
        ({"type": "worker_heartbeat", **_heartbeat_fields(num_free_blocks=-1)}, "num_free_blocks"),
        ({"type": "worker_heartbeat", **_heartbeat_fields(sent_at="now")}, "sent_at"),
        ({"type": "snapshot", "worker_id": "w", "seq": 0, "hashes": [-1]}, "hashes"),
        ({"type": "snapshot", "worker_id": "w", "seq": 0, "hashes": [1.5]}, "hashes"),
        ({"type": "kv_event_batch", "worker_id": "w", "seq": 0, "events": []}, "seq"),
        ({"type": "kv_event_batch", "worker_id": "w", "seq": 1, "events": [{"kind": "x"}]}, "kind"),
        (
            {"type": "kv_event_batch", "worker_id": "w", "seq": 1, "events": [{"kind": "removed"}]},
            "exactly the fields",
        ),
        (
            {
                "type": "kv_event_batch",
                "worker_id": "w",
                "seq": 1,
                "events": [{"kind": "stored", "hashes": [1]}],
            },
            "exactly the fields",
        ),
        (
            {
                "type": "token_output",
                "request_id": "r",
                "worker_id": "w",
                "index": 0,
                "token_ids": [],
                "finish_reason": None,
                "num_prompt_tokens": 1,
                "cached_tokens": 0,
            },
            "token_ids",
        ),
    ],
)
def test_malformed_messages_name_the_field(payload: dict, field: str) -> None:
    with pytest.raises(MessageError, match=field):
        decode(msgpack.packb(payload))


def test_constructor_validates() -> None:
    with pytest.raises(MessageError, match="role"):
        m.WorkerRegister("w", "colocated", "h", 1, "tcp://a", None, {}, 16, 1, 1, 1, 1, "m")
    with pytest.raises(ValueError, match="logprobs"):
        m.TokenOutput("r", "w", 0, [1, 2], None, 1, 0, logprobs=[{"logprob": 0.0, "top": []}])


def test_encode_rejects_non_messages() -> None:
    with pytest.raises(MessageError):
        encode(object())  # type: ignore[arg-type]


@settings(max_examples=400, deadline=None, database=None)
@given(st.binary(max_size=256))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    with contextlib.suppress(MessageError):
        decode(data)


_msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None, database=None)
@given(
    st.sampled_from(sorted(m.MESSAGE_TYPES)),
    st.dictionaries(st.text(max_size=12), _msgpack_values, max_size=8),
)
def test_tagged_maps_with_random_fields_never_crash(tag: str, body: dict) -> None:
    try:
        data = msgpack.packb({"type": tag, **body}, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return  # msgpack itself cannot carry this value
    with contextlib.suppress(MessageError):
        decode(data)


@settings(max_examples=200, deadline=None, database=None)
@given(st.sampled_from(EXAMPLES), st.data())
def test_mutated_valid_messages_never_crash(msg: m.Message, data: st.DataObject) -> None:
    payload = msgpack.unpackb(encode(msg))
    key = data.draw(st.sampled_from(sorted(payload)))
    payload[key] = data.draw(_msgpack_values)
    try:
        data_bytes = msgpack.packb(payload, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return  # msgpack itself cannot carry this value
    with contextlib.suppress(MessageError):
        decode(data_bytes)
