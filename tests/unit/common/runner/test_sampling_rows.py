"""Which rows the fused sampler may take, as prepare_sampling marks them (host-side, no kernel)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from common.core.sequence import Sequence
from common.runner.inputs import prepare_sampling, sampling_rows
from common.runner.sampler import Sampler
from common.runner.step_handle import HostTokens, StepHandle
from common.wire.sampling_params import SamplingParams


def _seqs(*params: SamplingParams) -> list[Sequence]:
    return [Sequence([1, 2, 3], p, block_size=16) for p in params]


def test_only_temperature_greedy_and_grammar_rows_are_plain():
    seqs = _seqs(
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, seed=3, logprobs=2),
        SamplingParams(grammar='{"type": "object"}'),
        SamplingParams(temperature=0, top_k=3, top_p=0.5),  # filters keep a greedy row's argmax
        SamplingParams(top_k=5),
        SamplingParams(top_p=0.9),
        SamplingParams(min_p=0.1),
        SamplingParams(repetition_penalty=1.2),
        SamplingParams(presence_penalty=0.5),
        SamplingParams(frequency_penalty=0.5),
        SamplingParams(min_tokens=4),  # EOS is banned until then
        SamplingParams(min_tokens=4, ignore_eos=True),  # nothing left to ban
    )
    batch = prepare_sampling(seqs, 32, torch.device("cpu"), eos_token_ids=(2,))
    assert batch.plain_rows == [True] * 4 + [False] * 7 + [True]


def test_the_cpu_keeps_the_torch_path_for_plain_rows():
    """Plain rows on the CPU: no Triton import, and the same tokens as before (greedy here)."""
    seqs = _seqs(SamplingParams(temperature=0), SamplingParams(temperature=0))
    batch = prepare_sampling(seqs, 8, torch.device("cpu"))
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0] * 2, [float("-inf")] * 8])
    assert Sampler()(logits, batch).token_ids.tolist() == [1, 0]


def _kernel_taken(monkeypatch, mode: str | None, params: SamplingParams) -> bool:
    """Whether Sampler() takes the fused kernel for one row with `params` where Triton is usable."""
    from common.runner import sampler as sampler_module

    monkeypatch.setattr(sampler_module, "use_fused", lambda logits: True)
    taken = []
    monkeypatch.setattr(Sampler, "_fused", lambda self, logits, batch, plain: taken.append(1))
    if mode is None:
        monkeypatch.delenv("PDSERVE_FUSED_SAMPLING", raising=False)
    else:
        monkeypatch.setenv("PDSERVE_FUSED_SAMPLING", mode)
    batch = prepare_sampling(_seqs(params), 4, torch.device("cpu"))
    with contextlib.suppress(AttributeError):  # the stub returns no tokens
        Sampler()(torch.tensor([[0.0, 2.0, 1.0, 0.5]]), batch)
    return bool(taken)


def test_the_kernel_takes_sampling_batches_by_default_and_follows_the_flag(monkeypatch):
    """By default (auto) a batch that samples takes the kernel and an all-greedy one keeps torch's
    argmax (cheaper to launch); PDSERVE_FUSED_SAMPLING=1 takes it for both, =0 for neither."""
    greedy, sampled = SamplingParams(temperature=0), SamplingParams(temperature=0.7)
    want = {None: (False, True), "auto": (False, True), "1": (True, True), "0": (False, False)}
    for mode, (for_greedy, for_sampled) in want.items():
        assert _kernel_taken(monkeypatch, mode, greedy) is for_greedy, mode
        assert _kernel_taken(monkeypatch, mode, sampled) is for_sampled, mode


def test_an_unknown_fused_sampling_mode_is_refused(monkeypatch):
    monkeypatch.setenv("PDSERVE_FUSED_SAMPLING", "yes")
    with pytest.raises(ValueError, match="PDSERVE_FUSED_SAMPLING"):
        Sampler()


def test_logprobs_only_for_the_rows_that_ask():
    seqs = _seqs(SamplingParams(temperature=0), SamplingParams(temperature=0, logprobs=2))
    batch = prepare_sampling(seqs, 6, torch.device("cpu"))
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [5.0, 1.0, 4.0, 3.0, 2.0, 0.0]])
    out = Sampler()(logits, batch)
    want = torch.log_softmax(logits[1], dim=-1)
    assert out.logprobs is not None and out.logprobs[0] is None
    assert out.logprobs[1].logprob == float(want[0])
    assert out.logprobs[1].top == ((0, float(want[0])), (2, float(want[2])))


def test_per_sequence_inputs_equal_the_row_by_row_ones():
    """A verification's rows repeat their sequence's parameters: building them once per sequence
    gives exactly the batch that one entry per row gives."""
    seqs = _seqs(
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, seed=3),
        SamplingParams(temperature=0.9, top_k=5, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.2, min_tokens=9),
    )
    counts = [3, 1, 4, 2]
    by_row = [s for s, c in zip(seqs, counts, strict=True) for _ in range(c)]
    once = prepare_sampling(seqs, 32, torch.device("cpu"), eos_token_ids=(2,), counts=counts)
    rows = prepare_sampling(by_row, 32, torch.device("cpu"), eos_token_ids=(2,))
    for name in ("temperatures", "top_k", "top_p", "min_p"):
        assert torch.equal(getattr(once, name), getattr(rows, name)), name
    assert once.generators == rows.generators and once.generators[3] is not None  # the seeded row
    assert (once.banned, once.plain_rows) == (rows.banned, rows.plain_rows)
    assert (once.all_greedy, once.any_greedy) == (rows.all_greedy, rows.any_greedy)


def _same_batch(a, b) -> None:
    for name in ("temperatures", "top_k", "top_p", "min_p"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None and y is None) or torch.equal(x, y), name
    assert [g is not None for g in a.generators] == [g is not None for g in b.generators]
    assert (a.banned, a.plain_rows, a.num_logprobs) == (b.banned, b.plain_rows, b.num_logprobs)
    assert (a.all_greedy, a.any_greedy) == (b.all_greedy, b.any_greedy)


def test_one_sampling_key_gives_the_per_sequence_batch():
    """Sequences with one sampling key take a once-for-all path; it must build what the general,
    sequence-by-sequence path builds (and fall back where a value depends on the sequence)."""
    cases = [
        dict(temperature=0),
        dict(temperature=0.8, top_k=4, top_p=0.9, min_p=0.05),
        dict(temperature=0.8, seed=5),  # per-sequence generators
        dict(temperature=0.6, min_tokens=3),  # a ban until 3 tokens
        dict(temperature=0, logprobs=1),
    ]
    for kw in cases:
        shared = SamplingParams(**kw)
        counts = [2, 1, 3]
        one = prepare_sampling(_seqs(shared, shared, shared), 32, torch.device("cpu"), (2,), counts)
        each = _seqs(*[SamplingParams(**kw, max_tokens=8 + i) for i in range(len(counts))])
        for seq in each:
            seq.sampling_key = None  # the general path, for reference
        _same_batch(one, prepare_sampling(each, 32, torch.device("cpu"), (2,), counts))


def test_equal_sampling_values_share_one_key_whatever_else_differs():
    a = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=5, stop=["x"])
    b = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=50)
    assert a.batch_key() is b.batch_key()
    assert SamplingParams(temperature=0.8).batch_key() is not a.batch_key()
    assert SamplingParams(temperature=0.7, seed=1).batch_key() is None  # a generator per sequence
    assert SamplingParams(temperature=0, seed=1).batch_key() is not None  # greedy: the seed is moot
    assert SamplingParams(presence_penalty=0.5).batch_key() is None


def test_sequences_that_sample_nothing_are_dropped():
    seqs = _seqs(SamplingParams(temperature=0), SamplingParams(temperature=0.5), SamplingParams())
    assert sampling_rows(seqs, [2, 0, 1]) == ([seqs[0], seqs[2]], [2, 1])
    assert sampling_rows(seqs, [1, 1, 1]) == (seqs, [1, 1, 1])


def test_step_handle_groups_each_sequences_rows():
    handle = StepHandle([0, 3, 1], HostTokens(torch.tensor([5, 6, 7, 8]), None), ["a", "b", "c", "d"])
    out = handle.result()
    assert out.sampled == [[], [5, 6, 7], [8]]
    assert out.logprobs == [None, "c", "d"]  # the last sampled row's
    assert StepHandle([1, 1], HostTokens(torch.tensor([4, 9]), None), None).result().sampled == [[4], [9]]


def test_greedy_rows_need_no_widened_copy():
    """All-greedy rows without penalties or masks take the argmax of the model's own dtype: the same
    tokens as the fp32 argmax, ties to the first index."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 50, generator=gen) * 4).to(torch.bfloat16)
    logits[2, 7] = logits[2, 30] = logits[2].max() + 1  # an exact tie
    batch = prepare_sampling(_seqs(*[SamplingParams(temperature=0)] * 6), 50, torch.device("cpu"))
    tokens = Sampler()(logits, batch).token_ids
    assert tokens.tolist() == logits.float().argmax(dim=-1).tolist() and tokens[2] == 7
