"""A prefill chunk in flight in multiplexed mode (common/multiplex/stepper.py) and the stepper's counters."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property

from common.core.sequence import Sequence
from common.multiplex.inline_budget import ChunkTiming
from common.multiplex.partitions import Completion
from common.runner.side_launch import SideLaunch

log = logging.getLogger(__name__)
# A chunk part whose launch takes the engine thread longer than this is logged (`SlowLaunches`).
SLOW_LAUNCH_S = 0.020


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


class SlowLaunches:
    """Logs chunk parts whose launch took the engine thread more than SLOW_LAUNCH_S, with their share,
    their graph bucket (or eager), their tokens and whether that share had launched that bucket before.
    Why: rare 47-150 ms launches make the chat ITL maxima (docs/benchmarks.md, sessions 30-31), mostly
    early in a run; a first use of a (share, bucket) pair is the leading suspect, and served runs show
    only these lines, not a profile."""

    def __init__(self) -> None:
        self._seen: set[tuple[int | None, int | None]] = set()

    def record(self, sms: int | None, chunk: ChunkInFlight, seconds: float) -> bool:
        """One part's launch took `seconds` on a share of `sms` SMs (None: the whole device); True when
        it was logged."""
        key = (sms, chunk.launch.bucket)
        first = key not in self._seen
        self._seen.add(key)
        if seconds <= SLOW_LAUNCH_S:
            return False
        log.warning(
            "slow chunk launch: %.1f ms on %s SMs, %s, %d tokens, %s",
            seconds * 1e3,
            "all" if sms is None else sms,
            "eager" if chunk.launch.bucket is None else f"graph bucket {chunk.launch.bucket}",
            chunk.tokens,
            "first use of that share and bucket" if first else "share and bucket used before",
        )
        return True
