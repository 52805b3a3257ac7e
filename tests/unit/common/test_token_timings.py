"""TokenOutput.timings: per-stage seconds a worker reports once per request (validated on both ends)."""

from __future__ import annotations

import math

import msgpack
import pytest

from common.wire.messages import TIMING_STAGES, MessageError, TokenOutput, decode, encode


def _out(timings) -> TokenOutput:
    return TokenOutput("r", "w", 0, [1], None, 3, 0, timings=timings)


def test_timings_round_trip_and_ints_widen() -> None:
    msg = _out({"prefill_queue": 0, "prefill": 0.25, "transfer": 0.001, "decode_admission": 1})
    back = decode(encode(msg))
    assert back == msg and back.timings == {
        "prefill_queue": 0.0,
        "prefill": 0.25,
        "transfer": 0.001,
        "decode_admission": 1.0,
    }
    assert all(type(v) is float for v in back.timings.values())
    assert _out(None).timings is None and decode(encode(_out({}))).timings == {}
    assert set(TIMING_STAGES) == {"prefill_queue", "prefill", "transfer", "decode_admission"}


@pytest.mark.parametrize(
    ("timings", "match"),
    [
        ({"decode": 1.0}, "timings keys"),  # the router measures decode itself
        ({"prefill": -0.1}, r"timings\['prefill'\]"),
        ({"prefill": math.inf}, "finite"),
        ({"prefill": math.nan}, "finite"),
        ({"prefill": "fast"}, r"timings\['prefill'\]"),
        ({"prefill": True}, r"timings\['prefill'\]"),
        ([0.1], "timings"),
    ],
)
def test_bad_timings_name_the_field(timings, match) -> None:
    with pytest.raises(MessageError, match=match):
        _out(timings)
    payload = {
        "type": "token_output",
        "request_id": "r",
        "worker_id": "w",
        "index": 0,
        "token_ids": [1],
        "finish_reason": None,
        "num_prompt_tokens": 3,
        "cached_tokens": 0,
        "timings": timings,
    }
    with pytest.raises(MessageError, match="timings"):
        decode(msgpack.packb(payload))
