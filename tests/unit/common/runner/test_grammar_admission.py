"""Grammar requests are built aside (`GrammarAdmission`) while the engine steps: they join the scheduler
once their matcher is ready and obey their grammar; one refused there comes back as `rejected` and
never runs; an abort finds it while it waits; plain requests beside them are not held."""

from __future__ import annotations

import threading

import pytest

from common import SamplingParams
from common.config import EngineConfig
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


@pytest.fixture(scope="module")
def default_engine():
    engine = _engine(prepare_default_model(progress=False))
    yield engine
    engine.close()


def test_a_grammar_request_is_built_off_the_engine_thread_then_obeys_it(default_engine, monkeypatch):
    engine = default_engine
    threads: list[str] = []
    check = GrammarMasker.check

    def recording(self, seq, vocab_size):
        threads.append(threading.current_thread().name)
        return check(self, seq, vocab_size)

    monkeypatch.setattr(GrammarMasker, "check", recording)
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
