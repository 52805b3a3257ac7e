"""The decode role: DecodeRequest -> Sequence, the hand-off from a real prefill role over real tcp
transfers (greedy tokens equal the offline engine's), recompute on a failed transfer, waiting for
room, aborts during a transfer, deadlines."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from common import SamplingParams
from common.core.sequence import SequenceStatus
from common.runner.grammar import GrammarMasker
from common.tools.default_model import prepare_default_model
from common.wire.handoff import HandOff, NcclStore
from common.wire.messages import Abort, DecodeRequest, RequestFailed, TokenOutput
from common.wire.structured_output import choice_grammar
from decode_worker.admission import sequence_from_request, transferable
from decode_worker.role import DecodeRole
from prefill_worker.role import PrefillRole
from tests.unit.decode_worker.cases import MAX_TOKENS, PROMPTS
from tests.unit.prefill_worker.harness import Pair, make_service, prefill_request, run_until


@pytest.fixture
def pair(tiny_model_dirs):
    p = Pair.of(tiny_model_dirs["llama"], kv_fetch_timeout_s=1.0)
    yield p
    p.close()


def dead_handoff(rid: str, num_blocks: int) -> HandOff:
    """A tcp hand-off of `num_blocks` blocks from a sender nobody runs."""
    return HandOff("tcp", "tcp://127.0.0.1:9", rid, 1, 1, num_blocks)


def decode_request(rid: str, prompt: list[int], handoff: HandOff, **sampling) -> DecodeRequest:
    params = prefill_request(rid, prompt, **sampling).sampling
    return DecodeRequest(rid, prompt, 7, params, handoff, "prefill-test", None)


def test_decode_request_becomes_prompt_plus_first_token(pair) -> None:
    req = decode_request("r1", [1, 2, 3], dead_handoff("r1", 1), max_tokens=4)
    seq = sequence_from_request(pair.decode.engine, req)
    assert seq.token_ids == [1, 2, 3, 7] and seq.num_prompt_tokens == 3
    assert seq.completion_token_ids == [7] and seq.request_id == "r1"
    assert seq.sampling_params.max_tokens == 4
    assert transferable(req, 16) and not transferable(replace(req, handoff=dead_handoff("r1", 2)), 16)
    with pytest.raises(ValueError):
        sequence_from_request(
            pair.decode.engine, decode_request("r2", [1], dead_handoff("r2", 1), max_tokens=0)
        )


def test_handoff_matches_the_offline_engine(pair, reference) -> None:
    rids = [f"r{i}" for i in range(len(PROMPTS))]
    for rid, prompt in zip(rids, PROMPTS, strict=True):
        pair.prefill.handle(prefill_request(rid, prompt, max_tokens=MAX_TOKENS, ignore_eos=True))
    pair.run(rids)
    assert [pair.tokens(rid) for rid in rids] == reference
    decode_outs = pair.decode.channels.of_type(TokenOutput)
    assert sum(o.kv_transfer_bytes for o in decode_outs) > 0  # reported once per request
    assert all(o.cached_tokens == 0 and o.index >= 1 for o in decode_outs)
    run_until([pair.prefill], lambda: not pair.prefill.engine.scheduler.handed_off)  # acks unpin


def test_failed_transfer_is_recomputed_locally(pair, reference) -> None:
    dead = dead_handoff("r1", 3)
    req = decode_request("r1", PROMPTS[2], dead, max_tokens=MAX_TOKENS, ignore_eos=True)
    first = reference[2][0]
    pair.decode.handle(replace(req, first_token_id=first))
    run_until([pair.decode], lambda: pair.finished("r1"), timeout=30)
    assert [first, *pair.tokens("r1")] == reference[2]


def test_a_transport_not_started_here_is_recomputed_locally(pair, reference) -> None:
    nccl = HandOff("nccl", "tcp://127.0.0.1:9", "r1", 1, 1, 1, nccl=NcclStore("127.0.0.1", 9, "gloo"))
    req = decode_request("r1", PROMPTS[1], nccl, max_tokens=MAX_TOKENS)  # this worker runs tcp only
    first = reference[1][0]
    pair.decode.handle(replace(req, first_token_id=first, sampling=_greedy()))
    run_until([pair.decode], lambda: pair.finished("r1"))
    assert [first, *pair.tokens("r1")] == reference[1]


def test_requests_wait_for_room_instead_of_being_dropped(tiny_model_dirs, reference) -> None:
    model = tiny_model_dirs["llama"]
    pair = Pair(make_service(PrefillRole(), model), make_service(DecodeRole(), model, num_kvcache_blocks=6))
    try:
        rids = ["a", "b"]  # 70 + 10 tokens need 5 blocks each: only one fits at a time
        for rid in rids:
            pair.prefill.handle(prefill_request(rid, PROMPTS[3], max_tokens=MAX_TOKENS, ignore_eos=True))
        waited = []

        def step() -> None:
            pair.forward()
            waited.append(len(pair.decode.role.pending))

        run_until([pair.prefill, pair.decode], lambda: all(map(pair.finished, rids)), 60, step)
        assert max(waited) == 1  # "b" waited for "a"'s blocks
        assert pair.tokens("a") == pair.tokens("b") == reference[3]
    finally:
        pair.close()


def test_abort_during_transfer_waits_for_the_transfer_to_settle(pair) -> None:
    decode = pair.decode
    pair.prefill.handle(prefill_request("r1", PROMPTS[3], max_tokens=MAX_TOKENS))
    run_until([pair.prefill], lambda: pair.prefill.channels.peers)
    pair.forward()
    decode.handle(decode.channels.inbox.get())
    seq = decode.role.jobs["r1"].seq
    assert seq.status is SequenceStatus.TRANSFERRING
    decode.handle(Abort("r1"))
    assert seq.block_table  # still owned: the receiver may be writing into these blocks
    run_until([pair.prefill, decode], lambda: "r1" not in decode.role.jobs)
    assert seq.block_table == [] and not decode.engine.has_unfinished
    decode.handle(Abort("r1"))  # unknown by now: ignored


def test_abort_after_the_kv_arrived_while_the_grammar_builds_frees_it_at_once(monkeypatch) -> None:
    """The KV arrived, the grammar's matcher is still being built aside: nothing writes the blocks
    any more, so an abort frees them now (waiting for the transfer to settle would wait forever)."""
    build, release = GrammarMasker.build, threading.Event()

    def slow(self, seq, vocab_size):
        if seq.num_completion_tokens:  # the decode side's copy (the prefill side's builds at once)
            release.wait(30)
        return build(self, seq, vocab_size)

    monkeypatch.setattr(GrammarMasker, "build", slow)
    pair = Pair.of(str(prepare_default_model(progress=False)), kv_fetch_timeout_s=5.0)
    try:
        decode = pair.decode
        grammar = choice_grammar(["yes", "no"])
        pair.prefill.handle(prefill_request("g", PROMPTS[3], max_tokens=4, grammar=grammar))
        run_until([pair.prefill], lambda: pair.prefill.channels.peers)
        pair.forward()
        decode.handle(decode.channels.inbox.get())
        job = decode.role.jobs["g"]
        run_until([pair.prefill, decode], lambda: job.fetch_done_at is not None)
        assert job.seq.status is SequenceStatus.TRANSFERRING and not job.transfer_in_flight
        decode.handle(Abort("g"))
        assert "g" not in decode.role.jobs and job.seq.block_table == []
        assert decode.engine.load_report().num_transferring == 0 and not decode.engine.has_unfinished
    finally:
        release.set()
        pair.close()


def test_a_grammar_that_cannot_be_followed_mid_answer_fails_the_request() -> None:
    """The first token (sampled elsewhere) is one the grammar does not allow: the matcher fails, the
    sequence ends on the EOS it forces, and the front gets a refusal naming the grammar, not a
    finished answer."""
    service = make_service(DecodeRole(), str(prepare_default_model(progress=False)), kv_fetch_timeout_s=1.0)
    try:
        tokenizer = service.engine.runner.grammar.tokenizer(service.engine.model_config.vocab_size)
        (maybe,) = tokenizer.tokenize_str("maybe")
        grammar = choice_grammar(["yes", "no"])
        req = decode_request("g", PROMPTS[0], dead_handoff("g", 1), max_tokens=8, grammar=grammar)
        service.handle(replace(req, first_token_id=maybe))  # recomputed here: the transfer is dead
        run_until([service], lambda: "g" not in service.role.jobs, timeout=60)
        (failed,) = service.channels.of_type(RequestFailed)
        assert failed.invalid and not failed.retryable and "grammar could not be followed" in failed.error
        assert not any(o.finish_reason for o in service.channels.of_type(TokenOutput))
        load = service.engine.load_report()
        assert load.num_running == load.num_waiting == 0 and load.num_free_blocks == load.num_total_blocks
    finally:
        service.close()


def test_abort_before_the_request_drops_the_late_request(pair) -> None:
    pair.decode.handle(Abort("r1"))
    req = decode_request("r1", PROMPTS[0], dead_handoff("r1", 1))
    pair.decode.handle(req)
    assert pair.decode.role.jobs == {} and not pair.decode.engine.has_unfinished


def test_deadline_ends_the_request_with_abort(pair) -> None:
    pair.prefill.handle(prefill_request("r1", PROMPTS[2], max_tokens=900, ignore_eos=True))
    run_until([pair.prefill], lambda: pair.prefill.channels.peers)
    _, req = pair.prefill.channels.peers.pop()
    pair.decode.handle(replace(req, deadline=time.time() + 0.3))
    run_until([pair.decode], lambda: pair.finished("r1"), timeout=30)
    last = pair.decode.channels.of_type(TokenOutput)[-1]
    assert last.finish_reason == "abort" and last.token_ids == []
    assert len(pair.tokens("r1")) == last.index  # the abort message sits right after the last token
    assert not pair.decode.engine.has_unfinished


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def test_logprobs_travel_in_the_wire_form(pair) -> None:
    pair.prefill.handle(prefill_request("r1", PROMPTS[1], max_tokens=4, logprobs=2))
    pair.run(["r1"])
    outs = [o for o in pair.outputs() if o.request_id == "r1"]
    entries = [e for o in outs for e in o.logprobs]
    assert len(entries) == 4 == len(pair.tokens("r1"))
    for entry, token in zip(entries, pair.tokens("r1"), strict=True):
        assert entry.logprob <= 0 and len(entry.top) == 2
        assert entry.top[0][0] == token  # greedy: the chosen token is the best alternative
