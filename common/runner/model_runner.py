"""Owns the device: weights, the paged KV cache, input preparation, the forward pass and sampling."""

from __future__ import annotations

import logging

import torch

from common.attention import create_backend, resolve_backend_name
from common.attention.context import ForwardContext, set_forward_context
from common.attention.kv_fp8 import kv_cache_torch_dtype
from common.config import EngineConfig
from common.core.sequence import Sequence
from common.device import DevicePlatform
from common.loader import load_weights
from common.model_config import ModelConfig
from common.models import build_model
from common.multiplex.partitions import PrefillLane
from common.parallel import use_group
from common.runner.cuda_graph import DecodeGraphs
from common.runner.grammar import GrammarMasker
from common.runner.graph_inputs import graph_rows
from common.runner.host_staging import HostStaging
from common.runner.inputs import (
    StepInputs,
    flat_sources,
    plan_step,
    prepare_sampling,
    prepare_step,
    sampling_rows,
)
from common.runner.kv_cache import allocate_kv_cache, blocks_for_memory, kv_bytes_per_block
from common.runner.output import RunnerOutput
from common.runner.prefill_graphs import PrefillGraphs, prefill_graphs_enabled
from common.runner.sampler import Sampler
from common.runner.side_launch import SideLaunch
from common.runner.step_costs import StepCosts
from common.runner.step_handle import StepHandle
from common.runner.tp_group import TPGroup, start_group
from common.wire.blocks import blocks_for
from common.wire.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Context length at which decode step costs are measured: a chat turn's worth of tokens.
_COST_CONTEXT_TOKENS = 512


