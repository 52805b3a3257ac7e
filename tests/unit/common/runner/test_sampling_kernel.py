"""The fused sampling kernel and the Sampler's fused path against torch.

Runs on a CUDA machine (marked `gpu`: bf16 logits, the Qwen3 vocabulary of 151,936) and on the CPU
under the Triton interpreter when `PDSERVE_TRITON_INTERPRET=1` (fp32, a vocabulary of a few chunks).
Anywhere else the module skips. Every random draw is seeded, so each test is deterministic.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import triton_interpret

triton_interpret.setup_or_skip()

from common.runner import sampling_kernel  # noqa: E402
from common.runner.sampler import Sampler, SamplingBatch  # noqa: E402

INTERPRET = triton_interpret.ENABLED
pytestmark = [] if INTERPRET else [pytest.mark.gpu]
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
DTYPE = torch.float32 if INTERPRET else torch.bfloat16
VOCAB = 9_000 if INTERPRET else 151_936  # 3 chunks under the interpreter, 38 on the GPU
# The draws' tests: the interpreter runs one program per row at ~30 ms a chunk, so there they use one
# chunk (its 4 Philox outputs) and fewer draws; the GPU uses the whole vocabulary.
HOT_VOCAB = sampling_kernel.CHUNK if INTERPRET else VOCAB
DRAWS = 1_000 if INTERPRET else 40_000
MIXED = 300 if INTERPRET else 2_000  # rows per kind in the mixed batch (the torch path sorts them)
TEMPERATURES = [0.8] if INTERPRET else [0.6, 1.3]


def _batch(temps: list[float], plain: list[bool] | None = None, **kw) -> SamplingBatch:
    fields = dict(
        temperatures=torch.tensor(temps, device=DEVICE),
        top_k=None,
        top_p=None,
        min_p=None,
        all_greedy=all(t == 0 for t in temps),
        any_greedy=any(t == 0 for t in temps),
        generators=[],
        plain_rows=[True] * len(temps) if plain is None else plain,
    )
    fields.update(kw)
    return SamplingBatch(**fields)


def _seeds(rows: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(2**62, (rows,), generator=gen).to(DEVICE)


def _chi_square_ok(counts: torch.Tensor, probs: torch.Tensor) -> tuple[bool, float]:
    """Pearson's statistic against a bound far in the tail (p < 1e-6 for these few buckets)."""
    expected = probs.double() * counts.sum()
    stat = float(((counts.double() - expected) ** 2 / expected).sum())
    dof = probs.numel() - 1
    return stat < dof + 10 * math.sqrt(2 * dof), stat


