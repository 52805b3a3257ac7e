"""The engine loop of multiplexed mode: one prefill chunk in flight on its SM share, decode steps beside it.

One thread, one engine, one model and one KV pool, so the hand-off from prefill to decode copies
nothing: a sequence whose prompt the chunk computed simply becomes decodable in the same block table.
Each `step()`:

1. resolves the chunk in flight if its completion says it is done (its first tokens are sampled,
   stops checked, blocks committed; the sequences join the decode batch from now on);
2. when no chunk is in flight, schedules the next one (`SplitScheduler.schedule_prefill`), asks the
   controller for its lane (SM share) and launches it there without waiting;
3. runs one decode step on the engine's stream (the CUDA graphs, all SMs but the chunk's share) over
   every decoding sequence not in the chunk, synchronously, and reports its duration to the controller
   while a chunk runs; with nothing to decode it waits for the chunk and resolves it instead.

Invariants: a chunk's sequences are `busy` until it resolves: never scheduled, preempted or freed
(an abort of one is held back until the chunk has finished, because the device may still be writing
its KV blocks and a freed block could be handed to a decoding sequence at once). Decode steps are
synchronous, so when a chunk is scheduled no decode work is in flight on the other stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from common.config import EngineConfig
from common.core.batch import SeqUpdate
from common.core.sequence import Sequence
from common.core.split_scheduler import SplitScheduler, is_decoding
from common.core.step_records import StepResult, StepTimings
from common.multiplex.controller import ControllerConfig, ShareController
from common.multiplex.partitions import Completion, SMPartitions
from common.runner.step_handle import StepHandle

if TYPE_CHECKING:
    from common.runner.model_runner import ModelRunner


@dataclass
class _Chunk:
    seqs: list[Sequence]
    handle: StepHandle
    completion: Completion
    lane: int

    @cached_property
    def request_ids(self) -> frozenset[str]:
        return frozenset(s.request_id for s in self.seqs)

    @cached_property
    def seq_ids(self) -> frozenset[int]:
        """Read by every decode step beside the chunk: built once."""
        return frozenset(s.seq_id for s in self.seqs)


@dataclass
class MultiplexStats:
    """Counters for benchmarks: chunks launched per lane index, decode steps run beside a chunk."""

    chunks_per_lane: dict[int, int] = field(default_factory=dict)
    decode_steps_beside: int = 0


class MultiplexedSteps:
    """See the module docstring. `chunk_tokens`: the most prompt tokens one chunk computes."""

    def __init__(
        self,
        scheduler: SplitScheduler,
        runner: ModelRunner,
        partitions: SMPartitions,
        controller: ShareController,
        chunk_tokens: int,
        timings: StepTimings,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.partitions = partitions
        self.controller = controller
        self.chunk_tokens = chunk_tokens
        self.timings = timings
        self.stats = MultiplexStats()
        self._chunk: _Chunk | None = None
        self._held_aborts: set[str] = set()

    @classmethod
    def build(
        cls,
        config: EngineConfig,
        scheduler: SplitScheduler,
        runner: ModelRunner,
        partitions: SMPartitions,
        timings: StepTimings,
    ) -> MultiplexedSteps:
        """Chunks of up to `max_num_batched_tokens`, shares following `itl_target_ms`."""
        lanes = len(partitions.lanes)
        controller = ShareController(ControllerConfig(config.itl_target_ms / 1e3, num_lanes=lanes))
        return cls(scheduler, runner, partitions, controller, config.max_num_batched_tokens, timings)

    @property
    def in_flight(self) -> bool:
        return self._chunk is not None

    def abort(self, request_ids: Iterable[str]) -> list[Sequence]:
        """Abort now what is not in the chunk in flight; the rest when the chunk resolves."""
        wanted = set(request_ids)
        if self._chunk is not None:
            held = wanted & self._chunk.request_ids
            self._held_aborts |= held
            wanted -= held
        return self.scheduler.abort(wanted)

    def step(self, result: StepResult) -> None:
        if self._chunk is not None and self._chunk.completion.done():
            result.updates += self._resolve(self._chunk)
        if self._chunk is None:
            self._launch_chunk(result)
        if not self._decode(result) and self._chunk is not None:
            self._chunk.completion.wait()
            result.updates += self._resolve(self._chunk)

    def _launch_chunk(self, result: StepResult) -> None:
        batch = self.scheduler.schedule_prefill(self.chunk_tokens)
        result.num_preempted += len(batch.preempted)
        if not batch.seqs:
            return
        began = time.perf_counter()
        lane = self.controller.next_lane(decoding=any(map(is_decoding, self.scheduler.running)))
        handle = self.runner.launch_side(batch.seqs, self.partitions.lanes[lane])
        self._chunk = _Chunk(batch.seqs, handle, self.partitions.lanes[lane].record(), lane)
        self.stats.chunks_per_lane[lane] = self.stats.chunks_per_lane.get(lane, 0) + 1
        self.timings.prefill_forward += time.perf_counter() - began  # host time to launch it
        self.timings.prefill_steps += 1
        result.num_prefill_tokens += batch.num_prefill_tokens

    def _decode(self, result: StepResult) -> bool:
        """One synchronous decode step; False when no sequence decodes."""
        busy = self._chunk.seq_ids if self._chunk is not None else frozenset()
        batch = self.scheduler.schedule_decode(busy)
        result.num_preempted += len(batch.preempted)
        if not batch.seqs:
            return False
        began = time.perf_counter()
        output = self.runner.launch(batch.seqs, True).result()
        seconds = time.perf_counter() - began
        result.updates += self.scheduler.update_from_output(batch.seqs, output)
        if self._chunk is not None:
            self.controller.observe_decode(seconds)
            self.stats.decode_steps_beside += 1
        self.timings.decode_forward += seconds
        self.timings.decode_steps += 1
        result.num_decode_tokens += batch.num_decode_tokens
        return True

    def _resolve(self, chunk: _Chunk) -> list[SeqUpdate]:
        """`chunk` has finished: apply held aborts (its blocks are safe to free now), then its tokens."""
        self._chunk = None
        output = chunk.handle.result()
        if self._held_aborts:
            self.scheduler.abort(self._held_aborts)
            self._held_aborts = set()
        return self.scheduler.update_from_output(chunk.seqs, output)
