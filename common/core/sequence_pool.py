"""Where each live sequence is, and the moves between those places that no step makes.

A sequence waits (in the admission policy's queue), runs, or is outside the step loop in a P/D pair:
transferring on a decode worker (blocks reserved while its prompt's KV arrives) or handed off on a
prefill worker (blocks pinned until the decode side has its copy). Intake, finishing, aborts and the
hand-off and transfer calls move sequences between those places from outside a step. They live here,
apart from `common/core/scheduler.py` (which builds each step and applies its output), so that the
scheduler reads as the step policy and this as the bookkeeping that it and the roles' calls share.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import count

from common.core.batch import SchedulerConfig
from common.core.block_manager import BlockManager
from common.core.request_queue import RequestQueue
from common.core.sequence import FinishReason, Sequence, SequenceStatus
from common.spec_decode.speculator import NoSpeculator, Speculator


class SequencePool:
    """The live sequences by place. `speculator`: proposes drafts each step and accepts what the target
    confirms (None: nothing speculates; the pool then composes a `NoSpeculator`, so the scheduler never
    asks whether one exists). It is the pool's because `finish` releases a sequence's drafts."""

    def __init__(
        self, config: SchedulerConfig, block_manager: BlockManager, speculator: Speculator | None = None
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: RequestQueue[Sequence] = RequestQueue()  # the admission policy
        self.running: list[Sequence] = []
        self.transferring: dict[int, Sequence] = {}
        self.handed_off: dict[int, Sequence] = {}
        self._admit_counter = count()
        self.speculator: Speculator = speculator if speculator is not None else NoSpeculator()
        self._deferred_free: list[Sequence] = []  # finished while a launched step writes their KV

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
        self.waiting.push(seq)

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

    # ---- finishing -----------------------------------------------------------------------------
    def finish(self, seq: Sequence, reason: FinishReason, defer_free: bool = False) -> None:
        """Finish a sequence wherever it is. `defer_free`: a launched step still writes its KV, so its
        blocks are freed by the next `update_from_output`."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if defer_free:
            self._deferred_free.append(seq)
        else:
            self.block_manager.free(seq)
        self.speculator.release(seq, finished=True)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _free_deferred(self) -> None:
        for seq in self._deferred_free:
            self.block_manager.free(seq)
        self._deferred_free = []

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
            self.finish(seq, FinishReason.ABORT)
        return aborted

    def _all_live(self) -> list[Sequence]:
        return [*self.waiting, *self.running, *self.transferring.values(), *self.handed_off.values()]

    def release(self, seq: Sequence) -> None:
        """Prefill role: the decode side has its copy; unpin the blocks (they stay cached)."""
        if self.handed_off.pop(seq.seq_id, None) is not None:
            self.finish(seq, FinishReason.STOP if seq.finish_reason is None else seq.finish_reason)

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
        seq.set_cached_prefix(seq.num_prompt_tokens)
        self.block_manager.commit(seq)
        seq.status = SequenceStatus.RUNNING
        seq.admit_order = next(self._admit_counter)
        self.running.append(seq)

    def cancel_transfer(self, seq: Sequence) -> None:
        """The prompt's KV arrived but the sequence will not run (refused at admission): free it."""
        self.transferring.pop(seq.seq_id)
        self.finish(seq, FinishReason.ABORT)

    def fail_transfer(self, seq: Sequence) -> None:
        """The transfer failed: recompute the prompt (and the first token's KV) locally."""
        self.transferring.pop(seq.seq_id)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.push(seq)
