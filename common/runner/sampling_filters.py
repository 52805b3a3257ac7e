"""The torch sampling path's filters (top-k, top-p, min-p) and its draw (the exponential race).

Two ways to the same tokens. Sorted: each row's whole vocabulary is sorted, filtered and drawn from.
Among the best: when every sampling row keeps at most N tokens (its top_k; `candidate_count`), only
each row's N best tokens (`torch.topk`) are filtered and drawn from: every survivor of top-k, and so of
top-p and min-p, is among them, and a token outside them has probability 0 either way. A seeded row's
noise is drawn over the whole vocabulary as on the sorted way and read at its candidates, so a seed
gives the same tokens whichever way the batch takes and whatever the other rows' top_k; unseeded rows
draw noise for their candidates only. Which of several tokens with equal logits at the top-k boundary
survives is not fixed either way (neither sort is stable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the sampler imports this module
    from common.runner.sampler import SamplingBatch

# The smallest temperature a sampling row is divided by (greedy rows, T = 0, take the argmax instead);
# the Triton kernels clamp to the same.
MIN_TEMPERATURE = 1e-5


def candidate_count(batch: SamplingBatch, vocab: int, max_candidates: int) -> int | None:
    """How many of each row's best tokens the filters take instead of the sorted row: the batch's
    `top_k_bound`, where it is below the vocabulary and at most `max_candidates`; None: sort."""
    bound = batch.top_k_bound
    if bound is None or bound >= vocab or bound > max_candidates:
        return None
    return bound


def draw_sorted(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """[B] token ids drawn from each row's filtered distribution over the whole vocabulary."""
    probs = torch.softmax(filter_logits(logits / _temperatures(batch), batch), dim=-1)
    return (probs / exponential_noise(probs, batch.generators)).argmax(dim=-1)


def draw_among_best(
    logits: torch.Tensor, batch: SamplingBatch, candidates: int, kernel: bool = False
) -> torch.Tensor:
    """[B] token ids drawn among each row's `candidates` best tokens (`candidate_count`): no pass over
    the vocabulary but `topk` (and a seeded row's noise). Dividing by a temperature > 0 keeps the
    order, so topk runs on the raw logits and only the N best are divided. `kernel`: the filters and
    the draw as one Triton launch (runner/candidate_kernel.py; the caller checks that Triton runs)."""
    vocab = logits.shape[-1]
    best, ids = logits.topk(candidates, dim=-1)
    noise = _exponential(torch.empty(best.shape, device=best.device), None)  # fp32 whatever the logits
    for row, gen in enumerate(batch.generators):
        if gen is not None:  # the sorted way's draw for this row, read at its candidates
            noise[row] = _exponential(torch.empty(vocab, device=logits.device), gen)[ids[row]]
    if kernel:
        from common.runner import candidate_kernel

        if candidate_kernel.fits(candidates):
            filters = (batch.top_k, batch.top_p, batch.min_p)
            return candidate_kernel.draw(best, ids, noise, batch.temperatures, *filters, vocab)
    probs = torch.softmax(filter_sorted(best / _temperatures(batch), batch, vocab), dim=-1)
    pick = (probs / noise).argmax(dim=-1, keepdim=True)
    return ids.gather(1, pick).squeeze(1)


def _temperatures(batch: SamplingBatch) -> torch.Tensor:
    """[B, 1] each row's temperature, at least MIN_TEMPERATURE (what the rows are divided by)."""
    return batch.temperatures.clamp_min(MIN_TEMPERATURE).unsqueeze(1)


def filter_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """top-k, top-p and min-p over each sorted row; what they drop becomes -inf."""
    if batch.top_k is None and batch.top_p is None and batch.min_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    filtered = filter_sorted(sorted_logits, batch, logits.shape[-1])
    return torch.empty_like(logits).scatter_(1, order, filtered)


def filter_sorted(sorted_logits: torch.Tensor, batch: SamplingBatch, vocab: int) -> torch.Tensor:
    """The filters over each row's best logits in descending order (the whole row, or a prefix that
    holds every token top-k keeps); what they drop becomes -inf."""
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    position = torch.arange(sorted_logits.shape[-1], device=sorted_logits.device).unsqueeze(0)
    if batch.top_k is not None:
        k = torch.where(batch.top_k <= 0, vocab, batch.top_k).clamp(max=vocab)
        drop |= position >= k.unsqueeze(1)
    if batch.top_p is not None:
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass strictly above each token
        drop |= before >= batch.top_p.unsqueeze(1)
    if batch.min_p is not None:
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        drop |= probs < batch.min_p.unsqueeze(1) * probs[:, :1]
    drop[:, 0] = False  # the most likely token always survives
    return sorted_logits.masked_fill(drop, float("-inf"))


def exponential_noise(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """Exp(1) noise shaped as `probs`; a seeded row's from its own generator."""
    noise = _exponential(torch.empty_like(probs), None)
    for row, gen in enumerate(generators):
        if gen is not None:
            _exponential(noise[row], gen)
    return noise


def _exponential(out: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """Exp(1) samples in place. On the CPU `exponential_` is scalar code (~11 ms for 16 x 49k); -log(U)
    with a vectorised uniform draw gives the same distribution an order of magnitude faster."""
    if out.is_cuda:
        return out.exponential_(generator=gen)
    return out.uniform_(generator=gen).clamp_(min=1e-30).log_().neg_()
