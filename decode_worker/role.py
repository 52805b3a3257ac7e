"""The decode role's request handling (the engine loop itself is common/worker/service.py).

Two commands start a request here:
* DecodeRequest (from a prefill worker) -> Sequence(prompt + first token) -> wait in `pending` (in
  the admission policy's order, common/core/request_queue.py) until the cache has room for the
  prompt's blocks (never dropped) -> engine.reserve_transfer -> receiver fetch -> DONE:
  engine.complete_transfer (joins the decode batch) / FAILED: engine.fail_transfer (the engine
  recomputes the prompt here). DONE means the transfer passed its checks (kvtransfer's
  verify.py: nonce, sender epoch, the prompt's block-hash chain computed here, checksums of the bytes);
  a transfer that fails them is FAILED like any other, so it is recomputed, never decoded on. Tokens
  are sent from index 1 (index 0, the first token, came from the prefill worker).
* GenerateRequest (from the router, no disaggregation) -> Sequence(prompt) -> engine.add_sequence:
  the prompt is computed here, reusing this worker's cached prefix, and tokens are sent from index 0;
  the first message carries `cached_tokens` (the prefix hit). Until that first token it fails as a
  prefill worker would (RequestFailed, e.g. a deadline), afterwards it ends as a decode does.
Either way: each step's tokens go out in one message per step, index = completion position of a
message's first token: plain mid-stream tokens as the rows of one TokenBatch, a request's first and
last message (and any with logprobs) as a TokenOutput.

Aborting a sequence whose transfer is in flight is deferred until the receiver reports it: until
then the transfer may still write its destination blocks, so they must not go back to the pool.

Mixed workers (`MixedRole`, `--role mixed`) are this role under another name, with engine role
"mixed". The scheduler treats "mixed" like "decode" (only "prefill" hands sequences off), so the
prefix cache works the same: a GenerateRequest's prompt is matched against it, and transferred prompts
are registered on arrival. What "mixed" changes is outside the engine: the worker registers as
prefill- and decode-capable, and it publishes its cache events and answers snapshots like a prefill
worker, so the router's prefix index covers it. A mixed worker still accepts DecodeRequests; it does
not take PrefillRequests (handing blocks off is the prefill role's job).
"""

from __future__ import annotations

import logging
import time

from common.core.request_queue import RequestQueue
from common.core.sequence import SequenceStatus
from common.core.step_records import StepResult
from common.runner.grammar import grammar_failure
from common.wire.codec import build_checked_parts
from common.wire.messages import DecodeRequest, GenerateRequest, Message, TokenBatch, TokenOutput
from common.wire.probe_messages import KVProbe
from common.worker.outputs import wire_logprobs
from common.worker.role import WorkerContext, WorkerRole
from decode_worker.admission import sequence_from_request, transferable
from decode_worker.job import DecodeJob
from decode_worker.probe import ProbeReceiver
from kvtransfer import KVTransferConfig, TransferResult, TransferStatus
from kvtransfer.peers import KVReceiverSet

log = logging.getLogger(__name__)
TRANSFER_POLL_S = 0.002  # a waiting transfer delays the second token: look often while one is in flight


