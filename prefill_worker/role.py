"""The prefill role's request handling (the engine loop itself is common/worker/service.py).

A request's life here: PrefillRequest -> engine (role "prefill") -> first token sampled ->
  * finished already (EOS / stop token / max_tokens == 1 / max_model_len): one TokenOutput with
    finish_reason; no decode worker is involved and the engine has freed the blocks;
  * otherwise: TokenOutput(index 0) to the router at once, then publish the prompt's blocks and send
    DecodeRequest to the decode worker. The blocks stay pinned (handed off) until the sender reports
    the publication released (DONE: acknowledged; FAILED: lease expired or transfer failed — the
    decode worker then recomputes); `engine.release_handoff` then drops them into the prefix-cache LRU.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from common.core.sequence import Sequence
from common.core.step_records import StepResult
from common.wire import request_log
from common.wire.messages import DecodeRequest, Message, PrefillRequest, TokenOutput
from common.wire.probe_messages import KVProbe, KVProbeRequest, KVProbeResult
from common.worker.outputs import prefill_timings, wire_logprobs
from common.worker.role import WorkerContext, WorkerRole
from kvtransfer import KVTransferConfig, TransferStatus
from kvtransfer.peers import KVSenderSet

log = logging.getLogger(__name__)
RELEASE_POLL_S = 0.01  # how often to look for acknowledged hand-offs while otherwise idle


@dataclass
class PrefillJob:
    request: PrefillRequest
    seq: Sequence
    handed_off: bool = False

    @property
    def log(self) -> logging.LoggerAdapter:
        """This request's logger: its lines name the request's X-Request-Id (common/wire/request_log.py)."""
        return request_log.for_request(log, self.request.log_name)


class PrefillRole(WorkerRole):
    name = "prefill"
    request_types = (PrefillRequest,)
    publishes_events = True
    jobs: dict[str, PrefillJob]
    kv: KVSenderSet | None

    def open_kv(self, ctx: WorkerContext) -> KVSenderSet:
        cfg = ctx.config
        config = KVTransferConfig(
            transport=cfg.kv_transport, host=ctx.host, lease_s=cfg.kv_lease_s, curve=cfg.curve
        )
        return KVSenderSet(ctx.engine.kv_cache, config)

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
            self.ctx.fail(rid, str(e), retryable=False, reply_to=msg.reply_to, invalid=True)
            return
        self.jobs[rid] = PrefillJob(msg, seq)
        log.debug("%s: prefilling %d prompt tokens", rid, len(msg.prompt_token_ids))

    def probe(self, msg: Message) -> None:
        """Publish about `num_bytes` of blocks for the decode target to time (KVProbe). They are only
        read, so any blocks do: their content is not looked at, and the engine keeps using them."""
        if not isinstance(msg, KVProbeRequest):
            return super().probe(msg)
        kv = self.engine.kv_cache
        block_bytes = kv[:, :, 0].numel() * kv.element_size()
        blocks = list(range(max(1, min(kv.shape[2], -(-msg.num_bytes // block_bytes)))))
        try:
            handoff = self.kv.publish(msg.probe_id, msg.decode_command_addr, blocks)
        except (ValueError, RuntimeError) as e:
            error = f"cannot publish the probe: {e}"
            failed = KVProbeResult(
                msg.probe_id, self.ctx.worker_id, msg.decode_worker_id, "none", 0, 0.0, error
            )
            self.ctx.channels.to_front(msg.reply_to, failed)
            return
        probe = KVProbe(msg.probe_id, self.ctx.worker_id, handoff, msg.reply_to)
        self.ctx.channels.to_peer(msg.decode_command_addr, probe)

    def abort(self, request_id: str) -> bool:
        job = self.jobs.pop(request_id, None)
        if job is None:
            return False
        self.kv.cancel(request_id)  # first: nothing may read the blocks once they are freed
        self.engine.abort([request_id])
        job.log.debug("%s: aborted", request_id)
        return True

    # ---- the loop ------------------------------------------------------------------------------

    def on_step(self, result: StepResult) -> None:
        for update in result.updates:
            job = self.jobs.get(update.seq.request_id)
            if job is None or update.new_token_id is None:
                continue
            if update.finished:
                del self.jobs[job.request.request_id]
                self._send_first_token(job, update.new_token_id, job.seq.finish_reason)
                job.log.debug(
                    "%s: finished at the first token (%s)", job.request.request_id, job.seq.finish_reason
                )
            elif update.handed_off:
                self._send_first_token(job, update.new_token_id, None)
                self._hand_off(job, update.new_token_id)

    def poll(self) -> None:
        for release in self.kv.poll_released():
            job = self.jobs.pop(release.request_id, None)
            if job is None:
                continue
            if release.status is TransferStatus.FAILED:
                job.log.warning("hand-off of %s ended without ack: %s", release.request_id, release.error)
            self.engine.release_handoff(job.seq)

    def expire(self, now: float) -> None:
        # Handed-off requests are the decode worker's to expire; their blocks go with the lease.
        for rid, job in list(self.jobs.items()):
            deadline = job.request.deadline
            if not job.handed_off and deadline is not None and deadline < now:
                self.abort(rid)
                self.ctx.fail(
                    rid,
                    "deadline exceeded before the first token",
                    retryable=False,
                    reply_to=job.request.reply_to,
                )

    def poll_interval(self) -> float | None:
        return RELEASE_POLL_S if self.jobs else None

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
            timings=prefill_timings(seq, time.monotonic()),
        )
        self.ctx.channels.to_front(job.request.reply_to, msg)

    def _hand_off(self, job: PrefillJob, token: int) -> None:
        req, seq = job.request, job.seq
        blocks = self.engine.prompt_block_ids(seq)
        hashes = seq.full_block_hashes(seq.num_prompt_tokens)  # what the decode side checks them against
        try:
            handoff = self.kv.publish(req.request_id, req.decode_command_addr, blocks, hashes)
        except (ValueError, RuntimeError) as e:  # our own bug or a closed sender: do not pin forever
            job.log.error("cannot publish %s: %s", req.request_id, e)
            del self.jobs[req.request_id]
            self.engine.release_handoff(seq)
            self.ctx.fail(req.request_id, f"KV hand-off failed: {e}", retryable=True, reply_to=req.reply_to)
            return
        job.handed_off = True
        decode_req = DecodeRequest(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            first_token_id=token,
            sampling=req.sampling,
            handoff=handoff,
            prefill_worker_id=self.ctx.worker_id,
            deadline=req.deadline,
            log_id=req.log_id,
            reply_to=req.reply_to,
        )
        self.ctx.channels.to_peer(req.decode_command_addr, decode_req)
        job.log.debug("%s: first token sent, KV handed to %s", req.request_id, req.decode_worker_id)
