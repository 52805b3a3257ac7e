"""The prefill role's request handling (the engine loop itself is common/worker/service.py).

A request's life here: PrefillRequest -> engine (role "prefill") -> first token sampled ->
  * finished already (EOS / stop token / max_tokens == 1 / max_model_len): one TokenOutput with
    finish_reason; no decode worker is involved and the engine has freed the blocks;
  * otherwise: TokenOutput(index 0) to the router at once, then publish the prompt's blocks and send
    DecodeRequest to the decode worker. The blocks stay pinned (scheduler.handed_off) until the sender
    reports the publication released (DONE: acknowledged; FAILED: lease expired or transfer failed —
    the decode worker then recomputes), and then fall into the prefix-cache LRU.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from common.llm_engine import LLMEngine, StepResult
from common.messages import DecodeRequest, Message, PrefillRequest, TokenOutput
from common.sequence import Sequence
from common.worker.outputs import wire_logprobs
from common.worker.role import LoadReport, WorkerContext, WorkerRole
from kvtransfer import TransferStatus
from prefill_worker.events import EventPublisher
from prefill_worker.senders import KVSenders

log = logging.getLogger(__name__)
RELEASE_POLL_S = 0.01  # how often to look for acknowledged hand-offs while otherwise idle


@dataclass
class PrefillJob:
    request: PrefillRequest
    seq: Sequence
    handed_off: bool = False


class PrefillRole(WorkerRole):
    name = "prefill"
    request_type = PrefillRequest
    publishes_events = True

    def __init__(self) -> None:
        self.jobs: dict[str, PrefillJob] = {}
        self.senders: KVSenders | None = None

    def start(self, ctx: WorkerContext) -> dict:
        self.ctx = ctx
        self.engine: LLMEngine = ctx.engine
        self.events = EventPublisher(ctx.worker_id, ctx.channels)
        cfg = ctx.config
        self.senders = KVSenders(cfg.kv_transport, self.engine.runner.kv_cache, ctx.host, cfg.kv_lease_s)
        self.senders.start()
        return self.senders.summary()

    def close(self) -> None:
        if self.senders is not None:
            self.senders.close()

    # ---- commands ------------------------------------------------------------------------------

    def submit(self, msg: Message) -> None:
        assert isinstance(msg, PrefillRequest)
        rid = msg.request_id
        if rid in self.jobs:
            log.warning("ignoring duplicate PrefillRequest %s", rid)
            return
        try:
            seq = self.engine.add_request(msg.prompt_token_ids, msg.sampling, rid)
        except ValueError as e:  # the same request would fail on every worker
            self.ctx.fail(rid, str(e), retryable=False)
            return
        self.jobs[rid] = PrefillJob(msg, seq)

    def abort(self, request_id: str) -> bool:
        job = self.jobs.pop(request_id, None)
        if job is None:
            return False
        self.senders.cancel(request_id)  # first: nothing may read the blocks once they are freed
        self.engine.abort([request_id])
        return True

    def snapshot(self, msg: Message) -> None:
        hashes = self.engine.block_manager.cached_hashes()
        self.events.snapshot(self.engine.drain_kv_events(), hashes)

    # ---- the loop ------------------------------------------------------------------------------

    def on_step(self, result: StepResult) -> None:
        for update in result.updates:
            job = self.jobs.get(update.seq.request_id)
            if job is None or update.new_token_id is None:
                continue
            if update.finished:
                del self.jobs[job.request.request_id]
                self._send_first_token(job, update.new_token_id, job.seq.finish_reason)
            elif update.handed_off:
                self._send_first_token(job, update.new_token_id, None)
                self._hand_off(job, update.new_token_id)

    def poll(self) -> None:
        for release in self.senders.poll_released():
            job = self.jobs.pop(release.request_id, None)
            if job is None:
                continue
            if release.status is TransferStatus.FAILED:
                log.warning("hand-off of %s ended without ack: %s", release.request_id, release.error)
            self.engine.scheduler.release(job.seq)

    def after_iteration(self) -> None:
        self.events.flush(self.engine.drain_kv_events())

    def expire(self, now: float) -> None:
        # Handed-off requests are the decode worker's to expire; their blocks go with the lease.
        for rid, job in list(self.jobs.items()):
            deadline = job.request.deadline
            if not job.handed_off and deadline is not None and deadline < now:
                self.abort(rid)
                self.ctx.fail(rid, "deadline exceeded before the first token", retryable=False)

    def poll_interval(self) -> float | None:
        return RELEASE_POLL_S if self.jobs else None

    def load(self) -> LoadReport:
        sched, bm = self.engine.scheduler, self.engine.block_manager
        return LoadReport(
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            num_waiting=len(sched.waiting),
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

    def _send_first_token(self, job: PrefillJob, token: int, reason: str | None) -> None:
        seq = job.seq
        msg = TokenOutput(
            request_id=job.request.request_id,
            worker_id=self.ctx.worker_id,
            index=0,
            token_ids=[token],
            finish_reason=reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            cached_tokens=seq.num_prefix_hit_tokens,
            logprobs=wire_logprobs(seq, 1),
        )
        self.ctx.channels.to_router(msg)

    def _hand_off(self, job: PrefillJob, token: int) -> None:
        req, seq = job.request, job.seq
        num_blocks = math.ceil(seq.num_prompt_tokens / self.engine.config.kvcache_block_size)
        blocks = seq.block_table[:num_blocks]
        transport = self.senders.choose(req.decode_command_addr)
        try:
            endpoint = self.senders.publish(req.request_id, transport, blocks)
        except (ValueError, RuntimeError) as e:  # our own bug or a closed sender: do not pin forever
            log.error("cannot publish %s: %s", req.request_id, e)
            del self.jobs[req.request_id]
            self.engine.scheduler.release(seq)
            self.ctx.fail(req.request_id, f"KV hand-off failed: {e}", retryable=True)
            return
        job.handed_off = True
        decode_req = DecodeRequest(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            first_token_id=token,
            sampling=req.sampling,
            kv_endpoint=endpoint,
            src_block_ids=list(blocks),
            prefill_worker_id=self.ctx.worker_id,
            deadline=req.deadline,
        )
        self.ctx.channels.to_peer(req.decode_command_addr, decode_req)
