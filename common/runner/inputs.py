"""Turns a scheduled batch of sequences into the flat tensors one forward pass needs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from common.attention.base import AttentionMetadata
from common.runner.sampler import SamplingBatch
from common.sampling_params import SamplingParams
from common.sequence import Sequence


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # rows of the hidden states whose logits are needed
    sample_seq_index: list[int]  # index into the batch of each sampled row


@dataclass
class StepPlan:
    """A step's flat inputs as host lists: what rank 0 broadcasts to the other tensor-parallel ranks.

    Plain ints pickle small and fast; every rank turns the plan into device tensors itself.
    """

    is_decode: bool
    input_ids: list[int]
    positions: list[int]
    slots: list[int]
    starts: list[int]  # query_start_loc
    seq_lens: list[int]
    block_tables: list[list[int]]
    sample_rows: list[int]
    sample_seq_index: list[int]
    max_seq_len: int
    seq_ids: list[int] = field(default_factory=list)

    def to_inputs(self, device: torch.device) -> StepInputs:
        pin = device.type == "cuda"
        starts = self.starts
        meta = AttentionMetadata(
            is_decode=self.is_decode,
            slot_mapping=_to(self.slots, torch.int64, device, pin),
            query_start_loc=_to(starts, torch.int32, device, pin),
            seq_lens=_to(self.seq_lens, torch.int32, device, pin),
            block_tables=_to(self.block_tables, torch.int32, device, pin),
            max_query_len=max(b - a for a, b in zip(starts, starts[1:], strict=False)),
            max_seq_len=self.max_seq_len,
            query_start_loc_host=starts,
            seq_lens_host=self.seq_lens,
            seq_ids_host=self.seq_ids or None,
        )
        return StepInputs(
            input_ids=_to(self.input_ids, torch.int64, device, pin),
            positions=_to(self.positions, torch.int64, device, pin),
            meta=meta,
            sample_rows=_to(self.sample_rows, torch.int64, device, pin),
            sample_seq_index=self.sample_seq_index,
        )


def prepare_step(
    seqs: list[Sequence], block_size: int, device: torch.device, is_decode: bool, decode_len_bound: int = 0
) -> StepInputs:
    """Flat inputs for one step (see `plan_step`), on `device`."""
    return plan_step(seqs, block_size, is_decode, decode_len_bound).to_inputs(device)


def plan_step(seqs: list[Sequence], block_size: int, is_decode: bool, decode_len_bound: int = 0) -> StepPlan:
    """Host-side flat inputs for one step. For decode steps `max_seq_len` is `decode_len_bound` when
    given, so the attention kernels split the context exactly as the CUDA graphs (captured with that
    bound) do and eager and graph decode compute bit-identical results."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts, seq_lens, sample_rows, sample_seq = [0], [], [], []
    for i, seq in enumerate(seqs):
        start, end = seq.num_cached_tokens, seq.num_cached_tokens + seq.num_scheduled_tokens
        input_ids.extend(seq.token_ids[start:end])
        positions.extend(range(start, end))
        slots.extend(_slots(seq.block_table, block_size, start, end))
        starts.append(starts[-1] + end - start)
        seq_lens.append(end)
        if end == len(seq):  # a verified draft of d tokens samples its last d + 1 positions
            first = starts[-1] - 1 - seq.num_draft_tokens
            sample_rows.extend(range(first, starts[-1]))
            sample_seq.extend([i] * (seq.num_draft_tokens + 1))
    width = max(len(s.block_table) for s in seqs)
    tables = [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
    max_seq_len = max(decode_len_bound, max(seq_lens)) if is_decode else max(seq_lens)
    return StepPlan(
        is_decode,
        input_ids,
        positions,
        slots,
        starts,
        seq_lens,
        tables,
        sample_rows,
        sample_seq,
        max_seq_len,
        seq_ids=[s.seq_id for s in seqs],
    )


def _slots(block_table: list[int], block_size: int, start: int, end: int) -> list[int]:
    out: list[int] = []
    pos = start
    while pos < end:
        block, offset = divmod(pos, block_size)
        n = min(block_size - offset, end - pos)
        base = block_table[block] * block_size + offset
        out.extend(range(base, base + n))
        pos += n
    return out


def _to(values: list, dtype: torch.dtype, device: torch.device, pin: bool) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True) if pin else t.to(device)