def _ties_and_edges(rows: int) -> torch.Tensor:
    """Integer logits (many exact ties in any dtype), plus rows that are all -inf, -inf but one
    column, tied maxima in different chunks, and a maximum in the last, partial chunk."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-4, 4, (max(rows, 5), VOCAB), generator=gen).float()
    x[0] = float("-inf")
    x[1] = float("-inf")
    x[1, VOCAB - 2] = -1e30
    x[2, 5] = x[2, 4096 * 2 + 7] = 9.0  # equal maxima in chunks 0 and 2
    x[3, VOCAB - 1] = 9.0
    x[4, :100] = float("-inf")
    return x[:rows].to(DEVICE, DTYPE)


@pytest.mark.parametrize("splits", [1, 2, 3, None])
def test_greedy_rows_equal_torch_argmax(splits):
    logits = _ties_and_edges(9)
    temps = torch.zeros(9, device=DEVICE)
    got = sampling_kernel.pick_tokens(logits, temps, None, splits=splits)
    assert got.tolist() == logits.float().argmax(dim=-1).tolist()
    assert got.tolist() == logits.argmax(dim=-1).tolist()  # the same in the model's own dtype


def test_greedy_rows_honour_the_grammar_mask():
    logits = _ties_and_edges(6)
    gen = torch.Generator().manual_seed(4)
    allowed = (torch.rand(6, VOCAB, generator=gen) < 0.1).to(DEVICE)
    allowed[5] = False  # nothing allowed: torch.argmax of all -inf is column 0
    temps = torch.zeros(6, device=DEVICE)
    got = sampling_kernel.pick_tokens(logits, temps, None, allowed)
    want = logits.float().masked_fill(~allowed, float("-inf")).argmax(dim=-1)
    assert got.tolist() == want.tolist()


def _hot_row(temperature: float) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """One row of logits whose mass sits on a few columns spread over the chunks, plus the rest
    (a few percent): the row, the hot columns, and softmax(row / T) bucketed as [hot..., the rest]."""
    lanes = sampling_kernel.LANES
    hot = [0, lanes - 1, lanes, HOT_VOCAB // 2 + 3, HOT_VOCAB - 1]
    row = torch.full((HOT_VOCAB,), -temperature * math.log(HOT_VOCAB))
    row[hot] = torch.tensor([1.0, 0.5, 1.5, 0.0, 1.25])
    row = row.to(DTYPE)  # the kernel sees these exact values
    probs = torch.softmax(row.float() / temperature, dim=-1)
    buckets = torch.cat([probs[hot], (1 - probs[hot].sum()).reshape(1)])
    return row.to(DEVICE), hot, buckets


def _bucket(tokens: torch.Tensor, hot: list[int]) -> torch.Tensor:
    counts = torch.bincount(tokens.cpu(), minlength=HOT_VOCAB).double()
    return torch.cat([counts[hot], (counts.sum() - counts[hot].sum()).reshape(1)])


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_draws_follow_softmax_over_temperature(temperature):
    row, hot, probs = _hot_row(temperature)
    logits = row.expand(DRAWS, HOT_VOCAB)  # stride 0 between rows: one read of the row per program
    temps = torch.full((DRAWS,), temperature, device=DEVICE)
    tokens = sampling_kernel.pick_tokens(logits, temps, _seeds(DRAWS))
    ok, stat = _chi_square_ok(_bucket(tokens, hot), probs)
    assert ok, (stat, _bucket(tokens, hot).tolist(), (probs * DRAWS).tolist())


def test_a_rows_draw_does_not_depend_on_how_it_is_split():
    logits = _ties_and_edges(5).float().mul(0.5).to(DTYPE)
    temps = torch.full((4,), 0.9, device=DEVICE)
    seeds = _seeds(4, seed=9)
    draws = [sampling_kernel.pick_tokens(logits, temps, seeds, splits=s).tolist() for s in (1, 2, 3)]
    assert draws[0] == draws[1] == draws[2]


def test_seeded_rows_repeat_whatever_the_batch():
    logits = _ties_and_edges(5)[2:].float().mul(0.5).to(DTYPE)

    def run(rows: list[int], steps: int = 4) -> list[list[int]]:
        gen = torch.Generator(device=DEVICE).manual_seed(1234)
        batch = _batch([0.8] * len(rows), generators=[gen] + [None] * (len(rows) - 1))
        return [Sampler(fused=True)(logits[rows], batch).token_ids.tolist()[0] for _ in range(steps)]

    alone = run([0])
    assert run([0]) == alone
    assert run([0, 2, 1]) == alone  # other traffic beside it changes nothing
    assert len(set(alone)) > 1  # the seed advances every step


def test_mixed_batch_greedy_sampled_and_a_top_p_row_on_the_torch_path():
    temperature = 0.7
    row, hot, probs = _hot_row(temperature)
    n = MIXED
    temps = [0.0] * 3 + [temperature] * n + [temperature] * n
    top_p = torch.tensor([1.0] * (3 + n) + [0.6] * n, device=DEVICE)
    batch = _batch(
        temps, plain=[True] * (3 + n) + [False] * n, top_p=top_p, num_logprobs=[2] + [None] * (2 * n + 2)
    )
    logits = row.expand(len(temps), HOT_VOCAB)
    torch.manual_seed(5)
    out = Sampler(fused=True)(logits, batch)
    tokens = out.token_ids.cpu()
    assert tokens[:3].tolist() == [hot[2]] * 3  # greedy rows: the argmax
    ok, stat = _chi_square_ok(_bucket(tokens[3 : 3 + n], hot), probs)
    assert ok, stat
    # top-p 0.6 keeps the most likely columns whose mass before them is under 0.6: renormalised.
    order = probs[:-1].argsort(descending=True)
    before = torch.cumsum(probs[order], 0) - probs[order]
    kept = torch.zeros_like(probs)
    kept[order[before < 0.6]] = probs[order[before < 0.6]]
    seen = _bucket(tokens[3 + n :], hot)
    assert seen[kept == 0].sum() == 0, seen
    ok, stat = _chi_square_ok(seen[kept > 0], kept[kept > 0] / kept.sum())
    assert ok, stat
    reference = torch.log_softmax(row.float(), dim=-1)
    assert out.logprobs is not None and out.logprobs[1] is None
    assert out.logprobs[0].logprob == pytest.approx(float(reference[hot[2]]), abs=1e-5)


def test_biased_rows_take_the_torch_path_beside_fused_rows():
    """A logit bias is not the kernel's: those rows (not plain) get their bias on the torch path,
    the plain rows beside them keep the kernel's picks."""
    logits = _ties_and_edges(8)[5:8].repeat(2, 1)  # random integer rows, no edge cases
    forced, banned = 17, int(logits[1].float().argmax())
    bias = [[], [(banned, -100.0)], [(forced, 100.0)]] * 2
    temps = [0.0, 0.0, 0.0, 0.9, 0.9, 0.9]
    batch = _batch(temps, plain=[not b for b in bias], bias=bias, any_greedy=True)
    torch.manual_seed(6)
    tokens = Sampler(fused=True)(logits, batch).token_ids.cpu().tolist()
    assert tokens[0] == int(logits[0].float().argmax())  # a plain greedy row: the argmax
    assert tokens[1] != banned and tokens[4] != banned
    assert tokens[2] == tokens[5] == forced
    unbanned = logits[1].float().clone()
    unbanned[banned] -= 100.0
    assert tokens[1] == int(unbanned.argmax())


