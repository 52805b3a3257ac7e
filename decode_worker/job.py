"""One request on a decode (or mixed) worker: its command, its sequence and where its stream stands
(decode_worker/role.py keeps one per request id)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from common.core.sequence import Sequence, SequenceStatus
from common.wire import request_log
from common.wire.messages import DecodeRequest, GenerateRequest
from common.worker.outputs import prefill_timings

ROLE_LOG = logging.getLogger("decode_worker.role")  # a job's lines are the role's


@dataclass
class DecodeJob:
    request: DecodeRequest | GenerateRequest
    seq: Sequence
    next_index: int  # completion position of the next token to send
    kv_bytes: int = 0
    kv_seconds: float = 0.0
    kv_reported: bool = False
    abort_when_settled: bool = False  # aborted while its transfer may still write the blocks
    fetch_started_at: float | None = None  # monotonic, for the stage breakdown
    fetch_done_at: float | None = None
    plain: bool = False  # its next tokens travel as TokenBatch rows (set once its first message is out)

    @property
    def transfer_in_flight(self) -> bool:
        """The receiver may still write its KV into its blocks (reserved, not yet reported). A
        sequence whose KV arrived stays TRANSFERRING while its grammar's matcher is built
        (common/runner/grammar_admission.py), but nothing writes its blocks any more."""
        return self.seq.status is SequenceStatus.TRANSFERRING and self.fetch_done_at is None

    @property
    def log(self) -> logging.LoggerAdapter:
        """This request's logger: its lines name the request's X-Request-Id (common/wire/request_log.py)."""
        return request_log.for_request(ROLE_LOG, self.request.log_name)

    def stage_timings(self, now: float) -> dict[str, float] | None:
        """Stage seconds for the request's first message from this worker."""
        if isinstance(self.request, GenerateRequest):
            return prefill_timings(self.seq, now)
        if self.fetch_started_at is None or self.fetch_done_at is None:
            return None  # recomputed here: the transfer never happened
        return {
            "decode_admission": self.fetch_started_at - self.seq.created_at,
            "transfer": self.fetch_done_at - self.fetch_started_at,
        }
