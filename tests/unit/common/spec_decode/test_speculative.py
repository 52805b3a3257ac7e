"""Speculative decoding (n-gram prompt lookup): exact greedy outputs, exact sampling distribution,
consistent rollback."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from common import LLM, SamplingParams
from common.core import run_ahead
from common.spec_decode.ngram import NgramIndex, ngram_propose
from common.spec_decode.speculative import accepted_length
from common.wire.hashing import block_hashes


def test_ngram_propose_takes_the_most_recent_longest_match():
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    # suffix [1,2,3] last occurred at index 4 (followed by 7, 8, 5), not at index 0.
    assert ngram_propose(tokens, 3, max_n=3, min_n=1) == [7, 8, 5]
    assert ngram_propose(tokens, 2, max_n=3, min_n=1) == [7, 8]
    assert ngram_propose([4, 5, 6], 3, max_n=3, min_n=1) == []  # nothing repeats
    assert ngram_propose([5, 6, 5], 4, max_n=2, min_n=1) == [6, 5, 6, 5]  # a 1-gram, period 2
    assert ngram_propose([1, 7, 7, 7], 3, max_n=3, min_n=1) == [7, 7, 7]  # a loop of one token


def test_ngram_index_answers_as_the_scan_does():
    rng = random.Random(0)
    for _ in range(200):
        tokens = [rng.randrange(6) for _ in range(rng.randint(1, 40))]
        index = NgramIndex(max_n=3, min_n=1)
        for length in range(1, len(tokens) + 1):  # grown one token at a time, as a sequence does
            assert index.propose(tokens[:length], 4) == ngram_propose(tokens[:length], 4, 3, 1)


def test_accepted_length():
    assert accepted_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert accepted_length([1, 2, 3], [1, 9, 3, 4]) == 1
    assert accepted_length([], [7]) == 0


def _repetitive_prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        pattern = [rng.randrange(512) for _ in range(rng.randint(3, 9))]
        prompts.append(pattern * rng.randint(2, 5) + [rng.randrange(512) for _ in range(rng.randint(0, 5))])
    return prompts


def _registered_hashes_are_real(llm: LLM, seqs_tokens: list[list[int]]) -> None:
    """Every hash in the prefix cache is the hash of a real block of some sequence (no draft leaked)."""
    real: set[int] = set()
    for tokens in seqs_tokens:
        real.update(block_hashes(tokens, llm.config.kvcache_block_size))
    assert set(llm.engine.block_manager.hash_to_block) <= real


def _count_verifications_behind(llm: LLM, monkeypatch) -> list[int]:
    """Records, per step launched behind a run-ahead step (`src_rows` given) that verifies drafts,
    how many drafts it verifies."""
    behind: list[int] = []
    runner = llm.engine.runner
    original = runner.launch

    def launch(seqs, is_decode, src_rows=None):
        drafts = sum(s.num_draft_tokens for s in seqs)
        if src_rows is not None and drafts:
            behind.append(drafts)
        return original(seqs, is_decode, src_rows)

    monkeypatch.setattr(runner, "launch", launch)
    return behind


@pytest.mark.parametrize(
    ("k", "kv_blocks", "run_ahead_on"),
    [(1, 256, False), (2, 256, False), (4, 256, False), (8, 256, False), (4, 14, False)]
    + [(1, 256, True), (4, 256, True), (8, 256, True), (4, 14, True)],
)
def test_greedy_outputs_identical_with_speculation(tiny_model_dirs, k, kv_blocks, run_ahead_on, monkeypatch):
    """With run-ahead on, n-gram drafts are proposed one step behind and verified in steps launched
    behind the run-ahead step (no drain first); outputs stay identical either way, with preemption."""
    prompts = _repetitive_prompts(6, seed=k)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (30, 17, 40, 8, 25, 33)]
    plain = LLM(tiny_model_dirs["llama"], num_kvcache_blocks=256)
    expected = [o["token_ids"] for o in plain.generate(prompts, params, use_tqdm=False)]
    spec = LLM(
        tiny_model_dirs["llama"],
        num_kvcache_blocks=kv_blocks,
        kvcache_block_size=16,
        speculative="ngram",
        num_speculative_tokens=k,
        async_scheduling=run_ahead_on,
    )
    behind = _count_verifications_behind(spec, monkeypatch)
    outs = [o["token_ids"] for o in spec.generate(prompts, params, use_tqdm=False)]
    assert outs == expected
    stats = spec.engine.scheduler.speculator.stats
    assert stats.proposed > 0 and stats.accepted > 0
    assert bool(behind) == run_ahead_on
    assert "speculate" not in spec.engine.timings.drains
    bm = spec.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    _registered_hashes_are_real(spec, [p + o for p, o in zip(prompts, outs, strict=True)])


@pytest.mark.parametrize("run_ahead_on", [False, True])
def test_stop_inside_an_accepted_run(tiny_model_dirs, run_ahead_on):
    """max_tokens and stop ids that fall inside a run of accepted drafts end the output exactly there
    (with run-ahead also where the stop is the placeholder that drafts proposed behind it follow)."""
    prompts = _repetitive_prompts(4, seed=11)
    plain = LLM(tiny_model_dirs["qwen2"], num_kvcache_blocks=256)
    spec = LLM(
        tiny_model_dirs["qwen2"],
        num_kvcache_blocks=256,
        speculative="ngram",
        num_speculative_tokens=8,
        async_scheduling=run_ahead_on,
    )
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    reference = [o["token_ids"] for o in plain.generate(prompts, free, use_tqdm=False)]
    for ref, prompt in zip(reference, prompts, strict=True):
        stop_id = ref[5]
        params = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True, stop_token_ids=[stop_id])
        out = spec.generate([prompt], params, use_tqdm=False)[0]
        cut = ref.index(stop_id) + 1
        assert out["token_ids"] == ref[: min(cut, 7)]


def test_sampled_outputs_follow_the_target_distribution(tiny_model_dirs):
    """Two-sample comparison of the 4th generated token (T=1) with and without speculation.

    The prompt repeats the model's own greedy continuation, so n-gram proposals are often right and
    often wrong: both the accept and the reject paths are exercised. Runs are deterministic (the
    engine seeds its generator), so the bound is not flaky.
    """
    n = 1500
    tv, accepted, rejected = two_sample_total_variation(
        tiny_model_dirs["qwen3"], n=n, max_num_seqs=n, speculative_max_batch=n
    )
    assert accepted > 100 and rejected > 100  # both paths ran
    # Binned so that every category is seen ~40+ times, two samples of 1500 from one distribution
    # differ by about 0.03 in total variation; a verifier that skewed towards the proposals would
    # move far more mass.
    assert tv < 0.08, tv


def test_sampled_outputs_follow_the_target_distribution_behind_run_ahead(tiny_model_dirs):
    """The same comparison with run-ahead on: drafts proposed one step behind, verified behind the
    run-ahead step that samples the token they follow."""
    n = 1500
    tv, accepted, rejected = two_sample_total_variation(
        tiny_model_dirs["qwen3"], n=n, max_num_seqs=n, speculative_max_batch=n, async_scheduling=True
    )
    assert accepted > 100 and rejected > 100
    assert tv < 0.08, tv


def two_sample_total_variation(
    model: str, n: int = 1500, prepare=None, **engine_kw
) -> tuple[float, int, int]:
    """(binned total variation between the 4th sampled token with and without n-gram speculation,
    drafts accepted, drafts rejected) for n requests of a prompt that repeats the model's own greedy
    continuation. `prepare(llm)` adjusts the speculating engine before it runs."""
    seed = [3, 4, 5, 6]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    own = LLM(model, num_kvcache_blocks=64).generate([seed], greedy, use_tqdm=False)[0]["token_ids"]
    prompt = seed + own + seed
    counts, stats = [], None
    for speculative in (None, "ngram"):
        llm = LLM(
            model, num_kvcache_blocks=2048, speculative=speculative, num_speculative_tokens=3, **engine_kw
        )
        if prepare is not None and speculative:
            prepare(llm)
        params = SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True)
        outs = llm.generate([prompt] * n, params, use_tqdm=False)
        counts.append(Counter(o["token_ids"][3] for o in outs))
        stats = llm.engine.scheduler.speculator.stats
    tv = _binned_total_variation(counts[0], counts[1], n)
    return tv, stats.accepted, stats.proposed - stats.accepted


def _binned_total_variation(a: Counter, b: Counter, n: int, min_count: int = 40) -> float:
    """Total variation between two empirical distributions, rare tokens pooled into one bin (their
    individual counts are too small to compare, and would inflate the distance with pure noise)."""
    common = {t for t in set(a) | set(b) if a[t] + b[t] >= min_count}
    rest_a = n - sum(a[t] for t in common)
    rest_b = n - sum(b[t] for t in common)
    diff = sum(abs(a[t] - b[t]) for t in common) + abs(rest_a - rest_b)
    return 0.5 * diff / n


@pytest.mark.parametrize(("draft", "kv_blocks"), [("llama", 256), ("qwen2", 256), ("qwen2", 14)])
def test_draft_model_proposals_keep_greedy_outputs(tiny_model_dirs, draft, kv_blocks):
    """A draft model with the same vocabulary: the target's own weights (every draft accepted), another
    model (mostly rejected), and a cache small enough to force preemption."""
    prompts = _repetitive_prompts(5, seed=21)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (20, 9, 31, 14, 25)]
    plain = LLM(tiny_model_dirs["llama"], num_kvcache_blocks=256)
    expected = [o["token_ids"] for o in plain.generate(prompts, params, use_tqdm=False)]
    spec = LLM(
        tiny_model_dirs["llama"],
        num_kvcache_blocks=kv_blocks,
        speculative="draft",
        draft_model=tiny_model_dirs[draft],
        num_speculative_tokens=3,
    )
    assert [o["token_ids"] for o in spec.generate(prompts, params, use_tqdm=False)] == expected
    stats = spec.engine.scheduler.speculator.stats
    assert stats.proposed > 0
    if draft == "llama":
        assert stats.accepted == stats.proposed and stats.tokens_per_step > 3
    proposer = spec.engine.scheduler.speculator.proposer
    assert proposer.mirrors == {} and proposer.blocks.num_free_blocks == proposer.blocks.num_blocks


def test_draft_model_must_share_the_vocabulary(tiny_model_dirs, tmp_path):
    from common.tools.tiny_models import write_tiny_model

    other = write_tiny_model("llama", tmp_path / "big_vocab", vocab_size=640)
    with pytest.raises(ValueError, match="draft_model"):
        LLM(tiny_model_dirs["llama"], num_kvcache_blocks=64, speculative="draft", draft_model=str(other))
    with pytest.raises(ValueError, match="draft_model"):
        LLM(tiny_model_dirs["llama"], num_kvcache_blocks=64, speculative="draft")


def test_speculation_alongside_run_ahead(tiny_model_dirs, monkeypatch):
    """With run-ahead on, steps without drafts run ahead and steps with drafts sync first: greedy
    outputs stay identical, and both kinds of step happen."""
    prompts = _repetitive_prompts(4, seed=5) + [[7, 300, 21, 9, 411]]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = LLM(tiny_model_dirs["llama"], num_kvcache_blocks=256)
    expected = [o["token_ids"] for o in plain.generate(prompts, params, use_tqdm=False)]
    spec = LLM(
        tiny_model_dirs["llama"],
        num_kvcache_blocks=256,
        speculative="ngram",
        num_speculative_tokens=4,
        async_scheduling=True,
    )
    launched_ahead = []
    original = run_ahead.start

    def counting(seqs, handle):
        launched_ahead.append(len(seqs))
        return original(seqs, handle)

    monkeypatch.setattr(run_ahead, "start", counting)
    outs = [o["token_ids"] for o in spec.generate(prompts, params, use_tqdm=False)]
    assert outs == expected
    assert spec.engine.scheduler.speculator.stats.verify_steps > 0 and launched_ahead
