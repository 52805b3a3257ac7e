"""CUDA-graph replay of prefill and mixed steps (prompt chunks, with decode rows beside them).

Why: an eager step of a small model is host-bound. On the H200 host a 16 x 512-token chunk of the
default model took 12-13 ms to launch (about 300 kernels through Python) while the device needed less
(docs/data/h200-muxahead-62e8e6a/p-probe-launch.txt), and in multiplexed mode that launch is an
inter-token gap for every decoding stream. Here a step is packed into one int32 buffer
(`prefill_graph_inputs`), copied in one host->device copy and replayed as the graph of the smallest
token bucket that holds it; only the sampled rows' logits run eagerly after it.

Invariants:
* The attention metadata a graph reads is fixed views of the device buffer: `max_seqs` sequences
  (padding ones have no queries) and the bucket's tokens (padding ones write no KV). The prefill
  kernel's grid depends only on those two counts (`prefill_attention.py`), so one graph serves any
  step of that bucket. The varlen FlashAttention route is never taken (it reads host lengths).
* Run-ahead: a token whose source row is >= 0 reads the previous step's sampled token from the
  decode graphs' `prev_tokens` buffer, on the device, as the eager path does.
* The graphs share one memory pool, separate from the decode graphs', so a decode step and a prefill
  step may run on two streams at once (multiplexed mode). Two prefill steps never overlap: a replay
  waits for the event recorded after the previous step last read the static buffers (the input
  buffer and `out`), whichever stream that was on.
* A graph replays the kernels chosen when it was captured. Multiplexed mode's SM shares get sets of
  their own, captured on their streams (`capture(lane)`): replayed on a share, the whole-device set
  diverged from the aggregated engine in a float32 GPU test, while eager launches on the shares
  (and the start-up GEMM check) compute right.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import torch

from common.attention.base import AttentionBackend, AttentionMetadata
from common.attention.context import ForwardContext, set_forward_context
from common.core.sequence import Sequence
from common.env_flags import env_switch
from common.multiplex.partitions import PrefillLane
from common.runner.prefill_graph_inputs import (
    StepLayout,
    StepViews,
    fill_step,
    prefill_capture_sizes,
    step_token_reach,
)
from common.wire.blocks import blocks_for

if TYPE_CHECKING:
    from common.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def prefill_graphs_enabled() -> bool:
    """`PDSERVE_PREFILL_GRAPHS=0` keeps prefill and mixed steps eager (A/B runs)."""
    return env_switch("PDSERVE_PREFILL_GRAPHS", default=True)


def packed_forward(
    model: torch.nn.Module,
    backend: AttentionBackend,
    views: StepViews,
    bucket: int,
    prev_tokens: torch.Tensor,
    max_seq_len: int,
) -> torch.Tensor:
    """The hidden states of a packed step padded to `bucket` tokens (what a prefill graph captures);
    `views` over a tensor on the model's device. Run-ahead sources read `prev_tokens`."""
    meta = AttentionMetadata(
        is_decode=False,
        slot_mapping=views.slots[:bucket],
        query_start_loc=views.query_start_loc,
        seq_lens=views.seq_lens,
        block_tables=views.block_tables,
        max_query_len=bucket,
        max_seq_len=max_seq_len,
    )
    set_forward_context(ForwardContext(backend, meta))
    try:
        src = views.src_rows[:bucket]
        ids = torch.where(src >= 0, prev_tokens[src.clamp(min=0)], views.input_ids[:bucket])
        return model(ids, views.positions[:bucket])
    finally:
        set_forward_context(None)


