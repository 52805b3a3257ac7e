"""One sequence from dispatch to finish (router/fanout.py runs several at once).

Per sequence: plan a route (router/route_planner.py: a prefill worker and a decode target, or one
decode/mixed worker that prefills the prompt itself), send the PrefillRequest or GenerateRequest, then
read TokenOutputs (reordered by index) until a finish, a stop string, max_tokens, the deadline or
cancellation (client gone). Whenever the router, not the worker, ends the sequence, every worker of
the route gets an Abort so its blocks are freed. Messages that arrived together are applied together
and yielded as one update (one SSE chunk), so a client that falls behind catches up in few chunks.

A retryable failure before any token was produced is re-dispatched to other workers (at most
`max_retries` times) under a fresh wire request id, so stray messages from the failed attempt can never
mix into the new one. After tokens were produced, only a request whose tokens a retry reproduces
(greedy, or seeded) is retried: the retry regenerates from the prompt, the tokens already produced are
checked equal and dropped, and the client's stream just continues; any other request (or a retry that
diverges) ends with a 503 `worker_failed` (a final SSE error event); the attempt and these rules are
router/sequence_attempts.py. Workers get the deadline a little later than the router's own timer, so
the client sees the 504.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from common.wire import request_log
from common.wire.detokenizer import IncrementalDetokenizer
from common.wire.messages import Abort, Message, RequestFailed, TokenOutput
from common.wire.sampling_params import FinishReason, SamplingParams
from router.cluster_client import ClusterClient
from router.config import RouterConfig
from router.errors import APIError
from router.live_rates import LiveRates
from router.load_tracker import Assignment
from router.observations import learn_from, record_finished, record_token_gap
from router.request_stream import StreamTimeout
from router.route_planner import RETRY_AFTER, Route, RoutePlanner
from router.router_metrics import RouterMetrics
from router.sequence_attempts import Dispatch, RetryElsewhere, replayable, worker_failed
from router.token_stream import (
    ReplayMismatch,
    SequenceOutput,
    SequenceUpdate,
    TokenReorderBuffer,
    joined,
    trim_replayed,
)
from router.tokenizer import ModelTokenizer
from router.work_requests import work_request
from router.worker_registry import WorkerRegistry

log = logging.getLogger(__name__)
# Workers get the deadline this much later than the router's own, so the router's timer fires first and
# the client always sees a 504 (and the workers an Abort); the workers' own expiry is only a backstop for
# an Abort that never arrives (router restarted, message lost).
WORKER_DEADLINE_GRACE_S = 2.0


@dataclass
class SequenceRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams  # n == 1
    skip_special_tokens: bool = True
    arrival: float = field(default_factory=time.monotonic)
    timeout: float | None = None  # the request's own limit; the router's --request-timeout also applies


class ChoiceUpdate(NamedTuple):
    """One update of the sequence behind choice `choice_index`, with the sequence's output so far."""

    choice_index: int
    update: SequenceUpdate
    output: SequenceOutput


