"""A step or prefill chunk that runs out of device memory is computed again instead of failing the worker.

An out-of-memory error in a launch (eager activations come from the caching allocator) used to fail the
engine step and with it every request the worker held: in multiplexed mode on an 80-GB H100 two such
errors in prefill chunks failed 130 requests of the Qwen3-8B shape (docs/benchmarks.md). Nothing the
failed launch wrote counts yet (blocks are registered and tokens applied only once a step's output is
taken), so its sequences go back to the head of the waiting queue with their blocks freed (preemption
by recompute: their generated tokens stay and are computed again with the prompt), the allocator's
unused blocks go back to the device, and the work is scheduled again. Users: the multiplexed stepper for
its chunks (the decode batch beside one is untouched) and the aggregated engine for its steps. A
sequence that ran out `MAX_RETRIES` times lets the error through (the worker then fails its requests,
retryably).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from common.core.scheduler import Scheduler
from common.core.sequence import Sequence

log = logging.getLogger(__name__)

# Recomputations of one sequence's prompt after its chunk ran out of memory, before the error stands.
MAX_RETRIES = 2


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
