"""The engine on the default model (SmolLM2-135M-Instruct) matches transformers on chat prompts."""

from __future__ import annotations

import pytest

from common import LLM, SamplingParams
from common.tools.default_model import prepare_default_model
from common.tools.tiny_models import hf_greedy

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain in one sentence what a CPU does.",
]


@pytest.fixture(scope="module")
def default_llm():
    return LLM(str(prepare_default_model(progress=False)), num_kvcache_blocks=256, max_model_len=2048)


def test_chat_greedy_matches_transformers(default_llm):
    tok = default_llm.tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in QUESTIONS
    ]
    ids = [tok.encode(p) for p in prompts]
    reference = hf_greedy(default_llm.config.model, ids, 32, use_cache=True)
    outs = default_llm.generate(
        ids, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), use_tqdm=False
    )
    assert [o["token_ids"] for o in outs] == reference
    assert "Paris" in outs[0]["text"]


def test_stop_strings_and_eos(default_llm):
    tok = default_llm.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    full = default_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)[0]
    assert (
        full["finish_reason"] == "stop"
        and full["token_ids"][-1] in default_llm.engine.model_config.eos_token_ids
    )
    cut = default_llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=32, stop=["France"]), use_tqdm=False
    )
    assert cut[0]["text"] == full["text"][: full["text"].index("France")]
    assert cut[0]["finish_reason"] == "stop"
