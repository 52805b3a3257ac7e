"""Iteration-level continuous batching with chunked prefill, prefix reuse and preemption.

Each step first gives every running sequence its next tokens (one for a decoding sequence, the
next chunk for one still prefilling), then admits waiting sequences into the remaining token
budget. Any prompt may be split into chunks, not only the first of a batch. When the KV cache runs
out, the most recently admitted running sequence is preempted: its blocks are freed and it goes back
to the head of the queue to be recomputed (its cached prefix usually survives in the LRU).

Roles: `mixed` runs a request from prompt to finish. `prefill` hands a sequence off as soon as its
first token is sampled, keeping its blocks pinned until `release`. `decode` receives sequences
whose prompt KV arrives by transfer (`reserve_for_transfer` / `complete_transfer`), and recomputes
them locally if the transfer fails.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import count

from common.block_manager import BlockManager
from common.sequence import FinishReason, Sequence, SequenceStatus
from common.speculative import SpecStats, accept_drafts, drop_drafts


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    role: str = "mixed"
    eos_token_ids: frozenset[int] = frozenset()


@dataclass
class ScheduledBatch:
    """Sequences to run this step; each carries `num_scheduled_tokens`."""

    seqs: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_draft_tokens: int = 0  # speculative proposals verified this step (counted in decode tokens)

    @property
    def is_decode(self) -> bool:
        """Every sequence computes exactly its last token (the CUDA-graph-friendly case)."""
        return bool(self.seqs) and self.num_prefill_tokens == 0 and self.num_draft_tokens == 0

    def __len__(self) -> int:
        return len(self.seqs)


@dataclass(frozen=True)
class SeqUpdate:
    """What happened to one sequence in a step."""

    seq: Sequence
    new_token_id: int | None
    finished: bool
    handed_off: bool = False


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.transferring: dict[int, Sequence] = {}
        self.handed_off: dict[int, Sequence] = {}
        self._admit_counter = count()
        self.proposer = None  # speculative decoding: an object with propose(seq) -> draft tokens
        self.spec_stats = SpecStats()

    # ---- intake --------------------------------------------------------------------------------
    def validate(self, seq: Sequence) -> None:
        """Reject a sequence that could never run (raises ValueError)."""
        if len(seq) == 0:
            raise ValueError("prompt must contain at least one token")
        if len(seq) > self.config.max_model_len:
            raise ValueError(
                f"prompt has {len(seq)} tokens, more than max_model_len={self.config.max_model_len}"
            )
        if seq.num_blocks_needed > self.block_manager.num_blocks:
            raise ValueError(
                f"prompt needs {seq.num_blocks_needed} KV blocks but the cache has "
                f"{self.block_manager.num_blocks}"
            )

    def add(self, seq: Sequence) -> None:
        self.validate(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.transferring)

    @property
    def queued_prefill_tokens(self) -> int:
        tokens = sum(s.num_uncomputed_tokens for s in self.waiting)
        return tokens + sum(s.num_uncomputed_tokens - 1 for s in self.running if s.num_uncomputed_tokens > 1)

    # ---- one step ------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self._schedule_running(batch, self.config.max_num_batched_tokens)
        if not batch.preempted:
            self._admit_waiting(batch, budget)
        return batch

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            self._add_drafts(seq, budget)
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.grow(seq, seq.num_cached_tokens + n):
                victim = self.running[-1]
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    return budget
            self._put(batch, seq, n)
            budget -= n
            i += 1
        return budget

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            match = self.block_manager.match_prefix(seq)
            n = min(len(seq) - match.num_tokens, budget)
            if not self.block_manager.can_admit(seq, match, match.num_tokens + n):
                break
            self.waiting.popleft()
            self.block_manager.admit(seq, match, match.num_tokens + n)
            if seq.num_preemptions == 0 and seq.admit_order < 0:
                seq.num_prefix_hit_tokens = match.num_tokens
            seq.admit_order = next(self._admit_counter)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._put(batch, seq, n)
            budget -= n

    def _add_drafts(self, seq: Sequence, budget: int) -> None:
        """Append speculative proposals to a decoding sequence (verified in this step's forward)."""
        if self.proposer is None or seq.num_uncomputed_tokens != 1 or seq.num_completion_tokens == 0:
            return
        if len(self.running) > self.proposer.config.max_batch or budget < 2:
            return
        drafts = self.proposer.propose(seq)[: budget - 1]
        seq.token_ids.extend(drafts)
        seq.num_draft_tokens = len(drafts)

    @staticmethod
    def _put(batch: ScheduledBatch, seq: Sequence, n: int) -> None:
        seq.num_scheduled_tokens = n
        batch.seqs.append(seq)
        if seq.num_draft_tokens:
            batch.num_decode_tokens += n
            batch.num_draft_tokens += seq.num_draft_tokens
        elif n == 1 and seq.num_uncomputed_tokens == 1 and seq.num_completion_tokens > 0:
            batch.num_decode_tokens += 1
        else:
            batch.num_prefill_tokens += n

    def _preempt(self, seq: Sequence) -> None:
        drop_drafts(seq)
        if self.proposer is not None:
            self.proposer.release(seq)
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ---- after the model ran -------------------------------------------------------------------
    def postprocess(
        self,
        batch: ScheduledBatch,
        sampled: list[int | None],
        all_samples: dict[int, list[int]] | None = None,
    ) -> list[SeqUpdate]:
        """Advance cache counters and append sampled tokens (None: mid-prompt chunk, no sample).

        `all_samples[i]`: every sampled position of batch entry i when it verified drafts."""
        updates = []
        for i, (seq, token) in enumerate(zip(batch.seqs, sampled, strict=True)):
            if seq.status != SequenceStatus.RUNNING:  # finished while the step ran
                continue
            if seq.num_draft_tokens:
                updates += self._verify(seq, (all_samples or {}).get(i, [token]))
                continue
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            self.block_manager.commit(seq)
            if token is None:
                continue
            seq.append_token(token)
            updates.append(self._after_token(seq, token))
        return updates

    def _verify(self, seq: Sequence, samples: list[int]) -> list[SeqUpdate]:
        """Keep the drafts the target's samples confirm, plus one sampled token (see common.speculative)."""
        base, new_tokens = accept_drafts(seq, samples, self.spec_stats)
        self.block_manager.commit(seq)
        updates = []
        for j, token in enumerate(new_tokens):
            reason = self.stop_reason(seq, token, length=base + j + 1)
            if reason is None:
                updates.append(SeqUpdate(seq, token, finished=False))
                continue
            del seq.token_ids[base + j + 1 :]  # never emit past a stop inside an accepted run
            self.finish(seq, reason)
            updates.append(SeqUpdate(seq, token, finished=True))
            break
        return updates

    def _after_token(self, seq: Sequence, token: int) -> SeqUpdate:
        reason = self.stop_reason(seq, token)
        if reason is not None:
            self._finish(seq, reason)
            return SeqUpdate(seq, token, finished=True)
        if self.config.role == "prefill":
            self.running.remove(seq)
            seq.status = SequenceStatus.HANDED_OFF
            self.handed_off[seq.seq_id] = seq
            return SeqUpdate(seq, token, finished=False, handed_off=True)
        return SeqUpdate(seq, token, finished=False)

    def stop_reason(self, seq: Sequence, token: int, length: int | None = None) -> FinishReason | None:
        """Why `token`, ending the first `length` tokens of `seq` (default: all), finishes it."""
        params = seq.sampling_params
        length = len(seq) if length is None else length
        completion = length - seq.num_prompt_tokens
        if token in params.stop_token_ids and completion >= params.min_tokens:
            return FinishReason.STOP
        eos = not params.ignore_eos and token in self.config.eos_token_ids
        if eos and completion >= params.min_tokens:
            return FinishReason.STOP
        if self.length_exhausted(seq, length):
            return FinishReason.LENGTH
        return None

    def length_exhausted(self, seq: Sequence, length: int) -> bool:
        """The first `length` tokens of `seq` use up its max_tokens or the model's context."""
        completion = length - seq.num_prompt_tokens
        return completion >= seq.sampling_params.max_tokens or length >= self.config.max_model_len

    def finish(self, seq: Sequence, reason: FinishReason, free_blocks: bool = True) -> None:
        """Finish a sequence wherever it is. `free_blocks=False` leaves the blocks to the caller,
        for a sequence the device is still writing KV for (a run-ahead step in flight)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if free_blocks:
            self.block_manager.free(seq)
        if self.proposer is not None:
            self.proposer.release(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        self.finish(seq, reason)

    # ---- aborts and hand-offs ------------------------------------------------------------------
    def abort(self, request_ids: Iterable[str]) -> list[Sequence]:
        """Finish every sequence of these requests wherever it is; returns the aborted ones."""
        wanted = set(request_ids)
        aborted = [s for s in self._all_live() if s.request_id in wanted]
        for seq in aborted:
            if seq in self.waiting:
                self.waiting.remove(seq)
            self.transferring.pop(seq.seq_id, None)
            self.handed_off.pop(seq.seq_id, None)
            self._finish(seq, FinishReason.ABORT)
        return aborted

    def _all_live(self) -> list[Sequence]:
        return [*self.waiting, *self.running, *self.transferring.values(), *self.handed_off.values()]

    def release(self, seq: Sequence) -> None:
        """Prefill role: the decode side has its copy; unpin the blocks (they stay cached)."""
        if self.handed_off.pop(seq.seq_id, None) is not None:
            self._finish(seq, FinishReason.STOP if seq.finish_reason is None else seq.finish_reason)

    def reserve_for_transfer(self, seq: Sequence) -> bool:
        """Decode role: allocate blocks for the prompt's KV; False if the cache is full right now."""
        self.validate(seq)
        if not self.block_manager.grow(seq, seq.num_prompt_tokens):
            return False
        seq.status = SequenceStatus.TRANSFERRING
        self.transferring[seq.seq_id] = seq
        return True

    def complete_transfer(self, seq: Sequence) -> None:
        """The prompt's KV arrived: the sequence joins the running batch at its first decode step."""
        self.transferring.pop(seq.seq_id)
        seq.num_cached_tokens = seq.num_prompt_tokens
        self.block_manager.commit(seq)
        seq.status = SequenceStatus.RUNNING
        seq.admit_order = next(self._admit_counter)
        self.running.append(seq)

    def fail_transfer(self, seq: Sequence) -> None:
        """The transfer failed: recompute the prompt (and the first token's KV) locally."""
        self.transferring.pop(seq.seq_id)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.append(seq)
