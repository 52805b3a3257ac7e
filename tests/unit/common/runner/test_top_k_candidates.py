"""The filters over each row's best tokens (`PDSERVE_TOPK_CANDIDATES`, common/runner/sampling_filters.py):
where every sampling row has a top-k within the bound, they keep exactly what the sorted rows keep, the
sampler draws the same tokens for seeded rows and the same distribution for the others; elsewhere the
rows are sorted as before."""

from __future__ import annotations

import pytest
import torch

from common.core.sequence import Sequence
from common.runner.inputs import prepare_sampling
from common.runner.sampler import Sampler, SamplingBatch, top_k_candidates
from common.runner.sampling_filters import candidate_count, filter_logits, filter_sorted
from common.wire.sampling_params import SamplingParams

VOCAB = 3_000
ROWS = 6


def _batch(
    top_k: list[int], top_p: list[float], min_p: list[float], temperatures: list[float]
) -> SamplingBatch:
    sampling = [t > 0 for t in temperatures]
    bound_ks = [k for k, s in zip(top_k, sampling, strict=True) if s]
    return SamplingBatch(
        temperatures=torch.tensor(temperatures),
        top_k=torch.tensor(top_k),
        top_p=torch.tensor(top_p),
        min_p=torch.tensor(min_p),
        all_greedy=not any(sampling),
        any_greedy=not all(sampling),
        generators=[torch.Generator().manual_seed(100 + row) for row in range(len(top_k))],
        top_k_bound=max(bound_ks) if bound_ks and min(bound_ks) > 0 else None,
    )


