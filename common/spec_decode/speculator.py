"""The seam between the scheduler and speculative decoding: the `Speculator` interface the scheduler
composes (given to its constructor), and `NoSpeculator`, what it composes when nothing speculates.

The engine builds one speculator (`build_speculator`, from `LLMEngine.from_config`), hands it to the
scheduler, and reports each step's timing to it; the run-ahead pipeline asks it whether a step may
stay in flight. Nothing else reaches into speculation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from common.core.sequence import Sequence
from common.spec_decode.speculative import SpecStats

if TYPE_CHECKING:
    from common.core.batch import ScheduledBatch


class Speculator(ABC):
    """Speculative decoding as the scheduler sees it.

    Invariants:
    * Exactness: `plan` only adds drafts (`Sequence.add_drafts`) to decoding sequences, within the
      step's budget; `accept` keeps exactly the drafts the target's samples confirm, plus one sampled
      token, so outputs are those of plain decoding.
    * Per-sequence state (acceptance records, a proposer's indexes or draft mirrors) lives in the
      speculator's own tables keyed by `Sequence.seq_id`, never on the sequence, and is dropped by
      `release(seq, finished=True)`.
    * `stats` counts what was proposed and accepted since the speculator was built.
    """

    stats: SpecStats

    @abstractmethod
    def plan(self, running: list[Sequence], budget: int) -> None:
        """Add this step's drafts to the decoding sequences among `running` (maybe to none) before the
        scheduler gives each its tokens. `budget`: tokens the step may compute; every running sequence
        keeps one, drafts share the rest."""

    @abstractmethod
    def accept(self, seq: Sequence, samples: list[int]) -> list[int]:
        """`seq` verified its drafts: keep those `samples` confirm and one sampled token; returns the
        new tokens in order."""

    @abstractmethod
    def holds_run_ahead(self, running: list[Sequence]) -> bool:
        """Must the in-flight run-ahead step resolve before the next one launches, because this
        speculator would propose for `running` from tokens that are still on the device?"""

    @abstractmethod
    def observe_step(self, start: float, batch: ScheduledBatch, ran_ahead: bool, drained: bool) -> None:
        """A non-empty step began at `start` (perf_counter seconds): `batch` is what it runs,
        `ran_ahead` whether it stays in flight, `drained` whether it first waited for a run-ahead
        step. Lets the speculator learn what steps cost on this engine."""

    @abstractmethod
    def release(self, seq: Sequence, finished: bool) -> None:
        """`seq` left the running batch: finished (all its state goes) or preempted (`finished`
        False: it comes back with its tokens, so its acceptance record stays)."""


class NoSpeculator(Speculator):
    """No speculation configured: never drafts, never holds the pipeline."""

    def __init__(self) -> None:
        self.stats = SpecStats()

    def plan(self, running: list[Sequence], budget: int) -> None:
        pass

    def accept(self, seq: Sequence, samples: list[int]) -> list[int]:
        raise ValueError(f"sequence {seq.seq_id} has drafts but nothing speculates")

    def holds_run_ahead(self, running: list[Sequence]) -> bool:
        return False

    def observe_step(self, start: float, batch: ScheduledBatch, ran_ahead: bool, drained: bool) -> None:
        pass

    def release(self, seq: Sequence, finished: bool) -> None:
        pass