@pytest.mark.skipif(INTERPRET, reason="CUDA graphs need a GPU")
def test_a_captured_sampler_draws_afresh_at_every_replay():
    """Inside a CUDA graph the seeds come from the default generator's graph-safe state, so each
    replay draws new tokens, greedy rows stay the argmax, and the one-launch merge resets itself."""
    logits = _ties_and_edges(5)[2:].float().mul(0.5).to(DTYPE)  # 3 rows of ties: splits matter
    batch = _batch([0.0, 1.0, 1.0])
    sampler = Sampler(fused=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sampler(logits, batch)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = sampler(logits, batch).token_ids
    draws = []
    for _ in range(6):
        graph.replay()
        draws.append(tokens.tolist())
    assert all(d[0] == int(logits[0].float().argmax()) for d in draws)
    assert len({tuple(d[1:]) for d in draws}) > 1


def _two_streams() -> tuple:
    """Two streams whose kernels run side by side: green contexts on two SM shares where this torch
    has them (as multiplexed mode runs a chunk beside a decode step), else two plain streams."""
    try:
        from common.multiplex.green_contexts import green_stream

        return green_stream(64, DEVICE)[1], green_stream(56, DEVICE)[1]
    except (ImportError, AttributeError, RuntimeError):
        return torch.cuda.Stream(), torch.cuda.Stream()


@pytest.mark.skipif(INTERPRET, reason="streams need a GPU")
def test_launches_on_two_streams_at_once_draw_as_they_would_alone():
    """A multiplexed prefill chunk samples on its lane's stream while a decode step samples on the
    engine's: each stream merges its split winners in a workspace of its own. The two streams draw
    from different logits and seeds, so a merge that read the other launch's winners would differ."""
    rows, cols = 64, 1 << 20  # several splits per row, and launches long enough to overlap
    logits = [torch.randn(rows, cols, device=DEVICE).mul(3).to(DTYPE) for _ in range(2)]
    temps = torch.ones(rows, device=DEVICE)
    seeds = [_seeds(rows, 11), _seeds(rows, 12)]
    alone = [sampling_kernel.pick_tokens(logits[i], temps, seeds[i]).tolist() for i in range(2)]
    streams = _two_streams()
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    draws: list[list[torch.Tensor]] = [[], []]
    for _ in range(100):
        for i, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                draws[i].append(sampling_kernel.pick_tokens(logits[i], temps, seeds[i]))
    torch.cuda.synchronize()
    for i in range(2):
        assert all(d.tolist() == alone[i] for d in draws[i]), f"stream {i} drew differently"


def _compiled_variants() -> int:
    """Kernels Triton has compiled for `_pick_kernel` on this device (its per-device cache)."""
    return len(sampling_kernel._pick_kernel.device_caches[torch.cuda.current_device()][0])


@pytest.mark.skipif(INTERPRET, reason="the interpreter compiles nothing")
def test_after_warm_up_no_batch_size_compiles_a_kernel():
    """The engine warms the kernel up at start; before that, a 49,152-column run compiled a second
    variant mid-run once the batch passed 22 rows (chunks per program 1 -> 2: Triton specialises 1)."""
    vocab = 49_152
    sampling_kernel.warm_up(DEVICE, vocab, DTYPE)
    sampling_kernel.warm_up(DEVICE, VOCAB, DTYPE)
    before = _compiled_variants()
    for rows in (1, 8, 23, 64, 256, 300, 600):
        for width in (vocab, VOCAB):
            logits = torch.randn(rows, width, device=DEVICE).to(DTYPE)
            temps = torch.full((rows,), 0.7, device=DEVICE)
            allowed = torch.rand(rows, width, device=DEVICE) < 0.5
            sampling_kernel.pick_tokens(logits, temps, _seeds(rows))
            sampling_kernel.pick_tokens(logits, temps, _seeds(rows), allowed)
    assert _compiled_variants() == before