class PrefillGraphs:
    """One graph per token bucket (`prefill_capture_sizes`); `run` replays the one a step fits."""

    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        layout: StepLayout,
        max_seq_len: int,
        block_size: int,
        prev_tokens: torch.Tensor,
        device: torch.device,
    ) -> None:
        self.model, self.backend, self.layout = model, backend, layout
        self.sizes = prefill_capture_sizes(layout.max_tokens)
        self.max_seq_len, self.block_size = max_seq_len, block_size
        self.prev_tokens = prev_tokens
        # Two pinned host buffers in turn: with run-ahead steps the copy of step k-1 may still be
        # queued while the host fills step k.
        self.hosts = [torch.zeros(layout.size, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self.host_views = [layout.views(h.numpy()) for h in self.hosts]
        self.copied = [torch.cuda.Event() for _ in range(2)]
        self.turn = 0
        self.packed = torch.zeros(layout.size, dtype=torch.int32, device=device)
        self.dev = layout.views(self.packed)
        self.released = torch.cuda.Event()  # recorded once a step's reads of the buffers are queued
        # (lane key, bucket) -> graph; key None: captured on the engine's side of the device (any
        # stream of the whole device replays it), an int: on that many SMs' green context.
        self.graphs: dict[tuple[int | None, int], torch.cuda.CUDAGraph] = {}
        self.out: torch.Tensor | None = None  # every graph writes its hidden states here
        self._pool = None  # one memory pool for every graph: no two of them ever run at once
        self._ready: set[int | None] = set()  # lane keys whose every bucket is captured
        self.largest_set_bytes = 0  # the most device memory one captured set took: what another will

    @classmethod
    def capture_for(cls, runner: ModelRunner) -> PrefillGraphs:
        """Graphs for `runner`'s steps: its token budget (as far as its sequence limit can fill it) and
        sequence limit, tables as wide as `max_model_len` needs; run-ahead sources read its decode
        graphs' `prev_tokens`."""
        config = runner.config
        layout = StepLayout(
            step_token_reach(config.max_num_batched_tokens, config.max_num_seqs, runner.max_model_len),
            config.max_num_seqs,
            blocks_for(runner.max_model_len, runner.block_size),
        )
        graphs = cls(
            runner.model,
            runner.backend,
            layout,
            runner.max_model_len,
            runner.block_size,
            runner.graphs.prev_tokens,
            runner.device,
        )
        graphs.capture()
        return graphs

    def bucket(self, seqs: list[Sequence]) -> int | None:
        """The captured bucket a step of `seqs` replays, or None when it does not fit any."""
        if len(seqs) > self.layout.max_seqs:
            return None
        tokens = sum(s.num_scheduled_tokens for s in seqs)
        return next((b for b in self.sizes if b >= tokens), None)

    def _forward(self, bucket: int) -> torch.Tensor:
        return packed_forward(self.model, self.backend, self.dev, bucket, self.prev_tokens, self.max_seq_len)

    def has_lane(self, key: int | None) -> bool:
        """Whether a whole set was captured for `key` (None: the whole device)."""
        return key in self._ready

    @torch.inference_mode()
    def capture(self, lane: PrefillLane | None = None) -> None:
        """Capture every bucket, largest first, sharing one memory pool; with `lane` (an SM share of
        multiplexed mode), on its stream, so the libraries choose their kernels for that share as
        they do for its eager launches. Each bucket runs once first (Triton compiles outside capture)
        on dummy sequences whose KV is never written."""
        key = None if lane is None else lane.sms
        before = torch.cuda.memory_reserved(self.packed.device)
        try:
            with contextlib.nullcontext() if lane is None else lane.activate():
                self._capture_set(key)
        except BaseException:
            for bucket in self.sizes:  # no half set: a step must find its bucket's graph
                self.graphs.pop((key, bucket), None)
            raise
        self._ready.add(key)
        torch.cuda.synchronize()
        grown = torch.cuda.memory_reserved(self.packed.device) - before
        self.largest_set_bytes = max(self.largest_set_bytes, grown)
        logger.info(
            "captured prefill CUDA graphs (SMs %s) for %d token buckets up to %d",
            "all" if key is None else key,
            len(self.sizes),
            self.sizes[-1],
        )

    def _capture_set(self, key: int | None) -> None:
        stream = None if key is None else torch.cuda.current_stream()
        for bucket in reversed(self.sizes):
            self._fill_dummy(bucket)
            hidden = self._forward(bucket)
            if self.out is None:
                self.out = torch.empty_like(hidden)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=stream):
                self.out[:bucket].copy_(self._forward(bucket))
            self._pool = graph.pool()
            self.graphs[key, bucket] = graph

    def _fill_dummy(self, bucket: int) -> None:
        """`bucket` tokens of fresh prompts, each as long as a table row allows; they read block 0
        and write no KV."""
        v, layout = self.host_views[0], self.layout
        per = min(self.max_seq_len, layout.width * self.block_size)
        bounds = [min(i * per, bucket) for i in range(-(-bucket // per) + 1)]
        if len(bounds) - 1 > layout.max_seqs:
            raise ValueError(f"{bucket} tokens need more than max_seqs={layout.max_seqs} sequences")
        v.query_start_loc[:] = bucket
        v.query_start_loc[: len(bounds)] = bounds
        v.seq_lens[:] = 0
        v.seq_lens[: len(bounds) - 1] = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
        v.input_ids[:] = 0
        v.positions[:] = 0
        v.slots[:] = -1
        v.src_rows[:] = -1
        v.block_tables[:] = 0
        v.tables.forget()
        self.packed.copy_(self.hosts[0])

    def run(
        self, seqs: list[Sequence], bucket: int, src_rows: list[int] | None = None, lane: int | None = None
    ) -> tuple[torch.Tensor | None, list[int]]:
        """Logits of the step's sampled rows (None when none samples) and each sequence's count of
        them, as `ModelRunner._forward` returns them; `bucket` from `bucket(seqs)`, `lane` the key of
        a captured set (`has_lane`) matching the current stream's SMs."""
        host = self.hosts[self.turn]
        self.copied[self.turn].synchronize()  # the copy that last read this host buffer is done
        step = fill_step(self.host_views[self.turn], seqs, bucket, src_rows, self.block_size)
        torch.cuda.current_stream().wait_event(self.released)
        used = self.layout.used(len(seqs))
        self.packed[:used].copy_(host[:used], non_blocking=True)
        self.copied[self.turn].record()
        self.turn ^= 1
        self.graphs[lane, bucket].replay()
        if not step.num_picked:
            self.released.record()
            return None, step.sample_counts
        rows = self.out.index_select(0, self.dev.picked[: step.num_picked])
        self.released.record()
        return self.model.compute_logits(rows), step.sample_counts
