"""The engine loop: requests in, one scheduler step + one forward pass per `step()`, token updates out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.config import EngineConfig
from common.core import run_ahead
from common.core.batch import SchedulerConfig
from common.core.block_manager import BlockManager
from common.core.scheduler import Scheduler
from common.core.sequence import Sequence
from common.core.split_scheduler import SplitScheduler
from common.core.step_records import EngineLoad, SequencesFailed, StepResult, StepTimings
from common.device import resolve_platform
from common.model_config import ModelConfig
from common.multiplex.build import build_multiplexed_steps
from common.multiplex.partitions import SMPartitions, partitions_for
from common.multiplex.stepper import MultiplexedSteps
from common.runner.aggregated_steps import AggregatedSteps
from common.runner.grammar_admission import GrammarAdmission
from common.runner.model_runner import ModelRunner
from common.spec_decode.proposer_speculator import build_speculator
from common.spec_decode.speculator import Speculator
from common.wire.blocks import blocks_for
from common.wire.kv_events import KVEvent
from common.wire.sampling_params import SamplingParams
from common.wire.token_ids import check_token_ids

if TYPE_CHECKING:
    import torch


class LLMEngine:
    """Build with `LLMEngine.from_config(config)` (loads the model and allocates the KV cache).

    `async_scheduling`: launch plain decode steps before the host has their predecessor's tokens
    (`common.core.run_ahead`); `speculator`: speculative decoding, composed by the scheduler;
    `partitions`: multiplexed mode (`common.multiplex`), prefill chunks on these SM shares beside the
    decode steps (None: one batch per step, as usual: `common.runner.aggregated_steps`)."""

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        runner: ModelRunner,
        async_scheduling: bool,
        speculator: Speculator | None = None,
        partitions: SMPartitions | None = None,
    ) -> None:
        self.config = config
        self.model_config = model_config
        self.runner = runner
        self.max_model_len = config.resolve_max_model_len(model_config.max_position_embeddings)
        self.block_manager = BlockManager(
            runner.num_kv_blocks, config.kvcache_block_size, config.enable_prefix_caching, record_events=False
        )
        self.scheduler_config = SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            role=config.role,
            eos_token_ids=frozenset(model_config.eos_token_ids),
            delay_factor=config.scheduler_delay_factor,
        )
        self.timings = StepTimings()
        self.multiplexer: MultiplexedSteps | None = None
        if partitions is None:
            self.scheduler = Scheduler(self.scheduler_config, self.block_manager, speculator)
        else:
            if speculator is not None:
                raise ValueError("multiplexed mode runs without speculation")
            scheduler = SplitScheduler(self.scheduler_config, self.block_manager)
            self.multiplexer = build_multiplexed_steps(
                config, scheduler, runner, partitions, self.timings, async_scheduling
            )
            self.scheduler = scheduler
        self.async_scheduling = async_scheduling
        self.aggregated = AggregatedSteps(
            runner, self.timings, async_scheduling, self.scheduler_config.max_num_batched_tokens
        )
        self.grammars = GrammarAdmission(runner.grammar, model_config.vocab_size)

    def replace_speculator(self, speculator: Speculator | None) -> None:
        """Speculate with `speculator` from now on (None: not at all), for benchmarks comparing
        speculators on one loaded model. Only between requests: the scheduler is rebuilt around it."""
        sched = self.scheduler
        if self.has_unfinished or sched.num_unfinished or sched.handed_off:
            raise ValueError("replace_speculator: the engine still has requests")
        if self.multiplexer is not None:
            raise ValueError("replace_speculator: multiplexed mode runs without speculation")
        self.scheduler = Scheduler(self.scheduler_config, self.block_manager, speculator)

    @classmethod
    def from_config(cls, config: EngineConfig, runner_cls: type[ModelRunner] = ModelRunner) -> LLMEngine:
        """The one way to build an engine: model, KV cache and (when configured) the speculator.
        `runner_cls` lets a caller size the KV cache its own way (cluster workers sharing a GPU pass
        `SharedGpuRunner`); everything else is built the same for every caller."""
        model_config = ModelConfig.from_dir(config.model)
        max_model_len = config.resolve_max_model_len(model_config.max_position_embeddings)
        platform = resolve_platform(config.device)
        runner = runner_cls.load(config, model_config, platform, max_model_len)
        partitions = partitions_for(config, platform)
        if config.pd_multiplex and partitions is None:
            config = config.with_overrides(pd_multiplex=False)
        ahead = run_ahead.enabled(config, runner.platform.is_cuda)
        speculator = build_speculator(config, model_config, runner, max_model_len, ahead)
        return cls(config, model_config, runner, ahead, speculator, partitions)

    # ---- requests ------------------------------------------------------------------------------
    def make_sequence(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        num_prompt_tokens: int | None = None,
    ) -> Sequence:
        """Validate a request and wrap it in a Sequence (raises ValueError; nothing is queued).

        `num_prompt_tokens` (default: all of `prompt_token_ids`) puts the prompt/completion boundary
        earlier, for a sequence that arrives with completion tokens already sampled elsewhere."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        self.validate_token_ids(prompt_token_ids)
        self._validate_sampling_ids(params)
        seq = Sequence(
            prompt_token_ids, params, self.config.kvcache_block_size, request_id, num_prompt_tokens
        )
        self.scheduler.validate(seq)
        return seq

    def prepare_grammar(self, seq: Sequence) -> None:
        """Build `seq`'s grammar matcher now, on this thread (ValueError if refused), so that
        `add_sequence` schedules it at once: for callers that want the refusal up front (the offline
        `LLM`). Without it a grammar request is built aside (`GrammarAdmission`)."""
        if seq.sampling_params.grammar is not None:
            self.runner.grammar.check(seq, self.model_config.vocab_size)

    def validate_token_ids(self, token_ids: list[int]) -> None:
        if not isinstance(token_ids, list | tuple) or len(token_ids) == 0:
            raise ValueError("prompt must contain at least one token")
        check_token_ids("prompt", token_ids, self.model_config.vocab_size)

    def _validate_sampling_ids(self, params: SamplingParams) -> None:
        """The ids the sampler indexes the logits with: stop tokens (banned until min_tokens) and
        biased tokens."""
        vocab = self.model_config.vocab_size
        check_token_ids("stop_token_ids", params.stop_token_ids, vocab)
        check_token_ids("logit_bias", [token for token, _ in params.logit_bias], vocab)

    def add_request(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> Sequence:
        seq = self.make_sequence(prompt_token_ids, params, request_id)
        self.add_sequence(seq)
        return seq

    def abort(self, request_ids: list[str]) -> list[Sequence]:
        held = self.grammars.abort(request_ids, self.scheduler)
        if self.multiplexer is not None:
            return held + self.multiplexer.abort(request_ids)
        return held + self.scheduler.abort(request_ids)

    @property
    def has_unfinished(self) -> bool:
        return self._busy() or self.grammars.num_joining > 0

    def _busy(self) -> bool:
        """Work for the next step besides grammar requests still being built."""
        chunk = self.multiplexer is not None and self.multiplexer.in_flight
        return self.scheduler.has_work or self.aggregated.in_flight is not None or chunk

    # ---- the loop ------------------------------------------------------------------------------
    def step(self) -> StepResult:
        """One step; grammar requests whose matcher got ready join the scheduler first, and those
        refused come back in `rejected`. A step that failed for some requests alone raises
        `SequencesFailed` (their ids and the step's result so far); abort them to go on."""
        rejected = self.grammars.admit_ready(self.scheduler, busy=self._busy()) if len(self.grammars) else []
        try:
            result = self._step()
        except SequencesFailed as e:  # the step's outcome so far travels with it, rejections included
            e.result.rejected = rejected
            raise
        result.rejected = rejected
        return result

    def _step(self) -> StepResult:
        if self.multiplexer is not None:
            result = StepResult()
            self.multiplexer.step(result)
            return result
        return self.aggregated.step(self.scheduler)

    def close(self) -> None:
        """Stop the tensor-parallel worker processes, if any, and the grammar threads (idempotent; also
        runs at exit/GC)."""
        self.grammars.close()
        self.runner.close()

    def record_kv_events(self, on: bool) -> None:
        """Whether the prefix cache keeps its events for `drain_kv_events`. Off from construction: only
        a worker that publishes them turns it on, so an engine nobody drains (offline, benchmarks that
        call `step()`) does not pile them up. Turning it off drops what was kept."""
        if not on:
            self.block_manager.drain_events()
        self.block_manager.record_events = on

    def drain_kv_events(self) -> list[KVEvent]:
        return self.block_manager.drain_events()

    # ---- worker roles --------------------------------------------------------------------------
    # The cluster roles (prefill_worker, decode_worker, common/worker) use only the verbs below and
    # the request methods above, never the scheduler, block manager or runner directly: these
    # delegate, so the engine's internals can change without touching the roles.

    @property
    def block_size(self) -> int:
        return self.config.kvcache_block_size

    @property
    def kv_cache(self) -> torch.Tensor:
        """The KV cache tensor the KV transfer reads (prefill) or writes (decode) blocks of."""
        return self.runner.kv_cache

    def add_sequence(self, seq: Sequence) -> None:
        """Queue a sequence made by `make_sequence` (its prompt is computed here); one with a grammar
        not yet built waits aside until it is (`GrammarAdmission`)."""
        if seq.sampling_params.grammar is not None and seq.grammar_state is None:
            self.grammars.hold(seq)
        else:
            self.scheduler.add(seq)

    def cached_hashes(self) -> list[int]:
        """Hashes of every full block the prefix cache holds now (for a snapshot)."""
        return self.block_manager.cached_hashes()

    def prompt_block_ids(self, seq: Sequence) -> list[int]:
        """The physical blocks that hold `seq`'s prompt (the last one may be partly filled)."""
        return seq.block_table[: blocks_for(seq.num_prompt_tokens, self.block_size)]

    def reserve_transfer(self, seq: Sequence) -> bool:
        """Allocate blocks for the prompt KV that a transfer will write; False while there is no room.
        A grammar's matcher is built aside meanwhile (`GrammarAdmission.prebuild`)."""
        if not self.scheduler.reserve_for_transfer(seq):
            return False
        if seq.sampling_params.grammar is not None and seq.grammar_state is None:
            self.grammars.prebuild(seq)
        return True

    def complete_transfer(self, seq: Sequence) -> None:
        """The reserved blocks hold the prompt's KV: the sequence joins the running batch (once its
        grammar's matcher is built, if it has one: a later `step` moves it)."""
        if self.grammars.arrived(seq):
            self.scheduler.complete_transfer(seq)

    def fail_transfer(self, seq: Sequence) -> None:
        """The transfer will not arrive: free the reserved blocks and compute the prompt here."""
        self.grammars.forget(seq)
        self.scheduler.fail_transfer(seq)

    def release_handoff(self, seq: Sequence) -> None:
        """Prefill role: the receiver has its copy; unpin the blocks (they stay in the prefix cache)."""
        self.scheduler.release(seq)

    def load_report(self) -> EngineLoad:
        sched, bm = self.scheduler, self.block_manager
        return EngineLoad(
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            num_waiting=len(sched.waiting) + self.grammars.num_queued,
            num_running=len(sched.running),
            num_transferring=len(sched.transferring),
            queued_prefill_tokens=sched.queued_prefill_tokens,
        )
