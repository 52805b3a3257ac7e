"""Turns a scheduled batch of sequences into the flat tensors one forward pass needs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from common.attention.base import AttentionMetadata
from common.core.sequence import Sequence
from common.runner.sampler import SamplingBatch
from common.wire.sampling_params import SamplingParams


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # rows of the hidden states whose logits are needed
    sample_counts: list[int]  # per sequence: how many of those rows are its (`sample_count`)


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
    sample_counts: list[int]
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
            sample_counts=self.sample_counts,
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
    starts, seq_lens, sample_rows, counts = [0], [], [], []
    for seq in seqs:
        start, end = seq.num_cached_tokens, seq.num_cached_tokens + seq.num_scheduled_tokens
        input_ids.extend(seq.token_ids[start:end])
        positions.extend(range(start, end))
        slots.extend(_slots(seq.block_table, block_size, start, end))
        starts.append(starts[-1] + end - start)
        seq_lens.append(end)
        counts.append(sample_count(seq))
        sample_rows.extend(range(starts[-1] - counts[-1], starts[-1]))
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
        counts,
        max_seq_len,
        seq_ids=[s.seq_id for s in seqs],
    )


def flat_sources(seqs: list[Sequence], src_rows: list[int]) -> list[int]:
    """Per flat input token of an eager step launched behind a run-ahead step: the row of that step's
    sampled tokens that is the token's value, or -1 (the host token). `src_rows[i]` belongs to
    sequence i's placeholder: its last scheduled token but the drafts that may follow it."""
    if all(s.num_scheduled_tokens == 1 for s in seqs):
        return src_rows
    flat: list[int] = []
    for seq, row in zip(seqs, src_rows, strict=True):
        drafts = seq.num_draft_tokens
        flat.extend([-1] * (seq.num_scheduled_tokens - 1 - drafts))
        flat.append(row)
        flat.extend([-1] * drafts)
    return flat


def sample_count(seq: Sequence) -> int:
    """Rows of this step's logits that `seq` samples: its last token's and each draft's (1 + d) when
    the step computes up to its end, none for a prompt chunk that stops short of it."""
    if seq.num_cached_tokens + seq.num_scheduled_tokens < len(seq):
        return 0
    return 1 + seq.num_draft_tokens


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
    seqs: list[Sequence],
    vocab_size: int,
    device: torch.device,
    eos_token_ids: tuple[int, ...] = (),
    counts: list[int] | None = None,
) -> SamplingBatch:
    """Sampling inputs for the rows that sample this step: `counts[i]` (>= 1) consecutive rows of
    `seqs[i]` (default: one each; `sampling_rows` drops the sequences that do not sample). A
    verification samples all its positions with the sequence's parameters, so each value is worked
    out once per sequence and repeated for its rows; once in all when every sequence has the same
    sampling key (`SamplingParams.batch_key`: equal sampling values that need nothing per sequence,
    however many request objects carry them)."""
    counts = [1] * len(seqs) if counts is None else counts
    key = seqs[0].sampling_key
    if key is not None and all(s.sampling_key is key for s in seqs):
        return _parameter_columns([seqs[0].sampling_params], [sum(counts)], device)
    params = [s.sampling_params for s in seqs]
    batch = _parameter_columns(params, counts, device)
    if any(p.seed is not None for p in params):
        batch.generators = per_row([_generator(s, device) for s in seqs], counts)
    _add_penalties(batch, params, seqs, counts, vocab_size, device)
    if any(p.logit_bias for p in params):
        batch.bias = per_row([p.logit_bias for p in params], counts)
    banned = [_banned(s, eos_token_ids) for s in seqs]
    if any(banned):
        batch.banned = per_row(banned, counts)
        plain = [_plain(p) and not ids for p, ids in zip(params, banned, strict=True)]
        batch.plain_rows = per_row(plain, counts)
    return batch


