"""The speculation policy: draft length follows acceptance; the batch decision follows step costs."""

from __future__ import annotations

import pytest

from common.sampling_params import SamplingParams
from common.sequence import Sequence
from common.spec_policy import (
    StepClock,
    StepCosts,
    acceptance_rate,
    choose_drafts,
    draft_length,
    expected_tokens,
    record_acceptance,
)
from common.speculative import NgramProposer, SpeculativeConfig


def _seq() -> Sequence:
    return Sequence([1, 2, 3], SamplingParams(temperature=0), 16)


def test_draft_length_follows_the_acceptance_record():
    seq = _seq()
    assert draft_length(seq, 8) == 8  # optimistic before the first verification
    for _ in range(6):
        record_acceptance(seq, proposed=8, accepted=8)
    assert acceptance_rate(seq) > 0.9 and draft_length(seq, 8) == 8
    for _ in range(15):
        record_acceptance(seq, proposed=4, accepted=0)
    assert acceptance_rate(seq) < 0.25 and draft_length(seq, 8) == 1


def test_expected_tokens_grow_with_acceptance():
    good, bad = _seq(), _seq()
    for _ in range(5):
        record_acceptance(good, 4, 4)
        record_acceptance(bad, 4, 0)
    assert expected_tokens(good, 4) > 3.5 and expected_tokens(bad, 4) < 1.3
    assert expected_tokens(good, 0) == 1.0


def test_launch_bound_steps_speculate_compute_bound_steps_do_not():
    seq = _seq()
    for _ in range(3):
        record_acceptance(seq, 4, 2)
    flat = StepClock(StepCosts((1, 8, 16, 64), (1.0, 1.05, 1.1, 1.5)))
    flat.host_per_row = 0.0
    assert choose_drafts(flat, 1, [(seq, 4)]) == [(seq, 4)]
    linear = StepClock(StepCosts((1, 8, 16, 64, 80), (1.0, 8.0, 16.0, 64.0, 80.0)))
    assert choose_drafts(linear, 64, [(seq, 4)]) == []
    assert choose_drafts(flat, 62, [(seq, 4)]) == []  # more rows than any captured graph
    with pytest.raises(ValueError):
        StepCosts((8, 1), (1.0, 1.0))


def test_the_likeliest_sequences_speculate_when_not_all_fit():
    good, bad = _seq(), _seq()
    for _ in range(5):
        record_acceptance(good, 4, 4)
        record_acceptance(bad, 4, 0)
    clock = StepClock(StepCosts((1, 2, 4, 8, 16), (1.0, 1.0, 1.0, 1.1, 3.0)))
    clock.host_per_row = 0.0
    assert choose_drafts(clock, 2, [(bad, 4), (good, 4)]) == [(good, 4)]


def test_observed_host_time_stops_speculation_that_does_not_pay():
    seq = _seq()
    for _ in range(3):
        record_acceptance(seq, 4, 2)
    clock = StepClock(StepCosts((1, 8, 16), (1.0, 1.0, 1.0)))
    clock.host_per_row = 0.0
    assert choose_drafts(clock, 1, [(seq, 4)])
    for _ in range(10):  # verification steps really take 3x a plain one (the host's share)
        clock.observe(verify=True, rows=5, seconds=3.0)
        clock.observe(verify=False, rows=1, seconds=1.0)
    assert choose_drafts(clock, 1, [(seq, 4)]) == []
    assert clock.host_per_row > 0.1  # and sizes not yet seen are estimated with it
    assert clock.verify_cost(16) > 2.0


def test_measured_costs_replace_the_fixed_batch_cap():
    proposer = NgramProposer(SpeculativeConfig(num_tokens=2, max_batch=1), max_model_len=64)
    seqs = []
    for _ in range(3):
        seq = Sequence([5, 6, 5, 6, 5, 6, 5], SamplingParams(temperature=0), 16, num_prompt_tokens=6)
        seq.set_cached_prefix(6)
        seqs.append(seq)
    proposer.plan(seqs, budget=64)
    assert all(s.num_draft_tokens == 0 for s in seqs)  # 3 running > max_batch, no costs: no drafts
    proposer.clock = StepClock(StepCosts((1, 4, 8, 16), (1.0, 1.0, 1.0, 1.0)))
    proposer.plan(seqs, budget=64)
    assert [s.token_ids[-2:] for s in seqs] == [[6, 5]] * 3
    assert all(s.num_draft_tokens == 2 for s in seqs)