class ModelRunner:
    """Runs forward passes for scheduled batches. Construct with `ModelRunner.load(...)`.

    With `tensor_parallel_size > 1` this is rank 0 of a `TPGroup` (`self.tp`): it starts the other
    ranks, broadcasts each step's inputs to them and alone samples. Those steps run eager (no CUDA
    graphs). `close()` stops the other ranks.
    """

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        platform: DevicePlatform,
        max_model_len: int,
        tp: TPGroup | None = None,
    ) -> None:
        self.config = config
        self.tp = tp
        self.max_model_len = max_model_len
        self.model_config = model_config
        self.platform = platform
        self.device = platform.torch_device
        self.dtype = platform.resolve_dtype(config.dtype, model_config.torch_dtype)
        self.kv_dtype = kv_cache_torch_dtype(config.kv_cache_dtype, self.dtype)
        self.block_size = config.kvcache_block_size
        self.backend_name = resolve_backend_name(config.attention_backend, platform.type)
        self.sampler = Sampler()
        self.grammar = GrammarMasker(config.model, model_config.eos_token_ids)
        self.model: torch.nn.Module | None = None
        self.kv_cache: torch.Tensor | None = None
        self.graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        self._prev_tokens: torch.Tensor | None = None
        staging_size = max(config.max_num_seqs, config.max_num_batched_tokens)
        self._staging = HostStaging(staging_size)
        self.side_staging = HostStaging(staging_size)  # for `launch_side`'s stream
        self._step_costs: StepCosts | None = None

    @classmethod
    def load(
        cls, config: EngineConfig, model_config: ModelConfig, platform: DevicePlatform, max_model_len: int
    ) -> ModelRunner:
        tp = (
            start_group(config, model_config, max_model_len, platform)
            if config.tensor_parallel_size > 1
            else None
        )
        runner = cls(config, model_config, platform, max_model_len, tp)
        try:
            runner.load_model()
            runner.allocate_kv_cache()
            if platform.is_cuda:
                runner.warmup()
                if not config.enforce_eager and tp is None:  # graphs would have to capture the collectives
                    runner.capture_graphs()
        except BaseException:
            if tp is not None:  # the workers may wait in a start-up collective: no stop message
                tp.abort()
            raise
        return runner

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (idempotent; a no-op for a single rank)."""
        if self.tp is not None:
            self.tp.close()

    @property
    def _group(self):
        return self.tp.group if self.tp is not None else None

    def warmup(self) -> None:
        """Run a small two-sequence prefill, then the sampling kernel's variants, so kernel
        compilation happens at start, not mid-request.

        The dummy sequences write KV into the first blocks, which the block manager later hands out
        as fresh blocks (their content is always rewritten before it is read).
        """
        seqs, next_block = [], 0
        for n in (17, 40):
            seq = Sequence(list(range(1, n + 1)), SamplingParams(temperature=0), self.block_size)
            blocks = blocks_for(n, self.block_size)
            seq.block_table = list(range(next_block, next_block + blocks))
            seq.schedule(n)
            next_block += blocks
            seqs.append(seq)
        self.run(seqs, is_decode=False)
        self.sampler.warm_up(self.model_config.vocab_size, self.dtype, self.device)

    def capture_graphs(self) -> None:
        self.graphs = DecodeGraphs(
            self.model,
            self.backend,
            graph_rows(self.config),
            blocks_for(self.max_model_len, self.block_size),
            self.max_model_len,
            self.block_size,
            self.device,
        )
        self.graphs.capture()
        if prefill_graphs_enabled():
            self.prefill_graphs = PrefillGraphs.capture_for(self)

    def step_costs(self) -> StepCosts | None:
        """Measured seconds of a decode-shaped step by row count (None without CUDA graphs); the
        speculation policy weighs drafts against it. Measured once, at a typical chat context."""
        if self.graphs is None:
            return None
        if self._step_costs is None:
            self._step_costs = self.graphs.measure_costs(_COST_CONTEXT_TOKENS)
            logger.info("decode step costs (rows: ms): %s", self._step_costs)
        return self._step_costs

    # ---- start-up ------------------------------------------------------------------------------
    def load_model(self) -> None:
        torch.manual_seed(self.config.seed)
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device), use_group(self._group):  # layers take their shard's shapes
                self.model = build_model(self.model_config)
        finally:
            torch.set_default_dtype(default_dtype)
        load_weights(self.model, self.config.model)
        self.model.eval()
        self.backend = create_backend(self.backend_name)

    @property
    def kv_bytes_per_block(self) -> int:
        return kv_bytes_per_block(self.model_config, self.config, self.kv_dtype)

    def num_blocks_for_memory(self) -> int:
        """How many KV blocks fit (common/runner/kv_cache.py); a worker's runner overrides it."""
        return blocks_for_memory(self.config, self.model_config, self.platform, self.kv_bytes_per_block)

    def allocate_kv_cache(self) -> None:
        num_blocks = self.num_blocks_for_memory()
        if self.tp is not None:  # block ids must mean the same slots on every rank
            num_blocks = self.tp.agree_num_blocks(num_blocks)
        self.kv_cache = allocate_kv_cache(
            self.model, self.config, self.model_config, num_blocks, self.kv_dtype, self.device
        )

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_cache.shape[2]

    # ---- one step ------------------------------------------------------------------------------
    def run(self, seqs: list[Sequence], is_decode: bool) -> RunnerOutput:
        """Forward + sample, waiting for the tokens."""
        return self.launch(seqs, is_decode).result()

    @torch.inference_mode()
    def launch(self, seqs: list[Sequence], is_decode: bool, src_rows: list[int] | None = None) -> StepHandle:
        """Queue forward + sampling and return at once (on CUDA the device works on while the host goes on).

        `src_rows` (decode steps only): for sequence i, the row of the previous launch's sampled
        tokens that is its input token (its host-side last token is still a placeholder), or -1.
        """
        sampled = self._forward_and_sample(seqs, is_decode, src_rows)
        if sampled is None:
            return StepHandle([0] * len(seqs), None, None)
        out, counts = sampled
        return StepHandle(counts, self._staging.stage(out.token_ids), out.logprobs)

    def launch_side(
        self, seqs: list[Sequence], lane: PrefillLane, layers_per_part: int | None = None
    ) -> SideLaunch:
        """A prefill chunk for `lane`'s stream (multiplexed mode), launched a part at a time by
        `SideLaunch.advance` (None: all layers in one part). See common/runner/side_launch.py."""
        return SideLaunch(self, seqs, lane, layers_per_part)

    @torch.inference_mode()
    def launch_on_device(self, seqs: list[Sequence], src_rows: list[int] | None = None) -> torch.Tensor:
        """Like `launch` for steps where each sequence samples one token, but the tokens stay on the
        device (a draft model chains several such steps and reads them back once)."""
        sampled = self._forward_and_sample(seqs, False, src_rows)
        if sampled is None or any(c != 1 for c in sampled[1]):
            raise ValueError("launch_on_device: every sequence must sample exactly one token")
        return sampled[0].token_ids

    def _forward_and_sample(self, seqs: list[Sequence], is_decode: bool, src_rows: list[int] | None):
        logits, counts = self.forward_logits(seqs, is_decode, src_rows)
        if logits is None:
            return None
        out = self.sample(seqs, logits, counts)
        if max(counts) <= 1:
            # At most one token per sequence, one row each in batch order: a step the next may be
            # launched behind (a verification is synchronous, so its tokens never feed the
            # device-side input of a step).
            self._prev_tokens = out.token_ids
            if self.graphs is not None:
                self.graphs.set_prev_tokens(out.token_ids)
        return out, counts

    def forward_logits(
        self, seqs: list[Sequence], is_decode: bool, src_rows: list[int] | None = None
    ) -> tuple[torch.Tensor | None, list[int]]:
        """The step's forward pass on the cheapest path that computes it: a decode graph for
        decode-shaped steps, a prefill graph for prefill and mixed steps that fit one, else eager.
        Returns the sampled rows' logits (None when no sequence samples) and each sequence's count."""
        q_lens = self.graphs.query_lens(seqs) if self.graphs is not None else None
        if q_lens is not None:  # decode, speculative verification, a draft's catch-up: graph rows
            return self.graphs.run(seqs, q_lens, src_rows)
        bucket = (
            self.prefill_graphs.bucket(seqs) if self.prefill_graphs is not None and not is_decode else None
        )
        if bucket is not None:
            return self.prefill_graphs.run(seqs, bucket, src_rows)
        return self._run_eager(seqs, is_decode, src_rows)

    def sample(self, seqs: list[Sequence], logits: torch.Tensor, counts: list[int]):
        """The sampled rows' tokens (and logprobs) from their logits: sampling parameters, grammar
        masks, the sampler."""
        vocab = logits.shape[-1]
        sampling, rows = sampling_rows(seqs, counts)
        batch = prepare_sampling(sampling, vocab, self.device, self.model_config.eos_token_ids, rows)
        batch.allowed = self.grammar.mask(sampling, vocab, self.device, rows)
        return self.sampler(logits, batch)

    def _run_eager(
        self, seqs: list[Sequence], is_decode: bool, src_rows: list[int] | None
    ) -> tuple[torch.Tensor | None, list[int]]:
        """Logits of the sampled rows (None when no sequence samples) and each sequence's row count."""
        if self.tp is None:
            inputs = prepare_step(seqs, self.block_size, self.device, is_decode, self.max_model_len)
        else:  # the plan is plain host lists: cheap to pickle, and each rank builds its own tensors
            plan = plan_step(seqs, self.block_size, is_decode, self.max_model_len)
            self.tp.broadcast(plan)
            inputs = plan.to_inputs(self.device)
        input_ids = inputs.input_ids
        if src_rows is not None:  # launched behind a run-ahead step: placeholders read its tokens
            src = torch.tensor(flat_sources(seqs, src_rows), dtype=torch.int64, device=self.device)
            input_ids = torch.where(src >= 0, self._prev_tokens[src.clamp(min=0)], input_ids)
        if self.tp is None:
            return self._forward(inputs, input_ids)
        with self.tp.guard():
            return self._forward(inputs, input_ids)

    def _forward(self, inputs: StepInputs, input_ids: torch.Tensor) -> tuple[torch.Tensor | None, list[int]]:
        """The model on this rank's shard; every rank of a group runs it for every step (collectives)."""
        set_forward_context(ForwardContext(self.backend, inputs.meta))
        try:
            with use_group(self._group):
                hidden = self.model(input_ids, inputs.positions)
                if not any(inputs.sample_counts):
                    return None, inputs.sample_counts
                return self.model.compute_logits(hidden[inputs.sample_rows]), inputs.sample_counts
        finally:
            set_forward_context(None)

    @torch.inference_mode()
    def serve_steps(self) -> None:
        """Ranks > 0: run each step rank 0 broadcasts, until it broadcasts None (stop)."""
        while (plan := self.tp.broadcast()) is not None:
            inputs = plan.to_inputs(self.device)
            self._forward(inputs, inputs.input_ids)
