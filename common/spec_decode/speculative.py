"""Speculative decoding with n-gram prompt lookup: propose, verify in one target pass, roll back.

Proposal: `NgramProposer` looks the sequence's last tokens up in its earlier ones
(common/spec_decode/ngram.py).

Verification is exact by construction. The proposer is a point mass q = 1{x = d_i}, so the rule
"accept d_i with probability min(1, p(d_i)/q(d_i)) = p(d_i), else sample from norm(max(0, p - q))"
is the same as: sample x_i ~ p (with the request's own sampling parameters) and accept while
x_i == d_i; the first x_i that differs is the correction, and if all k are accepted x_k is the
bonus token. Greedy is the special case where sampling is an argmax. Every position is sampled by
the normal sampler, so temperature / top-k / top-p / min-p apply unchanged.

Requests whose sampling reads the tokens before each position (penalties, min_tokens, logprobs)
are not speculated (their per-row state would not include the draft). Rollback needs no block
surgery: `num_cached_tokens` is set to the accepted length, rejected positions' KV is overwritten
before it is ever read, and prefix-cache hashes only cover `num_cached_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.config import EngineConfig
from common.core.sequence import Sequence
from common.spec_decode.ngram import NgramIndex
from common.spec_decode.spec_policy import (
    StepClock,
    acceptance_rate,
    any_pays,
    choose_drafts,
    draft_length,
    record_acceptance,
)


@dataclass(frozen=True)
class SpeculativeConfig:
    num_tokens: int = 4  # k: proposals per step
    max_n: int = 3  # longest n-gram matched
    min_n: int = 1
    # Without measured step costs (the CPU), speculation is off above this many running sequences.
    max_batch: int = 16

    def __post_init__(self) -> None:
        for name in ("num_tokens", "max_n", "min_n", "max_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"speculative {name} must be a positive int, got {value!r}")
        if self.min_n > self.max_n:
            raise ValueError(f"speculative min_n ({self.min_n}) must not exceed max_n ({self.max_n})")

    @classmethod
    def from_engine(cls, config: EngineConfig) -> SpeculativeConfig:
        return cls(config.num_speculative_tokens, max_batch=config.speculative_max_batch)


def can_speculate_later(seq: Sequence) -> bool:
    """The request's sampling allows speculation (its per-row state would not include the drafts
    otherwise); `Proposer.ready` also needs its tokens on the host now, or one step behind."""
    p = seq.sampling_params
    return not p.reads_token_history and p.min_tokens == 0


def is_waiting(seq: Sequence) -> bool:
    """The sequence waits before proposing again (after a rejection, or finding nothing to propose).
    A wait is kept as the completion length at which it ends: every decode step adds a token, so it
    counts itself down, and no step has to visit the sequences that wait."""
    return seq.num_completion_tokens < seq.spec_resume_at


def wait(seq: Sequence, steps: int) -> None:
    """Skip the next `steps` steps that would let the sequence propose (counted from its tokens now)."""
    seq.spec_resume_at = seq.num_completion_tokens + steps


# Steps a sequence waits after finding no match when proposing drains a run-ahead engine (a proposer
# that does not propose behind): each skipped step may run ahead, where a proposal needs a synced one.
SKIP_AFTER_NO_MATCH = 4
_MAX_SKIP_STEPS = 16
# Steps the measured-cost policy stays out after it found that nothing pays for the batch: weighing
# a large batch's drafts costs the host 0.2-0.6 ms (64 sequences x 8 drafts), more than run-ahead
# hides, and the answer changes slowly (H200 at 7d5c790: batch 64 at 0.70x with nothing verified).
RECHECK_AFTER_NOTHING_PAYS = 8


class Proposer:
    """Proposes draft tokens for decoding sequences; subclasses implement `draft(seq, room)` or, when
    proposing for many sequences at once is cheaper (a draft model), `draft_batch`.

    Drafts must be a deterministic function of the sequence's tokens (a point-mass proposal), which
    is what makes `accept_drafts` exact. `clock` (measured step costs, set and fed by the engine on a
    device with CUDA graphs) turns on the cost-based batch decision of
    `common.spec_decode.spec_policy`; without it the fixed `config.max_batch` rule applies.

    `proposes_behind`: the proposer can draft for a sequence whose last token is still a run-ahead
    placeholder, from the tokens before it (`draft` then guesses past the placeholder). Its drafts are
    verified in a step launched behind the run-ahead step that samples the placeholder, so
    speculation does not drain the pipeline first; verification stays exact, since the placeholder
    row reads the real token on the device and each draft is checked against the target's sample."""

    proposes_behind = False

    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.clock: StepClock | None = None
        self.skip_after_no_match = 0  # set by an engine that runs ahead (SKIP_AFTER_NO_MATCH)
        self._plans = 0  # plan() calls so far
        self._quiet_until = 0  # the policy found nothing to pay: no drafts before this many plans

    def draft(self, seq: Sequence, room: int) -> list[int]:
        raise NotImplementedError

    def draft_batch(self, seqs: list[Sequence], rooms: list[int]) -> list[list[int]]:
        """Up to `rooms[i]` drafts for each of `seqs`."""
        return [self.draft(seq, room) for seq, room in zip(seqs, rooms, strict=True)]

    def release(self, seq: Sequence) -> None:
        """The sequence finished or was preempted: drop any per-sequence proposer state."""

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

    def plan(self, running: list[Sequence], budget: int) -> None:
        """Add this step's drafts to the decoding sequences among `running` (maybe to none).

        `budget`: tokens the step may compute; every running sequence keeps one, drafts share the rest.
        """
        self._plans += 1
        wanted = self._wanted(running)
        if not wanted:
            return
        drafts = self.draft_batch([s for s, _ in wanted], [r for _, r in wanted])
        spare = budget - len(running)
        chosen, shortened = [], False
        for (seq, room), d in zip(wanted, drafts, strict=True):
            if not d:  # nothing to propose (free text): maybe let a few steps run ahead first
                wait(seq, self.skip_after_no_match + 1)  # this step's token, then the skipped ones
            d = d[: max(spare, 0)]
            shortened |= len(d) < room
            if d:
                chosen.append((seq, d))
                spare -= len(d)
        if self.clock is not None and shortened:  # fewer drafts than weighed: weigh them again
            counts = choose_drafts(self.clock, len(running), [(s, len(d)) for s, d in chosen])
            keep = {id(s): c for s, c in counts}
            chosen = [(s, d[: keep[id(s)]]) for s, d in chosen if id(s) in keep]
        for seq, d in chosen:
            seq.add_drafts(d)

    def ready(self, seq: Sequence) -> bool:
        """The sequence may propose now: its sampling allows it and its tokens are on the host (or
        all but a last placeholder, for a proposer that `proposes_behind`)."""
        pending = seq.num_pending_tokens
        return can_speculate_later(seq) and (pending == 0 or (pending == 1 and self.proposes_behind))

    def may_speculate(self, running: list[Sequence]) -> bool:
        """Could this step's batch speculate? False lets the engine run the step ahead (run-ahead
        leaves the last token on the device, where no proposal can read it)."""
        if not self._could_pay(running):
            return False
        candidates = [s for s in running if not is_waiting(s) and can_speculate_later(s)]
        if not candidates:
            return False
        if self.clock is None:
            return True
        return any_pays(self.clock, len(running), [(s, self._length(s)) for s in candidates])

    def _wanted(self, running: list[Sequence]) -> list[tuple[Sequence, int]]:
        """(sequence, draft room) of the decoding sequences that propose this step. The step
        verifies when some sequence is due (not waiting); then every sequence may propose, since the
        step is synchronous anyway, and measured costs pick the drafts that pay (`choose_drafts`)."""
        if self._plans < self._quiet_until or not self._could_pay(running):
            return []
        decoding = [s for s in running if s.num_uncomputed_tokens == 1 and s.num_completion_tokens > 0]
        if not any(not is_waiting(s) and self.ready(s) for s in decoding):
            return []
        wanted = [(seq, room) for seq in decoding if (room := self.room(seq)) > 0]
        if self.clock is not None and wanted:
            chosen = choose_drafts(self.clock, len(running), wanted)
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

    def _length(self, seq: Sequence) -> int:
        return draft_length(seq, self.config.num_tokens)


