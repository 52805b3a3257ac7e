"""Worker selection with concrete numbers."""

from __future__ import annotations

import pytest

from router.policy import (
    Choice,
    DecodeLoad,
    PrefillLoad,
    RoundRobinPolicy,
    choose_decode,
    choose_prefill,
    make_policy,
    prefill_cost,
)

BS = 16


def test_prefill_cost_counts_uncached_plus_queued_tokens() -> None:
    load = PrefillLoad("p0", queued_prefill_tokens=100, in_flight=1)
    assert prefill_cost(load, cached_blocks=0, num_prompt_tokens=70, block_size=BS) == 170
    assert prefill_cost(load, cached_blocks=4, num_prompt_tokens=70, block_size=BS) == 106
    # a fully cached prompt still computes one token
    assert prefill_cost(load, cached_blocks=4, num_prompt_tokens=64, block_size=BS) == 101


def test_cache_hit_beats_an_idle_worker_when_it_saves_more_than_the_queue() -> None:
    loads = [PrefillLoad("p0", 0, 0), PrefillLoad("p1", 200, 2)]
    # Load counted in full (threshold 0). 1000-token prompt: p1 holds 40 blocks (640 tokens):
    # cost 360 + 200 = 560 < 1000
    assert choose_prefill(loads, {"p1": 40}, 1000, BS, 0) == Choice("p1", 40, 560)
    # with only 10 blocks cached (160 tokens): p1 costs 840 + 200 = 1040 > 1000 -> the idle p0
    assert choose_prefill(loads, {"p1": 10}, 1000, BS, 0) == Choice("p0", 0, 1000)


def test_balanced_queues_route_by_cache_alone() -> None:
    loads = [PrefillLoad("p0", 0, 0), PrefillLoad("p1", 200, 2)]
    # Queues within the threshold: the worker holding the prefix wins (840 < 1000 new tokens)...
    assert choose_prefill(loads, {"p1": 10}, 1000, BS, balance_threshold_tokens=256) == Choice("p1", 10, 840)
    # ...but a queue imbalance beyond it brings the load back into the cost.
    assert choose_prefill(loads, {"p1": 10}, 1000, BS, balance_threshold_tokens=100).worker_id == "p0"
    # Without any hit, the shorter queue wins a balanced tie.
    assert choose_prefill(loads, {}, 1000, BS, balance_threshold_tokens=256).worker_id == "p0"


def test_prefill_ties_go_to_fewest_in_flight_then_id() -> None:
    loads = [PrefillLoad("p2", 50, 3), PrefillLoad("p1", 50, 1), PrefillLoad("p0", 50, 1)]
    assert choose_prefill(loads, {}, 100, BS, 0) == Choice("p0", 0, 150)
    assert (
        choose_prefill([PrefillLoad("p2", 50, 3), PrefillLoad("p1", 50, 2)], {}, 100, BS, 0).worker_id == "p1"
    )


def test_no_prefill_candidate() -> None:
    assert choose_prefill([], {"p0": 3}, 100, BS) is None


def _decode(worker_id: str, free: int, running: int, total: int = 1000, max_len: int = 8192) -> DecodeLoad:
    return DecodeLoad(worker_id, free, total, running, BS, max_len)


def test_decode_prefers_most_free_blocks_then_fewest_running() -> None:
    loads = [_decode("d0", 100, 1), _decode("d1", 300, 9), _decode("d2", 300, 4)]
    assert choose_decode(loads, 500) == Choice("d2", 0, 300)


def test_decode_only_workers_that_can_hold_the_sequence() -> None:
    small = _decode("small", 60, 0, total=60)  # 60 blocks * 16 = 960 tokens
    short = _decode("short", 900, 0, max_len=512)
    big = _decode("big", 10, 5)
    assert choose_decode([small, short, big], 961).worker_id == "big"
    assert choose_decode([small, short], 961) is None
    assert choose_decode([small, short], 960).worker_id == "small"  # exactly fits its 60 blocks
    assert choose_decode([small, short], 500).worker_id == "short"  # both fit: more free blocks wins


def test_round_robin_cycles_and_ignores_hits() -> None:
    policy = RoundRobinPolicy()
    loads = [PrefillLoad("p1", 0, 0), PrefillLoad("p0", 10**6, 50)]
    picks = [policy.pick_prefill(loads, {"p1": 99}, 100, BS).worker_id for _ in range(4)]
    assert picks == ["p0", "p1", "p0", "p1"]
    decodes = [_decode("d0", 1, 0), _decode("d1", 1, 0), _decode("tiny", 1, 0, total=1)]
    assert [policy.pick_decode(decodes, 100).worker_id for _ in range(3)] == ["d0", "d1", "d0"]
    assert policy.pick_prefill([], {}, 1, BS) is None


def test_make_policy() -> None:
    assert make_policy("prefix").name == "prefix"
    assert make_policy("round_robin").name == "round_robin"
    with pytest.raises(ValueError, match="routing"):
        make_policy("random")


def test_unseen_prefix_goes_to_the_emptier_cache():
    """Equal cost and load: the worker holding fewer cached blocks takes the new prefix, so distinct
    prefixes spread over the caches instead of all landing on the first worker."""
    a = PrefillLoad("prefill-0", queued_prefill_tokens=0, in_flight=0, cached_blocks=40)
    b = PrefillLoad("prefill-1", queued_prefill_tokens=0, in_flight=0, cached_blocks=16)
    assert choose_prefill([a, b], {}, num_prompt_tokens=100, block_size=16).worker_id == "prefill-1"
    # A cache hit still beats an emptier cache.
    assert choose_prefill([a, b], {"prefill-0": 4}, 100, 16).worker_id == "prefill-0"
