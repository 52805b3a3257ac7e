"""The speculation policy: draft length follows acceptance; the batch decision follows step costs."""

from __future__ import annotations

import pytest

from common.core.sequence import Sequence
from common.runner.step_costs import StepCosts
from common.spec_decode import proposer_speculator
from common.spec_decode.proposer_speculator import ProposerSpeculator
from common.spec_decode.spec_policy import Acceptance, any_pays, choose_drafts, draft_gains
from common.spec_decode.speculative import NgramProposer, SpeculativeConfig
from common.spec_decode.step_clock import StepClock
from common.wire.sampling_params import SamplingParams

# The records below belong to sequences whose completion length stays 0 unless a test says otherwise.
_LEN = 0


def _wanted(record: Acceptance, drafts: int) -> tuple[Acceptance, float, int]:
    """A `choose_drafts` entry for a sequence with this record wanting `drafts` drafts."""
    return (record, record.rate(_LEN), drafts)


def _speculator(num_tokens: int, max_model_len: int, **config) -> ProposerSpeculator:
    spec = SpeculativeConfig(num_tokens=num_tokens, **config)
    return ProposerSpeculator(NgramProposer(spec), spec, max_model_len)


def test_draft_length_follows_the_acceptance_record():
    record = Acceptance()
    assert record.draft_length(_LEN, 8) == 8  # optimistic before the first verification
    for _ in range(6):
        record.record(_LEN, proposed=8, accepted=8)
    assert record.rate(_LEN) > 0.9 and record.draft_length(_LEN, 8) == 8
    for _ in range(15):
        record.record(_LEN, proposed=4, accepted=0)
    assert record.rate(_LEN) < 0.25 and record.draft_length(_LEN, 8) == 1


def test_expected_tokens_grow_with_acceptance():
    good, bad = Acceptance(), Acceptance()
    for _ in range(5):
        good.record(_LEN, 4, 4)
        bad.record(_LEN, 4, 0)
    assert sum(draft_gains(good.rate(_LEN), 4)) > 2.5 and sum(draft_gains(bad.rate(_LEN), 4)) < 0.3
    assert draft_gains(good.rate(_LEN), 0) == []
    gains = draft_gains(good.rate(_LEN), 4)
    assert gains == sorted(gains, reverse=True)  # a later draft counts only if the earlier ones do


def test_launch_bound_steps_speculate_compute_bound_steps_do_not():
    seq = Acceptance()
    for _ in range(3):
        seq.record(_LEN, 4, 2)
    flat = StepClock(StepCosts((1, 8, 16, 64), (1.0, 1.05, 1.1, 1.5)))
    flat.host_per_step = 0.0
    assert choose_drafts(flat, 1, [_wanted(seq, 4)]) == [(seq, 4)]
    linear = StepClock(StepCosts((1, 8, 16, 64, 80), (1.0, 8.0, 16.0, 64.0, 80.0)))
    assert choose_drafts(linear, 64, [_wanted(seq, 4)]) == []
    # 62 plain rows run in the 64-row graph: two drafts fit in its padding, the others do not
    assert choose_drafts(flat, 62, [_wanted(seq, 4)]) == [(seq, 2)]
    assert choose_drafts(flat, 64, [_wanted(seq, 4)]) == []  # no captured graph has more rows
    with pytest.raises(ValueError):
        StepCosts((8, 1), (1.0, 1.0))


def test_the_likeliest_sequences_speculate_when_not_all_fit():
    good, bad = Acceptance(), Acceptance()
    for _ in range(5):
        good.record(_LEN, 4, 4)
        bad.record(_LEN, 4, 0)
    clock = StepClock(StepCosts((1, 2, 4, 8, 16), (1.0, 1.0, 1.0, 1.1, 3.0)))
    clock.host_per_step = 0.0
    wanted = [_wanted(bad, 4), _wanted(good, 4)]
    # 2 + 8 rows would take the 16-row graph: the likely drafts first, the unlikely ones only in the
    # 8-row graph's rows left over.
    assert choose_drafts(clock, 2, wanted) == [(bad, 2), (good, 4)]
    clock.host_per_step = 0.1  # a host cost per verifying step: the same rows fill the same graph
    assert choose_drafts(clock, 2, wanted) == [(bad, 2), (good, 4)]
    clock.host_per_step = 2.0  # 3.1 s for at most 2 + 3.2 expected tokens: a plain step is better
    assert choose_drafts(clock, 2, wanted) == []


