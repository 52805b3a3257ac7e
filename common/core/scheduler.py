"""Iteration-level continuous batching with chunked prefill, prefix reuse and preemption.

Each step first gives every running sequence its next tokens (one for a decoding sequence, the
next chunk for one still prefilling), then admits waiting sequences into the remaining token
budget. Any prompt may be split into chunks, not only the first of a batch. When the KV cache runs
out, a running sequence is preempted: its blocks are freed and it goes back to the queue to be
recomputed (its cached prefix usually survives in the LRU). Which sequence waits, is admitted or is
preempted is the admission policy's choice (`common/core/request_queue.py`, FCFS).

Roles: `mixed` runs a request from prompt to finish. `prefill` hands a sequence off as soon as its
first token is sampled, keeping its blocks pinned until `release`. `decode` receives sequences
whose prompt KV arrives by transfer (`reserve_for_transfer` / `complete_transfer`), and recomputes
them locally if the transfer fails. Those calls, like intake, finish and abort, are the base class's
(`common/core/sequence_pool.py`): where each sequence is, apart from how a step is built.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from common.core.admission_delay import AdmissionDelay
from common.core.batch import ScheduledBatch, SchedulerConfig, SeqUpdate
from common.core.block_manager import BlockManager
from common.core.sequence import Sequence, SequenceStatus
from common.core.sequence_pool import SequencePool
from common.core.stopping import finishes_in_flight, first_stop
from common.runner.output import RunnerOutput
from common.spec_decode.speculator import Speculator


class Scheduler(SequencePool):
    """Builds each step's batch and applies its output; where the sequences are, and the moves no step
    makes (intake, finish, abort, hand-off, transfer), are its `SequencePool`'s."""

    def __init__(
        self, config: SchedulerConfig, block_manager: BlockManager, speculator: Speculator | None = None
    ) -> None:
        super().__init__(config, block_manager, speculator)
        # None: admission is never held (factor 0, the default; a prefill worker, which never decodes).
        self.admission_delay: AdmissionDelay | None = None
        if config.delay_factor > 0 and config.role != "prefill":
            self.admission_delay = AdmissionDelay(config.delay_factor, config.max_num_batched_tokens)

    # ---- one step ------------------------------------------------------------------------------
    def schedule(self, token_budget: int | None = None) -> ScheduledBatch:
        """The next step's batch, of at most `token_budget` tokens (None: `max_num_batched_tokens`;
        less after a step ran out of device memory, common/runner/memory_retry.py)."""
        batch = ScheduledBatch()
        delay = self.admission_delay
        now = time.monotonic() if delay is not None else 0.0
        if delay is not None:
            delay.observe(now)
        budget = self.config.max_num_batched_tokens if token_budget is None else token_budget
        budget = self._schedule_running(batch, budget)
        if not batch.preempted and not self._admission_held(now):
            self._admit_waiting(batch, budget)
        if delay is not None:
            delay.record(batch.num_prefill_tokens)
        return batch

    def _admission_held(self, now: float) -> bool:
        delay = self.admission_delay
        if delay is None or not self.waiting or not self.running:
            return False
        return delay.holds(self.waiting, self.waiting.peek(), now)

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        self.speculator.plan(self.running, budget)
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            i += 1
            if seq.num_pending_tokens and finishes_in_flight(seq, self.config.max_model_len):
                continue  # its in-flight token is its last: the step's resolve finishes it
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.grow(seq, seq.num_cached_tokens + n):
                victim = self.waiting.victim(self.running)
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    return budget
            self._put(batch, seq, n)
            budget -= n
        return budget

    def _admit_waiting(self, batch: ScheduledBatch, budget: int, whole_upto: int = 0) -> int:
        """Admit waiting sequences in queue order into `budget` tokens; `whole_upto` > 0: only whole
        prompts (no partial chunk) of at most that many uncached tokens, stopping at the first other.
        Returns the budget left."""
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting.peek()
            match = self.block_manager.match_prefix(seq)
            rest = len(seq) - match.num_tokens
            n = min(rest, budget)
            if whole_upto and (n < rest or rest > whole_upto):
                break
            if not self.block_manager.can_admit(seq, match, match.num_tokens + n):
                break
            self.waiting.pop()
            self.block_manager.admit(seq, match, match.num_tokens + n)
            if seq.num_preemptions == 0 and seq.admit_order < 0:
                seq.num_prefix_hit_tokens = match.num_tokens
                seq.first_scheduled_at = time.monotonic()
            seq.admit_order = next(self._admit_counter)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._put(batch, seq, n)
            budget -= n
        return budget

    @staticmethod
    def _put(batch: ScheduledBatch, seq: Sequence, n: int) -> None:
        seq.schedule(n)
        batch.seqs.append(seq)
        if seq.num_draft_tokens:
            batch.num_decode_tokens += n
            batch.num_draft_tokens += seq.num_draft_tokens
        elif n == 1 and seq.num_uncomputed_tokens == 1 and seq.num_completion_tokens > 0:
            batch.num_decode_tokens += 1
        else:
            batch.num_prefill_tokens += n

    def recompute(self, seqs: list[Sequence]) -> list[Sequence]:
        """Send these running sequences back to the head of the waiting queue, in their order, with
        their blocks freed, to be computed again from the start (a chunk that failed before any of its
        work counted); the others (finished, aborted) are left alone. Returns those sent back."""
        requeued = [s for s in seqs if s in self.running]
        for seq in reversed(requeued):
            self._preempt(seq)
        return requeued

    def _preempt(self, seq: Sequence) -> None:
        seq.drop_drafts()
        self.speculator.release(seq, finished=False)
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        seq.num_preemptions += 1
        self.waiting.requeue(seq)

    # ---- after the model ran -------------------------------------------------------------------
    def update_from_output(
        self, seqs: list[Sequence], output: RunnerOutput, in_flight: Collection[int] = ()
    ) -> list[SeqUpdate]:
        """Apply one launched step's output to its sequences (batch order): the only place sampled
        tokens are applied, stops checked, blocks committed and finished sequences' blocks freed.

        A synchronous step's sequences commit their scheduled tokens here; a verifying sequence keeps
        the drafts its samples confirm; a run-ahead step's token fills its placeholder (its cache was
        committed at launch). A sequence finished while the step ran (aborted) drops its tokens.
        `in_flight`: ids of sequences in a step launched after this one. One of them that finishes
        here keeps its blocks, which the device is still writing, until the next call: that call's
        output comes from that step or a later one, so the step has completed by then.
        """
        self._free_deferred()
        updates: list[SeqUpdate] = []
        cfg, commit = self.config, self.block_manager.commit
        plain_rows = cfg.role != "prefill"
        for seq, tokens, logprobs in zip(seqs, output.sampled, output.logprobs, strict=True):
            if seq.status is SequenceStatus.FINISHED:
                seq.truncate(seq.num_known_tokens)
                continue
            if plain_rows and logprobs is None and len(tokens) == 1 and seq.num_pending_tokens == 1:
                # A run-ahead decode row (most rows of most steps): `_place` and `_check_stops`'s verbs
                # and rules without their dispatch (a placeholder with drafts behind it resolves in place).
                position = seq.resolve_placeholder(tokens[0])
                commit(seq)
                if first_stop(seq, tokens, position, cfg.eos_token_ids, cfg.max_model_len) is None:
                    updates.append(SeqUpdate(seq, tokens[0], False))
                    continue
                updates += self._check_stops(seq, tokens, defer_free=seq.seq_id in in_flight)
                continue
            new_tokens = self._place(seq, tokens)
            commit(seq)
            if new_tokens and logprobs is not None:
                seq.logprobs.append(logprobs)
            updates += self._check_stops(seq, new_tokens, defer_free=seq.seq_id in in_flight)
        return updates

    def _place(self, seq: Sequence, tokens: list[int]) -> list[int]:
        """Advance `seq`'s cache past this step and put the sampled tokens in; returns the new ones."""
        if seq.num_pending_tokens:
            seq.resolve_placeholder(tokens[0])
            return tokens
        if seq.num_draft_tokens:
            return self.speculator.accept(seq, tokens)
        seq.commit_scheduled()
        seq.append_tokens(tokens)
        return tokens

    def _check_stops(self, seq: Sequence, new_tokens: list[int], defer_free: bool) -> list[SeqUpdate]:
        """One update per new token; the first stop ends `seq` there (later tokens are dropped)."""
        cfg = self.config
        length = seq.num_known_tokens - len(new_tokens)  # before the first new token (drafts may follow)
        stop = first_stop(seq, new_tokens, length, cfg.eos_token_ids, cfg.max_model_len)
        if stop is None and len(new_tokens) == 1 and cfg.role != "prefill":
            return [SeqUpdate(seq, new_tokens[0], False)]  # the common case, without the general walk
        kept = new_tokens if stop is None else new_tokens[: stop.index + 1]
        updates = [SeqUpdate(seq, token, finished=False) for token in kept]
        if stop is not None:
            seq.truncate(length + len(kept))
            self.finish(seq, stop.reason, defer_free)
            updates[-1] = SeqUpdate(seq, kept[-1], finished=True)
        elif updates and cfg.role == "prefill":
            self.running.remove(seq)
            seq.status = SequenceStatus.HANDED_OFF
            self.handed_off[seq.seq_id] = seq
            updates[-1] = SeqUpdate(seq, updates[-1].new_token_id, finished=False, handed_off=True)
        return updates
