"""CUDA-graph replay of decode steps.

A decode step launches hundreds of small kernels; captured once per batch size and replayed, the
launch cost disappears. Graphs are captured for batch sizes 1, 2, 4, 8 and then steps of 16 up to
`max_num_seqs`; a batch is padded to the next captured size (padding rows write no KV: slot -1).

All of a step's integer inputs live in one packed int32 device buffer with a pinned host mirror, so
preparing a step is one host->device copy. Each graph reads fixed views of that buffer and writes
logits into its own static output.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from common.attention.base import AttentionBackend, AttentionMetadata
from common.attention.context import ForwardContext, set_forward_context
from common.sequence import Sequence

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
    sizes += list(range(16, max_num_seqs + 1, 16))
    if sizes[-1] < max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


@dataclass
class _Views:
    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    seq_lens: torch.Tensor
    src_rows: torch.Tensor  # >= 0: take this row's input token from `prev_tokens` (run-ahead steps)
    block_tables: torch.Tensor


class DecodeGraphs:
    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        max_seq_len: int,
        block_size: int,
        device: torch.device,
    ) -> None:
        self.model, self.backend, self.device = model, backend, device
        self.sizes = capture_sizes(max_num_seqs)
        self.max_bs, self.width = self.sizes[-1], max_blocks_per_seq
        self.max_seq_len, self.block_size = max_seq_len, block_size
        n = self.max_bs * (5 + self.width)
        # Two pinned host buffers used in turn: with run-ahead steps, the copy of step k-1 may still be
        # queued while the host fills step k's inputs.
        self.hosts = [torch.zeros(n, dtype=torch.int32, pin_memory=True) for _ in range(2)]
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
        rows = [buf[i * m : (i + 1) * m] for i in range(5)]
        return _Views(*rows, buf[5 * m :].reshape(m, self.width))

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
        views = self._views(self.hosts[0].numpy())
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

    def can_run(self, batch_size: int) -> bool:
        return batch_size <= self.max_bs

    def run(self, seqs: list[Sequence], src_rows: list[int] | None = None) -> torch.Tensor:
        """Logits [len(seqs), vocab] of one decode step.

        `src_rows[i] >= 0` means sequence i's input token is still on the device: row `src_rows[i]` of
        the previous step's sampled tokens (see `set_prev_tokens`).
        """
        n = len(seqs)
        bs = next(s for s in self.sizes if s >= n)
        host = self.hosts[self.turn]
        self.copied[self.turn].synchronize()  # the copy that last read this buffer has finished
        self._fill_host(self._views(host.numpy()), seqs, bs, src_rows)
        self.packed.copy_(host, non_blocking=True)
        self.copied[self.turn].record()
        self.turn ^= 1
        self.graphs[bs].replay()
        return self.logits[bs][:n]

    def set_prev_tokens(self, tokens: torch.Tensor) -> None:
        """Remember this step's sampled tokens on the device for the next run-ahead step."""
        self.prev_tokens[: tokens.shape[0]].copy_(tokens)

    def _fill_host(self, v: _Views, seqs: list[Sequence], bs: int, src_rows: list[int] | None) -> None:
        block = self.block_size
        n = len(seqs)
        pos = np.fromiter((len(s) - 1 for s in seqs), dtype=np.int32, count=n)
        v.input_ids[:n] = [max(s.token_ids[-1], 0) for s in seqs]  # placeholders (-1) come from src_rows
        v.positions[:n] = pos
        v.seq_lens[:n] = pos + 1
        v.src_rows[:n] = src_rows if src_rows is not None else -1
        last_blocks = np.fromiter(
            (s.block_table[p // block] for s, p in zip(seqs, pos.tolist(), strict=True)), np.int32, n
        )
        v.slots[:n] = last_blocks * block + pos % block
        for i, s in enumerate(seqs):
            v.block_tables[i, : len(s.block_table)] = s.block_table
        v.slots[n:bs] = -1
        v.seq_lens[n:bs] = 1
        v.src_rows[n:bs] = -1