def _speculating_at_flat_cost() -> tuple[Acceptance, StepClock]:
    """A sequence with half its drafts accepted, on a clock where every step size costs the same and
    the host adds nothing yet: its drafts pay."""
    seq = Acceptance()
    for _ in range(3):
        seq.record(_LEN, 4, 2)
    clock = StepClock(StepCosts((1, 8, 16), (1.0, 1.0, 1.0)))
    clock.host_per_step = 0.0
    assert choose_drafts(clock, 1, [_wanted(seq, 4)])
    return seq, clock


def test_observed_host_time_stops_speculation_that_does_not_pay():
    seq, clock = _speculating_at_flat_cost()
    for _ in range(10):  # verification steps really take 3x a plain one (the host's share)
        clock.observe(verify=True, rows=5, seconds=3.0)
        clock.observe(verify=False, rows=1, seconds=1.0)
    assert choose_drafts(clock, 1, [_wanted(seq, 4)]) == []
    assert clock.host_per_step > 1.0  # and sizes not yet seen are estimated with it
    assert clock.verify_cost(16) > 2.0


def test_short_costly_verifications_do_not_price_long_ones_out():
    """The host's share of a verification is per step: what 2-row steps cost beyond their replay is
    not multiplied by 16 for a 16-row step never tried yet."""
    clock = StepClock(StepCosts((1, 2, 16), (0.5, 0.6, 0.8)))
    for _ in range(10):
        clock.observe(verify=True, rows=2, seconds=1.4)
    assert clock.verify_cost(16) < 1.7


def test_measured_costs_replace_the_fixed_batch_cap():
    speculator = _speculator(num_tokens=2, max_model_len=64, max_batch=1)
    seqs = []
    for _ in range(3):
        seq = Sequence([5, 6, 5, 6, 5, 6, 5], SamplingParams(temperature=0), 16, num_prompt_tokens=6)
        seq.set_cached_prefix(6)
        seqs.append(seq)
    speculator.plan(seqs, budget=64)
    assert all(s.num_draft_tokens == 0 for s in seqs)  # 3 running > max_batch, no costs: no drafts
    speculator.clock = StepClock(StepCosts((1, 4, 8, 16), (1.0, 1.0, 1.0, 1.0)))
    speculator.plan(seqs, budget=64)
    assert [s.token_ids[-2:] for s in seqs] == [[6, 5]] * 3
    assert all(s.num_draft_tokens == 2 for s in seqs)


def test_no_proposals_when_even_perfect_drafts_could_not_pay():
    clock = StepClock(StepCosts((1, 8, 64, 128), (1.0, 1.0, 1.2, 3.0)))
    clock.host_per_step = 0.0
    assert clock.can_pay(1) and clock.can_pay(8)
    assert not clock.can_pay(64)  # 128 rows cost 2.5x a 64-row step: at most 2x the tokens


def test_one_off_slow_steps_are_not_learned():
    clock = StepClock(StepCosts((1, 8), (1.0, 1.0)))
    clock.observe(verify=False, rows=1, seconds=9.0)  # a pause, not what a step costs
    assert clock.plain_cost(1) == 1.0
    clock.observe(verify=False, rows=1, seconds=2.0)
    assert clock.plain_cost(1) == 2.0


