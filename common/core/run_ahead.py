"""Run-ahead decoding: launch step k+1 before the host has looked at step k's tokens.

With CUDA graphs a decode step takes the GPU a few milliseconds, and the host needs about as long to
schedule, prepare and post-process it. Run-ahead overlaps the two: step k's sampled tokens stay on
the device and feed step k+1 directly (the host-side token is a placeholder, -1), and the host
post-processes step k while the device computes step k+1.

Invariants:
* At most one step is in flight; `resolve` waits for it and hands its tokens to
  `Scheduler.update_from_output`, which replaces each placeholder like any other sampled token.
* Only pure decode steps run ahead (stay in flight while the host goes on). The next step may be
  launched behind one when its running sequences are the in-flight ones plus sequences whose next
  input token is already on the host (`joins_as_decode`: a decode worker's requests whose KV just
  arrived; their rows read the host token, `src_rows` -1), and nothing needs token values on the
  host first (logprobs, penalties, a batch a proposer that needs every token on the host wants to
  propose for: `Speculator.holds_run_ahead`). That next step may admit waiting requests or verify
  drafts proposed one step behind (`Proposer.proposes_behind`, the n-gram lookup): such a step is
  launched behind the in-flight step (its placeholder rows read the device tokens, the runner maps
  each sequence's source to its placeholder, the last scheduled token but its drafts), then runs
  synchronously.
* A sequence whose in-flight token is its last by length (`max_tokens`, the model's context) is not
  scheduled again (`Scheduler` skips it: `stopping.finishes_in_flight`): the next step runs ahead
  without it instead of draining the pipeline, and `resolve` finishes it.
* A sequence that turns out to have finished at step k was already launched in step k+1: its extra
  token is discarded, and the scheduler frees its blocks only after step k+1 has completed (the
  device is still writing its KV). Prefix-cache hashes are registered only once tokens are real.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from common.core.batch import SeqUpdate
from common.core.scheduler import Scheduler
from common.core.sequence import Sequence, SequenceStatus
from common.runner.step_handle import StepHandle


@dataclass
class InFlightStep:
    seqs: list[Sequence]  # the launched batch, in batch order (rows of its sampled tokens)
    rows: dict[int, int]  # seq_id -> row, for the sequences that got a placeholder
    handle: StepHandle


def needs_host_tokens(seq: Sequence) -> bool:
    return seq.reads_token_history


def start(seqs: list[Sequence], handle: StepHandle) -> InFlightStep:
    """Advance the launched sequences as if their tokens were known, appending placeholders.

    A sequence that finished after this step was launched gets none: its sampled token is dropped."""
    rows = {}
    for i, seq in enumerate(seqs):
        if seq.status == SequenceStatus.RUNNING:
            seq.commit_scheduled()
            seq.append_placeholder()
            rows[seq.seq_id] = i
    return InFlightStep(list(seqs), rows, handle)


class Drain(StrEnum):
    """Why an in-flight step must be resolved before the next one is launched (the device idles
    while the host then schedules and prepares that step; counted in `StepTimings.drains`)."""

    SPECULATE = "speculate"  # the speculator proposes from host-side tokens
    NEW_SEQUENCE = "new_sequence"  # a running sequence outside the in-flight step is not a plain decode
    HOST_TOKENS = "host_tokens"  # logprobs or penalties need the token values


def drain_reason(step: InFlightStep, scheduler: Scheduler) -> Drain | None:
    """None when the next step can be launched behind `step`; else why `step` must resolve first."""
    if scheduler.speculator.holds_run_ahead(scheduler.running):
        return Drain.SPECULATE  # proposals read the host-side tokens: resolve, then speculate
    for seq in scheduler.running:  # a sequence in `step.rows` holds that step's placeholder
        if seq.seq_id not in step.rows and not joins_as_decode(seq):
            return Drain.NEW_SEQUENCE
        if needs_host_tokens(seq):
            return Drain.HOST_TOKENS
    return None


def joins_as_decode(seq: Sequence) -> bool:
    """A running sequence outside the in-flight step can join the next one as a plain decode row: its
    input token is on the host (no placeholder) and only that token is uncomputed (a decode worker's
    request whose KV just arrived, a sequence whose first token a synchronous step sampled)."""
    return seq.num_pending_tokens == 0 and seq.num_uncomputed_tokens == 1 and seq.num_completion_tokens > 0


def src_rows(step: InFlightStep, seqs: list[Sequence]) -> list[int]:
    return [step.rows.get(s.seq_id, -1) if s.num_pending_tokens else -1 for s in seqs]


def resolve(step: InFlightStep, scheduler: Scheduler, launched: set[int]) -> list[SeqUpdate]:
    """Wait for the in-flight tokens and hand them to the scheduler, which replaces the placeholders
    and applies stop conditions (`Scheduler.update_from_output`).

    `launched`: ids of sequences in a step launched after this one (their blocks must outlive it).
    """
    return scheduler.update_from_output(step.seqs, step.handle.result(), launched)
