"""Scheduler: token budget, chunk boundaries, max_num_seqs, preemption order and the three roles."""

from __future__ import annotations

import pytest

from common.core.batch import ScheduledBatch, SchedulerConfig, SeqUpdate
from common.core.block_manager import BlockManager
from common.core.scheduler import Scheduler
from common.core.sequence import FinishReason, Sequence, SequenceStatus
from common.runner.output import RunnerOutput
from common.spec_decode.proposer_speculator import ProposerSpeculator
from common.spec_decode.speculative import NgramProposer, SpeculativeConfig
from common.wire.sampling_params import SamplingParams

BS = 4
EOS = 3


def _sched(blocks=64, budget=16, max_seqs=8, role="mixed", max_len=256, speculator=None) -> Scheduler:
    cfg = SchedulerConfig(max_seqs, budget, max_len, role, frozenset({EOS}))
    return Scheduler(cfg, BlockManager(blocks, BS), speculator)


def _seq(n: int, start: int = 10, **params) -> Sequence:
    params.setdefault("max_tokens", 8)
    return Sequence(list(range(start, start + n)), SamplingParams(**params), BS)


def _apply(s: Scheduler, batch: ScheduledBatch, sampled: list[int | None]) -> list[SeqUpdate]:
    """Feed one token per sequence (None: a mid-prompt chunk samples nothing)."""
    output = RunnerOutput([[] if t is None else [t] for t in sampled], [None] * len(sampled))
    return s.update_from_output(batch.seqs, output)


def _step(s: Scheduler, token: int = 7):
    batch = s.schedule()
    plan = [(seq.seq_id, seq.num_scheduled_tokens) for seq in batch.seqs]
    sampled = [
        token if seq.num_cached_tokens + seq.num_scheduled_tokens == len(seq) else None for seq in batch.seqs
    ]
    return batch, plan, _apply(s, batch, sampled)


def test_chunked_prefill_respects_budget_for_every_prompt():
    s = _sched(budget=16)
    a, b = _seq(20), _seq(10, start=100)
    s.add(a)
    s.add(b)
    _, plan, updates = _step(s)
    assert plan == [(a.seq_id, 16)]  # a takes the whole budget
    _, plan, updates = _step(s)
    assert plan == [(a.seq_id, 4), (b.seq_id, 10)]  # a's last chunk, then b in one go
    assert {u.seq.seq_id for u in updates} == {a.seq_id, b.seq_id}
    _, plan, _ = _step(s)
    assert plan == [(a.seq_id, 1), (b.seq_id, 1)]  # both decode


def test_second_prompt_is_chunked_too():
    s = _sched(budget=12)
    a, b = _seq(5), _seq(30, start=200)
    s.add(a)
    s.add(b)
    _, plan, _ = _step(s)
    assert plan == [(a.seq_id, 5), (b.seq_id, 7)]
    batch, plan, _ = _step(s)
    assert plan == [(a.seq_id, 1), (b.seq_id, 11)]
    assert batch.num_decode_tokens == 1 and batch.num_prefill_tokens == 11


def test_max_num_seqs_limits_admission():
    s = _sched(budget=100, max_seqs=2)
    seqs = [_seq(3, start=10 * i) for i in range(3)]
    for q in seqs:
        s.add(q)
    _, plan, _ = _step(s)
    assert [p[0] for p in plan] == [seqs[0].seq_id, seqs[1].seq_id]
    assert list(s.waiting) == [seqs[2]]


def test_preempts_most_recently_admitted_and_requeues_at_head():
    s = _sched(blocks=4, budget=64)
    a, b = _seq(7), _seq(7, start=50)  # 2 blocks each: the cache is full after admission
    s.add(a)
    s.add(b)
    _step(s)
    _step(s)  # both decode their 8th token into their second block
    assert len(s.running) == 2 and s.block_manager.num_free_blocks == 0
    batch, plan, _ = _step(s)  # a's 9th token needs a block: b, admitted last, gives its own up
    assert plan == [(a.seq_id, 1)]
    assert batch.preempted == [b]
    assert s.waiting.peek() is b and b.status == SequenceStatus.WAITING and b.num_cached_tokens == 0
    assert b.block_table == [] and b.num_preemptions == 1
    assert len(b) == 9  # its sampled tokens are kept and recomputed later


def test_finish_on_eos_max_tokens_and_stop_ids():
    s = _sched()
    a, b, c = _seq(3, max_tokens=2), _seq(3, start=30), _seq(3, start=60, stop_token_ids=[9])
    for q in (a, b, c):
        s.add(q)
    batch = s.schedule()
    updates = _apply(s, batch, [5, EOS, 9])
    finished = {u.seq.seq_id: u.seq.finish_reason for u in updates if u.finished}
    assert finished == {b.seq_id: FinishReason.STOP, c.seq_id: FinishReason.STOP}
    batch = s.schedule()
    updates = _apply(s, batch, [5])
    assert updates[0].finished and a.finish_reason == FinishReason.LENGTH
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


def test_ignore_eos_and_min_tokens():
    s = _sched()
    a = _seq(3, ignore_eos=True, max_tokens=3)
    b = _seq(3, start=40, min_tokens=2, max_tokens=5)
    s.add(a)
    s.add(b)
    batch = s.schedule()
    assert not any(u.finished for u in _apply(s, batch, [EOS, EOS]))
    batch = s.schedule()
    updates = _apply(s, batch, [EOS, EOS])
    assert [u.finished for u in updates] == [False, True]


