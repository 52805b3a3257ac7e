"""The host side of a CUDA-graph prefill (or mixed) step: packed int32 inputs for a variable-length
step of up to `max_tokens` tokens from up to `max_seqs` sequences, and how a step fills them.

An eager prefill step of the default model is host-bound: on the H200 host a 16 x 512-token chunk took
12-13 ms of Python and kernel launches while the device finished it sooner
(docs/data/h200-muxahead-62e8e6a/p-probe-launch.txt). Captured once per token bucket and replayed, it
costs one host->device copy and one graph launch (`prefill_graphs.PrefillGraphs`).

Layout (`StepLayout`): the per-sequence fields (`query_start_loc` [max_seqs + 1], `seq_lens`
[max_seqs]), the per-token fields (input ids, positions, slots, run-ahead sources, sampled rows;
`max_tokens` each), then the block tables [max_seqs, width]. A step of n sequences is read from the
buffer's prefix up to the end of table row n, so one copy of that prefix prepares it.

Padding rules (the graphs are captured for a fixed bucket of tokens and `max_seqs` sequences):
tokens past the step's up to the bucket have slot -1 (their KV is never written) and belong to no
sequence; sequences past the step's have no queries (`query_start_loc` stays at the token count) and
context length 0, so the attention kernel's programs for them exit at once. Pure numpy/Python, so
every rule here is tested on the CPU (`tests/unit/common/runner/test_prefill_graph_inputs.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from common.core.sequence import Sequence
from common.runner.graph_inputs import TableRows
from common.runner.inputs import sample_count

_TOKEN_FIELDS = 5  # input ids, positions, slots, run-ahead sources, sampled rows


def _at_least_one(**values: int) -> None:
    """ValueError naming the first of `values` under 1 (the capacities of this module)."""
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def prefill_capture_sizes(max_tokens: int) -> list[int]:
    """Token buckets captured up to `max_tokens` (the step token budget): powers of two to 1,024,
    then every 512 to 8,192, then every 2,048, and `max_tokens` itself. A step pads to the next bucket,
    so the padding is at most 1/8 of a step past 1,024 tokens (at most 1/4 above 8,192)."""
    _at_least_one(max_tokens=max_tokens)
    sizes = [s for s in (16, 32, 64, 128, 256, 512, 1024) if s < max_tokens]
    sizes += [s for s in range(1536, min(max_tokens, 8192 + 1), 512) if s < max_tokens]
    sizes += [s for s in range(8192 + 2048, max_tokens, 2048)]
    return sorted(set(sizes)) + [max_tokens]


def step_token_reach(max_tokens: int, max_seqs: int, max_seq_len: int) -> int:
    """The most tokens one prefill step can hold: the token budget, unless `max_seqs` sequences of
    `max_seq_len` tokens each fill less (e.g. one sequence under a 16,384-token budget). Buckets past
    it could never be replayed, and their dummy steps would need more sequences than a step has."""
    _at_least_one(max_tokens=max_tokens, max_seqs=max_seqs, max_seq_len=max_seq_len)
    return min(max_tokens, max_seqs * max_seq_len)


@dataclass(frozen=True)
class StepLayout:
    """Capacities of a packed step buffer: tokens, sequences, and block-table entries per sequence."""

    max_tokens: int
    max_seqs: int
    width: int

    def __post_init__(self) -> None:
        _at_least_one(max_tokens=self.max_tokens, max_seqs=self.max_seqs, width=self.width)

    @property
    def size(self) -> int:
        return self.used(self.max_seqs)

    def used(self, num_seqs: int) -> int:
        """Int32s a step of `num_seqs` sequences reads: the buffer's prefix through its last table row."""
        return 2 * self.max_seqs + 1 + _TOKEN_FIELDS * self.max_tokens + num_seqs * self.width

    def views(self, buf) -> StepViews:
        """Views of a packed buffer of `size` int32s (numpy or torch)."""
        s, t = self.max_seqs, self.max_tokens
        at = 2 * s + 1
        tokens = [buf[at + i * t : at + (i + 1) * t] for i in range(_TOKEN_FIELDS)]
        at += _TOKEN_FIELDS * t
        return StepViews(
            buf[: s + 1],
            buf[s + 1 : 2 * s + 1],
            *tokens,
            buf[at : at + s * self.width].reshape(s, self.width),
        )


