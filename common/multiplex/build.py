"""Multiplexed mode's stepper built from the engine's config (common/multiplex/stepper.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.config import EngineConfig
from common.core.split_scheduler import SplitScheduler
from common.core.step_records import StepTimings
from common.multiplex.controller import ControllerConfig, ShareController
from common.multiplex.inline_budget import DEFAULT_CAP, InlineBudget
from common.multiplex.launch_knobs import (
    capture_share_graphs,
    chunk_after_decode,
    layers_per_part,
    share_graphs_enabled,
)
from common.multiplex.partitions import SMPartitions
from common.multiplex.stepper import MultiplexedSteps

if TYPE_CHECKING:
    from common.runner.model_runner import ModelRunner


def build_multiplexed_steps(
    config: EngineConfig,
    scheduler: SplitScheduler,
    runner: ModelRunner,
    partitions: SMPartitions,
    timings: StepTimings,
    ahead: bool,
) -> MultiplexedSteps:
    """Chunks of up to `max_num_batched_tokens`, shares following `itl_target_ms` (or
    `itl_target_solo_ratio` x the solo decode gap) by the `mux_split` rule, prompts of up to
    `mux_inline_prompt_tokens` inside decode steps (with `mux_inline_measured`:
    prompts up to the measured break-even, at most that many or DEFAULT_CAP); prefill graphs captured
    on the SM shares first, where memory allows (`capture_share_graphs`)."""
    lanes = len(partitions.lanes)
    knee, drain = config.mux_split == "knee", config.mux_split == "drain"
    controller = ShareController(
        ControllerConfig(
            config.itl_target_ms / 1e3,
            num_lanes=lanes,
            knee=knee,
            solo_ratio=config.itl_target_solo_ratio,
            drain=drain,
        )
    )
    if runner.prefill_graphs is not None and share_graphs_enabled():
        capture_share_graphs(runner, partitions)
    inline = config.mux_inline_prompt_tokens
    budget = InlineBudget(inline or DEFAULT_CAP) if config.mux_inline_measured else None
    return MultiplexedSteps(
        scheduler,
        runner,
        partitions,
        controller,
        config.max_num_batched_tokens,
        timings,
        ahead,
        layers_per_part(),
        inline,
        budget,
        chunk_after_decode(),
    )