def _logits(seed: int) -> torch.Tensor:
    # Random normal logits in float32: no two equal, so which token survives a boundary is decided.
    return torch.randn(ROWS, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


CASES = [
    # top_k, top_p, min_p per row; the greedy row (temperature 0) has no top-k: it does not bound
    ([20, 5, 40, 1, 20, 0], [1.0, 0.8, 0.95, 1.0, 0.5, 0.9], [0.0, 0.0, 0.1, 0.0, 0.05, 0.0]),
    ([64, 64, 64, 64, 64, 0], [0.95] * 6, [0.0] * 6),
    ([3, 10, 2, 7, 9, 0], [1.0] * 6, [0.2, 0.0, 0.0, 0.3, 0.0, 0.0]),
]
TEMPERATURES = [0.6, 1.0, 0.8, 0.6, 1.2, 0.0]


@pytest.mark.parametrize("top_k,top_p,min_p", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_best_tokens_keep_what_the_sorted_rows_keep(top_k, top_p, min_p, seed):
    batch = _batch(top_k, top_p, min_p, TEMPERATURES)
    logits = _logits(seed)
    assert candidate_count(batch, VOCAB, 0) is None
    temps = batch.temperatures.clamp_min(1e-5).unsqueeze(1)
    sorted_rows = filter_logits(logits / temps, batch)
    assert candidate_count(batch, VOCAB, 1024) == max(top_k)
    best, ids = logits.topk(max(top_k), dim=-1)
    kept = filter_sorted(best / temps, batch, VOCAB)
    best_rows = torch.full_like(logits, float("-inf")).scatter_(1, ids, kept)
    sampling = torch.tensor(TEMPERATURES) > 0  # a greedy row's filtered logits are never drawn from
    assert torch.equal(best_rows[sampling], sorted_rows[sampling])
    kept = torch.isfinite(best_rows[sampling]).sum(dim=-1)
    assert (kept >= 1).all() and (kept <= torch.tensor(top_k)[sampling]).all()


@pytest.mark.parametrize("top_k,top_p,min_p", CASES)
def test_the_sampler_draws_the_same_tokens_either_way(monkeypatch, top_k, top_p, min_p):
    logits = _logits(7)
    tokens = {}
    for candidates in ("0", "1024"):
        monkeypatch.setenv("PDSERVE_TOPK_CANDIDATES", candidates)
        batch = _batch(top_k, top_p, min_p, TEMPERATURES)  # fresh generators: the same draws
        tokens[candidates] = [Sampler(fused=False)(logits, batch).token_ids for _ in range(5)]
    assert all(torch.equal(a, b) for a, b in zip(tokens["0"], tokens["1024"], strict=True))
    assert tokens["0"][0][-1] == logits[-1].argmax()  # the greedy row


def test_rows_are_sorted_where_a_top_k_is_missing_or_past_the_bound(monkeypatch):
    monkeypatch.setenv("PDSERVE_TOPK_CANDIDATES", "32")
    limit = top_k_candidates()
    batch = _batch([20, 0, 5, 1, 2, 3], [1.0] * 6, [0.0] * 6, [0.6] * 6)
    assert (
        batch.top_k_bound is None and candidate_count(batch, VOCAB, limit) is None
    )  # a sampling row without
    batch = _batch([20, 40, 5, 1, 2, 3], [1.0] * 6, [0.0] * 6, [0.6] * 6)
    assert candidate_count(batch, VOCAB, limit) is None  # 40 > 32
    assert candidate_count(batch, 40, limit) is None  # the whole vocabulary: nothing to save
    assert candidate_count(batch, VOCAB + 1, limit) is None
    monkeypatch.setenv("PDSERVE_TOPK_CANDIDATES", "40")
    assert candidate_count(batch, VOCAB, top_k_candidates()) == 40


def test_the_runner_states_the_bound_from_the_sampling_rows():
    def bound(*params: SamplingParams) -> int | None:
        seqs = [Sequence([1, 2, 3], p, block_size=16) for p in params]
        return prepare_sampling(seqs, VOCAB, torch.device("cpu")).top_k_bound

    qwen3 = SamplingParams(temperature=0.6, top_p=0.95, top_k=20)
    assert bound(qwen3) == 20
    assert bound(qwen3, SamplingParams(temperature=1.0, top_k=50), SamplingParams(temperature=0.0)) == 50
    assert bound(qwen3, SamplingParams(temperature=0.7, top_p=0.9)) is None  # a sampling row without top-k
    assert bound(SamplingParams(temperature=0.0)) is None


def test_unseeded_rows_draw_the_filtered_distribution(monkeypatch):
    """Rows without a seed draw noise for their candidates only: the frequencies of many draws match
    the softmax of the sorted way's filtered logits."""
    monkeypatch.setenv("PDSERVE_TOPK_CANDIDATES", "64")
    rows, vocab = 4_000, 200
    torch.manual_seed(3)
    logits = (torch.randn(vocab, generator=torch.Generator().manual_seed(11)) * 2).expand(rows, vocab)

    def batch_of(n: int) -> SamplingBatch:
        return SamplingBatch(
            temperatures=torch.full((n,), 0.8),
            top_k=torch.full((n,), 8),
            top_p=torch.full((n,), 0.9),
            min_p=None,
            all_greedy=False,
            any_greedy=False,
            generators=[],
            top_k_bound=8,
        )

    counts = torch.zeros(vocab)
    sampler = Sampler(fused=False)
    for _ in range(5):
        counts += torch.bincount(sampler(logits, batch_of(rows)).token_ids, minlength=vocab)
    expected = torch.softmax(filter_logits(logits[:1] / 0.8, batch_of(1)), dim=-1)[0]
    assert (counts[expected == 0] == 0).all()  # nothing outside top-k and top-p is ever drawn
    assert (counts / counts.sum() - expected).abs().max() < 0.015


def test_a_seeded_row_draws_the_same_tokens_whatever_the_other_rows_top_k(monkeypatch):
    monkeypatch.setenv("PDSERVE_TOPK_CANDIDATES", "1024")
    logits = _logits(5)[:2]

    def draws(other_top_k: int) -> list[int]:
        batch = SamplingBatch(
            temperatures=torch.tensor([0.7, 1.0]),
            top_k=torch.tensor([10, other_top_k]),
            top_p=None,
            min_p=None,
            all_greedy=False,
            any_greedy=False,
            generators=[torch.Generator().manual_seed(42), None],
            top_k_bound=max(10, other_top_k),
        )
        sampler = Sampler(fused=False)
        return [int(sampler(logits, batch).token_ids[0]) for _ in range(20)]

    first = draws(10)
    assert first == draws(500) == draws(900)
    assert len(set(first)) > 1  # the row samples: the equality is not the argmax's


@pytest.mark.parametrize("candidates", ["0", "1024"])
def test_logits_in_the_models_dtype_draw_as_widened_ones(monkeypatch, candidates):
    """With nothing to adjust the sampler reads bf16 logits as they are (no widened copy): the same
    tokens as the same logits widened to float32, sorted or among the best."""
    monkeypatch.setenv("PDSERVE_TOPK_CANDIDATES", candidates)
    logits = _logits(9).to(torch.bfloat16)
    tokens = []
    for values in (logits, logits.float()):
        batch = _batch(*CASES[0], TEMPERATURES)  # fresh generators: the same draws
        tokens.append(torch.stack([Sampler(fused=False)(values, batch).token_ids for _ in range(4)]))
    assert torch.equal(tokens[0], tokens[1])
