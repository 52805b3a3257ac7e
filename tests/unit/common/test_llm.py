"""The offline LLM's stop strings (the shared incremental detokenizer) on the default model: the text
ends before the stop string and the tokens at the one that completed it, whatever the engine mode."""

from __future__ import annotations

import pytest

from common import LLM, SamplingParams
from common.tools.default_model import prepare_default_model

ENGINES = {
    "plain": {},
    "run_ahead": {"async_scheduling": True},
    "ngram": {"speculative": "ngram", "num_speculative_tokens": 4},
}
GREEDY = {"temperature": 0, "max_tokens": 40, "ignore_eos": True}


@pytest.fixture(scope="module", params=list(ENGINES))
def llm(request) -> LLM:
    path = str(prepare_default_model(progress=False))
    return LLM(path, num_kvcache_blocks=256, max_model_len=2048, **ENGINES[request.param])


@pytest.fixture(scope="module")
def haiku(llm: LLM) -> tuple[str, dict]:
    """A prompt whose greedy answer repeats itself (so n-gram drafts are accepted) and its full answer."""
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a haiku about the sea."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    return prompt, llm.generate([prompt], SamplingParams(**GREEDY), use_tqdm=False)[0]


def _tokens_to_reach(llm: LLM, ids: list[int], num_chars: int) -> int:
    """How many tokens the output needs before its text is `num_chars` long."""
    return next(k for k in range(len(ids) + 1) if len(llm.tokenizer.decode(ids[:k])) >= num_chars)


@pytest.mark.parametrize("stop", ["beauty", "\nA", "reminder of the ocean"])
def test_stop_string_ends_text_and_tokens(llm, haiku, stop):
    prompt, full = haiku
    cut = full["text"].index(stop)
    out = llm.generate([prompt], SamplingParams(**GREEDY, stop=[stop]), use_tqdm=False)[0]
    assert out["text"] == full["text"][:cut] and out["finish_reason"] == "stop"
    assert out["token_ids"] == full["token_ids"][: _tokens_to_reach(llm, full["token_ids"], cut + len(stop))]
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    if llm.config.speculative:  # the answer repeats itself: drafts were accepted around the stops
        assert llm.engine.scheduler.speculator.stats.accepted > 0
    kept = llm.generate([prompt], SamplingParams(**GREEDY, stop=[stop], include_stop_str_in_output=True))[0]
    assert kept["text"] == full["text"][: cut + len(stop)] and kept["token_ids"] == out["token_ids"]


def test_stop_strings_wait_for_min_tokens(llm, haiku):
    """Like the router: a stop string is not looked for before min_tokens tokens are generated."""
    prompt, full = haiku
    first = full["text"].index("beauty")
    assert _tokens_to_reach(llm, full["token_ids"], first + len("beauty")) < 10
    params = SamplingParams(**GREEDY, stop=["beauty"], min_tokens=10)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert out["text"] == full["text"][: full["text"].index("beauty", first + 1)]


def test_stop_string_completed_by_the_last_allowed_token(llm, haiku):
    """The stop string wins over max_tokens when the same token completes both."""
    prompt, full = haiku
    cut = full["text"].index("silent")
    k = _tokens_to_reach(llm, full["token_ids"], cut + len("silent"))
    params = SamplingParams(**{**GREEDY, "max_tokens": k}, stop=["silent"])
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert (out["text"], out["finish_reason"]) == (full["text"][:cut], "stop")
    assert out["token_ids"] == full["token_ids"][:k]


def test_an_engine_keeps_cache_events_only_when_asked(tiny_model_dirs):
    """The prefix cache's events are for a worker to publish (its role turns recording on); an engine
    nobody drains (offline, a benchmark calling `step()`) keeps none, instead of piling them up for the
    process's life (they did: one event per stored block chain and per eviction). The prefix cache
    itself works either way, and turning recording off drops what was kept."""
    from common.wire.kv_events import BlockRemoved, BlockStored

    llm = LLM(tiny_model_dirs["llama"], num_kvcache_blocks=16, max_model_len=128)
    prompts = [[i % 500 for i in range(start, start + 40)] for start in (0, 100, 200)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for _ in range(2):
        llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.drain_kv_events() == []
    assert llm.engine.block_manager.stats.hit_tokens >= 32  # later prompts hit cached prefixes
    llm.engine.record_kv_events(True)
    fresh = [[(i * 7) % 500 for i in range(start, start + 40)] for start in range(300, 800, 100)]
    llm.generate(fresh, params, use_tqdm=False)
    kinds = {type(e) for e in llm.engine.drain_kv_events()}
    assert BlockStored in kinds and BlockRemoved in kinds  # 16 blocks: the new prompts evicted old ones
    llm.generate([[i % 500 for i in range(400, 440)]], params, use_tqdm=False)
    llm.engine.record_kv_events(False)
    assert llm.engine.drain_kv_events() == []


def test_a_stop_token_ids_text_is_cut_unless_asked_for(llm, haiku):
    """As the router answers (SamplingParams.visible_tokens): the text ends before the stop token id
    that ended it, or after it with include_stop_str_in_output."""
    prompt, full = haiku
    ids = full["token_ids"]
    stop_at = next(i for i, t in enumerate(ids) if i >= 3 and llm.tokenizer.decode([t]).strip())
    stop_id = ids[stop_at]
    for include in (False, True):
        params = SamplingParams(**GREEDY, stop_token_ids=[stop_id], include_stop_str_in_output=include)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        first = ids.index(stop_id)
        assert out["token_ids"] == ids[: first + 1] and out["finish_reason"] == "stop"
        assert out["text"] == llm.tokenizer.decode(ids[: first + include], skip_special_tokens=True)