def test_steps_slow_every_time_are_learned_and_speculation_that_does_not_pay_stops():
    """A draft model's proposals can make every verification cost several replays: past the
    one-off filter (3x the estimate), a run of such steps replaces the estimate."""
    seq, clock = _speculating_at_flat_cost()
    clock.observe(verify=False, rows=1, seconds=1.0)
    for _ in range(2):  # one-offs so far: not learned
        clock.observe(verify=True, rows=5, seconds=9.0)
    assert clock.verify_cost(5) == 1.0 + 15e-6 * 5 and choose_drafts(clock, 1, [_wanted(seq, 4)])
    clock.observe(verify=True, rows=5, seconds=9.0)  # the third in a row: the estimate was wrong
    assert clock.verify_cost(5) == 9.0 and clock.host_per_step > 7.0
    assert choose_drafts(clock, 1, [_wanted(seq, 4)]) == []


def test_a_slow_run_broken_by_a_normal_step_stays_one_offs():
    clock = StepClock(StepCosts((1, 8), (1.0, 1.0)))
    for seconds in (9.0, 9.0, 1.0, 9.0, 9.0):
        clock.observe(verify=False, rows=1, seconds=seconds)
    assert clock.plain_cost(1) == 1.0


def _verify_rate(clock: StepClock, num_rows: int, chosen: list[tuple[Acceptance, int]]) -> float:
    rows = num_rows + sum(c for _, c in chosen)
    return (num_rows + sum(sum(draft_gains(s.rate(_LEN), c)) for s, c in chosen)) / clock.verify_cost(rows)


def test_chosen_drafts_beat_every_other_choice_of_prefixes():
    """Against brute force over every prefix length of every proposal, on random costs and records."""
    import itertools
    import random

    rng = random.Random(0)
    for _ in range(60):
        seqs = [Acceptance() for _ in range(3)]
        for seq in seqs:
            for _ in range(rng.randint(0, 4)):
                proposed = rng.randint(1, 4)
                seq.record(_LEN, proposed, rng.randint(0, proposed))
        sizes = (1, 2, 4, 8, 16)
        clock = StepClock(StepCosts(sizes, tuple(sorted(rng.uniform(1.0, 2.0) for _ in sizes))))
        clock.host_per_step = rng.choice([0.0, 0.1, 0.5])
        wanted = [_wanted(s, rng.randint(1, 4)) for s in seqs]
        num_rows = rng.randint(1, 6)
        chosen = choose_drafts(clock, num_rows, wanted)
        plain = num_rows / clock.plain_cost(num_rows)
        best = plain
        for counts in itertools.product(*(range(d + 1) for _, _, d in wanted)):
            if num_rows + sum(counts) <= clock.max_rows:
                pick = [(s, c) for (s, _, _), c in zip(wanted, counts, strict=True) if c]
                best = max(best, _verify_rate(clock, num_rows, pick))
        got = _verify_rate(clock, num_rows, chosen) if chosen else plain
        assert got >= best - 1e-9
        assert any_pays(clock, num_rows, wanted) == bool(chosen)
        assert all(c <= d for (s, c) in chosen for (t, _, d) in wanted if s is t)


def test_the_cached_bound_answers_as_the_scan_over_sizes_does():
    """`can_pay` keeps its per-size rates between verifications; observed steps of either kind must
    leave it answering as the direct scan does."""
    import random

    rng = random.Random(1)
    sizes = (1, 2, 4, 8, 16, 32, 48, 64)
    clock = StepClock(StepCosts(sizes, tuple(1.0 + s / 64 for s in sizes)))
    for _ in range(300):
        rows = rng.randint(1, 64)
        clock.observe(verify=rng.random() < 0.3, rows=rows, seconds=rng.uniform(0.8, 3.0))
        n = rng.randint(1, 64)
        scan = any(s / clock.verify_cost(s) > n / clock.plain_cost(n) for s in sizes if s > n)
        assert clock.can_pay(n) == scan
        assert clock.verify_costs(n, 65) == [clock.verify_cost(r) for r in range(n, 65)]


