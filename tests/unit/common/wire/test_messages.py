"""Wire messages: round trips, strict validation, and no crash on arbitrary bytes."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.wire import kv_messages as kv
from common.wire import messages as m
from common.wire.handoff import HandOff, IpcExport
from common.wire.hashing import probe_hash
from common.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from common.wire.logprobs import TokenLogprob
from common.wire.messages import MessageError, decode, encode
from common.wire.sampling_params import FinishReason, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
TCP_HANDOFF = HandOff("tcp", "tcp://127.0.0.1:5002", "r1", 5, 2**63 - 1, 2)
IPC_HANDOFF = HandOff(
    "ipc",
    "tcp://h:2",
    "kvprobe-1",
    5,
    9,
    2,
    ipc=IpcExport(77, 1.7e9, {"handle": b"\x00"}, [4, 0], [3, None], None),
)
LAYOUT = kv.BlockLayout("bfloat16", [2, 16, 4, 64])
BINDING = kv.KVBinding(5, 9, [2**64 - 1, None])

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
        node_id="a1b2c3",
    ),
    m.WorkerHeartbeat("decode-0", 10, 20, 1, 2, 300, 1700000000.5),
    m.PrefillRequest("r1", [1, 2, 3], GREEDY, "decode-0", "tcp://h:1", None),
    m.GenerateRequest("r1", [1, 2, 3], SamplingParams(stop=["x"], seed=2**63 - 1, logprobs=2), 9.5),
    m.DecodeRequest("r1", [1, 2, 3], 7, GREEDY, TCP_HANDOFF, "prefill-0", 12.5),
    m.TokenOutput("r1", "prefill-0", 0, [7], None, 3, 0),
    m.TokenBatch("decode-0", ["r1", "r2"], [3, 1], [[8], [9, 10]], [3, 40]),
    m.TokenOutput(
        "r1",
        "decode-0",
        1,
        [8, 9],
        FinishReason.STOP,
        3,
        0,
        logprobs=[TokenLogprob(-0.1, ((8, -0.1),)), TokenLogprob(float("-inf"))],
    ),
    m.RequestFailed("r1", "decode-0", "out of blocks", True),
    m.Abort("r1"),
    m.KVEventBatch(
        "prefill-0",
        1,
        [
            BlockStored((1, 2**64 - 1), None),
            BlockStored((3,), 2**64 - 1),
            BlockRemoved((1,)),
            AllBlocksCleared(),
        ],
    ),
    m.SnapshotRequest("prefill-0"),
    m.Snapshot("prefill-0", 0, [5, 6]),
    m.KVProbeRequest("kvprobe-1-prefill-0-decode-0", "decode-0", "tcp://h:1", 32 << 20),
    m.KVProbe("kvprobe-1", "prefill-0", IPC_HANDOFF),
    m.KVProbeResult("kvprobe-1", "prefill-0", "decode-0", "tcp", 1 << 20, 0.01),
    m.KVProbeResult("kvprobe-2", "prefill-0", "decode-0", "nccl", 0, 0.0, "timed out"),
    m.Shutdown(),
    kv.KVFetch("r1", 1, 5, LAYOUT, 30.0, pair="a" * 32, drop_pairs=["b" * 32]),
    kv.KVAck("r1", 1),
    kv.KVError("r1", 0, "no such publication", pair_broken=True),
    kv.KVCopied(["r1", "r2"]),
    kv.KVData("r1", 1, 0, 4, True, BINDING),
    kv.KVSums("r1", 1, 4, [-(2**63), 7]),
    kv.KVReady("r1", 2, 4096, b"\x01" * 16, BINDING),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda msg: msg.TYPE)
def test_round_trip(msg: m.Message) -> None:
    assert decode(encode(msg)) == msg


def test_probe_results_say_their_rate() -> None:
    assert m.KVProbeResult("p", "a", "b", "tcp", 10**9, 0.5).gbps == 2.0
    assert m.KVProbeResult("p", "a", "b", "tcp", 10**9, 0.5, "broken").gbps == 0.0
    with pytest.raises(MessageError, match="num_bytes"):
        m.KVProbeRequest("p", "b", "tcp://h:1", 0)


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


def _events(*events: object) -> dict:
    return {"type": "kv_event_batch", "worker_id": "w", "seq": 1, "events": list(events)}


def _token_output(**over) -> dict:
    base = dict(request_id="r", worker_id="w", index=0, token_ids=[1], finish_reason=None)
    return {"type": "token_output", **base, "num_prompt_tokens": 1, "cached_tokens": 0, **over}


def _prefill(sampling: dict | None) -> dict:
    wire = None if sampling is None else {**GREEDY.to_dict(), **sampling}
    fields = dict(request_id="r7", prompt_token_ids=[1], decode_worker_id="d", decode_command_addr="a")
    return {"type": "prefill_request", **fields, "sampling": wire, "deadline": None}


def _payload(msg: m.Message) -> dict:
    return msgpack.unpackb(encode(msg))


def _decode_request(**handoff) -> dict:
    payload = _payload(next(msg for msg in EXAMPLES if isinstance(msg, m.DecodeRequest)))
    return {**payload, "handoff": {**payload["handoff"], **handoff}}


def _register_fields(**over) -> dict:
    return {**msgpack.unpackb(encode(EXAMPLES[0])), "type": "worker_register", **over}


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
        (
            {"type": "kv_event_batch", "worker_id": "w", "seq": 1, "events": [{"kind": "x"}]},
            r"events\[0\]\.kind",
        ),
        (_events({"kind": "removed"}), r"events\[0\]: missing field 'hashes'"),
        (_events({"kind": "stored", "hashes": [1]}), "missing field 'parent'"),
        (
            _events({"kind": "cleared"}, {"kind": "removed", "hashes": [-1]}),
            r"events\[1\]\.hashes must be >= 0",
        ),
        (_events({"kind": "cleared", "hashes": []}), "unknown field 'hashes'"),
        (_events({"kind": "stored", "hashes": [1], "parent": "h"}), r"events\[0\]\.parent must be a int"),
        (_events([1]), r"events\[0\] must be a map"),
        (_token_output(finish_reason="done"), "finish_reason must be one of"),
        (_token_output(logprobs=[{"top": []}]), r"logprobs\[0\]: missing field 'logprob'"),
        (
            _token_output(logprobs=[{"logprob": -1.0, "top": [[1]]}]),
            r"logprobs\[0\]\.top\[0\] must be a list of 2",
        ),
        (_token_output(logprobs=[{"logprob": "x", "top": []}]), r"logprobs\[0\]\.logprob must be a float"),
        (_token_output(logprobs=[]), "one entry per token"),
        (_prefill(sampling={"max_tokens": 0}), "sampling: max_tokens must be >= 1"),
        (_prefill(sampling={"bogus": 1}), "sampling: unknown field 'bogus'"),
        (_prefill(sampling={"stop": "x"}), "sampling.stop must be a list"),
        (_prefill(sampling={"n": 2}), "sampling.n must be 1"),
        (_prefill(sampling=None), "sampling must be a map"),
        ({"type": "worker_register", **_register_fields(role="router")}, "role must be one of"),
        (_decode_request(transport="udp"), "handoff.transport must be one of"),
        (_decode_request(transport="ipc"), "ipc must be set exactly when transport is 'ipc'"),
        (_decode_request(request_id="other"), "handoff.request_id must be 'r1'"),
        (_decode_request(num_blocks=0), "handoff.num_blocks must be >= 1"),
        ({**_payload(kv.KVFetch("r", 1, 1, LAYOUT, 1.0)), "timeout_s": -1}, "timeout_s must be a positive"),
        (
            {**_payload(kv.KVFetch("r", 1, 1, LAYOUT, 1.0)), "layout": {"dtype": "f", "shape": [1]}},
            "4 positive",
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
    for role in ("prefill", "decode", "mixed"):
        m.WorkerRegister("w", role, "h", 1, "tcp://a", None, {}, 16, 1, 1, 1, 1, "m")
    with pytest.raises(MessageError, match="role"):
        m.WorkerRegister("w", "router", "h", 1, "tcp://a", None, {}, 16, 1, 1, 1, 1, "m")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="logprobs"):
        m.TokenOutput("r", "w", 0, [1, 2], None, 1, 0, logprobs=[TokenLogprob(0.0)])
    with pytest.raises(MessageError, match="sampling.n must be 1"):
        m.GenerateRequest("r", [1], SamplingParams(n=2), None)
    with pytest.raises(MessageError, match=r"sampling.seed must be a int"):
        m.GenerateRequest("r", [1], SamplingParams(seed=2**64), None)  # msgpack cannot carry it
    with pytest.raises(MessageError, match=r"logprobs\[0\]\.top\[0\]\[0\] must be a int"):
        m.TokenOutput("r", "w", 0, [1], None, 1, 0, logprobs=[TokenLogprob(0.0, ((1.5, 0.0),))])  # type: ignore[arg-type]
    with pytest.raises(MessageError, match=r"events\[0\]\.hashes must be >= 0"):
        m.KVEventBatch("w", 1, [BlockRemoved((-1,))])


def test_nested_values_are_typed_on_both_sides() -> None:
    (request,) = [msg for msg in EXAMPLES if isinstance(msg, m.DecodeRequest)]
    assert msgpack.unpackb(encode(request))["sampling"] == GREEDY.to_dict()
    msg = decode(encode(request))
    assert isinstance(msg, m.DecodeRequest) and msg.sampling == GREEDY
    out = decode(encode(next(msg for msg in EXAMPLES if isinstance(msg, m.TokenOutput) and msg.logprobs)))
    assert isinstance(out, m.TokenOutput)
    assert out.finish_reason is FinishReason.STOP and out.finish_reason == "stop"
    assert out.logprobs == [TokenLogprob(-0.1, ((8, -0.1),)), TokenLogprob(float("-inf"), ())]
    assert msgpack.unpackb(encode(out))["logprobs"][0] == {"logprob": -0.1, "top": [[8, -0.1]]}
    batch = decode(encode(next(msg for msg in EXAMPLES if isinstance(msg, m.KVEventBatch))))
    assert isinstance(batch, m.KVEventBatch)
    assert [type(e) for e in batch.events] == [BlockStored, BlockStored, BlockRemoved, AllBlocksCleared]
    assert msgpack.unpackb(encode(batch))["events"][2] == {"kind": "removed", "hashes": [1]}


def test_a_malformed_work_request_keeps_its_request_id() -> None:
    with pytest.raises(MessageError) as err:
        decode(msgpack.packb(_prefill(sampling={"max_tokens": 0})))
    assert err.value.request_id == "r7"
    with pytest.raises(MessageError) as err:  # not a command that starts work
        decode(msgpack.packb({"type": "abort", "request_id": "r7", "extra": 1}))
    assert err.value.request_id is None
    with pytest.raises(MessageError) as err:  # an id that is not one
        decode(msgpack.packb({**_prefill(sampling={"max_tokens": 0}), "request_id": ""}))
    assert err.value.request_id is None


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


def test_a_token_batch_means_its_rows_as_token_outputs() -> None:
    batch = decode(encode(m.TokenBatch("decode-0", ["r1", "r2"], [3, 1], [[8], [9, 10]], [3, 40])))
    assert isinstance(batch, m.TokenBatch)
    assert batch.outputs() == [
        m.TokenOutput("r1", "decode-0", 3, [8], None, 3, 0),
        m.TokenOutput("r2", "decode-0", 1, [9, 10], None, 40, 0),
    ]
    with pytest.raises(MessageError, match="one entry per request id"):
        m.TokenBatch("d", ["r1", "r2"], [3], [[8], [9]], [3, 4])
    with pytest.raises(MessageError, match="token_ids rows"):
        m.TokenBatch("d", ["r1"], [3], [[]], [3])
    with pytest.raises(MessageError, match="empty id"):
        m.TokenBatch("d", [""], [3], [[1]], [3])