def _parameter_columns(
    params: list[SamplingParams], counts: list[int], device: torch.device
) -> SamplingBatch:
    """What `params[i]` alone decides, for its `counts[i]` rows."""
    plain = [_plain(p) for p in params]
    logprobs = [p.logprobs for p in params]
    return SamplingBatch(
        temperatures=_column([p.temperature for p in params], counts, torch.float32, device),
        top_k=_optional_column([max(p.top_k, 0) for p in params], counts, 0, torch.int64, device),
        top_p=_optional_column([p.top_p for p in params], counts, 1.0, torch.float32, device),
        min_p=_optional_column([p.min_p for p in params], counts, 0.0, torch.float32, device),
        all_greedy=all(p.greedy for p in params),
        any_greedy=any(p.greedy for p in params),
        generators=[],
        num_logprobs=per_row(logprobs, counts) if any(n is not None for n in logprobs) else None,
        plain_rows=[plain[0]] * sum(counts) if all(q == plain[0] for q in plain) else per_row(plain, counts),
        top_k_bound=_top_k_bound(params),
    )


def _top_k_bound(params: list[SamplingParams]) -> int | None:
    """The largest top-k of the sampling rows when every one has a top-k (SamplingBatch.top_k_bound)."""
    ks = [p.top_k for p in params if not p.greedy]
    return max(ks) if ks and min(ks) > 0 else None


def sampling_rows(seqs: list[Sequence], counts: list[int]) -> tuple[list[Sequence], list[int]]:
    """The sequences that sample this step (a nonzero count), with their counts."""
    if 0 not in counts:
        return seqs, counts
    pairs = [(s, c) for s, c in zip(seqs, counts, strict=True) if c]
    return [s for s, _ in pairs], [c for _, c in pairs]


def per_row(values: list, counts: list[int]) -> list:
    """Each sequence's value repeated for each of its rows."""
    if len(values) == sum(counts) and 0 not in counts:  # one row each: nothing to repeat
        return values
    return [v for v, c in zip(values, counts, strict=True) for _ in range(c)]


def _plain(p: SamplingParams) -> bool:
    """The row needs only temperature (or greedy) and its grammar mask (no penalty, no logit bias):
    the fused sampler's rows.
    Filters never change a greedy row's token (they always keep the most likely one)."""
    no_filter = p.greedy or (p.top_k <= 0 and p.top_p == 1.0 and p.min_p == 0.0)
    no_penalty = p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty
    return no_filter and no_penalty and not p.logit_bias


def _column(values: list, counts: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A per-row parameter from per-sequence values; the common all-equal case is a device fill,
    with no host copy."""
    first = values[0]
    if all(v == first for v in values):
        return torch.full((sum(counts),), first, dtype=dtype, device=device)
    return _to(per_row(values, counts), dtype, device, device.type == "cuda")


def _optional_column(
    values: list, counts: list[int], neutral, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """None when no row uses the filter (the sampler then skips it)."""
    if all(v == neutral for v in values):
        return None
    return _column(values, counts, dtype, device)


def _generator(seq: Sequence, device: torch.device) -> torch.Generator | None:
    """A seeded request owns a generator for its whole life, so its draws do not depend on the batch."""
    seed = seq.sampling_params.seed
    if seed is None or seq.sampling_params.greedy:
        return None
    if seq.generator is None:
        seq.generator = torch.Generator(device=device)
        seq.generator.manual_seed(seed)
    return seq.generator


def _add_penalties(
    batch: SamplingBatch,
    params: list[SamplingParams],
    seqs: list[Sequence],
    counts: list[int],
    vocab_size: int,
    device: torch.device,
) -> None:
    repetition = any(p.repetition_penalty != 1.0 for p in params)
    if not repetition and not any(p.presence_penalty or p.frequency_penalty for p in params):
        return
    # Penalised requests are never speculated (their state would miss the drafts): one row each, and
    # rare enough that rows are built one by one.
    seqs, params = per_row(seqs, counts), per_row(params, counts)
    if repetition:
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
