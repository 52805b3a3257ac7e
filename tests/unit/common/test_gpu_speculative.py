"""Speculative decoding on a CUDA GPU: verification replays the decode CUDA graphs, greedy outputs in
float32 equal plain decoding's token for token (n-gram k = 1, 4, 8 and a draft model with its own
graphs, mixed batches), and sampling keeps the target distribution. Real default model (its near-ties
are rare; random weights would flip tokens on rounding alone). Skipped without CUDA."""

from __future__ import annotations

import pytest

from common import LLM, SamplingParams
from common.tools.chat import build_chat_prompt
from common.tools.default_model import prepare_default_model
from tests.helpers.gpu_llm import small_gpu_llm
from tests.unit.common.spec_decode.test_speculative import two_sample_total_variation

pytestmark = pytest.mark.gpu

TEXTS = [
    "Repeat exactly: the quick brown fox jumps over the lazy dog, and the dog sleeps on.",
    "Rename the variable `t` to `acc` and return the code:\n\ndef total(xs):\n    t = 0\n"
    "    for x in xs:\n        t = t + x\n    return t\n",
    "Fix the typos and return the text: Teh river rose thrugh the nigth and the feilds were wet.",
    "Write a poem about autumn leaves.",
    "Explain how a bicycle works to a ten-year-old.",
    "List the days of the week, then list them again in reverse order.",
]
MAX_TOKENS = (64, 23, 48, 40, 9, 57)


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(prepare_default_model(progress=False))


def _llm(model: str, **kw) -> LLM:
    return small_gpu_llm(model, dtype="float32", max_model_len=2048, max_num_seqs=32, **kw)


def _generate(llm: LLM) -> list[list[int]]:
    prompts = [llm.tokenizer.encode(build_chat_prompt(llm.tokenizer, t)) for t in TEXTS]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
    return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]


def _always_speculate(llm: LLM) -> None:
    """Exactness is under test, not the cost policy: drop the measured clock so every step that can
    verify does (the fixed batch rule, with speculative_max_batch above the batch)."""
    llm.engine.scheduler.speculator.clock = None


def _count_graph_verifications(llm: LLM) -> list[bool]:
    """Wrap the graph runner: the returned list grows by one per graph step that verified drafts,
    True where that step was launched behind a run-ahead step (its placeholders read device tokens)."""
    graphs, calls = llm.engine.runner.graphs, []
    run = graphs.run

    def counting(seqs, q_lens, src_rows=None):
        if any(q > 1 for q in q_lens):
            calls.append(src_rows is not None and any(r >= 0 for r in src_rows))
        return run(seqs, q_lens, src_rows)

    graphs.run = counting
    return calls


@pytest.fixture(scope="module")
def plain_outputs(model_dir) -> list[list[int]]:
    llm = _llm(model_dir)
    out = _generate(llm)
    del llm
    return out


@pytest.mark.parametrize("k", [1, 4, 8])
def test_fp32_greedy_identical_with_ngram_verification_in_graphs(model_dir, plain_outputs, k):
    llm = _llm(model_dir, speculative="ngram", num_speculative_tokens=k)
    assert llm.engine.scheduler.speculator.clock is not None  # the policy weighs measured step costs
    _always_speculate(llm)
    verified = _count_graph_verifications(llm)
    assert _generate(llm) == plain_outputs
    stats = llm.engine.scheduler.speculator.stats
    assert stats.accepted > 0 and verified, (stats, verified)
    assert any(verified), "no verification was launched behind a run-ahead step"
    assert "speculate" not in llm.engine.timings.drains


def test_fp32_greedy_identical_with_a_draft_model_on_graphs(model_dir, plain_outputs):
    llm = _llm(model_dir, speculative="draft", draft_model=model_dir, num_speculative_tokens=4)
    proposer = llm.engine.scheduler.speculator.proposer
    assert proposer.runner.graphs is not None  # the draft runs its own CUDA graphs
    _always_speculate(llm)
    assert _generate(llm) == plain_outputs
    stats = llm.engine.scheduler.speculator.stats
    assert stats.proposed > 0 and stats.accepted == stats.proposed  # the draft is the target
    assert proposer.mirrors == {} and proposer.blocks.num_free_blocks == proposer.blocks.num_blocks


@pytest.mark.parametrize("run_ahead_on", [False, True])
def test_sampling_keeps_the_target_distribution_on_the_gpu(tiny_model_dirs, run_ahead_on):
    # No cost policy: a request proposes at every step; with run-ahead, one step behind.
    tv, accepted, rejected = two_sample_total_variation(
        tiny_model_dirs["qwen3"],
        max_num_seqs=64,
        async_scheduling=run_ahead_on,
        speculative_max_batch=64,
        prepare=_always_speculate,
    )
    assert accepted > 100 and rejected > 100  # both paths ran
    assert tv < 0.08, tv
