"""Control messages between receiver and sender: one msgpack map per header frame, raw frames for data.

Every message carries "t" (its type), "rid" (request id) and "xid" (the receiver's number for this
fetch attempt, so replies to an earlier attempt of the same request are told apart). Peers may send
anything, so decoding validates every field and raises `ProtocolError`, never anything else.

receiver -> sender   fetch {rid, xid, src, layout, timeout, ...transport keys}
                     ack   {rid, xid}              (the blocks are copied: release DONE)
                     error {rid, xid, error}       (the receiver gave up: release FAILED)
                     done  {rid: "", xid: 0, rids}  (ipc: these publications were copied: release DONE)
sender -> receiver   data  {rid, xid, first, count, sums: bool, [nonce, epoch, hashes]} + one raw frame (tcp)
                     sums  {rid, xid, first, sums}            (tcp: right after each data, when it said so)
                     ready {rid, xid, nbytes, sums, nonce, epoch, hashes}                  (nccl)
                     error {rid, xid, error}

Verification fields (`verify.py`): `sums` is one int64 checksum per block (tcp: of the chunk at `first`;
nccl: of the whole buffer), or nil when the sender does not verify; a tcp `data` header's `sums` says
whether a `sums` message follows. `nonce`, `epoch` and `hashes` (the chain hash the publication
recorded for each served block, nil for a partly filled last block) bind the reply to a publication;
tcp sends them with the chunk at `first == 0`. ipc puts the same binding, and per published block
(`blocks`) its `hashes` and `sums`, in the publication endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from .config import validate_seconds
from .layout import CacheLayout, parse_block_ids

FETCH, ACK, ERROR, DATA, READY, DONE, SUMS = "fetch", "ack", "error", "data", "ready", "done", "sums"
MAX_ERROR_CHARS = 2000
MAX_HEADER_BYTES = 1 << 20  # headers are small; a bigger one is garbage


class ProtocolError(Exception):
    """A frame from a peer that does not follow the protocol."""


def encode(kind: str, request_id: str, xid: int, **fields: Any) -> bytes:
    return msgpack.packb({"t": kind, "rid": request_id, "xid": xid, **fields}, use_bin_type=True)


def encode_error(request_id: str, xid: int, error: str, **fields: Any) -> bytes:
    return encode(ERROR, request_id, xid, error=error[:MAX_ERROR_CHARS], **fields)


@dataclass(frozen=True)
class Header:
    """A decoded message header; `fields` is the whole map for transport-specific keys."""

    kind: str
    request_id: str
    xid: int
    fields: dict[str, Any]

    def get(self, name: str, kind: type | tuple[type, ...]) -> Any:
        """Field `name`, which must be of type `kind` (bools are not ints here)."""
        value = self.fields.get(name)
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
            raise ProtocolError(f"{self.kind} message: field {name!r} must be {_names(kind)}, got {value!r}")
        return value


def decode(frame: bytes | memoryview) -> Header:
    """Parse a header frame; ProtocolError for anything that is not a well-formed header."""
    if len(frame) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header frame of {len(frame)} bytes is too large")
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"undecodable header ({type(e).__name__})") from None
    if not isinstance(msg, dict):
        raise ProtocolError("header is not a map")
    kind, rid, xid = msg.get("t"), msg.get("rid"), msg.get("xid")
    if not isinstance(kind, str) or not isinstance(rid, str) or type(xid) is not int:
        raise ProtocolError("header lacks t/rid/xid")
    return Header(kind, rid, xid, msg)


@dataclass(frozen=True)
class FetchRequest:
    request_id: str
    xid: int
    src_block_ids: list[int]
    layout: CacheLayout
    timeout_s: float
    fields: dict[str, Any] = field(default_factory=dict)  # the whole map, for transport keys

    def encode(self, **extra: Any) -> bytes:
        return encode(
            FETCH,
            self.request_id,
            self.xid,
            src=self.src_block_ids,
            layout=self.layout.to_wire(),
            timeout=self.timeout_s,
            **extra,
        )

    @classmethod
    def parse(cls, header: Header) -> FetchRequest:
        error = validate_seconds("timeout", header.fields.get("timeout"))
        if error:
            raise ProtocolError(f"fetch: {error}")
        try:
            src = parse_block_ids("src", header.fields.get("src"), None)
            layout = CacheLayout.from_wire(header.fields.get("layout"))
        except ValueError as e:
            raise ProtocolError(f"fetch: {e}") from None
        return cls(header.request_id, header.xid, src, layout, float(header.fields["timeout"]), header.fields)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: type | tuple[type, ...]) -> str:
    return "/".join(k.__name__ for k in _as_tuple(kind))