@dataclass
class StepViews:
    """Views of one packed buffer (numpy on the host, torch on the device); see `StepLayout.views`."""

    query_start_loc: object
    seq_lens: object
    input_ids: object
    positions: object
    slots: object
    src_rows: object  # >= 0: the token's value is that row of the previous step's sampled tokens
    picked: object  # the hidden rows whose logits are sampled, in order
    block_tables: object
    tables: TableRows = field(init=False)  # what the host `block_tables` rows hold

    def __post_init__(self) -> None:
        self.tables = TableRows(len(self.block_tables))


@dataclass(frozen=True)
class FilledStep:
    """What `fill_step` wrote: the step's token count, each sequence's sampled-row count, and how many
    entries of `picked` the step reads (0: no sequence samples)."""

    num_tokens: int
    sample_counts: list[int]
    num_picked: int


def fill_step(
    v: StepViews, seqs: list[Sequence], bucket: int, src_rows: list[int] | None, block: int
) -> FilledStep:
    """Write one step (each sequence's scheduled tokens, as `plan_step` lays them out) into the host
    views, padded to `bucket` tokens and the views' sequence capacity. `src_rows[i]` (run-ahead)
    applies to sequence i's placeholder: its last scheduled token but the drafts that follow it."""
    n = len(seqs)
    starts = np.fromiter((s.num_cached_tokens for s in seqs), dtype=np.int64, count=n)
    q_lens = np.fromiter((s.num_scheduled_tokens for s in seqs), dtype=np.int64, count=n)
    ids: list[int] = []
    for row, (s, a, q) in enumerate(zip(seqs, starts.tolist(), q_lens.tolist(), strict=True)):
        ids += s.token_ids[a : a + q]
        v.tables.write(v.block_tables, row, s.block_table)
    total = len(ids)
    if total > bucket:
        raise ValueError(f"step of {total} tokens does not fit bucket {bucket}")
    qsl = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(q_lens, out=qsl[1:])
    v.query_start_loc[: n + 1] = qsl
    v.query_start_loc[n + 1 :] = total
    v.seq_lens[:n] = starts + q_lens
    v.seq_lens[n:] = 0
    v.input_ids[:total] = ids
    np.maximum(v.input_ids[:total], 0, out=v.input_ids[:total])  # placeholders come from src_rows
    v.input_ids[total:bucket] = 0
    _fill_positions_and_slots(v, starts, q_lens, qsl, total, bucket, block)
    v.src_rows[:bucket] = -1
    if src_rows is not None:
        drafts = np.fromiter((s.num_draft_tokens for s in seqs), dtype=np.int64, count=n)
        v.src_rows[qsl[1:] - 1 - drafts] = src_rows
    counts = [sample_count(s) for s in seqs]
    return FilledStep(total, counts, _fill_picked(v, qsl, counts))


def _fill_positions_and_slots(v: StepViews, starts, q_lens, qsl, total: int, bucket: int, block: int) -> None:
    """Token t of sequence i sits at position starts[i] + (t - qsl[i]); its slot comes from i's table."""
    seq_of = np.repeat(np.arange(len(q_lens)), q_lens)
    pos = np.arange(total, dtype=np.int64) + np.repeat(starts - qsl[:-1], q_lens)
    v.positions[:total] = pos
    v.positions[total:bucket] = 0
    blocks = v.block_tables[seq_of, pos // block].astype(np.int64)
    v.slots[:total] = blocks * block + pos % block
    v.slots[total:bucket] = -1


def _fill_picked(v: StepViews, qsl, counts: list[int]) -> int:
    """Sequence i's sampled rows are the last counts[i] of its tokens (`sample_count`)."""
    c = np.asarray(counts, dtype=np.int64)
    picked = int(c.sum())
    if picked:
        first = np.repeat(qsl[1:] - c, c)
        within = np.arange(picked, dtype=np.int64) - np.repeat(np.cumsum(c) - c, c)
        v.picked[:picked] = first + within
    return picked
