"""How multiplexed mode launches its prefill chunks: in parts or whole (`PDSERVE_MUX_LAYERS_PER_PART`),
after the engine step's decode step or beside it (`PDSERVE_MUX_CHUNK_AFTER_DECODE`), and whether each
SM share replays prefill graphs of its own (`PDSERVE_MUX_SHARE_GRAPHS`, captured here)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from common.env_flags import env_int, env_switch
from common.runner.kv_cache import activation_reserve

if TYPE_CHECKING:
    from common.config import EngineConfig
    from common.model_config import ModelConfig
    from common.multiplex.partitions import PrefillLane, SMPartitions
    from common.runner.model_runner import ModelRunner

log = logging.getLogger(__name__)


def layers_per_part() -> int | None:
    """Layers launched per part of a chunk while sequences decode (`PDSERVE_MUX_LAYERS_PER_PART`;
    0, the default: the whole chunk at once, the form measured on the H200 so far)."""
    n = env_int("PDSERVE_MUX_LAYERS_PER_PART", 0, 0, 10_000)
    return n or None


def chunk_after_decode() -> bool:
    """`PDSERVE_MUX_CHUNK_AFTER_DECODE=1`: a new chunk starts on the device after the decode step
    launched in its engine step, not beside it from the start. Off by default: on the H100's 8B shape
    it brought the first decode step beside a new chunk down to the others' time (9.0 against 11.2 ms)
    and ITL max to 0.82x, with output and ITL p99 unchanged; the real model has not run with it
    (docs/benchmarks.md "The decode help as the default")."""
    return env_switch("PDSERVE_MUX_CHUNK_AFTER_DECODE", default=False)


def share_graphs_enabled() -> bool:
    """`PDSERVE_MUX_SHARE_GRAPHS=1`: each SM share gets prefill graphs captured on it, so chunks there
    launch as one graph too (common/runner/prefill_graphs.py); 0: chunks on shares launch eager."""
    return env_switch("PDSERVE_MUX_SHARE_GRAPHS", default=True)


def graph_floor_enabled() -> bool:
    """The split stays off shares without prefill graphs (`graph_floor`); `PDSERVE_MUX_GRAPH_FLOOR=0` lets
    it go lower. On by default since session 36 (docs/benchmarks.md): on the H100's 8B shape at two long
    prompts a second it kept the solo-ratio split from the collapse session 32 measured."""
    return env_switch("PDSERVE_MUX_GRAPH_FLOOR", default=True)


def share_set_fits(free_bytes: int, set_bytes: int, keep_free: int) -> bool:
    """Whether one more set of share graphs (`set_bytes`, as the largest set so far took) still leaves
    `keep_free` bytes of the device free: room for a chunk launched eager on a share without graphs."""
    return free_bytes - set_bytes >= keep_free


def eager_chunk_room(config: EngineConfig, model_config: ModelConfig) -> int:
    """Device memory kept free for chunks launched eager on shares without graphs: one step's
    activations (`activation_reserve`) and half as much again. The half is for what the caching
    allocator cannot hand back (blocks split between the shares' streams) and memory outside PyTorch
    that grows once serving starts: on an 80-GB H100 the Qwen3-8B shape ran out with 0.68 GiB reserved
    but unusable and 2.48 GiB free at start-up against a 1.93-GiB reserve (2026-12-05)."""
    reserve = activation_reserve(config, model_config)
    return reserve + reserve // 2


def largest_share_first(lanes: Iterable[PrefillLane]) -> list[PrefillLane]:
    """The SM-share lanes (not the whole device's), largest share first: the order sets are captured in."""
    shares = [lane for lane in lanes if lane.sms is not None]
    return sorted(shares, key=lambda lane: lane.sms or 0, reverse=True)


def capture_share_graphs(runner: ModelRunner, partitions: SMPartitions) -> None:
    """A set of prefill graphs per SM share, largest share first: under load chunks run on the largest
    shares (a mean of 105-112 of 132 SMs on the H100 in every arm measured), so those get graphs
    before memory runs short. Each set holds its own activation memory (the caching allocator reuses
    a block only on the stream that freed it), which the KV budget did not count. Capturing stops
    while one more set would leave less free than `eager_chunk_room`, so the shares left without
    graphs launch their chunks eager with room to do so."""
    graphs = runner.prefill_graphs
    if graphs is None:
        return
    keep_free = eager_chunk_room(runner.config, runner.model_config)
    for lane in largest_share_first(partitions.lanes):
        free = torch.cuda.mem_get_info(runner.device)[0]
        if not share_set_fits(free, graphs.largest_set_bytes, keep_free):
            log.warning(
                "no room for prefill graphs on the %d-SM share (%.2f GiB free, a set takes %.2f, eager"
                " chunks keep %.2f): it and the smaller shares launch eager",
                lane.sms,
                free / 2**30,
                graphs.largest_set_bytes / 2**30,
                keep_free / 2**30,
            )
            return
        try:
            graphs.capture(lane)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()  # what the failed set held goes back for the eager chunks
            log.warning(
                "no memory for prefill graphs on the %d-SM share: it and the smaller shares launch eager",
                lane.sms,
            )
            return


def graph_floor(lanes: Sequence[PrefillLane], has_graphs: Callable[[int | None], bool]) -> int:
    """The lowest ladder rung the share controller may use (`ControllerConfig.lowest_rung`): the index
    in `lanes` (smallest share first, the whole device last) of the smallest share with prefill graphs
    (`has_graphs(sms)`), when a smaller share has none; 0 when every share or none has them. The
    controller's docstring says why a share that launches eager is no rung below one with graphs."""
    return next((i for i, lane in enumerate(lanes) if lane.sms is not None and has_graphs(lane.sms)), 0)
