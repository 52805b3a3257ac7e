"""The host side of a CUDA-graph decode step: the packed row inputs (`RowViews` over one int32
buffer: input ids, positions, slots, context lengths, run-ahead sources, sampled rows, then the block
tables) and how a step's sequences fill them. Pure numpy/Python, so every rule here is tested on the
CPU (`tests/unit/common/runner/test_graph_inputs.py`); `cuda_graph.DecodeGraphs` owns the buffers
and the graphs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from common.config import EngineConfig
from common.core.sequence import Sequence
from common.runner.inputs import sample_count

# Most rows a speculating engine captures graphs for (a verification of k drafts takes k + 1 rows).
_MAX_SPECULATIVE_ROWS = 512


def graph_rows(config: EngineConfig) -> int:
    """Largest captured step: a decode step of `max_num_seqs`, or, with speculation configured, room
    for that many sequences verifying k drafts each, up to `_MAX_SPECULATIVE_ROWS`."""
    if config.speculative is None:
        return config.max_num_seqs
    wanted = config.max_num_seqs * (config.num_speculative_tokens + 1)
    return max(config.max_num_seqs, min(wanted, _MAX_SPECULATIVE_ROWS))


def capture_sizes(max_rows: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_rows]
    sizes += list(range(16, max_rows + 1, 16))
    if sizes[-1] < max_rows:
        sizes.append(max_rows)
    return sizes


class TableRows:
    """Which block table each row of a host `block_tables` view holds, so a step rewrites only what
    changed: a row that holds the same list object as before gets only the entries appended since
    (block tables grow in place and are otherwise replaced: `Sequence`). At batch 256 x 63 blocks
    this turns a step's table fill from 0.4 ms of list-to-array copies into one check per row."""

    def __init__(self, rows: int) -> None:
        self.owner: list[list[int] | None] = [None] * rows
        self.written = [0] * rows

    def write(self, view: np.ndarray, row: int, table: list[int]) -> None:
        n = len(table)
        if self.owner[row] is not table:
            view[row, :n] = table
            self.owner[row] = table
        elif self.written[row] < n:
            done = self.written[row]
            view[row, done:n] = table[done:]
        else:
            return
        self.written[row] = n

    def forget(self) -> None:
        """The view was written by something else (every row is rewritten at its next use)."""
        self.owner = [None] * len(self.owner)


@dataclass
class RowViews:
    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    seq_lens: torch.Tensor
    src_rows: torch.Tensor  # >= 0: take this row's input token from `prev_tokens` (run-ahead steps)
    picked: torch.Tensor  # the logits rows that sample, when not every row does (not read by graphs)
    block_tables: torch.Tensor
    tables: TableRows = field(init=False)  # what the `block_tables` rows hold (host views)

    def __post_init__(self) -> None:
        self.tables = TableRows(len(self.block_tables))

    @classmethod
    def over(cls, buf, rows: int, width: int) -> RowViews:
        """Views of a packed buffer (`packed_size(rows, width)` int32s, numpy or torch) for `rows` rows
        of block tables `width` entries wide: each field's `rows` entries in turn, then the tables."""
        fields = [buf[i * rows : (i + 1) * rows] for i in range(ROW_FIELDS)]
        return cls(*fields, buf[ROW_FIELDS * rows : packed_size(rows, width)].reshape(rows, width))


ROW_FIELDS = 6  # the RowViews fields before block_tables


def packed_size(rows: int, width: int) -> int:
    return rows * (ROW_FIELDS + width)


# Longest run of query tokens one sequence may send through the graphs (k + 1 for speculation, a draft
# mirror's catch-up); longer runs are prefill chunks, which the varlen prefill kernel does better.
MAX_GRAPH_QUERY = 16


def query_lens(seqs: list[Sequence], max_rows: int) -> list[int] | None:
    """Rows per sequence when the step is decode-shaped (every sequence computes 1..MAX_GRAPH_QUERY
    tokens that end at its last token, at most `max_rows` in all); None when it is not."""
    lens, total = [], 0
    for s in seqs:
        q = s.num_scheduled_tokens
        if not 1 <= q <= MAX_GRAPH_QUERY or s.num_cached_tokens + q != len(s):
            return None
        lens.append(q)
        total += q
    return lens if total <= max_rows else None


