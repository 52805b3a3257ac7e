"""One Triton launch that filters each row's best tokens and draws among them.

The torch path's draw among the best (runner/sampling_filters.py) after its `topk`: temperature,
top-k, top-p, min-p, the most likely token kept, and the exponential race, as about 25 small torch
launches over [B, N]; here one program per row does them in registers. Same arithmetic, in log space
where it may be: the race is argmax(x / T - log E) over the kept tokens (the softmax's normaliser is
the same for every token of a row), min-p compares exp(x_j - x_0) with min_p (p_j / p_0), top-p the
running sum of exp(x_j - x_0) over the kept tokens with top_p times their total. The noise E is the
caller's ([B, N], as the torch path draws it), so a seeded row's draw is the torch path's.

One compiled variant per logits dtype: the block is MAX_CANDIDATES wide whatever N, and the filters
present are runtime flags (masked loads), so a run never compiles a kernel after `warm_up`.
Imported only on CUDA (or under the Triton interpreter), never on a plain CPU run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.runner.sampling_filters import MIN_TEMPERATURE

# The widest candidate set the kernel takes (one block per row); wider sets take the torch path.
MAX_CANDIDATES = 1024


@triton.jit(do_not_specialize=["n", "vocab", "has_top_k", "has_top_p", "has_min_p"])
def _draw_kernel(
    best_ptr,
    ids_ptr,
    noise_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    out_ptr,
    n,
    vocab,
    has_top_k,
    has_top_p,
    has_min_p,
    min_temp,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    j = tl.arange(0, BLOCK)
    valid = j < n
    base = row.to(tl.int64) * n
    t = tl.maximum(tl.load(temp_ptr + row), min_temp)
    x = tl.load(best_ptr + base + j, mask=valid, other=float("-inf")).to(tl.float32) / t
    k = tl.load(top_k_ptr + row, mask=has_top_k != 0, other=0)
    k = tl.where(k <= 0, vocab, k)
    drop = (j >= n) | (j >= k)
    x0 = tl.max(x, axis=0)  # the row's first (best) candidate
    e = tl.where(drop, 0.0, tl.exp(x - x0))
    before = tl.cumsum(e, axis=0) - e  # mass strictly above each token
    top_p = tl.load(top_p_ptr + row, mask=has_top_p != 0, other=2.0)
    drop = drop | (before >= top_p * tl.sum(e, axis=0))
    min_p = tl.load(min_p_ptr + row, mask=has_min_p != 0, other=0.0)
    drop = drop | (tl.exp(x - x0) < min_p)
    drop = drop & (j != 0)  # the most likely token always survives
    noise = tl.load(noise_ptr + base + j, mask=valid, other=1.0)
    key = tl.where(drop, float("-inf"), x - tl.log(noise))
    top = tl.max(key, axis=0)
    pick = tl.min(tl.where(key == top, j, BLOCK), axis=0)
    tl.store(out_ptr + row, tl.load(ids_ptr + base + pick))


def fits(candidates: int) -> bool:
    """Whether `candidates` per row fit the kernel's block."""
    return candidates <= MAX_CANDIDATES


def draw(
    best: torch.Tensor,
    ids: torch.Tensor,
    noise: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    vocab: int,
) -> torch.Tensor:
    """[B] int64 token ids: each row's draw among its `best` logits ([B, N], descending, as `topk`
    gives them), `ids` their vocabulary ids, `noise` [B, N] Exp(1), after the row's temperature and
    filters (None: the filter is off for every row)."""
    rows, n = best.shape
    if not fits(n):
        raise ValueError(f"candidates per row must be at most {MAX_CANDIDATES}, got {n}")
    best, ids, noise = best.contiguous(), ids.contiguous(), noise.contiguous()
    out = torch.empty(rows, dtype=torch.int64, device=best.device)
    if rows == 0:
        return out
    _draw_kernel[(rows,)](
        best,
        ids,
        noise,
        temperatures,
        out if top_k is None else top_k,
        noise if top_p is None else top_p,
        noise if min_p is None else min_p,
        out,
        n,
        vocab,
        int(top_k is not None),
        int(top_p is not None),
        int(min_p is not None),
        MIN_TEMPERATURE,
        BLOCK=MAX_CANDIDATES,
        num_warps=4,
    )
    return out


def warm_up(device: torch.device, vocab: int, dtype: torch.dtype) -> None:
    """Compile the kernel now (start-up) for the candidates' dtypes the sampler passes: the model's
    logits as they are, and float32 after penalties, a bias or a mask widened them."""
    ids = torch.zeros(1, 1, dtype=torch.int64, device=device)
    ones = torch.ones(1, dtype=torch.float32, device=device)
    for best_dtype in {dtype, torch.float32}:
        best = torch.zeros(1, 1, dtype=best_dtype, device=device)
        draw(best, ids, ones.view(1, 1), ones, ids.view(1), ones, ones * 0, vocab)
