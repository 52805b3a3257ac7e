"""A prefill chunk in flight in multiplexed mode (common/multiplex/stepper.py) and the stepper's counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from common.core.sequence import Sequence
from common.multiplex.inline_budget import ChunkTiming
from common.multiplex.partitions import Completion
from common.runner.side_launch import SideLaunch


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


@dataclass
class MultiplexStats:
    """Counters for benchmarks: chunks launched per lane index, the parts they were launched in, decode
    steps run beside a chunk (the worker's stats line reads `StepTimings`' share of them)."""

    chunks_per_lane: dict[int, int] = field(default_factory=dict)
    chunk_parts: int = 0
    decode_steps_beside: int = 0
