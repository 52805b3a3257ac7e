"""Control messages between a KV receiver (decode side) and the sender (prefill side) it pulls from.

They travel on the sender's ZMQ ROUTER socket, one message per header frame, encoded by the one codec
(`common.wire.codec`); bulk data rides in raw frames after a header. Every message names the
publication (`request_id`) and the receiver's attempt at it (`xid`: replies to an earlier attempt of
the same request are told apart; 0 where the receiver reads without fetching, ipc).

receiver -> sender   KVFetch   serve the publication (request_id, nonce) to me
                     KVAck     the blocks are copied: release DONE
                     KVError   the receiver gave up: release FAILED
                     KVCopied  (ipc) these publications were copied: release DONE
sender -> receiver   KVData    (tcp) `count` blocks from `first`, in one raw frame after the header
                     KVSums    (tcp) the checksums of the chunk at `first`, right behind its data
                     KVReady   (nccl) the blocks are gathered; `nbytes` follow on the pair's group
                     KVError   the fetch is refused or failed

Verification (kvtransfer/verify.py): a reply's `binding` repeats the publication's nonce, the
sender's epoch and the hash the publication recorded for each block it serves (tcp: with the chunk
at `first == 0`); `sums` are per-block checksums (nccl: packed little-endian int64s).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar

from common.wire.codec import Message, decode
from common.wire.wire_fields import Count, Id, MaybeHashes, MessageError, Positive, at_least

MAX_ERROR_CHARS = 2000
MAX_HEADER_BYTES = 1 << 20  # headers are small; a bigger one is garbage


@dataclass(frozen=True)
class KVBinding:
    """What ties a reply to one publication: its nonce, the sender's epoch, and the prompt chain's hash
    of each block served (None for a partly filled last block)."""

    nonce: Count
    epoch: Count
    hashes: MaybeHashes


@dataclass(frozen=True)
class BlockLayout:
    """What two caches must agree on for their blocks to be byte-compatible (kvtransfer/layout.py)."""

    dtype: Id
    shape: Annotated[list[int], at_least(1)]  # [num_layers, block_size, num_kv_heads, head_dim]

    def __post_init__(self) -> None:
        if len(self.shape) != 4:
            raise MessageError(f"layout.shape must be 4 positive ints, got {self.shape!r}")


@dataclass
class KVFetch(Message):
    """Receiver -> sender: serve publication `request_id`, whose `nonce` the hand-off carried, within
    `timeout_s`. nccl adds the pair the blocks travel on and pairs the receiver abandoned."""

    TYPE: ClassVar[str] = "kv_fetch"
    request_id: Id
    xid: Positive
    nonce: Count
    layout: BlockLayout
    timeout_s: float
    pair: str | None = None
    drop_pairs: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if not 0 < self.timeout_s < float("inf"):
            raise MessageError(f"timeout_s must be a positive finite number of seconds, got {self.timeout_s}")


@dataclass
class KVAck(Message):
    """Receiver -> sender: the blocks are in place; the publication is released DONE."""

    TYPE: ClassVar[str] = "kv_ack"
    request_id: Id
    xid: Count


@dataclass
class KVError(Message):
    """Either way: the transfer failed (`pair_broken`: the nccl pair must not be used again)."""

    TYPE: ClassVar[str] = "kv_error"
    request_id: Id
    xid: Count
    error: str
    pair_broken: bool = False

    def validate(self) -> None:
        self.error = self.error[:MAX_ERROR_CHARS]  # a peer's error text is logged, never trusted in size


@dataclass
class KVCopied(Message):
    """ipc receiver -> sender: these publications were copied; released DONE."""

    TYPE: ClassVar[str] = "kv_copied"
    request_ids: list[str]


@dataclass
class KVData(Message):
    """tcp sender -> receiver: blocks first..first+count-1 of the publication in the next raw frame;
    `sums`: whether a KVSums for them follows."""

    TYPE: ClassVar[str] = "kv_data"
    request_id: Id
    xid: Positive
    first: Count
    count: Positive
    sums: bool
    binding: KVBinding | None = None


@dataclass
class KVSums(Message):
    """tcp sender -> receiver: one checksum per block of the chunk at `first`."""

    TYPE: ClassVar[str] = "kv_sums"
    request_id: Id
    xid: Positive
    first: Count
    sums: list[int]


@dataclass
class KVReady(Message):
    """nccl sender -> receiver: `nbytes` of gathered blocks follow on the pair's group."""

    TYPE: ClassVar[str] = "kv_ready"
    request_id: Id
    xid: Positive
    nbytes: Positive
    sums: bytes | None
    binding: KVBinding


KV_MESSAGES = (KVFetch, KVAck, KVError, KVCopied, KVData, KVSums, KVReady)


def decode_kv(frame: bytes | memoryview) -> Message:
    """A KV control message from a header frame; MessageError for anything else (peers may send
    anything, and a header of more than MAX_HEADER_BYTES is garbage before it is parsed)."""
    if len(frame) > MAX_HEADER_BYTES:
        raise MessageError(f"header frame of {len(frame)} bytes is too large")
    msg = decode(frame)
    if not isinstance(msg, KV_MESSAGES):
        raise MessageError(f"{msg.TYPE} is not a KV control message")
    return msg
