"""Worker selection: small pure functions over load snapshots, plus the selectable routing policies.

Prefill: the cost of sending a request to a worker is the prompt tokens it would have to compute
(cached leading blocks are free) plus the prompt tokens already queued on it, the queue counting only
once the queues are out of balance by more than a threshold (SGLang's cache-aware routing does the
same); the cheapest wins, ties go to the shorter queue, then to the worker with fewest in flight,
then to the one holding the fewest cached blocks (so new prefixes spread over the workers' caches
instead of piling into one and evicting each other),
then to the smallest worker id (deterministic).

Decode: only workers whose KV capacity (total blocks and max_model_len) can hold prompt + max_tokens
are eligible; among them the most free blocks wins, then the fewest running sequences, then the
smallest id. Free blocks are a moment's figure, so they rank workers rather than exclude them: a
decode worker that is momentarily full queues the request.

Local (a decode or mixed worker prefilling a request itself, see router/disagg.py): among the workers
able to hold the request, the same rule as prefill over their own caches and prefill queues.

`round_robin` ignores prefix hits and load (a baseline for benchmarks) but still honours capacity.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from common.wire.blocks import blocks_for

ROUTING_POLICIES = ("prefix", "round_robin")


@dataclass(frozen=True)
class PrefillLoad:
    """A prefill worker as the policy sees it. `queued_prefill_tokens`: prompt tokens not yet computed."""

    worker_id: str
    queued_prefill_tokens: int
    in_flight: int
    cached_blocks: int = 0  # blocks the global index says this worker's prefix cache holds


@dataclass(frozen=True)
class DecodeLoad:
    """A decode or mixed worker. The last three figures matter when it prefills locally."""

    worker_id: str
    num_free_blocks: int
    num_total_blocks: int
    num_running: int
    block_size: int
    max_model_len: int
    queued_prefill_tokens: int = 0
    in_flight: int = 0
    cached_blocks: int = 0

    def as_prefill(self) -> PrefillLoad:
        return PrefillLoad(self.worker_id, self.queued_prefill_tokens, self.in_flight, self.cached_blocks)

    def can_hold(self, num_tokens: int) -> bool:
        """Whether this worker could ever hold a sequence of `num_tokens` tokens."""
        blocks_needed = blocks_for(num_tokens, self.block_size)
        return num_tokens <= self.max_model_len and blocks_needed <= self.num_total_blocks


class Choice(NamedTuple):
    worker_id: str
    cached_blocks: int = 0  # leading prompt blocks the chosen prefill worker already holds
    cost: int = 0  # the policy's figure for the winner (prefill: new + queued tokens)


def new_prefill_tokens(num_prompt_tokens: int, cached_blocks: int, block_size: int) -> int:
    """Prompt tokens a worker holding `cached_blocks` leading blocks computes: at least one (the last),
    as the workers' block managers do."""
    return max(num_prompt_tokens - cached_blocks * block_size, 1)


def prefill_cost(load: PrefillLoad, cached_blocks: int, num_prompt_tokens: int, block_size: int) -> int:
    """new_prefill_tokens + queued_prefill_tokens."""
    return new_prefill_tokens(num_prompt_tokens, cached_blocks, block_size) + load.queued_prefill_tokens


DEFAULT_BALANCE_THRESHOLD_TOKENS = 2048


def choose_prefill(
    candidates: Sequence[PrefillLoad],
    matches: Mapping[str, int],
    num_prompt_tokens: int,
    block_size: int,
    balance_threshold_tokens: int = DEFAULT_BALANCE_THRESHOLD_TOKENS,
) -> Choice | None:
    """The cheapest prefill worker for a prompt, or None when there is no candidate.

    `matches` maps worker id -> leading cached blocks (from PrefixIndex.match; absent means 0).
    While the queues differ by at most `balance_threshold_tokens` (> 0), queued tokens are left out of the
    cost: the router's queue figures count an in-flight prompt whole until its first token, so they
    overstate the wait at the worker holding the prefix, and following them would duplicate the
    prefix on the other worker (evicting its own). Beyond the threshold, load counts in full.
    """
    queues = [c.queued_prefill_tokens for c in candidates]
    balanced = (
        bool(queues)
        and balance_threshold_tokens > 0
        and max(queues) - min(queues) <= balance_threshold_tokens
    )
    best: tuple[int, int, int, int, str] | None = None
    for load in candidates:
        cost = prefill_cost(load, matches.get(load.worker_id, 0), num_prompt_tokens, block_size)
        if balanced:
            cost -= load.queued_prefill_tokens
        key = (cost, load.queued_prefill_tokens, load.in_flight, load.cached_blocks, load.worker_id)
        if best is None or key < best:
            best = key
    if best is None:
        return None
    return Choice(best[4], matches.get(best[4], 0), best[0])


