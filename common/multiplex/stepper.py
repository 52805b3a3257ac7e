"""The engine loop of multiplexed mode: one prefill chunk in flight on its SM share, decode steps beside it.

One thread, one engine, one model and one KV pool, so the hand-off from prefill to decode copies
nothing: a sequence whose prompt the chunk computed simply becomes decodable in the same block table.
Each `step()`:

1. resolves the chunk in flight if its completion says it is done (its first tokens are sampled,
   stops checked, blocks committed; the sequences join the decode batch from now on);
2. when no chunk is in flight, schedules the next one (`SplitScheduler.schedule_prefill`), asks the
   controller for its lane (SM share) and launches it there without waiting, whole or (with
   `layers_per_part`) its first part; while a chunk is still being launched, launches its next part
   (common/runner/side_launch.py: a whole chunk's launch stalls every decoding stream for its host time);
   with `chunk_after_decode` a new chunk's launch waits until step 3 has launched its decode step;
3. launches one decode step on the engine's stream (the CUDA graphs, all SMs but the chunk's share)
   over every decoding sequence not in the chunk (with `inline_tokens`, short waiting prompts ride in
   it as mixed rows, as in aggregated mode: a chunk launch of its own costs a host-bound model about a
   decode step), then resolves the decode step launched by the
   previous `step()` (run-ahead, as the aggregated engine's `common.core.run_ahead`: the new step's
   placeholder rows read that step's tokens on the device), or waits for the new one when run-ahead
   is off; the gap between two decode outputs goes to the controller while a chunk runs. With
   nothing to decode it resolves what is in flight and waits for the chunk.

Invariants: a chunk's sequences are `busy` until it resolves: never scheduled, preempted or freed
(an abort of one is held back until the chunk has finished, because the device may still be writing
its KV blocks and a freed block could be handed to a decoding sequence at once). At most one decode
step is in flight. Blocks a decode sequence gives up while its step is in flight (a finish, an abort,
a preemption by a chunk) may be handed out at once: the next decode step runs after it on the same
stream, and a chunk's lane waits for the engine's stream when it starts (`PrefillLane.activate`), so
no new owner writes a block before the in-flight step is done with it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from common.core import run_ahead
from common.core.batch import SeqUpdate
from common.core.sequence import Sequence
from common.core.split_scheduler import SplitScheduler, is_decoding
from common.core.step_records import SequencesFailed, StepResult, StepTimings
from common.multiplex.chunk import ChunkInFlight, MultiplexStats, SlowLaunches
from common.multiplex.controller import ShareController
from common.multiplex.inline_budget import InlineBudget
from common.multiplex.partitions import SMPartitions
from common.runner.memory_retry import MemoryRetries, TokenBudget

if TYPE_CHECKING:
    from common.runner.model_runner import ModelRunner


class MultiplexedSteps:
    """See the module docstring. `chunk_tokens`: the most prompt tokens one chunk computes (less for a
    while after a chunk ran out of device memory: `chunk_budget`);
    `ahead`: decode steps run ahead (off on the CPU, where a launch already computes the step);
    `inline_tokens`: prompts of at most this many uncached tokens computed inside decode steps, as
    many as fit in `chunk_tokens` (0: every prompt runs as a chunk); `inline_budget`, when given,
    replaces that fixed limit by a measured one (common/multiplex/inline_budget.py)."""

    def __init__(
        self,
        scheduler: SplitScheduler,
        runner: ModelRunner,
        partitions: SMPartitions,
        controller: ShareController,
        chunk_tokens: int,
        timings: StepTimings,
        ahead: bool = False,
        layers_per_part: int | None = None,
        inline_tokens: int = 0,
        inline_budget: InlineBudget | None = None,
        chunk_after_decode: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.partitions = partitions
        self.controller = controller
        self.timings = timings
        self.stats = MultiplexStats()
        self.ahead = ahead
        self.layers_per_part = layers_per_part  # None: every chunk launched in one piece
        self.inline_tokens = inline_tokens
        self.inline_budget = inline_budget
        self.mixed_ahead = run_ahead.mixed_steps_enabled()
        self._chunk: ChunkInFlight | None = None
        # With `chunk_after_decode`, a chunk scheduled in this step starts only once the step's decode
        # step is launched (its lane then waits for that step too), not at once beside it.
        self.chunk_after_decode = chunk_after_decode
        self._unstarted: ChunkInFlight | None = None
        self._decode_in_flight: run_ahead.InFlightStep | None = None
        self._held_aborts: set[str] = set()
        self.memory_retries = MemoryRetries()
        self.chunk_budget = TokenBudget(chunk_tokens)
        self._failed: SequencesFailed | None = None  # launches given up on this step (raised by `step`)
        self.slow_launches = SlowLaunches()

    @property
    def in_flight(self) -> bool:
        """A chunk or a decode step is still on the device."""
        return self._chunk is not None or self._decode_in_flight is not None

    @property
    def chunk_in_flight(self) -> bool:
        return self._chunk is not None

    def abort(self, request_ids: Iterable[str]) -> list[Sequence]:
        """Abort now what is not in the chunk in flight; the rest when the chunk resolves."""
        wanted = set(request_ids)
        if self._chunk is not None:
            held = wanted & self._chunk.request_ids
            self._held_aborts |= held
            wanted -= held
        return self.scheduler.abort(wanted)

    def step(self, result: StepResult) -> None:
        """One step into `result`; a chunk or a decode launch that failed for good raises
        `SequencesFailed` for its requests alone, carrying what the step did."""
        with self.partitions.engine_scope():
            self._step(result)
        failed, self._failed = self._failed, None
        if failed is not None:
            failed.result = result
            raise failed from failed.cause

    def _step(self, result: StepResult) -> None:
        if self._chunk is not None and self._chunk.done:
            result.updates += self._resolve_chunk(self._chunk)
        if self._chunk is None:
            self._schedule_chunk(result)
            if not self.chunk_after_decode:
                self._start_chunk(result)
        elif self._chunk.completion is None:
            self._advance(self._chunk)
        decoding = self._decode(result)
        self._start_chunk(result)  # one held for the decode step: started by now, or here
        if not decoding:
            result.updates += self._resolve_decode(frozenset())
            self.controller.decode_paused()
            while self._chunk is not None and self._chunk.completion is None:
                self._advance(self._chunk)  # may abandon it (common/runner/memory_retry.py)
            if self._chunk is not None and self._chunk.completion is not None:
                self._chunk.completion.wait()
                result.updates += self._resolve_chunk(self._chunk)

    def _schedule_chunk(self, result: StepResult) -> None:
        """Schedule the next chunk (it becomes `_chunk`, not yet started: `_start_chunk`); while
        sequences decode, short prompts are left to the decode step (with nothing decoding no decode
        step would take them)."""
        began = time.perf_counter()
        scheduler = self.scheduler
        limit = self._inline_limit()
        # The scan of `running` only when a prompt waits to be placed: most steps launch no chunk.
        decoding = None
        if limit and scheduler.waiting:
            decoding = any(map(is_decoding, scheduler.running))
        tokens = self.chunk_budget.tokens
        batch = scheduler.schedule_prefill(tokens, limit if decoding else 0)
        result.num_preempted += len(batch.preempted)
        if not batch.seqs:
            return
        if decoding is None or batch.preempted:  # admitted prompts do not decode; a preemption may stop one
            decoding = any(map(is_decoding, scheduler.running))
        # Prompt tokens left after a full chunk, or prompts left waiting: prefill is not keeping up.
        # (With inlining, a head left waiting may be one the next decode step takes: not counted.)
        full = batch.num_prefill_tokens >= tokens
        behind = full or (bool(scheduler.waiting) and not (limit and decoding))
        lane = self.controller.next_lane(decoding, behind)
        share = self.partitions.lanes[lane]
        if decoding and share.sms is not None:
            self.timings.shared_chunks += 1
            self.timings.shared_chunk_sms += share.sms
            self.timings.shared_chunk_target_ms += 1e3 * self.controller.held_target(behind)
        per_part = self.layers_per_part if decoding else None
        launch = self.runner.launch_side(batch.seqs, share, per_part)
        chunk = ChunkInFlight(batch.seqs, launch, lane, batch.num_prefill_tokens, time.perf_counter() - began)
        self._chunk = self._unstarted = chunk

    def _start_chunk(self, result: StepResult) -> None:
        """Launch the first part of the chunk `_schedule_chunk` made, if one waits to start."""
        chunk, self._unstarted = self._unstarted, None
        if chunk is None:
            return
        chunk.start(time.perf_counter())
        self._advance(chunk)
        if self._chunk is None:
            return  # abandoned (out of memory), its sequences waiting again: nothing was computed
        self.stats.chunks_per_lane[chunk.lane] = self.stats.chunks_per_lane.get(chunk.lane, 0) + 1
        self.timings.prefill_steps += 1
        result.num_prefill_tokens += chunk.tokens

    def _fail(self, request_ids: frozenset[str], error: BaseException) -> None:
        """Requests given up on this step (past their retries): `step` raises one `SequencesFailed`
        for all of them once the step's other work is done."""
        if self._failed is not None:
            request_ids |= self._failed.request_ids
        self._failed = SequencesFailed(request_ids, error)

    def _inline_limit(self) -> int:
        """The longest uncached prompt the next decode step takes whole (it packs such prompts up to
        `chunk_tokens`); 0: none."""
        return self.inline_tokens if self.inline_budget is None else self.inline_budget.tokens

    def _advance(self, chunk: ChunkInFlight) -> None:
        """Launch the chunk's next part; once all are launched, record its completion. A part that
        fails abandons the chunk: out of device memory, its sequences are computed again
        (common/runner/memory_retry.py), or past their retries they stay running until aborted and
        `step` raises `SequencesFailed` for them once the step's decode work is done; any other error
        is raised at once (they stay running until aborted)."""
        began = time.perf_counter()
        self.stats.chunk_parts += 1
        lane = self.partitions.lanes[chunk.lane]
        try:
            if chunk.launch.advance():
                chunk.completion = lane.record()
        except BaseException as e:
            lane.record().wait()  # the parts already launched may still write the chunk's blocks
            self._chunk = None
            self.scheduler.abort(self._held_aborts)
            self._held_aborts = set()
            recovered = self.memory_retries.recover(e, self.scheduler, chunk.seqs)
            if not recovered and not isinstance(e, torch.OutOfMemoryError):
                raise
            self.chunk_budget.ran_out()
            if not recovered:  # past its retries: the decode side is untouched, so these alone fail
                self._fail(chunk.request_ids, e)
        finally:
            spent = time.perf_counter() - began  # host time to launch it
            self.timings.prefill_forward += spent
            chunk.host_seconds += spent
            self.slow_launches.record(lane.sms, chunk, spent)

    def _decode(self, result: StepResult) -> bool:
        """Launch one decode step (with short prompts inlined) and resolve the one before it; False when
        no sequence decodes. A step with prompt rows runs ahead only as aggregated mode's mixed steps do
        (`run_ahead.mixed_steps_enabled`)."""
        # One pass per step: the decode batch is drawn from `running`, so this also says whether it
        # may run ahead.
        host_tokens = any(map(run_ahead.needs_host_tokens, self.scheduler.running))
        if host_tokens and self._decode_in_flight is not None:
            result.updates += self._resolve_decode(frozenset())  # penalties, logprobs: host tokens first
        busy = self._chunk.seq_ids if self._chunk is not None else frozenset()
        batch = self.scheduler.schedule_decode(busy)
        result.num_preempted += len(batch.preempted)
        if not batch.seqs:
            return False
        decode_rows = len(batch.seqs)  # all drawn from `running`, which `host_tokens` covered
        if limit := self._inline_limit():
            self.scheduler.inline_prompts(batch, limit, self.chunk_budget.full)
            self.timings.inline_prompts += len(batch.seqs) - decode_rows
        began = time.perf_counter()
        previous = self._decode_in_flight
        rows = run_ahead.src_rows(previous, batch.seqs) if previous is not None else None
        try:
            handle = self.runner.launch(batch.seqs, batch.is_decode, rows)
        except torch.OutOfMemoryError as e:  # as an aggregated step's (common/runner/aggregated_steps.py)
            result.updates += self._resolve_decode(frozenset())
            self.runner.platform.synchronize()
            if not self.memory_retries.recover(e, self.scheduler, batch.seqs):
                self._fail(frozenset(s.request_id for s in batch.seqs), e)  # the chunk beside goes on
            return True
        self._start_chunk(result)  # one held for this step (`chunk_after_decode`) starts after it
        result.updates += self._resolve_decode(frozenset(s.seq_id for s in batch.seqs))
        ahead = self.ahead and not host_tokens
        if ahead and run_ahead.launches_ahead(batch, self.scheduler, self.mixed_ahead, decode_rows):
            self._decode_in_flight = run_ahead.start(batch.seqs, handle)
        else:
            result.updates += self.scheduler.update_from_output(batch.seqs, handle.result())
            self._decode_output(handle.wait_seconds)
            self.memory_retries.forget(batch.seqs)
        self.timings.decode_forward += time.perf_counter() - began
        self.timings.decode_steps += 1
        result.num_decode_tokens += batch.num_decode_tokens
        result.num_prefill_tokens += batch.num_prefill_tokens
        return True

    def _resolve_decode(self, launched: frozenset[int]) -> list[SeqUpdate]:
        """The in-flight decode step's tokens (none in flight: nothing). `launched`: the sequences of
        the step launched after it, whose blocks outlive it (`Scheduler.update_from_output`)."""
        step, self._decode_in_flight = self._decode_in_flight, None
        if step is None:
            return []
        updates = run_ahead.resolve(step, self.scheduler, set(launched))
        self._decode_output(step.handle.wait_seconds)
        self.memory_retries.forget(step.seqs)
        return updates

    def _decode_output(self, wait_seconds: float) -> None:
        """Decode tokens reached the host: the gap since the last ones is an inter-token gap, which
        the controller reads (beside a chunk, or solo)."""
        if self.controller.decode_output(time.perf_counter(), self._chunk is not None):
            self.stats.decode_steps_beside += 1
        self.timings.device_wait += wait_seconds

    def _resolve_chunk(self, chunk: ChunkInFlight) -> list[SeqUpdate]:
        """`chunk` has finished: apply held aborts (its blocks are safe to free now), then its tokens;
        its timing goes to the inline budget."""
        done_at = time.perf_counter()
        self._chunk = None
        assert chunk.launch.handle is not None  # resolved only once launched and done
        output = chunk.launch.handle.result()
        if self._held_aborts:
            self.scheduler.abort(self._held_aborts)
            self._held_aborts = set()
        updates = self.scheduler.update_from_output(chunk.seqs, output)
        self.memory_retries.forget(chunk.seqs)
        self.chunk_budget.resolved()
        if self.inline_budget is not None and chunk.tokens > 0:  # a chunk computes a token at least
            chunk.host_seconds += time.perf_counter() - done_at
            self.inline_budget.observe(chunk.timing(done_at))
        return updates
