"""Scheduling for multiplexed mode (common/multiplex): decode steps and prefill chunks as separate batches.

The plain `Scheduler` packs every running sequence's next tokens and newly admitted prompts into one
batch per step. Multiplexed mode runs prefill chunks on a stream of their own beside the decode steps,
so it asks for the two kinds of work separately:

* `schedule_decode(busy)`: one token for every running sequence that is decoding (its prompt is
  computed and its last sampled token is its only uncomputed one) and is not `busy`.
* `schedule_prefill(budget)`: the next chunk of every running sequence still computing its prompt,
  then waiting sequences admitted into the rest of `budget` (as the plain scheduler admits them).
* `inline_prompts(batch, limit, budget)`: short waiting prompts computed inside a decode step (mixed
  rows), whole, in queue order; `schedule_prefill(budget, inline_limit)` then leaves such a head alone.

Invariants (what makes the two streams safe to overlap):
* `busy` holds the ids of the sequences of the prefill chunk in flight. They are never scheduled
  nor preempted while it runs: the device may still be writing their KV blocks, so those blocks
  must not be freed and handed to another sequence (aborts of busy sequences wait, see
  `common/multiplex/stepper.py`).
* A prefill chunk is scheduled only while no chunk is in flight, so its preemptions (the plain
  scheduler's policy: the most recently admitted running sequence) never touch a busy sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from common.core.batch import ScheduledBatch
from common.core.scheduler import Scheduler
from common.core.sequence import Sequence
from common.core.stopping import finishes_in_flight


def is_decoding(seq: Sequence) -> bool:
    """`seq`'s prompt is computed: its next step computes the one token it sampled last."""
    return seq.num_uncomputed_tokens == 1 and seq.num_completion_tokens > 0


class SplitScheduler(Scheduler):
    """A `Scheduler` whose steps are either all decode or all prefill (see the module docstring).

    Built without a speculator (multiplexed mode refuses speculation, common/config.py)."""

    def schedule_decode(self, busy: Collection[int] = ()) -> ScheduledBatch:
        """One token for each decoding sequence not `busy`, except a sequence whose run-ahead token
        still in flight is its last by length (the in-flight step's resolve finishes it)."""
        limit = self.config.max_model_len

        def wanted(s: Sequence) -> bool:
            return s.seq_id not in busy and is_decoding(s) and not finishes_in_flight(s, limit)

        batch = ScheduledBatch()
        self._schedule_matching(batch, self.config.max_num_seqs, wanted, busy)
        return batch

    def schedule_prefill(self, budget: int, inline_limit: int = 0) -> ScheduledBatch:
        """The next prefill chunk, at most `budget` tokens (only while no chunk is in flight).
        `inline_limit` > 0: a waiting head whose uncached prompt is at most that many tokens is left
        for `inline_prompts` (the decode step computes it), and admission stops there."""
        batch = ScheduledBatch()
        budget = self._schedule_matching(batch, budget, lambda s: not is_decoding(s), ())
        if not batch.preempted and not (inline_limit and self._head_fits(inline_limit)):
            self._admit_waiting(batch, budget)
        return batch

    def inline_prompts(self, batch: ScheduledBatch, limit: int, budget: int) -> None:
        """Admit whole waiting prompts of at most `limit` uncached tokens, in queue order, into the
        decode step `batch` while they fit in `budget` tokens (its decode rows counted, as aggregated
        mode counts them). The first prompt that is longer or does not fit stops it: it and those
        behind it wait for the chunk path or the next step."""
        if batch.seqs and not batch.preempted:
            self._admit_waiting(batch, budget - len(batch.seqs), whole_upto=limit)

    def _head_fits(self, limit: int) -> bool:
        if not self.waiting:
            return False
        head = self.waiting.peek()
        return len(head) - self.block_manager.match_prefix(head).num_tokens <= limit

    def _schedule_matching(
        self, batch: ScheduledBatch, budget: int, wanted: Callable[[Sequence], bool], busy: Collection[int]
    ) -> int:
        """The plain scheduler's running pass over the running sequences `wanted` picks; a preemption
        victim is never busy. Returns the budget left."""
        preempted: set[int] = set()
        for seq in [s for s in self.running if wanted(s)]:
            if budget <= 0:
                break
            if seq.seq_id in preempted:
                continue
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.grow(seq, seq.num_cached_tokens + n):
                # Running order is admission order and `seq` is not busy, so the victim (the last
                # candidate) is `seq` or a sequence after it: never one already in this batch.
                victim = self.waiting.victim([s for s in self.running if s.seq_id not in busy])
                self._preempt(victim)
                batch.preempted.append(victim)
                preempted.add(victim.seq_id)
                if victim is seq:
                    return budget
            self._put(batch, seq, n)
            budget -= n
        return budget
