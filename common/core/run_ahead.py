"""Run-ahead decoding: launch step k+1 before the host has looked at step k's tokens.

With CUDA graphs a decode step takes the GPU a few milliseconds, and the host needs about as long to
schedule, prepare and post-process it. Run-ahead overlaps the two: step k's sampled tokens stay on
the device and feed step k+1 directly (the host-side token is a placeholder, -1), and the host
post-processes step k while the device computes step k+1.

Invariants:
* At most one step is in flight; `resolve` waits for it and hands its tokens to
  `Scheduler.update_from_output`, which replaces each placeholder like any other sampled token.
* A step runs ahead (stays in flight while the host goes on) when each of its sequences samples at
  most one token and none needs token values on the host (`launches_ahead`): pure decode steps, and
  with `PDSERVE_MIXED_RUN_AHEAD=1` mixed steps (prompt chunks beside decode rows) too; never a
  verification of drafts (synchronous) nor a prefill worker's steps (it hands a sequence off with its
  first token). In such a step a sequence that samples gets a placeholder; a prompt chunk that
  samples nothing commits its tokens at launch (its resolve applies no token; the commit there
  covers only chunks already launched). Mixed steps stay synchronous by default: on the H200 the
  switch removed the served worker's device wait but raised no throughput (docs/benchmarks.md).
* The next step may be launched behind the in-flight one unless a running sequence needs token values
  on the host first (logprobs, penalties, a batch a proposer that needs every token on the host wants
  to propose for: `Speculator.holds_run_ahead`). Its rows read the device tokens where the host holds
  a placeholder (the runner maps each sequence's source to its placeholder, the last scheduled token
  but its drafts) and host tokens everywhere else: prompt chunks, admitted requests, a decode worker's
  requests whose KV just arrived. A step that verifies drafts proposed one step behind
  (`Proposer.proposes_behind`, the n-gram lookup) is launched behind it too, then runs synchronously.
* A sequence whose in-flight token is its last by length (`max_tokens`, the model's context) is not
  scheduled again (`Scheduler` skips it: `stopping.finishes_in_flight`): the next step runs ahead
  without it instead of draining the pipeline, and `resolve` finishes it.
* A sequence that turns out to have finished at step k was already launched in step k+1: its extra
  token is discarded, and the scheduler frees its blocks only after step k+1 has completed (the
  device is still writing its KV). Prefix-cache hashes are registered only once tokens are real.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from itertools import islice

from common.config import EngineConfig
from common.core.batch import ScheduledBatch, SeqUpdate
from common.core.scheduler import Scheduler
from common.core.sequence import Sequence, SequenceStatus
from common.env_flags import env_switch
from common.runner.step_handle import StepHandle

logger = logging.getLogger(__name__)


@dataclass
class InFlightStep:
    seqs: list[Sequence]  # the launched batch, in batch order (rows of its sampled tokens)
    rows: dict[int, int]  # seq_id -> row, for the sequences that got a placeholder
    handle: StepHandle


def needs_host_tokens(seq: Sequence) -> bool:
    return seq.reads_token_history


def enabled(config: EngineConfig, is_cuda: bool) -> bool:
    """Whether plain decode steps run ahead: as configured, by default on CUDA; never with tensor
    parallelism (run-ahead feeds device-side tokens that only rank 0, the sampler, holds). In
    multiplexed mode only decode steps run ahead (common/multiplex/stepper.py)."""
    on = is_cuda if config.async_scheduling is None else config.async_scheduling
    if config.tensor_parallel_size > 1 and on:
        logger.info("run-ahead decoding is off with tensor_parallel_size > 1")
        return False
    return on


def mixed_steps_enabled() -> bool:
    """`PDSERVE_MIXED_RUN_AHEAD=1`: steps with prompt chunks run ahead too (off by default)."""
    return env_switch("PDSERVE_MIXED_RUN_AHEAD", default=False)


def launches_ahead(batch: ScheduledBatch, scheduler: Scheduler, mixed: bool, checked: int = 0) -> bool:
    """Whether `batch`, just launched, may stay in flight while the host goes on (see the invariants);
    `mixed`: steps with prompt chunks may (`mixed_steps_enabled`); `checked`: the batch's first rows
    the caller already knows need no host tokens (not scanned again: a pass over the rows per step)."""
    if not (batch.is_decode or mixed) or batch.num_draft_tokens or scheduler.config.role == "prefill":
        return False
    rows = islice(batch.seqs, checked, None) if checked else batch.seqs
    return not any(map(needs_host_tokens, rows))


def start(seqs: list[Sequence], handle: StepHandle) -> InFlightStep:
    """Advance the launched sequences as if their tokens were known: each commits its scheduled tokens,
    and each that samples (row by row in `handle.counts` order) gets a placeholder.

    A sequence that finished after this step was launched gets none: its sampled token is dropped."""
    rows, row = {}, 0
    for seq, count in zip(seqs, handle.counts, strict=True):
        if seq.status == SequenceStatus.RUNNING:
            seq.commit_scheduled()
            if count:
                seq.append_placeholder()
                rows[seq.seq_id] = row
        row += count
    return InFlightStep(list(seqs), rows, handle)


class Drain(StrEnum):
    """Why an in-flight step must be resolved before the next one is launched (the device idles
    while the host then schedules and prepares that step; counted in `StepTimings.drains`)."""

    SPECULATE = "speculate"  # the speculator proposes from host-side tokens
    HOST_TOKENS = "host_tokens"  # logprobs or penalties need the token values


def drain_reason(step: InFlightStep, scheduler: Scheduler) -> Drain | None:
    """None when the next step can be launched behind `step`; else why `step` must resolve first."""
    if scheduler.speculator.holds_run_ahead(scheduler.running):
        return Drain.SPECULATE  # proposals read the host-side tokens: resolve, then speculate
    # A running sequence outside `step.rows` holds no placeholder (only `start` makes them): its rows
    # read host tokens, so it never forces a drain.
    if any(map(needs_host_tokens, scheduler.running)):
        return Drain.HOST_TOKENS
    return None


def src_rows(step: InFlightStep, seqs: list[Sequence]) -> list[int] | None:
    """Each sequence's row of `step`'s sampled tokens that is its input, or -1 (a host token); None
    when `step` sampled nothing (prompt chunks only): every input is on the host."""
    if not step.rows:
        return None
    return [step.rows.get(s.seq_id, -1) if s.num_pending_tokens else -1 for s in seqs]


def resolve(step: InFlightStep, scheduler: Scheduler, launched: set[int]) -> list[SeqUpdate]:
    """Wait for the in-flight tokens and hand them to the scheduler, which replaces the placeholders
    and applies stop conditions (`Scheduler.update_from_output`).

    `launched`: ids of sequences in a step launched after this one (their blocks must outlive it).
    """
    return scheduler.update_from_output(step.seqs, step.handle.result(), launched)
