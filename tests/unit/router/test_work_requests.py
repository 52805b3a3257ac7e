"""The command that starts a sequence, built without per-field checks: what the worker decodes (with
every check) is exactly what the front meant, for a local and for a remote route."""

from __future__ import annotations

import pytest

from common.wire.messages import GenerateRequest, PrefillRequest, decode, encode
from common.wire.sampling_params import SamplingParams
from router.disagg import LOCAL, REMOTE, Decision
from router.route_planner import Route
from router.work_requests import work_request

PROMPT = [5, 17, 300, 2]
SAMPLING = SamplingParams(temperature=0.7, max_tokens=9, seed=3)
PARTS = {"deadline": 1.8e9, "log_id": "trace-1", "reply_to": "tcp://10.0.0.1:7000"}


def _route(kind: str) -> Route:
    decode_id = "mixed-0" if kind == LOCAL else "decode-1"
    prefill_id = "mixed-0" if kind == LOCAL else "prefill-0"
    return Route(Decision(kind, None, None), prefill_id, decode_id, 4, 0, 4, 1)


def test_a_local_route_starts_with_a_generate_request() -> None:
    msg = work_request("cmpl-1-0", PROMPT, SAMPLING, _route(LOCAL), decode_command_addr=None, **PARTS)
    got = decode(encode(msg))
    assert isinstance(got, GenerateRequest) and got == msg
    assert (got.prompt_token_ids, got.sampling, got.reply_to, got.log_id) == (
        PROMPT,
        SAMPLING,
        PARTS["reply_to"],
        "trace-1",
    )


def test_a_remote_route_names_the_decode_target() -> None:
    addr = "tcp://10.0.0.2:7100"
    msg = work_request("cmpl-2-0", PROMPT, SAMPLING, _route(REMOTE), decode_command_addr=addr, **PARTS)
    got = decode(encode(msg))
    assert isinstance(got, PrefillRequest) and got == msg
    assert (got.decode_worker_id, got.decode_command_addr, got.deadline) == ("decode-1", addr, 1.8e9)


def test_a_remote_route_without_the_decode_address_is_refused() -> None:
    with pytest.raises(ValueError, match="decode_command_addr"):
        work_request("cmpl-3-0", PROMPT, SAMPLING, _route(REMOTE), decode_command_addr=None, **PARTS)
