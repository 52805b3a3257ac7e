"""Wire messages: round trips and strict validation (fuzzing: test_messages_fuzz.py)."""

from __future__ import annotations

import msgpack
import pytest

from common.wire import cache_messages as cache
from common.wire import kv_messages as kv
from common.wire import messages as m
from common.wire import probe_messages as probe
from common.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from common.wire.logprobs import TokenLogprob
from common.wire.messages import MessageError, decode, encode
from common.wire.sampling_params import FinishReason, SamplingParams
from tests.unit.common.wire.message_examples import EXAMPLES, GREEDY, LAYOUT


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda msg: msg.TYPE)
def test_round_trip(msg: m.Message) -> None:
    assert decode(encode(msg)) == msg


def test_probe_results_say_their_rate() -> None:
    assert probe.KVProbeResult("p", "a", "b", "tcp", 10**9, 0.5).gbps == 2.0
    assert probe.KVProbeResult("p", "a", "b", "tcp", 10**9, 0.5, "broken").gbps == 0.0
    with pytest.raises(MessageError, match="num_bytes"):
        probe.KVProbeRequest("p", "b", "tcp://h:1", 0)


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
    with pytest.raises(ValueError, match=r"seed must be in"):  # msgpack could not carry it either
        m.GenerateRequest("r", [1], SamplingParams(seed=2**64), None)
    with pytest.raises(MessageError, match=r"logprobs\[0\]\.top\[0\]\[0\] must be a int"):
        m.TokenOutput("r", "w", 0, [1], None, 1, 0, logprobs=[TokenLogprob(0.0, ((1.5, 0.0),))])  # type: ignore[arg-type]
    with pytest.raises(MessageError, match=r"events\[0\]\.hashes must be >= 0"):
        cache.KVEventBatch("w", 1, [BlockRemoved((-1,))])


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
    batch = decode(encode(next(msg for msg in EXAMPLES if isinstance(msg, cache.KVEventBatch))))
    assert isinstance(batch, cache.KVEventBatch)
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
