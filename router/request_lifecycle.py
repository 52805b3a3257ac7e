"""One sequence from dispatch to finish (router/fanout.py runs several at once).

Per sequence: hash the prompt's blocks, pick a prefill and a decode worker, send the PrefillRequest,
then read TokenOutputs (reordered by index) until a finish, a stop string, max_tokens, the deadline or
cancellation (client gone). Whenever the router, not the worker, ends the sequence, both workers get an
Abort so their blocks are freed. A retryable failure before any token was produced is re-dispatched
to other workers (at most `max_retries` times) under a fresh wire request id, so stray messages from
the failed attempt can never mix into the new one. After tokens were produced, only a request whose
tokens a retry reproduces (greedy, or seeded) is retried: the retry regenerates from the prompt, the
tokens already produced are checked equal and dropped, and the client's stream just continues; any
other request (or a retry that diverges) ends with a 503 `worker_failed` (a final SSE error event).
Workers get the deadline a little later than the router's own timer, so the client sees the 504.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field, replace

from common.blocks import blocks_for
from common.detokenizer import IncrementalDetokenizer
from common.hashing import block_hashes
from common.messages import Abort, PrefillRequest, RequestFailed, TokenOutput
from common.sampling_params import SamplingParams
from router.cluster_client import ClusterClient
from router.config import RouterConfig
from router.errors import APIError
from router.load_tracker import Assignment
from router.policy import Choice, RoutingPolicy
from router.prefix_index import PrefixIndex
from router.router_metrics import RouterMetrics
from router.token_stream import (
    ReplayMismatch,
    SequenceOutput,
    SequenceUpdate,
    TokenReorderBuffer,
    trim_replayed,
)
from router.tokenizer import ModelTokenizer
from router.worker_registry import WorkerRegistry

log = logging.getLogger(__name__)
# Workers get the deadline this much later than the router's own, so the router's timer fires first and
# the client always sees a 504 (and the workers an Abort); the workers' own expiry is only a backstop for
# an Abort that never arrives (router restarted, message lost).
WORKER_DEADLINE_GRACE_S = 2.0
# A 503 here means "the cluster cannot take this right now" (workers down, full or failing): a client
# that backs off briefly will usually succeed, so say so, as for a 429.
RETRY_AFTER = {"Retry-After": "1"}


@dataclass
class SequenceRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams  # n == 1
    skip_special_tokens: bool = True
    arrival: float = field(default_factory=time.monotonic)
    timeout: float | None = None  # the request's own limit; the router's --request-timeout also applies


@dataclass(frozen=True)
class _Dispatch:
    wire_id: str
    prefill_id: str
    decode_id: str
    queue: asyncio.Queue


class _RetryElsewhere(Exception):
    def __init__(self, worker_id: str, reason: str) -> None:
        super().__init__(reason)
        self.worker_id = worker_id


class RequestLifecycle:
    def __init__(
        self,
        config: RouterConfig,
        tokenizer: ModelTokenizer,
        cluster: ClusterClient,
        registry: WorkerRegistry,
        index: PrefixIndex,
        policy: RoutingPolicy,
        metrics: RouterMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.cluster = cluster
        self.registry = registry
        self.index = index
        self.policy = policy
        self.metrics = metrics
        self._clock = clock

    async def generate(self, seq: SequenceRequest) -> AsyncGenerator[tuple[SequenceUpdate, SequenceOutput]]:
        """Yields each update with the sequence's accumulated output; the last update has finish_reason."""
        excluded: set[str] = set()
        output = SequenceOutput(self._detokenizer(seq), seq.sampling)
        for attempt in range(self.config.max_retries + 1):
            seen = list(output.token_ids)  # what the client already has: a retry must reproduce it
            dispatch = await self._dispatch(seq, attempt, excluded)
            try:
                async with contextlib.aclosing(self._collect(seq, dispatch, output, seen)) as updates:
                    async for update in updates:
                        yield update, output
                self._observe(seq, output)
                return
            except _RetryElsewhere as retry:
                if output.num_generated and not _replayable(seq.sampling):
                    raise _worker_failed(str(retry)) from None
                excluded.add(retry.worker_id)
                self.metrics.retries.inc()
                log.warning("retrying %s without %s: %s", seq.request_id, retry.worker_id, retry)
        raise APIError(503, "no worker could run the request", code="no_workers", headers=RETRY_AFTER)

    def _detokenizer(self, seq: SequenceRequest) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(
            self.tokenizer.backend, seq.prompt_token_ids, seq.sampling.stop, seq.skip_special_tokens
        )

    def _choose(self, seq: SequenceRequest, excluded: set[str]) -> tuple[Choice, Choice, int]:
        """(prefill choice, decode choice, block size) for this sequence, or a 503."""
        block_size = self.registry.block_size
        prefill_loads = [
            replace(w, cached_blocks=self.index.num_blocks(w.worker_id))
            for w in self.registry.prefill_loads()
            if w.worker_id not in excluded
        ]
        decode_loads = [w for w in self.registry.decode_loads() if w.worker_id not in excluded]
        if block_size is None or not prefill_loads or not decode_loads:
            raise APIError(503, "no live prefill and decode workers", code="no_workers", headers=RETRY_AFTER)
        prompt = seq.prompt_token_ids
        matches = self.index.match(block_hashes(prompt, block_size))
        prefill = self.policy.pick_prefill(prefill_loads, matches, len(prompt), block_size)
        decode = self.policy.pick_decode(decode_loads, len(prompt) + seq.sampling.max_tokens)
        if prefill is None or decode is None:
            raise APIError(
                503, "no decode worker can hold this request", code="no_capacity", headers=RETRY_AFTER
            )
        return prefill, decode, block_size

    async def _dispatch(self, seq: SequenceRequest, attempt: int, excluded: set[str]) -> _Dispatch:
        prefill, decode, block_size = self._choose(seq, excluded)
        prompt = seq.prompt_token_ids
        wire_id = seq.request_id if attempt == 0 else f"{seq.request_id}~retry{attempt}"
        dispatch = _Dispatch(wire_id, prefill.worker_id, decode.worker_id, self.cluster.open_stream(wire_id))
        new_tokens = max(len(prompt) - prefill.cached_blocks * block_size, 1)
        num_blocks = blocks_for(len(prompt), block_size)
        self.registry.loads.assign(
            Assignment(wire_id, prefill.worker_id, decode.worker_id, new_tokens, num_blocks)
        )
        decode_info = self.registry.get(decode.worker_id)
        assert decode_info is not None  # it came from decode_loads() just now
        deadline = self._wall_deadline(seq)
        msg = PrefillRequest(
            wire_id, prompt, seq.sampling, decode.worker_id, decode_info.reg.command_addr, deadline
        )
        if not await self.cluster.send(prefill.worker_id, msg):
            dispatch.queue.put_nowait(RequestFailed(wire_id, prefill.worker_id, "cannot reach worker", True))
        self.metrics.prefill_requests.inc(worker=prefill.worker_id)
        self.metrics.decode_requests.inc(worker=decode.worker_id)
        return dispatch

    def _limit(self, seq: SequenceRequest) -> float | None:
        """The tighter of the router's --request-timeout and the request's own `timeout`."""
        limits = [t for t in (self.config.request_timeout, seq.timeout) if t is not None]
        return min(limits) if limits else None

    def _wall_deadline(self, seq: SequenceRequest) -> float | None:
        if self._limit(seq) is None:
            return None
        return time.time() + self._remaining(seq) + WORKER_DEADLINE_GRACE_S

    def _remaining(self, seq: SequenceRequest) -> float:
        limit = self._limit(seq)
        return float("inf") if limit is None else seq.arrival + limit - self._clock()

    async def _collect(
        self, seq: SequenceRequest, dispatch: _Dispatch, output: SequenceOutput, seen: list[int]
    ) -> AsyncGenerator[SequenceUpdate]:
        reorder = TokenReorderBuffer()
        ended_by_worker = False
        try:
            while True:
                msg = await self._next_message(seq, dispatch)
                if isinstance(msg, RequestFailed):
                    if msg.retryable:
                        raise _RetryElsewhere(msg.worker_id, msg.error)
                    raise APIError(500, f"worker {msg.worker_id} failed: {msg.error}", code="worker_failed")
                if msg.finish_reason == "abort":  # a worker gives up on its own only past the deadline
                    raise APIError(504, "request timed out", code="request_timeout")
                for out in self._new_outputs(reorder.push(msg), dispatch, seen):
                    update = self._apply(seq, output, out)
                    yield update
                    if update.finish_reason is not None:
                        ended_by_worker = update.finished_by_worker
                        return
        finally:
            self.cluster.close_stream(dispatch.wire_id)
            self.registry.loads.release(dispatch.wire_id)
            if not ended_by_worker:
                await self._abort(dispatch)

    def _new_outputs(
        self, ready: list[TokenOutput], dispatch: _Dispatch, seen: list[int]
    ) -> list[TokenOutput]:
        """In-order messages minus what a failed attempt already produced (`seen`, checked equal)."""
        outs = []
        for out in ready:
            if out.index == 0:
                self.registry.loads.prefill_finished(dispatch.wire_id)
            try:
                new = trim_replayed(out, seen)
            except ReplayMismatch as e:
                raise _worker_failed(f"the retry diverged: {e}") from None
            if new is not None:
                outs.append(new)
        return outs

    async def _next_message(self, seq: SequenceRequest, dispatch: _Dispatch) -> TokenOutput | RequestFailed:
        if self._limit(seq) is None:
            return await dispatch.queue.get()
        try:
            return await asyncio.wait_for(dispatch.queue.get(), timeout=max(self._remaining(seq), 0.0))
        except TimeoutError:
            raise APIError(504, "request timed out", code="request_timeout") from None

    def _apply(self, seq: SequenceRequest, output: SequenceOutput, out: TokenOutput) -> SequenceUpdate:
        if out.index == 0:
            output.first_token_at = self._clock()
            self.metrics.ttft.observe(output.first_token_at - seq.arrival)
        return output.apply(out)

    async def _abort(self, dispatch: _Dispatch) -> None:
        for worker_id in (dispatch.prefill_id, dispatch.decode_id):
            with contextlib.suppress(Exception):  # best effort: the worker may already be gone
                await self.cluster.send(worker_id, Abort(dispatch.wire_id))

    def _observe(self, seq: SequenceRequest, output: SequenceOutput) -> None:
        m = self.metrics
        m.prompt_tokens.inc(output.num_prompt_tokens or len(seq.prompt_token_ids))
        m.generation_tokens.inc(output.num_generated)
        m.prefix_hit_tokens.inc(output.cached_tokens)
        now = self._clock()
        m.e2e.observe(now - seq.arrival)
        if output.first_token_at is not None and output.num_generated > 1:
            m.tpot.observe((now - output.first_token_at) / (output.num_generated - 1))
        if output.kv_transfer_bytes:
            m.kv_transfer_bytes.inc(output.kv_transfer_bytes)
            m.kv_transfer_seconds.observe(output.kv_transfer_seconds)


def _replayable(sampling: SamplingParams) -> bool:
    """Whether a retry regenerates the same tokens: greedy, or seeded (each worker seeds afresh)."""
    return sampling.greedy or sampling.seed is not None


def _worker_failed(reason: str) -> APIError:
    return APIError(503, f"worker failed mid-generation: {reason}", code="worker_failed", headers=RETRY_AFTER)
