"""What one engine step schedules (`ScheduledBatch`) and what it did to each sequence (`SeqUpdate`),
and the scheduler's limits (`SchedulerConfig`): the records the scheduler, the engine, run-ahead and
the speculators pass between them (common/core/scheduler.py makes and applies them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from common.core.sequence import Sequence


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    role: str = "mixed"
    eos_token_ids: frozenset[int] = frozenset()
    delay_factor: float = 0.0  # admission delay while sequences run (common/core/admission_delay.py)


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


class SeqUpdate(NamedTuple):  # a tuple: one is made per sequence per step, and tuples build fastest
    """What happened to one sequence in a step."""

    seq: Sequence
    new_token_id: int | None
    finished: bool
    handed_off: bool = False