def test_a_rejected_proposal_waits_about_one_over_acceptance_decode_steps():
    speculator = _speculator(num_tokens=4, max_model_len=64)
    seq = Sequence([1, 2, 3, 4], SamplingParams(temperature=0), 16, num_prompt_tokens=3)
    record = speculator.records[seq.seq_id] = Acceptance()
    for _ in range(4):
        record.record(seq.num_completion_tokens, 4, 0)
    seq.set_cached_prefix(3)
    seq.add_drafts([7, 7])
    seq.schedule(3)
    assert speculator.accept(seq, [8, 9, 9]) == [8]  # the first draft is rejected: nothing accepted
    # the rule, with this rejection counted
    expected = min(16, int(1.0 / record.rate(seq.num_completion_tokens)) - 1)
    steps = 0
    while record.is_waiting(seq.num_completion_tokens):  # each decode step adds a token
        seq.append_token(5)
        steps += 1
    assert steps == expected > 1
    speculator.release(seq, finished=False)  # preempted: it comes back with its record
    assert speculator.record_of(seq) is record
    speculator.release(seq, finished=True)
    assert seq.seq_id not in speculator.records


def test_a_record_of_misses_fades_while_the_sequence_writes_unverified():
    """A sequence whose drafts kept failing stops speculating; as it writes on without verifications
    its record fades back towards the prior, so it proposes again when its text may have changed."""
    record, length = Acceptance(), 0
    for _ in range(6):
        length += 1
        record.record(length, proposed=4, accepted=0)
    low = record.rate(length)
    assert low < 0.25 and record.draft_length(length, 8) == 1
    length += 30  # plain decode steps, no verification
    assert 0.45 < record.rate(length) <= 0.5 and record.draft_length(length, 8) == 2
    length += 1
    record.record(length, proposed=2, accepted=0)  # a new miss counts in full again
    assert record.rate(length) < 0.5


def test_long_verifications_of_a_large_batch_pay_their_rows_host_share():
    """A 64-row batch whose sequences all accept well: verifying 2-4 drafts each would take 128-320
    rows. Each row costs the host its share (sampling, acceptance) beyond the replay, so such steps do
    not pay against a plain step of 64 rows (measured on the H200 at b63e584, where only a per-step
    host cost was modelled: 200-row verifications were tried at a loss, batch 64 at 0.66-0.94x)."""
    seqs = [Acceptance() for _ in range(64)]
    for seq in seqs:
        for _ in range(4):
            seq.record(_LEN, 8, 7)
    clock = StepClock(StepCosts((64, 128, 256, 512), (1.0e-3, 1.2e-3, 1.5e-3, 2.5e-3)))
    clock.observe(verify=False, rows=64, seconds=1.2e-3)
    clock.host_per_step = 0.5e-3
    assert choose_drafts(clock, 64, [_wanted(s, 8) for s in seqs]) == []
    assert not any_pays(clock, 64, [_wanted(s, 8) for s in seqs])


def test_the_policy_rests_after_finding_that_nothing_pays(monkeypatch):
    """Weighing a large batch's drafts costs host time every step; once nothing pays, the speculator
    skips the weighing for RECHECK_AFTER_NOTHING_PAYS steps, then looks again."""
    speculator = _speculator(num_tokens=4, max_model_len=256)
    speculator.clock = StepClock(StepCosts((1, 4, 8, 16), (1.0, 5.0, 9.0, 17.0)))  # rows cost in full
    speculator.clock.host_per_step = 0.0
    monkeypatch.setattr(speculator.clock, "can_pay", lambda rows: True)  # only choose_drafts decides
    calls = []
    original = proposer_speculator.choose_drafts
    monkeypatch.setattr(proposer_speculator, "choose_drafts", lambda *a: calls.append(1) or original(*a))
    seq = Sequence([5, 6, 5, 6, 5, 6, 5], SamplingParams(temperature=0), 16, num_prompt_tokens=6)
    seq.set_cached_prefix(6)
    steps = 2 * proposer_speculator.RECHECK_AFTER_NOTHING_PAYS + 1
    for _ in range(steps):
        speculator.plan([seq], budget=64)
        assert seq.num_draft_tokens == 0
    assert len(calls) == 3  # the first plan, then once after each rest
