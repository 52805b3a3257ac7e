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
    otherwise); `ProposerSpeculator.ready` also needs its tokens on the host now, or one step
    behind."""
    p = seq.sampling_params
    return not p.reads_token_history and p.min_tokens == 0


class Proposer:
    """Drafts tokens for decoding sequences; a subclass implements `draft(seq, room)` or, when drafting
    for many sequences at once is cheaper (a draft model), `draft_batch`. When and how many drafts
    to ask for is the speculator's policy (`common.spec_decode.proposer_speculator`), not the
    proposer's.

    Drafts must be a deterministic function of the sequence's tokens (a point-mass proposal), which
    is what makes `accept_drafts` exact.

    `proposes_behind`: the proposer can draft for a sequence whose last token is still a run-ahead
    placeholder, from the tokens before it (`draft` then guesses past the placeholder). Its drafts are
    verified in a step launched behind the run-ahead step that samples the placeholder, so
    speculation does not drain the pipeline first; verification stays exact, since the placeholder
    row reads the real token on the device and each draft is checked against the target's sample."""

    proposes_behind = False
    max_len: int | None = None  # the longest sequence it can draft for (a draft model's context)

    def draft(self, seq: Sequence, room: int) -> list[int]:
        raise NotImplementedError

    def draft_batch(self, seqs: list[Sequence], rooms: list[int]) -> list[list[int]]:
        """Up to `rooms[i]` drafts for each of `seqs`."""
        return [self.draft(seq, room) for seq, room in zip(seqs, rooms, strict=True)]

    def release(self, seq: Sequence) -> None:
        """The sequence finished or was preempted: drop any per-sequence proposer state."""


class NgramProposer(Proposer):
    proposes_behind = True  # a lookup needs only the tokens before the placeholder

    def __init__(self, config: SpeculativeConfig) -> None:
        self.max_n, self.min_n = config.max_n, config.min_n
        self.indexes: dict[int, NgramIndex] = {}

    def draft(self, seq: Sequence, room: int) -> list[int]:
        index = self.indexes.get(seq.seq_id)
        if index is None:
            index = self.indexes[seq.seq_id] = NgramIndex(self.max_n, self.min_n)
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
    """Keep the drafts `samples` confirm plus one sampled token; returns the new tokens in order
    (the accepted drafts, then the sampled one). The accepted drafts' KV is valid, the rejected
    positions' is overwritten before it is read, so only the cache counter moves
    (`Sequence.keep_drafts`)."""
    drafts = seq.token_ids[len(seq) - seq.num_draft_tokens :]
    accepted = accepted_length(drafts, samples)
    seq.keep_drafts(accepted)
    seq.append_token(samples[accepted])
    stats.proposed += len(drafts)
    stats.accepted += accepted
    stats.verify_steps += 1
    return drafts[:accepted] + [samples[accepted]]


def accepted_length(drafts: list[int], samples: list[int]) -> int:
    """How many leading drafts the target's samples confirm (samples has len(drafts) + 1 entries)."""
    a = 0
    while a < len(drafts) and samples[a] == drafts[a]:
        a += 1
    return a
