"""Multiplexed mode's stepper built from the engine's config (common/multiplex/stepper.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from common.config import EngineConfig
from common.core.split_scheduler import SplitScheduler
from common.core.step_records import StepTimings
from common.multiplex.controller import ControllerConfig, ShareController
from common.multiplex.inline_budget import DEFAULT_CAP, InlineBudget
from common.multiplex.launch_knobs import (
    capture_share_graphs,
    chunk_after_decode,
    graph_floor,
    graph_floor_enabled,
    layers_per_part,
    share_graphs_enabled,
)
from common.multiplex.partitions import SMPartitions
from common.multiplex.stepper import MultiplexedSteps

if TYPE_CHECKING:
    from common.runner.model_runner import ModelRunner

log = logging.getLogger(__name__)


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
    on the SM shares first, where memory allows (`capture_share_graphs`); with `PDSERVE_MUX_GRAPH_FLOOR=1`
    the split never goes below the smallest share with graphs (`graph_floor`)."""
    graphs = runner.prefill_graphs
    if graphs is not None and share_graphs_enabled():
        capture_share_graphs(runner, partitions)
    floor = 0
    if graphs is not None and graph_floor_enabled():
        floor = graph_floor(partitions.lanes, graphs.has_lane)
    if floor:
        log.info(
            "prefill shares below %d SMs launch eager: the split stays at or above it",
            partitions.lanes[floor].sms,
        )
    knee, drain = config.mux_split == "knee", config.mux_split == "drain"
    controller = ShareController(
        ControllerConfig(
            config.itl_target_ms / 1e3,
            num_lanes=len(partitions.lanes),
            knee=knee,
            solo_ratio=config.itl_target_solo_ratio,
            drain=drain,
            lowest_rung=floor,
        )
    )
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
