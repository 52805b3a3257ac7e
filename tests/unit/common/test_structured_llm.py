"""Structured output in the offline engine on the real default model: every answer parses and
validates against its schema (or matches its regex), greedy and sampled, with speculation
configured, and next to a free-text request in the same batches."""

from __future__ import annotations

import pytest

from common import LLM, SamplingParams
from common.core import run_ahead
from common.core.sequence import Sequence
from common.llm import _Pending
from common.spec_decode.speculative import can_speculate_later
from common.tools.default_model import prepare_default_model
from common.wire.structured_output import GuidedRequest, choice_grammar
from tests.helpers.structured_cases import CASES

MAX_TOKENS = 64
COPY_PROMPT = (
    "Repeat exactly: one two three four five six seven eight, one two three four five six seven eight"
)


def _engine(**overrides) -> LLM:
    return LLM(
        str(prepare_default_model(progress=False)), num_kvcache_blocks=256, max_model_len=1024, **overrides
    )


@pytest.fixture(scope="module")
def default_llm():
    return _engine()


def _chat(llm: LLM, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    return llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _params(grammar: str | None, temperature: float, seed: int) -> SamplingParams:
    return SamplingParams(
        temperature=temperature, top_p=0.95, max_tokens=MAX_TOKENS, seed=seed, grammar=grammar
    )


def _generate_cases(llm: LLM, temperature: float, seed: int = 0) -> list[dict]:
    """Every case plus one free-text request, in one batch."""
    prompts = [_chat(llm, c.question) for c in CASES] + [_chat(llm, COPY_PROMPT)]
    params = [
        _params(GuidedRequest(**c.request).grammar(), temperature, seed + i) for i, c in enumerate(CASES)
    ]
    params.append(_params(None, temperature, seed))
    return llm.generate(prompts, params, use_tqdm=False)


def _check_all(outs: list[dict]) -> None:
    for case, out in zip(CASES, outs, strict=False):
        assert out["finish_reason"] == "stop", (case.question, out)
        case.check(out["text"])


@pytest.fixture(scope="module")
def greedy_outputs(default_llm):
    return _generate_cases(default_llm, 0.0)


def test_greedy_answers_validate_against_their_schemas(greedy_outputs):
    _check_all(greedy_outputs)
    # The free-text request shared the batches and is not constrained to anything.
    assert not greedy_outputs[-1]["text"].lstrip().startswith(("{", "["))


def test_sampled_answers_validate_against_their_schemas(default_llm):
    """Sampling at temperature 1 explores more of each grammar than the greedy path."""
    _check_all(_generate_cases(default_llm, 1.0, seed=7))


def test_a_speculating_engine_gives_the_same_answers(greedy_outputs):
    """Grammar requests are not speculated, the free-text request beside them is: the greedy answers
    equal the plain engine's."""
    llm = _engine(speculative="ngram")
    outs = _generate_cases(llm, 0.0)
    _check_all(outs)
    assert [o["token_ids"] for o in outs] == [o["token_ids"] for o in greedy_outputs]
    assert llm.engine.scheduler.speculator.stats.proposed > 0  # the free-text request was speculated
    llm.close()


def test_grammar_requests_neither_speculate_nor_run_ahead():
    """Each step's mask depends on the token before it, which run-ahead and drafts do not have."""
    seq = Sequence([1, 2, 3], SamplingParams(grammar=choice_grammar(["a", "b"])), block_size=16)
    assert not can_speculate_later(seq)
    assert run_ahead.needs_host_tokens(seq)
    free = Sequence([1, 2, 3], SamplingParams(), block_size=16)
    assert can_speculate_later(free) and not run_ahead.needs_host_tokens(free)


def test_a_bad_grammar_is_refused_before_anything_runs(default_llm):
    with pytest.raises(ValueError, match=r"sampling_params\[1\].grammar"):
        default_llm.generate(
            ["a", "b"], [SamplingParams(), SamplingParams(grammar="start: (((")], use_tqdm=False
        )
    with pytest.raises(ValueError, match="grammar"):
        SamplingParams(grammar="")
    with pytest.raises(ValueError, match="^min_tokens"):  # the grammar decides where the output ends
        SamplingParams(grammar=choice_grammar(["a"]), min_tokens=1)


def test_thousands_of_choices_are_answered(default_llm):
    """Past llguidance's 2,000 alternatives per grammar row (its own choice helper failed there after
    the first token and ended the answer with EOS): the answer is one of the choices."""
    choices = [f"option number {i}" for i in range(3000)]
    params = SamplingParams(temperature=0, grammar=choice_grammar(choices), max_tokens=16)
    out = default_llm.generate(["Pick one option:"], params, use_tqdm=False)[0]
    assert out["text"] in choices and out["finish_reason"] == "stop"


def test_an_answer_whose_grammar_failed_says_so(default_llm):
    """A matcher that fails mid-answer (its first completion token, sampled elsewhere, is one the grammar
    does not allow) ends the sequence on the EOS it forces; the result is then an error naming the
    grammar, as a decode worker answers the router, not a finished answer."""
    engine = default_llm.engine
    vocab = engine.model_config.vocab_size
    (maybe,) = engine.runner.grammar.tokenizer(vocab).tokenize_str("maybe")
    prompt = default_llm.tokenizer.encode(_chat(default_llm, "yes or no?"))
    params = SamplingParams(temperature=0, grammar=choice_grammar(["yes", "no"]), max_tokens=8)
    seq = engine.make_sequence([*prompt, maybe], params, "g-0", num_prompt_tokens=len(prompt))
    engine.prepare_grammar(seq)
    engine.scheduler.add(seq)
    while engine.has_unfinished:
        engine.step()
    out = default_llm._result(_Pending(0, [seq]))
    assert out["finish_reason"] == "error" and "grammar could not be followed" in out["error"], out