class NgramProposer(Proposer):
    proposes_behind = True  # a lookup needs only the tokens before the placeholder

    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        super().__init__(config, max_model_len)
        self.indexes: dict[int, NgramIndex] = {}

    def draft(self, seq: Sequence, room: int) -> list[int]:
        index = self.indexes.get(seq.seq_id)
        if index is None:
            index = self.indexes[seq.seq_id] = NgramIndex(self.config.max_n, self.config.min_n)
        if seq.num_pending_tokens:  # the match's first token guesses the placeholder: draft past it
            return index.propose(seq.token_ids, room + 1, seq.num_known_tokens)[1:]
        return index.propose(seq.token_ids, room)

    def release(self, seq: Sequence) -> None:
        self.indexes.pop(seq.seq_id, None)


@dataclass
class SpecStats:
    """Proposals made and accepted, and target steps that verified drafts."""

    proposed: int = 0
    accepted: int = 0
    verify_steps: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a sequence gains per verifying target step (accepted drafts + 1)."""
        return (self.accepted + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0


def accept_drafts(seq: Sequence, samples: list[int], stats: SpecStats) -> list[int]:
    """Keep the drafts `samples` confirm plus one sampled token; returns the new tokens in order.
    The accepted drafts' KV is valid, the rejected positions' is overwritten before it is read, so
    only the cache counter moves (`Sequence.keep_drafts`)."""
    drafts = seq.token_ids[len(seq) - seq.num_draft_tokens :]
    accepted = accepted_length(drafts, samples)
    seq.keep_drafts(accepted)
    seq.append_token(samples[accepted])
    stats.proposed += len(drafts)
    stats.accepted += accepted
    record_acceptance(seq, len(drafts), accepted)
    stats.verify_steps += 1
    _back_off(seq, accepted)
    return drafts[:accepted] + [samples[accepted]]


def _back_off(seq: Sequence, accepted: int) -> None:
    """After a fully rejected proposal a sequence waits before proposing again, longer the less its
    drafts have been accepted lately (about 1/acceptance - 1 steps, at most 16): free text rarely
    repeats itself, and each skipped step may run ahead; copying text keeps being accepted."""
    if accepted:
        return
    wait(seq, min(_MAX_SKIP_STEPS, int(1.0 / acceptance_rate(seq)) - 1))


def accepted_length(drafts: list[int], samples: list[int]) -> int:
    """How many leading drafts the target's samples confirm (samples has len(drafts) + 1 entries)."""
    a = 0
    while a < len(drafts) and samples[a] == drafts[a]:
        a += 1
    return a