def prepare_sampling(
    seqs: list[Sequence], vocab_size: int, device: torch.device, eos_token_ids: tuple[int, ...] = ()
) -> SamplingBatch:
    """Sampling inputs for the sequences that sample this step (in row order)."""
    params = [s.sampling_params for s in seqs]
    temps = [p.temperature for p in params]
    batch = SamplingBatch(
        temperatures=_column(temps, torch.float32, device),
        top_k=_optional_column([max(p.top_k, 0) for p in params], 0, torch.int64, device),
        top_p=_optional_column([p.top_p for p in params], 1.0, torch.float32, device),
        min_p=_optional_column([p.min_p for p in params], 0.0, torch.float32, device),
        all_greedy=all(p.greedy for p in params),
        any_greedy=any(p.greedy for p in params),
        generators=[_generator(s, device) for s in seqs] if any(p.seed is not None for p in params) else [],
        num_logprobs=[p.logprobs for p in params] if any(p.logprobs is not None for p in params) else None,
    )
    _add_penalties(batch, seqs, vocab_size, device)
    banned = [_banned(s, eos_token_ids) for s in seqs]
    batch.banned = banned if any(banned) else None
    batch.plain_rows = [_plain(p) and not ids for p, ids in zip(params, banned, strict=True)]
    return batch


def _plain(p: SamplingParams) -> bool:
    """The row needs only temperature (or greedy) and its grammar mask: the fused sampler's rows.
    Filters never change a greedy row's token (they always keep the most likely one)."""
    no_filter = p.greedy or (p.top_k <= 0 and p.top_p == 1.0 and p.min_p == 0.0)
    no_penalty = p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty
    return no_filter and no_penalty


def _column(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A per-row parameter; the common all-equal case is a device fill, with no host copy."""
    first = values[0]
    if all(v == first for v in values):
        return torch.full((len(values),), first, dtype=dtype, device=device)
    return _to(values, dtype, device, device.type == "cuda")


def _optional_column(values: list, neutral, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """None when no row uses the filter (the sampler then skips it)."""
    if all(v == neutral for v in values):
        return None
    return _column(values, dtype, device)


def _generator(seq: Sequence, device: torch.device) -> torch.Generator | None:
    """A seeded request owns a generator for its whole life, so its draws do not depend on the batch."""
    seed = seq.sampling_params.seed
    if seed is None or seq.sampling_params.greedy:
        return None
    if seq.generator is None:
        seq.generator = torch.Generator(device=device)
        seq.generator.manual_seed(seed)
    return seq.generator


def _add_penalties(batch: SamplingBatch, seqs: list[Sequence], vocab_size: int, device: torch.device) -> None:
    params = [s.sampling_params for s in seqs]
    if any(p.repetition_penalty != 1.0 for p in params):
        batch.repetition = torch.tensor([p.repetition_penalty for p in params], device=device)
        batch.seen_mask = torch.zeros(len(seqs), vocab_size, dtype=torch.bool, device=device)
        for row, seq in enumerate(seqs):
            ids = torch.tensor(seq.token_ids, dtype=torch.int64, device=device).clamp(0, vocab_size - 1)
            batch.seen_mask[row, ids] = True
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        batch.presence = torch.tensor([p.presence_penalty for p in params], device=device)
        batch.frequency = torch.tensor([p.frequency_penalty for p in params], device=device)
        batch.output_counts = torch.zeros(len(seqs), vocab_size, device=device)
        for row, seq in enumerate(seqs):
            ids = torch.tensor(seq.completion_token_ids, dtype=torch.int64, device=device)
            batch.output_counts[row].index_add_(0, ids, torch.ones(len(ids), device=device))


def _banned(seq: Sequence, eos_token_ids: tuple[int, ...]) -> list[int]:
    """Stop and EOS tokens are banned until min_tokens have been generated."""
    p = seq.sampling_params
    if seq.num_completion_tokens >= p.min_tokens:
        return []
    return list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
