"""The speculator the engine builds when `speculative` is set: a `Proposer` drafts, and the policy here
decides which sequences propose, how many drafts each, and whether a step verifies at all.

Per sequence: an `Acceptance` record in this speculator's table (keyed by sequence id) sets the draft
length and, after a rejection or an empty proposal, how many steps the sequence waits. Per step: with
measured step costs (a `StepClock`, on a device with CUDA graphs, fed by a `StepTimer` from the
engine's own steps) the drafts that pay are chosen (`spec_policy.choose_drafts`); without them (the
CPU) the fixed `max_batch` rule of `SpeculativeConfig` applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.config import EngineConfig
from common.core.sequence import Sequence
from common.model_config import ModelConfig
from common.runner.model_runner import ModelRunner
from common.spec_decode.draft_proposer import build_draft_proposer
from common.spec_decode.spec_policy import FRESH, Acceptance, any_pays, choose_drafts
from common.spec_decode.speculative import (
    NgramProposer,
    Proposer,
    SpecStats,
    SpeculativeConfig,
    accept_drafts,
    can_speculate_later,
)
from common.spec_decode.speculator import Speculator
from common.spec_decode.step_clock import StepClock, StepTimer

if TYPE_CHECKING:
    from common.core.batch import ScheduledBatch

# Steps a sequence waits after finding no match when proposing drains a run-ahead engine (a proposer
# that does not propose behind): each skipped step may run ahead, where a proposal needs a synced one.
SKIP_AFTER_NO_MATCH = 4
_MAX_SKIP_STEPS = 16
# Steps the measured-cost policy stays out after it found that nothing pays for the batch: weighing
# a large batch's drafts costs the host 0.2-0.6 ms (64 sequences x 8 drafts), more than run-ahead
# hides, and the answer changes slowly (H200 at 7d5c790: batch 64 at 0.70x with nothing verified).
RECHECK_AFTER_NOTHING_PAYS = 8


class ProposerSpeculator(Speculator):
    """Speculates with `proposer` under the cost policy. `clock`: measured step costs (None: the fixed
    `config.max_batch` rule); `run_ahead`: the engine runs plain decode steps ahead."""

    def __init__(
        self,
        proposer: Proposer,
        config: SpeculativeConfig,
        max_model_len: int,
        clock: StepClock | None = None,
        run_ahead: bool = False,
    ) -> None:
        self.proposer = proposer
        self.config = config
        limit = proposer.max_len
        self.max_model_len = max_model_len if limit is None else min(max_model_len, limit)
        self.clock = clock
        self.stats = SpecStats()
        self.records: dict[int, Acceptance] = {}  # seq_id -> its acceptance record
        # Proposing drains a run-ahead pipeline unless the proposer can propose behind it.
        drains = run_ahead and not proposer.proposes_behind
        self.skip_after_no_match = SKIP_AFTER_NO_MATCH if drains else 0
        self.timer = StepTimer(run_ahead)
        self._plans = 0  # plan() calls so far
        self._quiet_until = 0  # the policy found nothing to pay: no drafts before this many plans

    # ---- the Speculator interface --------------------------------------------------------------
    def plan(self, running: list[Sequence], budget: int) -> None:
        self._plans += 1
        wanted = self._wanted(running)
        if not wanted:
            return
        drafts = self.proposer.draft_batch([s for s, _ in wanted], [r for _, r in wanted])
        spare = budget - len(running)
        chosen, shortened = [], False
        for (seq, room), d in zip(wanted, drafts, strict=True):
            if not d:  # nothing to propose (free text): maybe let a few steps run ahead first
                self._record(seq).wait(seq.num_completion_tokens, self.skip_after_no_match + 1)
            d = d[: max(spare, 0)]
            shortened |= len(d) < room
            if d:
                chosen.append((seq, d))
                spare -= len(d)
        if self.clock is not None and shortened:  # fewer drafts than weighed: weigh them again
            counts = choose_drafts(self.clock, len(running), [(s, self._rate(s), len(d)) for s, d in chosen])
            keep = {id(s): c for s, c in counts}
            chosen = [(s, d[: keep[id(s)]]) for s, d in chosen if id(s) in keep]
        for seq, d in chosen:
            seq.add_drafts(d)

    def accept(self, seq: Sequence, samples: list[int]) -> list[int]:
        proposed = seq.num_draft_tokens
        new_tokens = accept_drafts(seq, samples, self.stats)
        accepted = len(new_tokens) - 1
        record, length = self._record(seq), seq.num_completion_tokens
        record.record(length, proposed, accepted)
        if not accepted:
            # After a fully rejected proposal a sequence waits before proposing again, longer the
            # less its drafts have been accepted lately (about 1/acceptance - 1 steps, at most 16):
            # free text rarely repeats itself, and each skipped step may run ahead.
            record.wait(length, min(_MAX_SKIP_STEPS, int(1.0 / record.rate(length)) - 1))
        return new_tokens

    def holds_run_ahead(self, running: list[Sequence]) -> bool:
        return not self.proposer.proposes_behind and self.may_speculate(running)

    def observe_step(self, start: float, batch: ScheduledBatch, ran_ahead: bool, drained: bool) -> None:
        if self.clock is not None:
            self.timer.step_started(self.clock, start, batch, ran_ahead, drained)

    def release(self, seq: Sequence, finished: bool) -> None:
        self.proposer.release(seq)
        if finished:
            self.records.pop(seq.seq_id, None)

    # ---- the policy ----------------------------------------------------------------------------
    def may_speculate(self, running: list[Sequence]) -> bool:
        """Could this step's batch speculate? False lets the engine run the step ahead (run-ahead
        leaves the last token on the device, where no proposal can read it)."""
        if not self._could_pay(running):
            return False
        candidates = [s for s in running if not self._is_waiting(s) and can_speculate_later(s)]
        if not candidates:
            return False
        if self.clock is None:
            return True
        return any_pays(self.clock, len(running), [(s, self._rate(s), self._length(s)) for s in candidates])

    def room(self, seq: Sequence) -> int:
        """Drafts to propose for a decoding sequence: its adaptive draft length capped so the verified
        run never passes max_tokens or max_model_len (the accepted drafts plus one sampled token must
        fit); 0 when it cannot speculate now."""
        if not self.ready(seq):
            return 0
        return max(
            0,
            min(
                self._length(seq),
                seq.sampling_params.max_tokens - seq.num_completion_tokens - 1,
                self.max_model_len - len(seq) - 1,
            ),
        )

    def ready(self, seq: Sequence) -> bool:
        """The sequence may propose now: its sampling allows it and its tokens are on the host (or
        all but a last placeholder, for a proposer that `proposes_behind`)."""
        pending = seq.num_pending_tokens
        return can_speculate_later(seq) and (pending == 0 or (pending == 1 and self.proposer.proposes_behind))

    def _wanted(self, running: list[Sequence]) -> list[tuple[Sequence, int]]:
        """(sequence, draft room) of the decoding sequences that propose this step. The step
        verifies when some sequence is due (not waiting); then every sequence may propose, since the
        step is synchronous anyway, and measured costs pick the drafts that pay (`choose_drafts`)."""
        if self._plans < self._quiet_until or not self._could_pay(running):
            return []
        decoding = [s for s in running if s.num_uncomputed_tokens == 1 and s.num_completion_tokens > 0]
        if not any(not self._is_waiting(s) and self.ready(s) for s in decoding):
            return []
        wanted = [(seq, room) for seq in decoding if (room := self.room(seq)) > 0]
        if self.clock is not None and wanted:
            chosen = choose_drafts(self.clock, len(running), [(s, self._rate(s), r) for s, r in wanted])
            if not chosen:
                self._quiet_until = self._plans + RECHECK_AFTER_NOTHING_PAYS
            return chosen
        return wanted

    def _could_pay(self, running: list[Sequence]) -> bool:
        """The batch-size bound, checked before any sequence is looked at: the measured costs' bound
        (`StepClock.can_pay`) or, without them (the CPU), the fixed `max_batch` rule."""
        if self.clock is None:
            return len(running) <= self.config.max_batch
        return self.clock.can_pay(len(running))

    # ---- acceptance records --------------------------------------------------------------------
    def record_of(self, seq: Sequence) -> Acceptance:
        """`seq`'s acceptance record, to read (a sequence without one reads as a fresh one)."""
        return self.records.get(seq.seq_id, FRESH)

    def _record(self, seq: Sequence) -> Acceptance:
        """`seq`'s acceptance record, to write (made on first use)."""
        record = self.records.get(seq.seq_id)
        if record is None:
            record = self.records[seq.seq_id] = Acceptance()
        return record

    def _is_waiting(self, seq: Sequence) -> bool:
        return self.record_of(seq).is_waiting(seq.num_completion_tokens)

    def _rate(self, seq: Sequence) -> float:
        return self.record_of(seq).rate(seq.num_completion_tokens)

    def _length(self, seq: Sequence) -> int:
        return self.record_of(seq).draft_length(seq.num_completion_tokens, self.config.num_tokens)


def build_speculator(
    config: EngineConfig, model_config: ModelConfig, runner: ModelRunner, max_model_len: int, run_ahead: bool
) -> Speculator | None:
    """The speculator `config.speculative` asks for (None: no speculation): an n-gram lookup or a draft
    model loaded beside `runner`, weighing drafts against `runner`'s measured step costs."""
    if config.speculative is None:
        return None
    spec_config = SpeculativeConfig.from_engine(config)
    proposer: Proposer
    if config.speculative == "draft":
        proposer = build_draft_proposer(config, model_config, runner, max_model_len)
    else:
        proposer = NgramProposer(spec_config)
    return ProposerSpeculator(proposer, spec_config, max_model_len, measured_clock(runner), run_ahead)


def measured_clock(runner: ModelRunner) -> StepClock | None:
    """A clock over `runner`'s measured step costs (timed once, on first use); None without them."""
    costs = runner.step_costs()
    return StepClock(costs) if costs is not None else None
