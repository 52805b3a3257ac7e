"""Structured output in the offline engine on the real default model: every answer parses and
validates against its schema (or matches its regex), greedy and sampled, with speculation and
run-ahead configured, and next to free-text requests in the same batches."""

from __future__ import annotations

import pytest

from common import LLM, SamplingParams
from common.default_model import prepare_default_model
from common.structured_output import GuidedRequest, json_schema_grammar
from tests.helpers.structured_cases import CASES, PERSON

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


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_answers_validate_against_their_schemas(default_llm, temperature):
    outs = _generate_cases(default_llm, temperature, seed=7)
    _check_all(outs)
    # The free-text request shared the batches and is not constrained to anything.
    assert not outs[-1]["text"].lstrip().startswith(("{", "["))


def test_many_sampled_answers_validate(default_llm):
    """Sampling explores the grammar's corners (escapes, empty arrays, bounds): 8 draws of one schema."""
    prompt = _chat(default_llm, CASES[0].question)
    params = SamplingParams(
        temperature=1.2, max_tokens=MAX_TOKENS, n=8, seed=3, grammar=json_schema_grammar(PERSON)
    )
    (out,) = default_llm.generate([prompt], params, use_tqdm=False)
    for sample in out["outputs"]:
        assert sample["finish_reason"] == "stop", sample
        CASES[0].check(sample["text"])


def test_speculation_and_run_ahead_keep_grammar_answers(default_llm):
    """Grammar requests are neither speculated nor run ahead (`reads_token_history`), while the
    free-text request beside them is: the greedy answers equal the plain engine's."""
    reference = _generate_cases(default_llm, 0.0)
    for overrides in ({"speculative": "ngram"}, {"async_scheduling": True}):
        llm = _engine(**overrides)
        outs = _generate_cases(llm, 0.0)
        _check_all(outs)
        assert [o["token_ids"] for o in outs] == [o["token_ids"] for o in reference], overrides
        if "speculative" in overrides:
            assert llm.engine.scheduler.spec_stats.proposed > 0  # the free-text request was speculated
        llm.close()


def test_a_bad_grammar_is_refused_before_anything_runs(default_llm):
    with pytest.raises(ValueError, match=r"sampling_params\[1\].grammar"):
        default_llm.generate(
            ["a", "b"], [SamplingParams(), SamplingParams(grammar="start: (((")], use_tqdm=False
        )
    with pytest.raises(ValueError, match="grammar"):
        SamplingParams(grammar="")
