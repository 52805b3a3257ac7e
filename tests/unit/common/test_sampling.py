"""Sampler behaviour on a real (tiny) model and on hand-made logits."""

from __future__ import annotations

import pytest
import torch

from common import LLM, SamplingParams
from common.runner.sampler import Sampler, SamplingBatch
from common.tools.tiny_models import hf_greedy


def _batch(n: int, **kw) -> SamplingBatch:
    defaults = dict(
        temperatures=torch.ones(n),
        top_k=None,
        top_p=None,
        min_p=None,
        all_greedy=False,
        generators=[None] * n,
    )
    defaults.update(kw)
    return SamplingBatch(**defaults)


def test_filters_keep_only_allowed_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))
    sampler = Sampler()
    torch.manual_seed(0)
    seen = [set(), set(), set()]
    batch = _batch(
        3,
        top_k=torch.tensor([2, 0, 0]),
        top_p=torch.tensor([1.0, 0.7, 1.0]),
        min_p=torch.tensor([0.0, 0.0, 0.5]),
    )
    for _ in range(300):
        for row, tok in enumerate(sampler(logits, batch).token_ids.tolist()):
            seen[row].add(tok)
    assert seen == [{0, 1}, {0, 1}, {0, 1}]


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    batch = _batch(4000)
    torch.manual_seed(1)
    tokens = Sampler()(torch.log(probs).expand(4000, 3), batch).token_ids
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03)


def test_penalties_and_greedy_rows():
    logits = torch.tensor([[2.0, 1.9, 0.0], [2.0, 1.9, 0.0]])
    batch = _batch(
        2,
        temperatures=torch.zeros(2),
        all_greedy=True,
        presence=torch.tensor([0.0, 0.5]),
        frequency=torch.tensor([0.0, 0.0]),
        output_counts=torch.tensor([[3.0, 0.0, 0.0], [3.0, 0.0, 0.0]]),
    )
    assert Sampler()(logits, batch).token_ids.tolist() == [0, 1]


def test_seeded_requests_repeat_and_n_samples(tiny_model_dirs):
    llm = LLM(tiny_model_dirs["qwen2"], num_kvcache_blocks=128)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=1234, ignore_eos=True)
    a = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0]["token_ids"]
    # Same seed alongside other traffic: identical draws.
    other = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    b = llm.generate([[7, 8, 9], [1, 2, 3]], [other, params], use_tqdm=False)[1]["token_ids"]
    assert a == b
    multi = llm.generate(
        [[1, 2, 3]], SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=5), use_tqdm=False
    )
    outs = multi[0]["outputs"]
    assert len(outs) == 3 and len({tuple(o["token_ids"]) for o in outs}) > 1


def test_top_k_one_equals_greedy_and_logprobs(tiny_model_dirs):
    llm = LLM(tiny_model_dirs["llama"], num_kvcache_blocks=128)
    greedy = llm.generate(
        [[4, 5, 6]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False
    )
    topk = SamplingParams(temperature=0.8, top_k=1, max_tokens=10, ignore_eos=True, logprobs=3)
    llm.generate([[4, 5, 6]], topk, use_tqdm=False)
    out = llm.generate([[4, 5, 6]], topk, use_tqdm=False)
    assert out[0]["token_ids"] == greedy[0]["token_ids"]
    logprobs = out[0]["logprobs"]
    assert len(logprobs) == 10
    for token, lp in zip(out[0]["token_ids"], logprobs, strict=True):
        assert len(lp.top) == 3 and lp.top[0][0] == token
        assert abs(lp.top[0][1] - lp.logprob) < 1e-6 and lp.logprob <= 0


def test_logit_bias_moves_the_distribution_on_sampled_rows():
    """+100 all but forces a token, -100 all but bans one; a row without a bias keeps its draws."""
    probs = torch.tensor([0.6, 0.3, 0.1])
    n = 3000
    bias = [[(2, 100.0)], [(0, -100.0)], []] * (n // 3)
    torch.manual_seed(2)
    tokens = Sampler()(torch.log(probs).expand(n, 3), _batch(n, bias=bias)).token_ids.view(-1, 3)
    assert (tokens[:, 0] == 2).all() and (tokens[:, 1] != 0).all()
    freq = torch.bincount(tokens[:, 2], minlength=3).float() / (n // 3)
    assert torch.allclose(freq, probs, atol=0.05)
    kept = torch.bincount(tokens[:, 1], minlength=3).float() / (n // 3)
    assert torch.allclose(kept, torch.tensor([0.0, 0.75, 0.25]), atol=0.05)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_logit_bias_equals_transformers_logits_plus_bias(tiny_model_dirs, arch):
    """Greedy with a bias = the argmax of transformers' logits plus that bias, in a batch with an
    unbiased request that keeps its own greedy tokens."""
    model_dir = tiny_model_dirs[arch]
    prompts = [[5, 9, 12, 40, 7], [3, 3, 8]]
    plain = hf_greedy(model_dir, prompts, 12)
    bias = {plain[0][0]: -100.0, plain[0][1]: -100.0, 17: 3.0}  # its greedy start banned
    want = hf_greedy(model_dir, prompts[:1], 12, logit_bias=bias)[0]
    assert want != plain[0]
    # On the CPU in float32 wherever it runs: on a GPU box "auto" serves bfloat16, whose sums flip the
    # random tiny model's near-ties against transformers' float32 reference (seen on an H100).
    llm = LLM(model_dir, num_kvcache_blocks=128, device="cpu")
    biased = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logit_bias=bias)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate(prompts, [biased, greedy], use_tqdm=False)
    assert outs[0]["token_ids"] == want and outs[1]["token_ids"] == plain[1]


def test_sampling_token_ids_outside_the_vocabulary_are_refused(tiny_model_dirs):
    """They would index past the logits (min_tokens bans the stop ids there): refused per request."""
    llm = LLM(tiny_model_dirs["llama"], num_kvcache_blocks=64)
    vocab = llm.engine.model_config.vocab_size
    bad = [
        ("stop_token_ids", vocab, SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=[vocab])),
        ("logit_bias", vocab + 5, SamplingParams(max_tokens=4, logit_bias={vocab + 5: 1.0})),
    ]
    for name, token, params in bad:
        with pytest.raises(ValueError, match=rf"{name} token id {token} is outside"):
            llm.generate([[1, 2, 3]], params, use_tqdm=False)
    ok = SamplingParams(temperature=0, max_tokens=4, min_tokens=2, stop_token_ids=[vocab - 1])
    assert len(llm.generate([[1, 2, 3]], ok, use_tqdm=False)[0]["token_ids"]) >= 2
