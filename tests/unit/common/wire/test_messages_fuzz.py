"""Wire messages never crash the decoder: arbitrary bytes, tagged maps with random fields, and valid
messages with one field mutated all end in a message or a MessageError."""

from __future__ import annotations

import contextlib

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from common.wire import messages as m
from common.wire.messages import MessageError, decode, encode
from tests.unit.common.wire.message_examples import EXAMPLES


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
