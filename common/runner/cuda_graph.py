"""CUDA-graph replay of decode-shaped steps.

A decode step launches hundreds of small kernels; captured once per row count and replayed, the
launch cost disappears. Graphs are captured for 1, 2, 4, 8 and then steps of 16 up to `max_rows`
rows; a step is padded to the next captured size (padding rows write no KV: slot -1).

A row is one query token with its own context length, so any step whose sequences each compute a few
tokens ending at their last token runs here, not only plain decode: a speculative verification
(the last token plus k drafts: k + 1 rows of one sequence, row j attending to positions <= its own,
whose KV the same step stored first) and a draft model's catch-up step. Such a row computes exactly
what a decode step at that position computes, with the same fused kernels.

All of a step's integer inputs live in one packed int32 device buffer with a pinned host mirror, so
preparing a step is one host->device copy, of the buffer's prefix that the step's size reads (the
block tables come last, one row per graph row). Each graph reads fixed views of that buffer and
writes logits into its own static output.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from common.attention.base import AttentionBackend, AttentionMetadata
from common.attention.context import ForwardContext, set_forward_context
from common.runner.inputs import sample_count
from common.sequence import Sequence
from common.spec_policy import StepCosts

logger = logging.getLogger(__name__)


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
class _Views:
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


_ROW_FIELDS = 6  # the _Views fields before block_tables

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
    v: _Views, seqs: list[Sequence], q_lens: list[int], bs: int, src_rows: list[int] | None, block: int
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
    v: _Views, seqs: list[Sequence], q_lens: list[int], bs: int, src_rows: list[int] | None, block: int
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
    v: _Views, seqs: list[Sequence], q_lens: list[int], block: int
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


class DecodeGraphs:
    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        max_rows: int,
        max_blocks_per_seq: int,
        max_seq_len: int,
        block_size: int,
        device: torch.device,
    ) -> None:
        self.model, self.backend, self.device = model, backend, device
        self.sizes = capture_sizes(max_rows)
        self.max_bs, self.width = self.sizes[-1], max_blocks_per_seq
        self.max_seq_len, self.block_size = max_seq_len, block_size
        n = self.max_bs * (_ROW_FIELDS + self.width)
        # Two pinned host buffers used in turn: with run-ahead steps, the copy of step k-1 may still be
        # queued while the host fills step k's inputs.
        self.hosts = [torch.zeros(n, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self.host_views = [self._views(h.numpy()) for h in self.hosts]
        self.copied = [torch.cuda.Event() for _ in range(2)]
        self.turn = 0
        self.packed = torch.zeros(n, dtype=torch.int32, device=device)
        self.prev_tokens = torch.zeros(self.max_bs, dtype=torch.int32, device=device)
        self.dev = self._views(self.packed)
        self.query_start_loc = torch.arange(self.max_bs + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    def _views(self, buf) -> _Views:
        m = self.max_bs
        rows = [buf[i * m : (i + 1) * m] for i in range(_ROW_FIELDS)]
        return _Views(*rows, buf[_ROW_FIELDS * m :].reshape(m, self.width))

    def _meta(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            is_decode=True,
            slot_mapping=self.dev.slots[:bs],
            query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.dev.seq_lens[:bs],
            block_tables=self.dev.block_tables[:bs],
            max_query_len=1,
            max_seq_len=self.max_seq_len,
        )

    def _forward(self, bs: int) -> torch.Tensor:
        set_forward_context(ForwardContext(self.backend, self._meta(bs)))
        try:
            src = self.dev.src_rows[:bs]
            ids = torch.where(src >= 0, self.prev_tokens[src.clamp(min=0)], self.dev.input_ids[:bs])
            hidden = self.model(ids, self.dev.positions[:bs])
            return self.model.compute_logits(hidden)
        finally:
            set_forward_context(None)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, sharing one memory pool."""
        views = self.host_views[0]
        views.seq_lens[:] = 1
        views.slots[:] = -1
        views.src_rows[:] = -1
        self.packed.copy_(self.hosts[0])
        pool = None
        for bs in reversed(self.sizes):
            self._forward(bs)  # warm-up: Triton compilation and autotuning happen outside capture
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[bs] = self._forward(bs)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)
        logger.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def query_lens(self, seqs: list[Sequence]) -> list[int] | None:
        """Rows per sequence if this step can replay a graph (see `query_lens`), else None."""
        return query_lens(seqs, self.max_bs)

    def run(
        self, seqs: list[Sequence], q_lens: list[int], src_rows: list[int] | None = None
    ) -> tuple[torch.Tensor, list[int]]:
        """Logits of the sampled rows of one decode-shaped step, and each sequence's count of them.

        `src_rows[i] >= 0` means sequence i's input token is still on the device: row `src_rows[i]` of
        the previous step's sampled tokens (see `set_prev_tokens`).
        """
        n = sum(q_lens)
        bs = next(s for s in self.sizes if s >= n)
        host = self.hosts[self.turn]
        self.copied[self.turn].synchronize()  # the copy that last read this buffer has finished
        views = self.host_views[self.turn]
        counts, picked = prepare_rows(views, seqs, q_lens, bs, src_rows, self.block_size)
        used = self.max_bs * _ROW_FIELDS + bs * self.width  # the step's graph reads no further
        self.packed[:used].copy_(host[:used], non_blocking=True)
        self.copied[self.turn].record()
        self.turn ^= 1
        self.graphs[bs].replay()
        if picked is None:  # every row samples (plain decode, verification)
            return self.logits[bs][:n], counts
        return self.logits[bs].index_select(0, self.dev.picked[:picked]), counts

    @torch.inference_mode()
    def measure_costs(self, context_len: int, repeats: int = 5) -> StepCosts:
        """Seconds per replay of every captured size with each row attending to `context_len` tokens
        (padding rows: nothing is written; every block-table entry is block 0, valid memory)."""
        host = self.hosts[self.turn]
        self.copied[self.turn].synchronize()
        v = self.host_views[self.turn]
        length = max(1, min(context_len, self.max_seq_len))
        v.seq_lens[:] = length
        v.positions[:] = length - 1
        v.slots[:] = -1
        v.src_rows[:] = -1
        v.block_tables[:] = 0
        v.tables.forget()
        self.packed.copy_(host)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        seconds = []
        for bs in self.sizes:
            self.graphs[bs].replay()  # warm
            start.record()
            for _ in range(repeats):
                self.graphs[bs].replay()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3 / repeats)
        return StepCosts(tuple(self.sizes), tuple(seconds))

    def set_prev_tokens(self, tokens: torch.Tensor) -> None:
        """Remember this step's sampled tokens on the device for the next run-ahead step."""
        self.prev_tokens[: tokens.shape[0]].copy_(tokens)
