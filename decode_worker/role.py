"""The decode role's request handling (the engine loop itself is common/worker/service.py).

A request's life here: DecodeRequest -> Sequence(prompt + first token) -> wait in `pending` until the
cache has room for the prompt's blocks (never dropped) -> scheduler.reserve_for_transfer ->
receiver.fetch -> DONE: complete_transfer (joins the decode batch) / FAILED: fail_transfer (the
engine recomputes the prompt here) -> one TokenOutput per request per step, index = completion
position of its token (the first token, index 0, came from the prefill worker).

Aborting a sequence whose transfer is in flight is deferred until the receiver reports it: until
then the transfer may still write its destination blocks, so they must not go back to the pool.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from common.llm_engine import LLMEngine, StepResult
from common.messages import DecodeRequest, Message, TokenOutput
from common.sequence import Sequence, SequenceStatus
from common.worker.outputs import wire_logprobs
from common.worker.role import LoadReport, WorkerContext, WorkerRole
from decode_worker.admission import sequence_from_request, transferable
from decode_worker.receivers import KVReceivers
from kvtransfer import TransferResult, TransferStatus

log = logging.getLogger(__name__)
TRANSFER_POLL_S = 0.002  # a waiting transfer delays the second token: look often while one is in flight


@dataclass
class DecodeJob:
    request: DecodeRequest
    seq: Sequence
    kv_bytes: int = 0
    kv_seconds: float = 0.0
    kv_reported: bool = False
    next_index: int = 1  # completion position of the next token to send (0 came from the prefill worker)
    abort_when_settled: bool = False  # aborted while its transfer may still write the blocks


class DecodeRole(WorkerRole):
    name = "decode"
    request_type = DecodeRequest

    def __init__(self) -> None:
        self.jobs: dict[str, DecodeJob] = {}
        self.pending: deque[str] = deque()  # waiting for room to reserve the prompt's blocks, FIFO
        self.receivers: KVReceivers | None = None

    def start(self, ctx: WorkerContext) -> dict:
        self.ctx = ctx
        self.engine: LLMEngine = ctx.engine
        cfg = ctx.config
        kv_cache = self.engine.runner.kv_cache
        self.receivers = KVReceivers(cfg.kv_transport, kv_cache, ctx.host, cfg.kv_fetch_timeout_s)
        self.receivers.start()
        return self.receivers.summary()

    def close(self) -> None:
        if self.receivers is not None:
            self.receivers.close()

    # ---- commands ------------------------------------------------------------------------------

    def submit(self, msg: Message) -> None:
        assert isinstance(msg, DecodeRequest)
        rid = msg.request_id
        if rid in self.jobs:
            log.warning("ignoring duplicate DecodeRequest %s", rid)
            return
        try:
            seq = sequence_from_request(self.engine, msg)
        except ValueError as e:
            self.ctx.fail(rid, str(e), retryable=False)
            return
        self.jobs[rid] = DecodeJob(msg, seq)
        if transferable(msg, self.engine.config.kvcache_block_size):
            self.pending.append(rid)
            self._admit_pending()
        else:
            log.warning("%s: src_block_ids do not cover the prompt; recomputing it here", rid)
            self.engine.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        job = self.jobs.get(request_id)
        if job is None:
            return False
        if job.seq.status is SequenceStatus.TRANSFERRING:
            job.abort_when_settled = True  # finished in poll() once the receiver reports it
            return True
        del self.jobs[request_id]
        if request_id in self.pending:
            self.pending.remove(request_id)  # holds no blocks yet
        else:
            self.engine.abort([request_id])
        return True

    def snapshot(self, msg: Message) -> None:
        # The router only mirrors prefill workers' caches; a decode worker has nothing to report.
        log.debug("ignoring %s: decode workers publish no cache index", msg.TYPE)

    # ---- the loop ------------------------------------------------------------------------------

    def poll(self) -> None:
        for result in self.receivers.poll():
            self._on_transfer(result)
        self._admit_pending()

    def on_step(self, result: StepResult) -> None:
        # One message per request per step. Positions are counted here rather than read off the
        # sequence, so they stay right even if a step reports several tokens of one request.
        tokens: dict[str, list[int]] = {}
        finished: set[str] = set()
        for update in result.updates:
            rid = update.seq.request_id
            if rid in self.jobs and update.new_token_id is not None:
                tokens.setdefault(rid, []).append(update.new_token_id)
                if update.finished:
                    finished.add(rid)
        for rid, ids in tokens.items():
            self._send_tokens(self.jobs[rid], ids, rid in finished)
            if rid in finished:
                del self.jobs[rid]

    def after_iteration(self) -> None:
        # No one subscribes to a decode worker's cache events; drain them so they do not pile up.
        self.engine.drain_kv_events()

    def expire(self, now: float) -> None:
        for rid, job in list(self.jobs.items()):
            deadline = job.request.deadline
            if deadline is None or deadline >= now or job.abort_when_settled:
                continue
            self.abort(rid)
            self.ctx.finish_aborted(rid, job.next_index, len(job.request.prompt_token_ids))

    def poll_interval(self) -> float | None:
        return TRANSFER_POLL_S if self.engine.scheduler.transferring or self.pending else None

    def load(self) -> LoadReport:
        sched, bm = self.engine.scheduler, self.engine.block_manager
        return LoadReport(
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            num_waiting=len(sched.waiting) + len(self.pending) + len(sched.transferring),
            num_running=len(sched.running),
            queued_prefill_tokens=sched.queued_prefill_tokens,
        )

    def fail_all(self, error: str) -> None:
        for rid in list(self.jobs):
            self.ctx.fail(rid, error, retryable=True)
            try:
                self.abort(rid)
            except Exception:  # the engine may be inconsistent: at least forget the request
                log.exception("could not abort %s", rid)
                self.jobs.pop(rid, None)

    # ---- helpers -------------------------------------------------------------------------------

    def _admit_pending(self) -> None:
        sched = self.engine.scheduler
        while self.pending:
            job = self.jobs[self.pending[0]]
            if not sched.reserve_for_transfer(job.seq):
                return  # no room yet: retried after the next step frees blocks
            self.pending.popleft()
            self._start_fetch(job)

    def _start_fetch(self, job: DecodeJob) -> None:
        req, seq = job.request, job.seq
        dst = seq.block_table[: len(req.src_block_ids)]
        error = self.receivers.fetch(req.request_id, req.kv_endpoint, req.src_block_ids, dst)
        if error is not None:
            log.warning("%s: cannot fetch KV (%s); recomputing the prompt here", req.request_id, error)
            self.engine.scheduler.fail_transfer(seq)

    def _on_transfer(self, result: TransferResult) -> None:
        job = self.jobs.get(result.request_id)
        if job is None or job.seq.status is not SequenceStatus.TRANSFERRING:
            return  # a transfer of a request already gone
        if job.abort_when_settled:
            del self.jobs[result.request_id]
            self.engine.abort([result.request_id])
        elif result.status is TransferStatus.DONE:
            job.kv_bytes, job.kv_seconds = result.num_bytes, result.seconds
            self.engine.scheduler.complete_transfer(job.seq)
        else:
            log.warning("%s: KV transfer failed (%s); recomputing here", result.request_id, result.error)
            self.engine.scheduler.fail_transfer(job.seq)

    def _send_tokens(self, job: DecodeJob, token_ids: list[int], finished: bool) -> None:
        seq = job.seq
        # Transfer figures go out once per request (the router sums what it gets).
        kv_bytes, kv_seconds = (0, 0.0) if job.kv_reported else (job.kv_bytes, job.kv_seconds)
        job.kv_reported = True
        msg = TokenOutput(
            request_id=job.request.request_id,
            worker_id=self.ctx.worker_id,
            index=job.next_index,
            token_ids=token_ids,
            finish_reason=seq.finish_reason if finished else None,
            num_prompt_tokens=seq.num_prompt_tokens,
            cached_tokens=0,
            logprobs=wire_logprobs(seq, len(token_ids)),
            kv_transfer_bytes=kv_bytes,
            kv_transfer_seconds=kv_seconds,
        )
        job.next_index += len(token_ids)
        self.ctx.channels.to_router(msg)
