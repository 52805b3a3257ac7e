"""A step or prefill chunk that runs out of device memory is computed again instead of failing the worker.

An out-of-memory error in a launch (eager activations come from the caching allocator) used to fail the
engine step and with it every request the worker held: in multiplexed mode on an 80-GB H100 two such
errors in prefill chunks failed 130 requests of the Qwen3-8B shape (docs/benchmarks.md). Nothing the
failed launch wrote counts yet (blocks are registered and tokens applied only once a step's output is
taken), so its sequences go back to the head of the waiting queue with their blocks freed (preemption
by recompute: their generated tokens stay and are computed again with the prompt), the allocator's
unused blocks go back to the device, and the work is scheduled again. Users: the multiplexed stepper for
its chunks (the decode batch beside one is untouched) and the aggregated engine for its steps; both
also halve their launches' token budget after each such error (`TokenBudget`). A sequence that ran out
`MAX_RETRIES` times lets the error through: its launch's requests alone fail (`SequencesFailed`),
retryably, except under tensor parallelism, where the worker fails every request it holds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from common.core.scheduler import Scheduler
from common.core.sequence import Sequence

log = logging.getLogger(__name__)

# Recomputations of one sequence's prompt after its chunk ran out of memory, before the error stands.
MAX_RETRIES = 2
# The fewest prompt tokens a shrunk `TokenBudget` allows a launch: prompts still advance by this much.
MIN_LAUNCH_TOKENS = 512
# Launches with prompt tokens resolved in a row, after a shrink, before the budget doubles again.
RESTORE_AFTER_LAUNCHES = 32


class MemoryRetries:
    """A record of sequences recomputed after out-of-memory errors (by sequence id)."""

    def __init__(self, max_retries: int = MAX_RETRIES) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.max_retries = max_retries
        self._counts: dict[int, int] = {}
        self.recomputed = 0  # launches recomputed (for stats and tests)

    def recover(self, error: BaseException, scheduler: Scheduler, seqs: list[Sequence]) -> bool:
        """After `error` abandoned a launch of `seqs` (held aborts already applied, the kernels it
        launched finished): True when the sequences were sent back to be computed again; False when
        the error must stand (not an out-of-memory error, or one of them has run out `max_retries`
        times)."""
        if not isinstance(error, torch.OutOfMemoryError):
            return False
        if any(self._counts.get(s.seq_id, 0) >= self.max_retries for s in seqs):
            self.forget(seqs)
            return False
        requeued = scheduler.recompute(seqs)
        self.forget(s for s in seqs if s not in requeued)  # aborted meanwhile: nothing to count
        for seq in requeued:
            self._counts[seq.seq_id] = self._counts.get(seq.seq_id, 0) + 1
        torch.cuda.empty_cache()  # the other streams' unused blocks, for the next attempt (CPU: nothing)
        self.recomputed += 1
        log.warning("a launch of %d sequence(s) ran out of device memory: computing it again", len(seqs))
        return True

    def forget(self, seqs: Iterable[Sequence]) -> None:
        """The sequences' launch resolved (or failed for good): their counts go."""
        if not self._counts:  # the common case, on every step: nothing ran out
            return
        for seq in seqs:
            self._counts.pop(seq.seq_id, None)


@dataclass
class TokenBudget:
    """The most tokens the next launch computes (a multiplexed prefill chunk, an aggregated step):
    `full`, halved for each launch that ran out of device memory, doubled back after `restore_after`
    launches with prompt tokens resolve in a row; never below `floor` (nor above `full`). Why: the retry
    at the same size ran out again (on an 80-GB H100 the Qwen3-8B shape's 8,192-token chunks, eager on a
    32-SM share beside the blocks the other streams keep cached, three times in a row, 2026-12-06), and
    past its retries the error fails requests; a smaller launch needs proportionally less."""

    full: int
    floor: int = MIN_LAUNCH_TOKENS
    restore_after: int = RESTORE_AFTER_LAUNCHES
    halvings: int = 0
    resolved_in_a_row: int = 0

    def __post_init__(self) -> None:
        for name in ("full", "floor", "restore_after"):
            if getattr(self, name) < 1:
                raise ValueError(f"TokenBudget.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def tokens(self) -> int:
        return max(self.full >> self.halvings, min(self.floor, self.full))

    def ran_out(self) -> None:
        """A launch ran out of device memory: the next ones take half as many tokens (down to `floor`)."""
        if self.tokens > min(self.floor, self.full):
            self.halvings += 1
            log.warning("a launch ran out of device memory: launches take at most %d tokens", self.tokens)
        self.resolved_in_a_row = 0

    def resolved(self) -> None:
        """A launch with prompt tokens finished: after `restore_after` in a row, a shrunk budget doubles."""
        if not self.halvings:
            return
        self.resolved_in_a_row += 1
        if self.resolved_in_a_row >= self.restore_after:
            self.halvings -= 1
            self.resolved_in_a_row = 0
