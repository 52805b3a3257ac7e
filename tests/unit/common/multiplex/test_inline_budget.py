"""The measured inline budget of multiplexed mode: prompt tokens a decode step may carry while their
device time stays under one chunk launch's host time."""

from __future__ import annotations

import pytest

from common.multiplex.inline_budget import SMOOTHING, ChunkTiming, InlineBudget


def test_nothing_is_inlined_before_a_chunk_was_measured():
    assert InlineBudget(cap=8192).tokens == 0


def test_a_host_bound_model_inlines_up_to_the_cap():
    budget = InlineBudget(cap=8192)
    # 135M-like: 1 ms of host time per chunk, a 6,000-token chunk done 3 ms after it was scheduled.
    budget.observe(ChunkTiming(tokens=6000, host_seconds=1e-3, wall_seconds=3e-3))
    assert budget.tokens == 2000
    budget = InlineBudget(cap=512)
    budget.observe(ChunkTiming(tokens=500, host_seconds=1e-3, wall_seconds=1e-3))
    assert budget.tokens == 500
    budget.observe(ChunkTiming(tokens=6000, host_seconds=20e-3, wall_seconds=5e-3))
    assert budget.tokens == 512


def test_a_compute_bound_model_keeps_its_prompts_on_chunks():
    budget = InlineBudget(cap=512)
    # 8B-like: 1 ms of host time for a chat chunk, 250 ms for 6,000 tokens on the prefill share.
    budget.observe(ChunkTiming(tokens=256, host_seconds=1e-3, wall_seconds=12e-3))
    budget.observe(ChunkTiming(tokens=6000, host_seconds=8e-3, wall_seconds=0.25))
    assert 0 < budget.tokens < 64  # a 256-token chat prompt goes to a chunk


def test_only_short_chunks_say_what_a_chunk_costs_the_host():
    """A long chunk's host time (an eager launch) is not what inlining a short prompt saves."""
    budget = InlineBudget(cap=512)
    budget.observe(ChunkTiming(tokens=6000, host_seconds=20e-3, wall_seconds=6e-3))
    assert budget.tokens == 0
    budget.observe(ChunkTiming(tokens=300, host_seconds=0.5e-3, wall_seconds=1e-3))
    wall = 6e-3 + SMOOTHING * (1e-3 - 6e-3)
    tokens = 6000 + SMOOTHING * (300 - 6000)
    assert budget.tokens == int(0.5e-3 * tokens / wall)


def test_the_budget_follows_newer_chunks_smoothly():
    budget = InlineBudget(cap=100_000)
    budget.observe(ChunkTiming(tokens=1000, host_seconds=1e-3, wall_seconds=1e-3))  # 1 us a token
    assert budget.tokens == 1000
    for _ in range(40):
        budget.observe(ChunkTiming(tokens=1000, host_seconds=1e-3, wall_seconds=3e-3))  # 3 us a token
    assert budget.tokens == pytest.approx(333, abs=2)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"tokens": 0, "host_seconds": 1.0, "wall_seconds": 1.0}, "tokens"),
        ({"tokens": True, "host_seconds": 1.0, "wall_seconds": 1.0}, "tokens"),
        ({"tokens": 4, "host_seconds": -1.0, "wall_seconds": 1.0}, "host_seconds"),
        ({"tokens": 4, "host_seconds": 1.0, "wall_seconds": 0.0}, "wall_seconds"),
        ({"tokens": 4, "host_seconds": float("nan"), "wall_seconds": 1.0}, "host_seconds"),
    ],
)
def test_timings_are_checked(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        ChunkTiming(**kwargs)


def test_the_cap_is_checked():
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="^cap"):
            InlineBudget(cap=bad)