def test_prefill_role_hands_off_and_keeps_blocks_pinned():
    s = _sched(role="prefill")
    a = _seq(9)
    s.add(a)
    _, _, updates = _step(s)
    assert updates[0].handed_off and a.status == SequenceStatus.HANDED_OFF
    assert not s.running and len(a.block_table) == 3
    assert s.block_manager.num_free_blocks == 64 - 3
    s.release(a)
    assert a.is_finished and s.block_manager.num_free_blocks == 64
    assert len(s.block_manager.hash_to_block) == 2  # the two full prompt blocks stay cached


def test_prefill_role_finishes_without_handoff_when_done_at_first_token():
    s = _sched(role="prefill")
    a = _seq(5, max_tokens=1)
    s.add(a)
    _, _, updates = _step(s)
    assert updates[0].finished and not updates[0].handed_off


def test_decode_role_transfer_success_and_failure():
    s = _sched(role="decode")
    ok, bad = _seq(9), _seq(6, start=70)
    for q in (ok, bad):
        q.append_token(5)  # the first token arrives with the request
        assert s.reserve_for_transfer(q)
        assert q.status == SequenceStatus.TRANSFERRING
    s.complete_transfer(ok)
    s.fail_transfer(bad)
    assert ok.num_cached_tokens == 9 and s.running == [ok]
    assert bad.num_cached_tokens == 0 and list(s.waiting) == [bad]
    _, plan, updates = _step(s)
    assert plan == [(ok.seq_id, 1), (bad.seq_id, 7)]  # bad recomputes prompt + first token
    assert [len(u.seq) for u in updates] == [11, 8]


def test_abort_anywhere_frees_blocks():
    s = _sched(role="decode")
    waiting, running, moving = _seq(4), _seq(4, start=20), _seq(4, start=40)
    moving.append_token(1)
    s.add(running)
    _step(s)
    s.add(waiting)
    assert s.reserve_for_transfer(moving)
    aborted = s.abort([waiting.request_id, running.request_id, moving.request_id])
    assert len(aborted) == 3 and all(q.finish_reason == FinishReason.ABORT for q in aborted)
    assert s.block_manager.num_free_blocks == 64 and not s.has_work


def test_rejects_what_can_never_run():
    s = _sched(blocks=2, max_len=16)
    with pytest.raises(ValueError, match="max_model_len"):
        s.add(_seq(17))
    with pytest.raises(ValueError, match="KV blocks"):
        s.add(_seq(9))
    with pytest.raises(ValueError, match="at least one token"):
        s.add(Sequence([], SamplingParams(), BS))


def _speculating(**params) -> tuple[Scheduler, Sequence]:
    """A decoding sequence whose next step verifies the n-gram proposal [1, 2, 3]."""
    config = SpeculativeConfig(num_tokens=3)
    s = _sched(budget=32, speculator=ProposerSpeculator(NgramProposer(config), config, max_model_len=256))
    seq = Sequence([1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(max_tokens=20, ignore_eos=True, **params), BS)
    s.add(seq)
    _step(s, token=3)  # prefill; the sequence now ends with a third "1 2 3"
    return s, seq


def test_update_from_output_keeps_confirmed_drafts_only():
    s, seq = _speculating()
    batch = s.schedule()
    assert batch.num_draft_tokens == 3 and seq.num_scheduled_tokens == 4
    updates = s.update_from_output(batch.seqs, RunnerOutput([[1, 2, 9, 5]], [None]))
    assert [u.new_token_id for u in updates] == [1, 2, 9]  # two drafts confirmed, then the correction
    assert seq.completion_token_ids == [3, 1, 2, 9]
    assert seq.num_cached_tokens == len(seq) - 1 and seq.num_draft_tokens == 0
    assert (s.speculator.stats.proposed, s.speculator.stats.accepted) == (3, 2)


def test_stop_inside_an_accepted_run_ends_the_output_there():
    s, seq = _speculating(stop_token_ids=[2])
    batch = s.schedule()
    updates = s.update_from_output(batch.seqs, RunnerOutput([[1, 2, 3, 4]], [None]))
    assert [(u.new_token_id, u.finished) for u in updates] == [(1, False), (2, True)]
    assert seq.completion_token_ids == [3, 1, 2] and seq.finish_reason == FinishReason.STOP
    assert seq.num_cached_tokens <= len(seq)
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


def test_finished_while_a_later_step_runs_keeps_blocks_until_the_next_output():
    s = _sched()
    a, b = _seq(3, max_tokens=2), _seq(3, start=30)
    s.add(a)
    s.add(b)
    _step(s)
    batch = s.schedule()  # a's second token finishes it by length
    updates = s.update_from_output(batch.seqs, RunnerOutput([[5], [5]], [None, None]), in_flight={a.seq_id})
    assert updates[0].finished and a.is_finished and len(a.block_table) == 1
    batch = s.schedule()
    assert batch.seqs == [b]
    s.update_from_output(batch.seqs, RunnerOutput([[6]], [None]))  # the later step's output: a is freed
    assert a.block_table == [] and s.block_manager.num_free_blocks == s.block_manager.num_blocks - 2


def test_a_placeholder_is_filled_or_dropped():
    s = _sched()
    kept, aborted = _seq(3, start=10), _seq(3, start=40)
    for q in (kept, aborted):
        s.add(q)
    _step(s)
    batch = s.schedule()
    for q in batch.seqs:  # what a run-ahead launch does
        q.commit_scheduled()
        q.append_placeholder()
    s.abort([aborted.request_id])
    updates = s.update_from_output(batch.seqs, RunnerOutput([[8], [8]], [None, None]))
    assert [u.seq for u in updates] == [kept] and kept.completion_token_ids == [7, 8]
    assert aborted.completion_token_ids == [7] and aborted.num_pending_tokens == 0