class DecodeRole(WorkerRole):
    name = "decode"
    request_types = (DecodeRequest, GenerateRequest)
    jobs: dict[str, DecodeJob]
    kv: KVReceiverSet | None

    def __init__(self) -> None:
        super().__init__()
        # Request ids waiting for room to reserve the prompt's blocks, in the admission policy's order.
        self.pending: RequestQueue[str] = RequestQueue()
        self.probes: ProbeReceiver | None = None  # made at the first KV path probe

    def open_kv(self, ctx: WorkerContext) -> KVReceiverSet:
        cfg = ctx.config
        config = KVTransferConfig(
            transport=cfg.kv_transport, host=ctx.host, fetch_timeout_s=cfg.kv_fetch_timeout_s, curve=cfg.curve
        )
        return KVReceiverSet(ctx.engine.kv_cache, config)

    # ---- commands ------------------------------------------------------------------------------

    def submit(self, msg: Message) -> None:
        assert isinstance(msg, self.request_types)
        rid = msg.request_id
        if rid in self.jobs:
            log.warning("ignoring duplicate %s %s", msg.TYPE, rid)
            return
        try:
            seq = sequence_from_request(self.engine, msg)
        except ValueError as e:  # the same request would fail on every worker
            self.ctx.fail(rid, str(e), retryable=False, reply_to=msg.reply_to, invalid=True)
            return
        log.debug("%s: %s with %d prompt tokens", rid, msg.TYPE, len(msg.prompt_token_ids))
        if isinstance(msg, GenerateRequest):
            self.jobs[rid] = DecodeJob(msg, seq, next_index=0)
            self.engine.add_sequence(seq)
            return
        self.jobs[rid] = DecodeJob(msg, seq, next_index=1)
        if transferable(msg, self.engine.block_size):
            self.pending.push(rid)
            self._admit_pending()
        else:
            log.warning("%s: the hand-off does not cover the prompt; recomputing it here", rid)
            self.engine.add_sequence(seq)

    def probe(self, msg: Message) -> None:
        if not isinstance(msg, KVProbe):
            return super().probe(msg)
        if self.probes is None:
            self.probes = ProbeReceiver(self.engine.kv_cache, self.kv.config, self.ctx.worker_id)
        result = self.probes.start(msg)
        if result is not None:
            self.ctx.channels.to_front(msg.reply_to, result)

    def close(self) -> None:
        if self.probes is not None:
            self.probes.close()
        super().close()

    def abort(self, request_id: str) -> bool:
        job = self.jobs.get(request_id)
        if job is None:
            return False
        if job.transfer_in_flight:
            job.abort_when_settled = True  # finished in poll() once the receiver reports it
            return True
        del self.jobs[request_id]
        job.log.debug("%s: aborted", request_id)
        if request_id in self.pending:
            self.pending.remove(request_id)  # holds no blocks yet
        else:
            self.engine.abort([request_id])
        return True

    # ---- the loop ------------------------------------------------------------------------------

    def poll(self) -> None:
        for result in self.kv.poll():
            self._on_transfer(result)
        for probe, reply_to in self.probes.poll() if self.probes is not None else ():
            log.info("KV probe from %s: %s", probe.prefill_worker_id, probe.error or f"{probe.gbps:.2f} GB/s")
            self.ctx.channels.to_front(reply_to, probe)
        self._admit_pending()
        self.kv.flush()

    def on_step(self, result: StepResult) -> None:
        jobs = self.jobs
        batches: dict[str | None, tuple[list, list, list, list]] = {}  # one TokenBatch per front
        rest: dict[str, list[int]] = {}  # requests whose tokens go out as a TokenOutput, in step order
        finished: set[str] = set()
        # One pass, the hot path (a few hundred rows per step): a plain request's token becomes a row at
        # once (a second token of it in this step, another row); a request's first or last message, or
        # one with logprobs, collects the step's tokens first and goes out as one TokenOutput after
        # the rows, so its messages keep their order.
        for seq, token, done, _ in result.updates:
            rid = seq.request_id
            if token is None or rid not in jobs:
                continue
            if done:
                finished.add(rid)
            ids = rest.get(rid)
            if ids is not None:
                ids.append(token)
                continue
            job = jobs[rid]
            if done or not job.plain:
                rest[rid] = [token]
                continue
            rows = batches.get(job.request.reply_to)
            if rows is None:
                rows = batches[job.request.reply_to] = ([], [], [], [])
            rows[0].append(rid)
            rows[1].append(job.next_index)
            rows[2].append([token])
            rows[3].append(seq.num_prompt_tokens)
            job.next_index += 1
        self._send_batches(batches)
        for rid, ids in rest.items():
            self._finish_step(jobs[rid], ids, rid in finished)

    def _send_batches(self, batches: dict[str | None, tuple[list, list, list, list]]) -> None:
        """The step's plain rows, one TokenBatch per front. Built without the per-field checks (every
        part comes from this worker's own state); the router decodes it with all of them."""
        for reply_to, (rids, indexes, token_ids, prompts) in batches.items():
            batch = build_checked_parts(
                TokenBatch,
                worker_id=self.ctx.worker_id,
                request_ids=rids,
                indexes=indexes,
                token_ids=token_ids,
                num_prompt_tokens=prompts,
            )
            self.ctx.channels.to_front(reply_to, batch)

    def _finish_step(self, job: DecodeJob, ids: list[int], done: bool) -> None:
        rid = job.request.request_id
        failure = grammar_failure(job.seq) if done else None
        if failure is not None:  # it ended on the EOS its failed matcher forced: not a real finish
            self.reject(rid, f"the grammar could not be followed after {job.next_index} tokens: {failure}")
            return
        self._send_tokens(job, ids, done)
        if done:
            del self.jobs[rid]
            job.log.debug("%s: finished (%s) after %d tokens", rid, job.seq.finish_reason, job.next_index)

    def expire(self, now: float) -> None:
        for rid, job in list(self.jobs.items()):
            deadline = job.request.deadline
            if deadline is None or deadline >= now or job.abort_when_settled:
                continue
            self.abort(rid)
            reply_to = job.request.reply_to
            if job.next_index == 0:  # nothing sent yet: fail as a prefill worker would
                self.ctx.fail(
                    rid, "deadline exceeded before the first token", retryable=False, reply_to=reply_to
                )
            else:
                self.ctx.finish_aborted(rid, job.next_index, len(job.request.prompt_token_ids), reply_to)

    def poll_interval(self) -> float | None:
        transfers = self.engine.load_report().num_transferring
        probing = self.probes is not None and self.probes.busy
        return TRANSFER_POLL_S if transfers or self.pending or probing else None

    def num_queued(self) -> int:
        return len(self.pending)

    # ---- helpers -------------------------------------------------------------------------------

    def _admit_pending(self) -> None:
        while self.pending:
            job = self.jobs[self.pending.peek()]
            if not self.engine.reserve_transfer(job.seq):
                return  # no room yet: retried after the next step frees blocks
            self.pending.pop()
            self._start_fetch(job)

    def _start_fetch(self, job: DecodeJob) -> None:
        req, seq = job.request, job.seq
        dst = self.engine.prompt_block_ids(seq)  # as many as were published: see `transferable`
        job.fetch_started_at = time.monotonic()
        # The chain comes from the prompt's own tokens, not from the sender: what arrives must match it.
        chain = seq.full_block_hashes(seq.num_prompt_tokens)
        error = self.kv.fetch(req.handoff, dst, chain)
        if error is not None:
            job.log.warning("%s: cannot fetch KV (%s); recomputing the prompt here", req.request_id, error)
            self.engine.fail_transfer(seq)

    def _on_transfer(self, result: TransferResult) -> None:
        job = self.jobs.get(result.request_id)
        if job is None or job.seq.status is not SequenceStatus.TRANSFERRING:
            return  # a transfer of a request already gone
        if job.abort_when_settled:
            del self.jobs[result.request_id]
            self.engine.abort([result.request_id])
        elif result.status is TransferStatus.DONE:
            job.kv_bytes, job.kv_seconds = result.num_bytes, result.seconds
            job.fetch_done_at = time.monotonic()
            self.engine.complete_transfer(job.seq)
            job.log.debug(
                "%s: KV received (%d bytes in %.4f s)", result.request_id, result.num_bytes, result.seconds
            )
        else:
            job.log.warning("%s: KV transfer failed (%s); recomputing here", result.request_id, result.error)
            self.engine.fail_transfer(job.seq)

    def _send_tokens(self, job: DecodeJob, token_ids: list[int], finished: bool) -> None:
        seq = job.seq
        # Transfer figures go out once per request (the router sums what it gets).
        first_reported = job.kv_reported
        kv_bytes, kv_seconds = (0, 0.0) if first_reported else (job.kv_bytes, job.kv_seconds)
        job.kv_reported = True
        msg = TokenOutput(
            request_id=job.request.request_id,
            worker_id=self.ctx.worker_id,
            index=job.next_index,
            token_ids=token_ids,
            finish_reason=seq.finish_reason if finished else None,
            num_prompt_tokens=seq.num_prompt_tokens,
            cached_tokens=seq.num_prefix_hit_tokens if job.next_index == 0 else 0,
            logprobs=wire_logprobs(seq, len(token_ids)),
            kv_transfer_bytes=kv_bytes,
            kv_transfer_seconds=kv_seconds,
            timings=None if first_reported else job.stage_timings(time.monotonic()),
        )
        job.next_index += len(token_ids)
        # From now on its tokens carry nothing but tokens (no first-message figures), unless it asked
        # for logprobs: such requests' next tokens travel as rows of a TokenBatch.
        job.plain = seq.sampling_params.logprobs is None
        self.ctx.channels.to_front(job.request.reply_to, msg)


class MixedRole(DecodeRole):
    """A decode worker registered as "mixed": prefill- and decode-capable, with a published prefix
    cache (see the module docstring)."""

    name = "mixed"
    publishes_events = True
