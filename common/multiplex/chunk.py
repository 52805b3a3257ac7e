"""A prefill chunk in flight in multiplexed mode (common/multiplex/stepper.py), the size the next one may
take, and the stepper's counters."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property

from common.core.sequence import Sequence
from common.multiplex.inline_budget import ChunkTiming
from common.multiplex.partitions import Completion
from common.runner.side_launch import SideLaunch

log = logging.getLogger(__name__)


@dataclass
class ChunkInFlight:
    """`seqs` launched on lane `lane`; `completion` recorded once every part is launched. `tokens`,
    `host_seconds` (the engine thread's time on it so far: scheduling, launching, resolving) and `began`
    (perf_counter at its start, less the host time its scheduling took; set by `start`) time it for the
    inline budget."""

    seqs: list[Sequence]
    launch: SideLaunch
    lane: int
    tokens: int
    host_seconds: float = 0.0
    began: float = 0.0
    completion: Completion | None = None

    def start(self, now: float) -> None:
        """The chunk starts now: its wall time counts from here, less its scheduling, so a chunk held
        for its step's decode step leaves out the decode step it waited for."""
        self.began = now - self.host_seconds

    @property
    def done(self) -> bool:
        return self.completion is not None and self.completion.done()

    @cached_property
    def request_ids(self) -> frozenset[str]:
        return frozenset(s.request_id for s in self.seqs)

    @cached_property
    def seq_ids(self) -> frozenset[int]:
        """Read by every decode step beside the chunk: built once."""
        return frozenset(s.seq_id for s in self.seqs)

    def timing(self, done_at: float) -> ChunkTiming:
        return ChunkTiming(self.tokens, self.host_seconds, max(done_at - self.began, 1e-9))


# The smallest chunk a shrunk budget schedules (ChunkBudget): prompts still advance by this much a chunk.
MIN_CHUNK_TOKENS = 512
# Chunks resolved in a row, after a shrink, before the budget doubles again.
RESTORE_AFTER_CHUNKS = 32


@dataclass
class ChunkBudget:
    """The most prompt tokens the next chunk computes: `full`, halved for each chunk that ran out of
    device memory and was computed again (common/runner/memory_retry.py), doubled back after
    `restore_after` chunks in a row resolve; never below `floor` (nor above `full`). Why: an eager chunk
    on an SM share without graphs allocates its activations on its share's stream, beside the blocks
    the other shares' streams and the decode side keep cached; on an 80-GB H100 the Qwen3-8B shape's
    8,192-token chunks on a 32-SM share ran out three times in a row (2026-12-06) and the retry at the
    same size ran out again, failing the requests. A smaller chunk needs proportionally less."""

    full: int
    floor: int = MIN_CHUNK_TOKENS
    restore_after: int = RESTORE_AFTER_CHUNKS
    halvings: int = 0
    resolved_in_a_row: int = 0

    def __post_init__(self) -> None:
        for name in ("full", "floor", "restore_after"):
            if getattr(self, name) < 1:
                raise ValueError(f"ChunkBudget.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def tokens(self) -> int:
        return max(self.full >> self.halvings, min(self.floor, self.full))

    def ran_out(self) -> None:
        """A chunk ran out of device memory: the next ones take half as many tokens (down to `floor`)."""
        if self.tokens > min(self.floor, self.full):
            self.halvings += 1
            log.warning("a chunk ran out of device memory: chunks take at most %d prompt tokens", self.tokens)
        self.resolved_in_a_row = 0

    def resolved(self) -> None:
        """A chunk finished: after `restore_after` in a row, a shrunk budget doubles."""
        if not self.halvings:
            return
        self.resolved_in_a_row += 1
        if self.resolved_in_a_row >= self.restore_after:
            self.halvings -= 1
            self.resolved_in_a_row = 0


@dataclass
class MultiplexStats:
    """Counters for benchmarks: chunks launched per lane index, the parts they were launched in, decode
    steps run beside a chunk (the worker's stats line reads `StepTimings`' share of them)."""

    chunks_per_lane: dict[int, int] = field(default_factory=dict)
    chunk_parts: int = 0
    decode_steps_beside: int = 0