def choose_decode(candidates: Sequence[DecodeLoad], num_tokens: int) -> Choice | None:
    """The decode worker with most free blocks (then fewest running) able to hold `num_tokens`."""
    eligible = [c for c in candidates if c.can_hold(num_tokens)]
    if not eligible:
        return None
    best = min(eligible, key=lambda c: (-c.num_free_blocks, c.num_running, c.worker_id))
    return Choice(best.worker_id, 0, best.num_free_blocks)


class RoutingPolicy(Protocol):
    """Picks workers for one request; returns None when no candidate fits."""

    name: str

    def pick_prefill(
        self,
        candidates: Sequence[PrefillLoad],
        matches: Mapping[str, int],
        num_prompt_tokens: int,
        block_size: int,
    ) -> Choice | None: ...

    def pick_decode(self, candidates: Sequence[DecodeLoad], num_tokens: int) -> Choice | None: ...

    def pick_local(
        self,
        candidates: Sequence[DecodeLoad],
        matches: Mapping[str, int],
        num_prompt_tokens: int,
        block_size: int,
        num_tokens: int,
    ) -> Choice | None: ...


class _LocalByPrefill:
    """A local prefill is a prefill: choose it by `pick_prefill` among workers that can hold it."""

    def pick_local(
        self,
        candidates: Sequence[DecodeLoad],
        matches: Mapping[str, int],
        num_prompt_tokens: int,
        block_size: int,
        num_tokens: int,
    ) -> Choice | None:
        eligible = [c.as_prefill() for c in candidates if c.can_hold(num_tokens)]
        return self.pick_prefill(eligible, matches, num_prompt_tokens, block_size)  # type: ignore[attr-defined]


class PrefixAwarePolicy(_LocalByPrefill):
    name = "prefix"

    def __init__(self, balance_threshold_tokens: int = DEFAULT_BALANCE_THRESHOLD_TOKENS) -> None:
        self.balance_threshold_tokens = balance_threshold_tokens

    def pick_prefill(
        self,
        candidates: Sequence[PrefillLoad],
        matches: Mapping[str, int],
        num_prompt_tokens: int,
        block_size: int,
    ) -> Choice | None:
        return choose_prefill(
            candidates, matches, num_prompt_tokens, block_size, self.balance_threshold_tokens
        )

    def pick_decode(self, candidates: Sequence[DecodeLoad], num_tokens: int) -> Choice | None:
        return choose_decode(candidates, num_tokens)


class RoundRobinPolicy(_LocalByPrefill):
    """Cycles through candidates (sorted by id so the order is stable as workers come and go)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._prefill_turn = itertools.count()
        self._decode_turn = itertools.count()

    def pick_prefill(
        self,
        candidates: Sequence[PrefillLoad],
        matches: Mapping[str, int],
        num_prompt_tokens: int,
        block_size: int,
    ) -> Choice | None:
        if not candidates:
            return None
        ordered = sorted(candidates, key=lambda c: c.worker_id)
        load = ordered[next(self._prefill_turn) % len(ordered)]
        cached = matches.get(load.worker_id, 0)
        return Choice(load.worker_id, cached, prefill_cost(load, cached, num_prompt_tokens, block_size))

    def pick_decode(self, candidates: Sequence[DecodeLoad], num_tokens: int) -> Choice | None:
        eligible = sorted((c for c in candidates if c.can_hold(num_tokens)), key=lambda c: c.worker_id)
        if not eligible:
            return None
        chosen = eligible[next(self._decode_turn) % len(eligible)]
        return Choice(chosen.worker_id, 0, chosen.num_free_blocks)


def make_policy(name: str, balance_threshold_tokens: int = DEFAULT_BALANCE_THRESHOLD_TOKENS) -> RoutingPolicy:
    if name == "prefix":
        return PrefixAwarePolicy(balance_threshold_tokens)
    if name == "round_robin":
        return RoundRobinPolicy()
    raise ValueError(f"routing must be one of {ROUTING_POLICIES}, got {name!r}")