class RequestLifecycle:
    def __init__(
        self,
        config: RouterConfig,
        tokenizer: ModelTokenizer,
        cluster: ClusterClient,
        registry: WorkerRegistry,
        planner: RoutePlanner,
        metrics: RouterMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.cluster = cluster
        self.registry = registry
        self.planner = planner
        self.metrics = metrics
        self._clock = clock
        self._byte_table = tokenizer.byte_table  # built here, not on the first request

    @property
    def rates(self) -> LiveRates:
        return self.planner.rates

    async def generate(self, seq: SequenceRequest, choice_index: int = 0) -> AsyncGenerator[ChoiceUpdate]:
        """Yields each update with the sequence's accumulated output; the last update has finish_reason."""
        excluded: set[str] = set()
        output = SequenceOutput(self._detokenizer(seq), seq.sampling)
        for attempt in range(self.config.max_retries + 1):
            seen = list(output.token_ids)  # what the client already has: a retry must reproduce it
            dispatch = await self._dispatch(seq, attempt, excluded, output)
            try:
                async with contextlib.aclosing(self._collect(seq, dispatch, output, seen)) as updates:
                    async for update in updates:
                        yield ChoiceUpdate(choice_index, update, output)
                record_finished(self.metrics, len(seq.prompt_token_ids), output, seq.arrival, self._clock())
                log.debug(
                    "%s finished: %s, %d tokens", seq.request_id, output.finish_reason, output.num_generated
                )
                return
            except RetryElsewhere as retry:
                if output.num_generated and not replayable(seq.sampling):
                    raise worker_failed(str(retry)) from None
                excluded.add(retry.worker_id)
                self.metrics.retries.inc()
                log.warning("retrying %s without %s: %s", seq.request_id, retry.worker_id, retry)
        raise APIError(503, "no worker could run the request", code="no_workers", headers=RETRY_AFTER)

    def _detokenizer(self, seq: SequenceRequest) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(
            self.tokenizer.backend,
            seq.prompt_token_ids,
            seq.sampling.stop,
            seq.skip_special_tokens,
            self._byte_table,
            seq.sampling.include_stop_str_in_output,
        )

    async def _dispatch(
        self, seq: SequenceRequest, attempt: int, excluded: set[str], output: SequenceOutput
    ) -> Dispatch:
        route = self.planner.plan(seq.prompt_token_ids, seq.sampling, excluded)
        self.metrics.disagg_decisions.inc(decision=route.decision.kind)
        wire_id = seq.request_id if attempt == 0 else f"{seq.request_id}~retry{attempt}"
        stream = self.cluster.open_stream(wire_id, self.config.stream_interval)
        if self._limit(seq) is not None:
            stream.expire_after(self._remaining(seq))
        now = self._clock()
        if output.dispatched_at is None:
            output.dispatched_at = now
        self.registry.loads.assign(
            Assignment(wire_id, route.prefill_id, route.decode_id, route.new_tokens, route.prompt_blocks)
        )
        if not await self.cluster.send(route.prefill_id, self._request(wire_id, seq, route)):
            stream.put(RequestFailed(wire_id, route.prefill_id, "cannot reach worker", True))
        log.debug("%s sent: prefill on %s, decode on %s", wire_id, route.prefill_id, route.decode_id)
        self.metrics.prefill_requests.inc(worker=route.prefill_id)
        self.metrics.decode_requests.inc(worker=route.decode_id)
        return Dispatch(wire_id, route, stream, now)

    def _request(self, wire_id: str, seq: SequenceRequest, route: Route) -> Message:
        decode_addr = None
        if not route.local:
            decode_info = self.registry.get(route.decode_id)
            assert decode_info is not None  # the planner took it from the live workers just now
            decode_addr = decode_info.reg.command_addr
        return work_request(
            wire_id,
            seq.prompt_token_ids,
            seq.sampling,
            route,
            deadline=self._wall_deadline(seq),
            log_id=request_log.current(),  # the request task's X-Request-Id, for the workers' logs
            reply_to=self.cluster.inbox_addr,  # this front: the workers stream the request's tokens here
            decode_command_addr=decode_addr,
        )

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
        self, seq: SequenceRequest, dispatch: Dispatch, output: SequenceOutput, seen: list[int]
    ) -> AsyncGenerator[SequenceUpdate]:
        reorder = TokenReorderBuffer()
        ended_by_worker = False
        try:
            while True:
                try:
                    batch = await dispatch.stream.get_batch()
                except StreamTimeout:
                    raise APIError(504, "request timed out", code="request_timeout") from None
                ready, error = self._receive(batch, dispatch, reorder)
                for update in self._updates(seq, output, self._new_outputs(ready, dispatch, seen)):
                    if update.token_ids:
                        record_token_gap(self.metrics, output, self._clock())
                    yield update
                    if update.finish_reason is not None:
                        ended_by_worker = update.finished_by_worker
                        return
                if error is not None:
                    raise error
        finally:
            dispatch.stream.close()
            self.cluster.close_stream(dispatch.wire_id)
            self.registry.loads.release(dispatch.wire_id)
            if not ended_by_worker:
                await self._abort(dispatch)

    def _receive(
        self, batch: list[TokenOutput | RequestFailed], dispatch: Dispatch, reorder: TokenReorderBuffer
    ) -> tuple[list[TokenOutput], Exception | None]:
        """The in-order outputs of a batch of messages, and the error that ends the attempt, if any."""
        ready: list[TokenOutput] = []
        now = self._clock()
        for msg in batch:
            if isinstance(msg, RequestFailed):
                if msg.retryable:
                    return ready, RetryElsewhere(msg.worker_id, msg.error)
                if msg.invalid:  # what the router could not check itself (the model's own limits)
                    return ready, APIError(400, msg.error, code="invalid_value")
                error = f"worker {msg.worker_id} failed: {msg.error}"
                return ready, APIError(500, error, code="worker_failed")
            if msg.finish_reason == FinishReason.ABORT:  # a worker gives up on its own only past the deadline
                return ready, APIError(504, "request timed out", code="request_timeout")
            learn_from(self.rates, dispatch.route, dispatch.sent_at, msg, now)
            ready += reorder.push(msg)
        return ready, None

    def _updates(
        self, seq: SequenceRequest, output: SequenceOutput, outs: list[TokenOutput]
    ) -> list[SequenceUpdate]:
        """Apply in-order outputs; consecutive updates are merged into one where they can be."""
        updates: list[SequenceUpdate] = []
        runs = joined(outs) if len(outs) > 1 and output.takes_joined else [[out] for out in outs]
        for run in runs:
            update = self._apply(seq, output, run)
            if updates and updates[-1].can_merge(update):
                updates[-1] = updates[-1].merged(update)
            else:
                updates.append(update)
            if update.finish_reason is not None:
                break
        return updates

    def _new_outputs(
        self, ready: list[TokenOutput], dispatch: Dispatch, seen: list[int]
    ) -> list[TokenOutput]:
        """In-order messages minus what a failed attempt already produced (`seen`, checked equal)."""
        outs = []
        for out in ready:
            if out.index == 0:
                self.registry.loads.prefill_finished(dispatch.wire_id)
            try:
                new = trim_replayed(out, seen)
            except ReplayMismatch as e:
                raise worker_failed(f"the retry diverged: {e}") from None
            if new is not None:
                outs.append(new)
        return outs

    def _apply(self, seq: SequenceRequest, output: SequenceOutput, run: list[TokenOutput]) -> SequenceUpdate:
        if run[0].index == 0:
            output.first_token_at = self._clock()
            self.metrics.ttft.observe(output.first_token_at - seq.arrival)
        elif output.first_decode_at is None:
            output.first_decode_at = self._clock()
        return output.apply_run(run)

    async def _abort(self, dispatch: Dispatch) -> None:
        for worker_id in dispatch.workers:
            with contextlib.suppress(Exception):  # best effort: the worker may already be gone
                await self.cluster.send(worker_id, Abort(dispatch.wire_id))
