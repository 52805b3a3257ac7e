"""Aggregated mode's engine steps: one batch per step (prompt chunks and decode rows together), plain
decode steps launched ahead of their predecessor's tokens when `async_scheduling` is on.

Invariants: at most one step is in flight (`in_flight`), and it is resolved (its tokens applied)
before the next step's output is; a launch that runs out of device memory produces no step, its
sequences are computed again (common/runner/memory_retry.py) after the step before it was resolved and the
failed launch's kernels finished, and the steps after it take half the tokens (`TokenBudget`); past
their retries those sequences alone fail (`SequencesFailed`). The multiplexed counterpart is
common/multiplex/stepper.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from common.core import run_ahead
from common.core.batch import SeqUpdate
from common.core.scheduler import Scheduler
from common.core.sequence import Sequence
from common.core.step_records import SequencesFailed, StepResult, StepTimings
from common.runner.memory_retry import MAX_RETRIES, MemoryRetries, TokenBudget

if TYPE_CHECKING:
    from common.runner.model_runner import ModelRunner


class AggregatedSteps:
    """`async_scheduling`: launch plain decode steps (and, with `PDSERVE_MIXED_RUN_AHEAD`, mixed
    ones) before the host has their predecessor's tokens (common/core/run_ahead.py); `step_tokens`:
    the most tokens one step computes (`max_num_batched_tokens`)."""

    def __init__(
        self, runner: ModelRunner, timings: StepTimings, async_scheduling: bool, step_tokens: int
    ) -> None:
        self.runner = runner
        self.timings = timings
        self.async_scheduling = async_scheduling
        self.mixed_run_ahead = run_ahead.mixed_steps_enabled()
        self.in_flight: run_ahead.InFlightStep | None = None
        # Under tensor parallelism the other ranks may wait inside the failed launch's collectives, so
        # there the error stands (no retry) as it did before retries existed.
        self.memory_retries = MemoryRetries(0 if runner.tp is not None else MAX_RETRIES)
        self.step_budget = TokenBudget(step_tokens)

    def step(self, scheduler: Scheduler) -> StepResult:
        t0 = time.perf_counter()
        updates: list[SeqUpdate] = []
        drained = False
        if self.in_flight is not None:
            reason = run_ahead.drain_reason(self.in_flight, scheduler)
            if reason is not None:
                self.timings.drains[reason.value] = self.timings.drains.get(reason.value, 0) + 1
                updates += self._resolve(scheduler, set())
                drained = True
        batch = scheduler.schedule(self.step_budget.tokens if self.step_budget.halvings else None)
        result = StepResult(num_preempted=len(batch.preempted))
        if not batch.seqs:
            result.updates = updates + self._resolve(scheduler, set())
            return result
        t1 = time.perf_counter()
        # A verification launched behind the in-flight step waits for that step like a drain does.
        drained |= self.in_flight is not None and batch.num_draft_tokens > 0
        rows = run_ahead.src_rows(self.in_flight, batch.seqs) if self.in_flight is not None else None
        try:
            handle = self.runner.launch(batch.seqs, batch.is_decode, rows)
        except torch.OutOfMemoryError as e:
            result.updates = updates + self._resolve(scheduler, set())  # also waits for its kernels
            self._recover(scheduler, e, batch.seqs, result)
            return result
        if batch.num_prefill_tokens:
            self.step_budget.resolved()
        updates += self._resolve(scheduler, {s.seq_id for s in batch.seqs})
        t2 = time.perf_counter()
        if self.async_scheduling and run_ahead.launches_ahead(batch, scheduler, self.mixed_run_ahead):
            self.in_flight = run_ahead.start(batch.seqs, handle)
        else:
            updates += scheduler.update_from_output(batch.seqs, handle.result())
            self.timings.device_wait += handle.wait_seconds
            self.memory_retries.forget(batch.seqs)
        result.updates = updates
        scheduler.speculator.observe_step(t0, batch, ran_ahead=self.in_flight is not None, drained=drained)
        self.timings.account(batch.is_decode, t0, t1, t2, time.perf_counter())
        result.num_prefill_tokens = batch.num_prefill_tokens
        result.num_decode_tokens = batch.num_decode_tokens
        return result

    def _recover(
        self, scheduler: Scheduler, error: torch.OutOfMemoryError, seqs: list[Sequence], result: StepResult
    ) -> None:
        """A launch ran out of device memory (the step in flight before it already resolved into
        `result`): its sequences are computed again and the next steps take half the tokens; out of
        retries they alone fail (`SequencesFailed` carrying `result`), or under tensor parallelism,
        where the other ranks may wait inside the failed launch, the error stands."""
        self.runner.platform.synchronize()  # the failed launch's kernels, before its blocks are freed
        recovered = self.memory_retries.recover(error, scheduler, seqs)
        if not recovered and self.runner.tp is not None:
            raise error
        self.step_budget.ran_out()
        if not recovered:
            raise SequencesFailed(frozenset(s.request_id for s in seqs), error, result)

    def _resolve(self, scheduler: Scheduler, launched: set[int]) -> list[SeqUpdate]:
        if self.in_flight is None:
            return []
        step, self.in_flight = self.in_flight, None
        updates = run_ahead.resolve(step, scheduler, launched)
        self.memory_retries.forget(step.seqs)
        self.timings.device_wait += step.handle.wait_seconds
        return updates
