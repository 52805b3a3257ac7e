"""The hand-off record and the KV control messages: the rules they hold wherever they are built."""

from __future__ import annotations

import msgpack
import pytest

from common.wire.blocks import check_block_ids
from common.wire.codec import encode
from common.wire.handoff import TRANSPORTS, HandOff, IpcExport, NcclStore
from common.wire.kv_messages import MAX_ERROR_CHARS, MAX_HEADER_BYTES, KVAck, KVError, decode_kv
from common.wire.messages import Abort
from common.wire.wire_fields import MessageError

IPC = IpcExport(12, 1.7e9, {"handle": b"h"}, [7, 3], [11, None], b"\x00" * 16)


def test_each_transport_carries_exactly_its_own_part() -> None:
    assert TRANSPORTS == ("tcp", "ipc", "nccl")
    HandOff("tcp", "tcp://h:1", "r", 1, 2, 2)
    HandOff("ipc", "tcp://h:1", "r", 1, 2, 2, ipc=IPC)
    HandOff("nccl", "tcp://h:1", "r", 1, 2, 2, nccl=NcclStore("h", 3, "gloo"))
    with pytest.raises(MessageError, match="nccl must be set exactly"):
        HandOff("nccl", "tcp://h:1", "r", 1, 2, 2)
    with pytest.raises(MessageError, match="ipc must be set exactly"):
        HandOff("tcp", "tcp://h:1", "r", 1, 2, 2, ipc=IPC)
    with pytest.raises(MessageError, match="transport must be one of"):
        HandOff("udp", "tcp://h:1", "r", 1, 2, 2)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"nonce": -1}, "nonce must be >= 0"),
        ({"address": ""}, "address must not be empty"),
        ({"num_blocks": 3}, r"ipc.block_ids must hold num_blocks \(3\)"),
        ({"ipc": IpcExport(12, 1.0, {}, [1], [None], None)}, r"ipc.block_ids must hold num_blocks \(2\)"),
    ],
)
def test_a_bad_handoff_fails_where_it_is_built(kwargs: dict, field: str) -> None:
    base = dict(transport="ipc", address="tcp://h:1", request_id="r", nonce=1, epoch=2, num_blocks=2, ipc=IPC)
    with pytest.raises(MessageError, match=field):
        HandOff(**{**base, **kwargs})


def test_published_block_ids_follow_the_one_rule() -> None:
    with pytest.raises(MessageError, match="block_ids must not repeat a block"):
        IpcExport(12, 1.0, {}, [4, 4], [None, None], None)
    with pytest.raises(MessageError, match="hashes must have one entry per block"):
        IpcExport(12, 1.0, {}, [4, 5], [None], None)
    assert check_block_ids("ids", (3, 1, 0), 4) == [3, 1, 0]
    for ids, error in (([], "non-empty"), ([True], "only ints"), ([4], r"\[0, 4\)"), ([-1], "lie in")):
        with pytest.raises(ValueError, match=error):
            check_block_ids("ids", ids, 4)


def test_decode_kv_takes_only_kv_control_messages() -> None:
    assert decode_kv(encode(KVAck("r", 3))) == KVAck("r", 3)
    with pytest.raises(MessageError, match="not a KV control message"):
        decode_kv(encode(Abort("r")))
    with pytest.raises(MessageError, match="too large"):
        decode_kv(msgpack.packb({"type": "kv_ack", "pad": "x" * MAX_HEADER_BYTES}))


def test_a_peer_error_text_is_bounded() -> None:
    assert len(KVError("r", 1, "x" * (3 * MAX_ERROR_CHARS)).error) == MAX_ERROR_CHARS


def test_served_hashes_may_have_gaps_but_no_negatives() -> None:
    from common.wire.kv_messages import KVBinding, KVReady

    ready = KVReady("r", 1, 8, None, KVBinding(1, 2, [2**64 - 1, None]))
    assert decode_kv(encode(ready)) == ready
    for bad, error in (([-1, None], ">= 0"), ([1.5], "list of ints"), ([2**64], "cannot carry")):
        with pytest.raises(MessageError, match=error):
            KVReady("r", 1, 8, None, KVBinding(1, 2, bad))