def sampled_rows(seqs: list[Sequence], q_lens: list[int]) -> list[int] | None:
    """Rows whose logits are sampled: each sequence's last token plus its drafts (the rule of
    `plan_step`). None when that is every row (plain decode, verification)."""
    if all(q == 1 + s.num_draft_tokens for s, q in zip(seqs, q_lens, strict=True)):
        return None
    rows, end = [], 0
    for s, q in zip(seqs, q_lens, strict=True):
        end += q
        rows.extend(range(end - 1 - s.num_draft_tokens, end))
    return rows


def prepare_rows(
    v: RowViews, seqs: list[Sequence], q_lens: list[int], bs: int, src_rows: list[int] | None, block: int
) -> tuple[list[int], int | None]:
    """The host side of a graph step: `fill_rows`, and which logits rows sample. Returns each
    sequence's sampled-row count and how many rows `v.picked` lists (None: every row, in order)."""
    fill_rows(v, seqs, q_lens, bs, src_rows, block)
    counts = [sample_count(s) for s in seqs]
    rows = sampled_rows(seqs, q_lens)
    if rows is None:
        return counts, None
    v.picked[: len(rows)] = rows
    return counts, len(rows)


def fill_rows(
    v: RowViews, seqs: list[Sequence], q_lens: list[int], bs: int, src_rows: list[int] | None, block: int
) -> None:
    """Write one step's rows into the host views: sequence i owns `q_lens[i]` consecutive rows, its
    last tokens, each with its own position, slot and context length; rows past the end up to the
    captured size `bs` are padding. `src_rows[i]` (run-ahead) applies to sequence i's placeholder row:
    its last but the drafts that may follow it."""
    if len(q_lens) == sum(q_lens):  # plain decode: one row per sequence, its last token
        lengths = [len(s) for s in seqs]
        ids = [s.token_ids[-1] for s in seqs]
        blocks = [s.block_table[(n - 1) // block] for s, n in zip(seqs, lengths, strict=True)]
        p = np.asarray(lengths, dtype=np.int32) - 1
        for r, s in enumerate(seqs):
            v.tables.write(v.block_tables, r, s.block_table)
    else:
        ids, blocks, p = _multi_rows(v, seqs, q_lens, block)
    n = len(ids)
    v.input_ids[:n] = ids
    np.maximum(v.input_ids[:n], 0, out=v.input_ids[:n])  # placeholders come from src_rows
    v.positions[:n] = p
    v.seq_lens[:n] = p + 1
    v.slots[:n] = np.asarray(blocks, dtype=np.int32) * block + p % block
    v.slots[n:bs] = -1
    v.seq_lens[n:bs] = 1
    v.src_rows[:bs] = -1
    if src_rows is not None:
        last = np.cumsum(q_lens) - 1
        if len(q_lens) != n:  # verification rows: a placeholder's drafts come after it
            last -= np.fromiter((s.num_draft_tokens for s in seqs), dtype=last.dtype, count=len(seqs))
        v.src_rows[last] = src_rows


def _multi_rows(
    v: RowViews, seqs: list[Sequence], q_lens: list[int], block: int
) -> tuple[list[int], list[int], np.ndarray]:
    """Token ids, KV blocks and positions of steps where a sequence may own several rows."""
    ids: list[int] = []
    pos: list[int] = []
    blocks: list[int] = []
    r = 0
    for s, q in zip(seqs, q_lens, strict=True):
        length, table = len(s), s.block_table
        ids += s.token_ids[length - q :]
        pos += range(length - q, length)
        blocks += [table[i // block] for i in range(length - q, length)]
        for row in range(r, r + q):
            v.tables.write(v.block_tables, row, table)
        r += q
    return ids, blocks, np.asarray(pos, dtype=np.int32)
