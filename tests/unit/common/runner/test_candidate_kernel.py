"""The candidate kernel (runner/candidate_kernel.py) against the torch draw among the best tokens.

Runs on a CUDA machine (marked `gpu`) and on the CPU under the Triton interpreter when
`PDSERVE_TRITON_INTERPRET=1`; anywhere else the module skips. Every row is seeded, so the noise both
ways is the same and the tokens must be equal; unseeded rows must draw the filtered distribution.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_interpret

triton_interpret.setup_or_skip()

from common.runner import candidate_kernel  # noqa: E402
from common.runner.sampler import Sampler, SamplingBatch  # noqa: E402
from common.runner.sampling_filters import filter_logits  # noqa: E402

pytestmark = triton_interpret.marks()
DEVICE = torch.device(triton_interpret.DEVICE)
VOCAB = 3_000 if triton_interpret.ENABLED else 151_936
ROWS = 8
# The distribution test: draws (rows x calls) and the largest frequency error allowed, about 4 standard
# deviations of the likeliest token's frequency: fewer under the interpreter, one program per row there.
DRAW_ROWS, DRAW_CALLS, DRAW_TOLERANCE = (500, 8, 0.03) if triton_interpret.ENABLED else (2_000, 10, 0.012)

# top_k, top_p, min_p per row (None: the filter off for the batch); the last row is greedy.
CASES = [
    (
        [20, 5, 40, 1, 20, 7, 3, 0],
        [1.0, 0.8, 0.95, 1.0, 0.5, 0.9, 0.3, 0.9],
        [0.0, 0.0, 0.1, 0.0, 0.05, 0.0, 0.2, 0.0],
    ),
    ([64] * 7 + [0], [0.95] * 8, None),
    ([20] * 7 + [0], None, None),
    ([3, 10, 2, 7, 9, 50, 12, 0], None, [0.2, 0.0, 0.0, 0.3, 0.0, 0.1, 0.05, 0.0]),
]
TEMPERATURES = [0.6, 1.0, 0.8, 0.6, 1.2, 0.7, 2.0, 0.0]


def _batch(top_k, top_p, min_p, seeded: bool) -> SamplingBatch:
    def column(values, dtype):
        return None if values is None else torch.tensor(values, dtype=dtype, device=DEVICE)

    gens = [torch.Generator(device=DEVICE).manual_seed(7 + row) for row in range(ROWS)] if seeded else []
    return SamplingBatch(
        temperatures=torch.tensor(TEMPERATURES, device=DEVICE),
        top_k=column(top_k, torch.int64),
        top_p=column(top_p, torch.float32),
        min_p=column(min_p, torch.float32),
        all_greedy=False,
        any_greedy=True,
        generators=gens,
        plain_rows=[False] * ROWS,
        top_k_bound=max(top_k[:-1]),
    )


def _logits(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(ROWS, VOCAB, generator=gen) * 3).to(DEVICE)


@pytest.mark.parametrize("top_k,top_p,min_p", CASES)
def test_the_kernel_draws_the_torch_paths_tokens(monkeypatch, top_k, top_p, min_p):
    monkeypatch.setenv("PDSERVE_TOPK_CANDIDATES", "1024")
    logits = _logits(3)
    tokens = {}
    for fused in (False, True):
        sampler = Sampler(fused=fused)
        batch = _batch(top_k, top_p, min_p, seeded=True)  # fresh generators: the same noise
        tokens[fused] = torch.stack([sampler(logits, batch).token_ids for _ in range(6)])
    assert torch.equal(tokens[True], tokens[False])
    assert (tokens[True][:, -1] == logits[-1].argmax()).all()  # the greedy row
    assert len(set(tokens[True][:, 1].tolist())) > 1  # a sampling row: not the argmax every time


def test_unseeded_rows_draw_the_filtered_distribution(monkeypatch):
    monkeypatch.setenv("PDSERVE_TOPK_CANDIDATES", "64")
    rows, vocab = DRAW_ROWS, 300
    torch.manual_seed(5)
    logits = (
        (torch.randn(vocab, generator=torch.Generator().manual_seed(11)) * 2).to(DEVICE).expand(rows, vocab)
    )

    def batch_of(n: int) -> SamplingBatch:
        return SamplingBatch(
            temperatures=torch.full((n,), 0.8, device=DEVICE),
            top_k=torch.full((n,), 12, device=DEVICE),
            top_p=torch.full((n,), 0.9, device=DEVICE),
            min_p=torch.full((n,), 0.02, device=DEVICE),
            all_greedy=False,
            any_greedy=False,
            generators=[],
            plain_rows=[False] * n,
            top_k_bound=12,
        )

    sampler = Sampler(fused=True)
    counts = torch.zeros(vocab, device=DEVICE)
    for _ in range(DRAW_CALLS):
        counts += torch.bincount(sampler(logits, batch_of(rows)).token_ids, minlength=vocab)
    expected = torch.softmax(filter_logits(logits[:1] / 0.8, batch_of(1)), dim=-1)[0]
    assert (counts[expected == 0] == 0).all()
    assert (counts / counts.sum() - expected).abs().max() < DRAW_TOLERANCE


def test_the_kernel_refuses_more_candidates_than_its_block():
    n = candidate_kernel.MAX_CANDIDATES + 1
    best = torch.zeros(1, n, device=DEVICE)
    ids = torch.zeros(1, n, dtype=torch.int64, device=DEVICE)
    one = torch.ones(1, device=DEVICE)
    with pytest.raises(ValueError, match="at most"):
        candidate_kernel.draw(best, ids, best + 1, one, None, None, None, VOCAB)


@pytest.mark.skipif(triton_interpret.ENABLED, reason="the interpreter compiles nothing")
def test_after_warm_up_no_batch_or_filter_compiles_a_kernel(monkeypatch):
    """One variant serves every batch size, candidate count and mix of filters (as the fused kernel,
    a variant compiled mid-run stalls the step loop)."""
    monkeypatch.setenv("PDSERVE_TOPK_CANDIDATES", "1024")
    candidate_kernel.warm_up(DEVICE, VOCAB, torch.bfloat16)
    cache = candidate_kernel._draw_kernel.device_caches[torch.cuda.current_device()][0]
    before = len(cache)
    sampler = Sampler(fused=True)
    for rows, dtype in ((1, torch.bfloat16), (16, torch.float32), (64, torch.bfloat16), (300, torch.float32)):
        for top_k, top_p, min_p in CASES:
            logits = torch.randn(rows, VOCAB, device=DEVICE).to(dtype)
            batch = _batch(top_k, top_p, min_p, seeded=False)
            picked = torch.arange(rows, device=DEVICE) % ROWS  # the case's rows, repeated
            batch = SamplingBatch(
                temperatures=batch.temperatures[picked],
                top_k=batch.top_k[picked],
                top_p=None if batch.top_p is None else batch.top_p[picked],
                min_p=None if batch.min_p is None else batch.min_p[picked],
                all_greedy=False,
                any_greedy=True,
                generators=[],
                plain_rows=[False] * rows,
                top_k_bound=batch.top_k_bound,
            )
            sampler(logits, batch)
    assert len(cache) == before
