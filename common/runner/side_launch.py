"""A prefill chunk launched onto a side stream a few layers at a time (multiplexed mode).

Launching an eager forward pass is host work: on the H200 host a 16 x 512-token chunk of the default
model took 12-13 ms of Python and kernel launches before the device had all of it
(docs/data/h200-muxahead-62e8e6a/p-probe-launch.txt). In multiplexed mode the same thread launches
the decode steps, so one launch in one piece is an inter-token gap of that length for every decoding
stream. A chunk that fits a prefill CUDA graph (`prefill_graphs.py`) captured for its lane launches
in one cheap part (SM shares have sets of their own: `PDSERVE_MUX_SHARE_GRAPHS`). Otherwise
(`enforce_eager`, `PDSERVE_PREFILL_GRAPHS=0`) `SideLaunch` cuts the launch into parts of
`layers_per_part` layers: the stepper launches one part, then a decode step, then the next part, and
the device runs the chunk's kernels on its lane meanwhile.

Invariants: the first part makes the lane wait for everything already on the engine's stream
(`PrefillLane.activate`: the chunk reads KV that earlier steps wrote); later parts only resume the
lane's stream (`PrefillLane.resume`), so the decode steps launched in between never delay the chunk.
The forward context (attention metadata) is set for each part and cleared after it, so a decode step
in between sees its own. The chunk's tokens are staged through the runner's side buffers and never
become a run-ahead step's inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from common.attention.context import ForwardContext, set_forward_context
from common.core.sequence import Sequence
from common.layers.fused import beside_the_engine_stream
from common.multiplex.partitions import PrefillLane
from common.runner.inputs import prepare_step
from common.runner.step_handle import StepHandle

if TYPE_CHECKING:
    from common.runner.model_runner import ModelRunner


class SideLaunch:
    """One chunk's launch; `advance()` launches its next part. `handle` is set once it is all launched."""

    def __init__(
        self, runner: ModelRunner, seqs: list[Sequence], lane: PrefillLane, layers_per_part: int | None
    ) -> None:
        if runner.tp is not None:
            raise ValueError("a side launch needs tensor_parallel_size 1 (multiplexed mode)")
        if layers_per_part is not None and layers_per_part < 1:
            raise ValueError(f"layers_per_part must be a positive int or None, got {layers_per_part!r}")
        self.runner, self.seqs, self.lane = runner, seqs, lane
        self.layers_per_part = layers_per_part
        self.handle: StepHandle | None = None
        self.bucket: int | None = None  # the prefill graph's token bucket it replays (None: eager)
        self._parts: Iterator[StepHandle | None] | None = None

    def advance(self) -> bool:
        """Launch the next part; True once the whole chunk (sampling included) is launched."""
        if self.handle is not None:
            return True
        first = self._parts is None
        if first:
            self._parts = self._launch()
        lane = self.lane.activate() if first else self.lane.resume()
        with torch.inference_mode(), lane, beside_the_engine_stream():
            self.handle = next(self._parts)
        return self.handle is not None

    def _launch(self) -> Iterator[StepHandle | None]:
        """Yields None after each part but the last, then the handle (the generator behind `advance`).
        A chunk that fits a prefill graph is one part: its launch is one copy and one graph launch."""
        runner, seqs = self.runner, self.seqs
        graphs = runner.prefill_graphs
        key = self.lane.sms
        bucket = graphs.bucket(seqs) if graphs is not None and graphs.has_lane(key) else None
        if bucket is not None:
            self.bucket = bucket
            yield self._sampled(*graphs.run(seqs, bucket, lane=key))
            return
        inputs = prepare_step(seqs, runner.block_size, runner.device, False, runner.max_model_len)
        context = ForwardContext(runner.backend, inputs.meta)
        per_part = self.layers_per_part or runner.model_config.num_hidden_layers
        parts = runner.model.forward_in_parts(inputs.input_ids, inputs.positions, per_part)
        while True:
            set_forward_context(context)
            try:
                hidden = next(parts)
            finally:
                set_forward_context(None)
            if hidden is not None:
                break
            yield None
        counts = inputs.sample_counts
        logits = runner.model.compute_logits(hidden[inputs.sample_rows]) if any(counts) else None
        yield self._sampled(logits, counts)

    def _sampled(self, logits: torch.Tensor | None, counts: list[int]) -> StepHandle:
        if logits is None:
            return StepHandle([0] * len(self.seqs), None, None)
        out = self.runner.sample(self.seqs, logits, counts)
        return StepHandle(counts, self.runner.side_staging.stage(out.token_ids), out.logprobs)
