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

import torch

from common.attention.base import AttentionBackend, AttentionMetadata
from common.attention.context import ForwardContext, set_forward_context
from common.core.sequence import Sequence
from common.runner.graph_inputs import (
    ROW_FIELDS,
    RowViews,
    capture_sizes,
    packed_size,
    prepare_rows,
    query_lens,
)
from common.runner.step_costs import StepCosts

logger = logging.getLogger(__name__)


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
        n = packed_size(self.max_bs, self.width)
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

    def _views(self, buf) -> RowViews:
        return RowViews.over(buf, self.max_bs, self.width)

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
        used = self.max_bs * ROW_FIELDS + bs * self.width  # the step's graph reads no further
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
