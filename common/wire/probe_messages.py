"""KV path probes (docs/protocol.md, "KV path probes"): the router measures each prefill/decode
pair's KV transfer once, when the pair forms (router/kv_probes.py), by having the prefill worker move
scratch blocks to the decode worker (decode_worker/probe.py) and report the time taken. Importing
`common.wire.messages` registers these messages with the codec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from common.wire.codec import Message
from common.wire.handoff import HandOff
from common.wire.wire_fields import Count, Id, MessageError, Positive, at_least


@dataclass
class KVProbeRequest(Message):
    """Router -> prefill worker command socket: measure the KV path to a decode target by moving about
    `num_bytes` of (scratch) blocks there; sent once per prefill/decode pair when the pair forms."""

    TYPE: ClassVar[str] = "kv_probe_request"
    probe_id: Id
    decode_worker_id: Id
    decode_command_addr: Id
    num_bytes: Positive
    reply_to: str | None = None  # the front that asked: where the answer goes


@dataclass
class KVProbe(Message):
    """Prefill worker -> decode worker command socket: fetch the blocks `handoff` publishes into scratch
    memory (never the engine's cache), time it and report a KVProbeResult to the router."""

    TYPE: ClassVar[str] = "kv_probe"
    probe_id: Id
    prefill_worker_id: Id
    handoff: HandOff
    reply_to: str | None = None  # the front that asked for the probe: where the result goes

    def validate(self) -> None:
        if self.handoff.request_id != self.probe_id:
            raise MessageError(f"handoff.request_id must be {self.probe_id!r}")


@dataclass
class KVProbeResult(Message):
    """Decode worker (or, when it cannot publish, the prefill worker) -> router inbox: how the probe
    went. `transport` is the one the pair uses; `error` is set when the probe failed."""

    TYPE: ClassVar[str] = "kv_probe_result"
    probe_id: Id
    prefill_worker_id: Id
    decode_worker_id: Id
    transport: str
    num_bytes: Count
    seconds: Annotated[float, at_least(0)]
    error: str | None = None

    @property
    def gbps(self) -> float:
        """Measured GB/s (0 for a failed probe)."""
        return self.num_bytes / self.seconds / 1e9 if self.error is None and self.seconds > 0 else 0.0
