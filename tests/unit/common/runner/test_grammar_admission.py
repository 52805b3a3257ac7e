"""Grammar requests are built aside (`GrammarAdmission`) while the engine steps: they join the scheduler
once their matcher is ready and obey their grammar; one refused there comes back as `rejected` and
never runs; an abort finds it while it waits; plain requests beside them are not held. A decode
worker's copy of a handed-off request is built while its KV travels: it joins the running batch once
both are there, a refused one is rejected only once its KV has arrived, and a failed transfer's
recompute still obeys the grammar."""

from __future__ import annotations

import threading

import pytest

from common import SamplingParams
from common.config import EngineConfig
from common.core.sequence import Sequence
from common.llm_engine import LLMEngine
from common.runner.grammar import GrammarMasker
from common.tools.default_model import prepare_default_model
from common.wire.structured_output import choice_grammar, regex_grammar


def _engine(model_dir) -> LLMEngine:
    return LLMEngine.from_config(
        EngineConfig(model=str(model_dir), num_kvcache_blocks=128, max_model_len=512)
    )


def _drain(engine: LLMEngine) -> tuple[dict[str, list[int]], dict[str, str]]:
    tokens: dict[str, list[int]] = {}
    rejected: dict[str, str] = {}
    while engine.has_unfinished:
        result = engine.step()
        rejected |= {r.seq.request_id: r.error for r in result.rejected}
        for update in result.updates:
            if update.new_token_id is not None:
                tokens.setdefault(update.seq.request_id, []).append(update.new_token_id)
    return tokens, rejected


def _record_builds(monkeypatch) -> list[str]:
    """The names of the threads on which matchers are made (admission's and a step's alike)."""
    threads: list[str] = []
    new_state = GrammarMasker._new_state

    def recording(self, seq, vocab_size):
        threads.append(threading.current_thread().name)
        return new_state(self, seq, vocab_size)

    monkeypatch.setattr(GrammarMasker, "_new_state", recording)
    return threads


def _handed_off(engine: LLMEngine, rid: str, grammar, first_token: int) -> Sequence:
    """A decode worker's copy of a handed-off request: prompt + the prefill worker's first token, its
    blocks reserved for the KV transfer (as decode_worker/role.py does)."""
    params = SamplingParams(temperature=0, grammar=grammar, max_tokens=8)
    seq = engine.make_sequence([1, 2, 3, 4, first_token], params, rid, 4)
    assert engine.reserve_transfer(seq)
    return seq


@pytest.fixture(scope="module")
def default_engine():
    engine = _engine(prepare_default_model(progress=False))
    yield engine
    engine.close()


def test_a_grammar_request_is_built_off_the_engine_thread_then_obeys_it(default_engine, monkeypatch):
    engine = default_engine
    threads = _record_builds(monkeypatch)
    grammar = choice_grammar(["yes", "no"])
    engine.add_request([1, 2, 3, 4], SamplingParams(temperature=0, grammar=grammar, max_tokens=8), "g")
    engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), "plain")
    assert len(engine.grammars) == 1 and len(engine.scheduler.waiting) == 1  # only the grammar waits aside
    tokens, rejected = _drain(engine)
    assert rejected == {} and len(tokens["plain"]) == 4
    assert threads and all(name.startswith("grammar") for name in threads)
    tokenizer = engine.runner.grammar.tokenizer(engine.model_config.vocab_size)
    text = tokenizer.decode_str([t for t in tokens["g"] if t not in engine.model_config.eos_token_ids])
    assert text in ("yes", "no")


def test_a_refused_grammar_is_rejected_and_never_runs(tiny_model_dirs):
    """The tiny model ships no tokenizer: its grammar is refused where it is built, aside."""
    engine = _engine(tiny_model_dirs["llama"])
    try:
        engine.add_request([1, 2], SamplingParams(grammar=regex_grammar("[a-z]+"), max_tokens=4), "bad")
        engine.add_request([3, 4], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), "ok")
        tokens, rejected = _drain(engine)
        assert "grammar needs a tokenizer" in rejected["bad"]
        assert "bad" not in tokens and len(tokens["ok"]) == 3
        assert engine.load_report().num_waiting == 0
    finally:
        engine.close()


def test_an_abort_finds_a_request_waiting_for_its_grammar(default_engine):
    engine = default_engine
    engine.add_request([1, 2, 3], SamplingParams(grammar=regex_grammar("[0-9]{3}"), max_tokens=4), "g")
    assert engine.load_report().num_waiting == 1
    (aborted,) = engine.abort(["g"])
    assert aborted.request_id == "g" and aborted.is_finished
    assert not engine.has_unfinished and engine.step().updates == []


def test_a_handed_off_grammar_request_is_built_while_its_kv_travels(default_engine, monkeypatch):
    engine = default_engine
    threads = _record_builds(monkeypatch)
    tokenizer = engine.runner.grammar.tokenizer(engine.model_config.vocab_size)
    (first,) = tokenizer.tokenize_str("yes")  # what the prefill worker sampled under the same grammar
    seq = _handed_off(engine, "d", choice_grammar(["yes", "no"]), first)
    assert len(engine.grammars) == 1 and not engine.has_unfinished  # the transfer, not a step, waits
    assert engine.load_report().num_transferring == 1 and engine.load_report().num_waiting == 0
    engine.complete_transfer(seq)  # the KV arrived: it runs once its matcher is there
    tokens, rejected = _drain(engine)
    assert rejected == {} and seq.is_finished
    assert threads and all(name.startswith("grammar") for name in threads)  # none made in a step
    assert tokens["d"] and all(t in engine.model_config.eos_token_ids for t in tokens["d"])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_handed_off_request_whose_grammar_is_refused_waits_for_its_kv(tiny_model_dirs):
    engine = _engine(tiny_model_dirs["llama"])
    try:
        seq = _handed_off(engine, "bad", regex_grammar("[a-z]+"), 7)
        build = engine.grammars._held[seq.seq_id].future
        with pytest.raises(ValueError, match="grammar needs a tokenizer"):
            build.result(timeout=30)
        assert engine.step().rejected == []  # refused, but the transfer may still write its blocks
        assert engine.load_report().num_transferring == 1
        engine.complete_transfer(seq)
        tokens, rejected = _drain(engine)
        assert "grammar needs a tokenizer" in rejected["bad"] and "bad" not in tokens
        load = engine.load_report()
        assert load.num_transferring == load.num_running == 0
        assert load.num_free_blocks == load.num_total_blocks
    finally:
        engine.close()


def test_a_failed_transfer_is_recomputed_under_its_grammar(default_engine):
    engine = default_engine
    tokenizer = engine.runner.grammar.tokenizer(engine.model_config.vocab_size)
    (first,) = tokenizer.tokenize_str("no")
    seq = _handed_off(engine, "f", choice_grammar(["yes", "no"]), first)
    engine.fail_transfer(seq)
    assert len(engine.grammars) == 0  # its build is dropped: the recompute makes the matcher in a step
    tokens, rejected = _drain(engine)
    assert rejected == {} and seq.is_finished
    assert all(t in engine.model_config.eos_token_ids for t in tokens["f"])
