"""Run-ahead decoding: launch step k+1 before the host has looked at step k's tokens.

With CUDA graphs a decode step takes the GPU a few milliseconds, and the host needs about as long to
schedule, prepare and post-process it. Run-ahead overlaps the two: step k's sampled tokens stay on
the device and feed step k+1 directly (the host-side token is a placeholder, -1), and the host
post-processes step k while the device computes step k+1.

Invariants:
* At most one step is in flight; `resolve` waits for it and replaces each placeholder.
* Only pure decode steps run ahead, and only when the next batch is exactly the in-flight sequences
  (no waiting requests, nothing that needs token values on the host first: logprobs, penalties, or a
  sequence that will stop by length at its in-flight token).
* A sequence that turns out to have finished at step k was already launched in step k+1: its extra
  token is discarded, and its blocks are freed only after step k+1 has completed (the device is
  still writing its KV). Prefix-cache hashes are registered only once tokens are real.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.runner.model_runner import StepHandle
from common.scheduler import Scheduler, SeqUpdate
from common.sequence import Sequence, SequenceStatus

PLACEHOLDER = -1


@dataclass
class InFlightStep:
    seqs: list[Sequence]
    positions: list[int]  # index of each sequence's placeholder in its token_ids
    rows: dict[int, int]  # seq_id -> row of this step's sampled tokens
    handle: StepHandle
    free_after: list[Sequence] = field(default_factory=list)  # finished, blocks still being written


def needs_host_tokens(seq: Sequence) -> bool:
    return seq.sampling_params.reads_token_history


def start(seqs: list[Sequence], handle: StepHandle) -> InFlightStep:
    """Advance the launched sequences as if their tokens were known, appending placeholders."""
    live = [s for s in seqs if s.status == SequenceStatus.RUNNING]
    rows = {s.seq_id: i for i, s in enumerate(seqs)}
    for seq in live:
        seq.num_cached_tokens += seq.num_scheduled_tokens
        seq.num_scheduled_tokens = 0
        seq.append_token(PLACEHOLDER)
        seq.num_pending_tokens += 1
    return InFlightStep(live, [len(s) - 1 for s in live], {s.seq_id: rows[s.seq_id] for s in live}, handle)


def can_run_ahead(step: InFlightStep | None, scheduler: Scheduler) -> bool:
    if step is None or scheduler.waiting:
        return False
    in_flight = {s.seq_id for s in step.seqs}
    for seq in scheduler.running:
        if seq.seq_id not in in_flight or seq.num_pending_tokens != 1 or needs_host_tokens(seq):
            return False
        if scheduler.length_exhausted(seq, len(seq)):
            return False
    return True


def src_rows(step: InFlightStep, seqs: list[Sequence]) -> list[int]:
    return [step.rows.get(s.seq_id, -1) if s.num_pending_tokens else -1 for s in seqs]


def resolve(step: InFlightStep, scheduler: Scheduler, launched: set[int]) -> list[SeqUpdate]:
    """Wait for the in-flight tokens, replace placeholders, apply stop conditions.

    `launched`: ids of sequences in a step launched after this one (their blocks must outlive it).
    """
    tokens = step.handle.result().token_ids
    for seq in step.free_after:
        scheduler.block_manager.free(seq)
    updates, deferred = [], []
    for seq, pos in zip(step.seqs, step.positions, strict=True):
        token = tokens[step.rows[seq.seq_id]]
        if seq.status == SequenceStatus.FINISHED:  # aborted meanwhile: its token is dropped
            del seq.token_ids[pos:]
            seq.num_pending_tokens = 0
            continue
        seq.token_ids[pos] = token
        seq.num_pending_tokens -= 1
        if seq.block_table:
            scheduler.block_manager.commit(seq)
        reason = scheduler.stop_reason(seq, token, length=pos + 1)
        if reason is None:
            updates.append(SeqUpdate(seq, token, finished=False))
            continue
        in_next = seq.seq_id in launched
        del seq.token_ids[pos + 1 :]
        seq.num_pending_tokens = 0
        scheduler.finish(seq, reason, free_blocks=not in_next)
        if in_next:
            deferred.append(seq)
        updates.append(SeqUpdate(seq, token, finished=True))
    step.free_after = deferred
    return updates
