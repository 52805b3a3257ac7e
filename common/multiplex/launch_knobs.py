"""How multiplexed mode launches its prefill chunks: in parts or whole (`PDSERVE_MUX_LAYERS_PER_PART`), and
whether each SM share replays prefill graphs of its own (`PDSERVE_MUX_SHARE_GRAPHS`, captured here)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from common.env_flags import env_int, env_switch

if TYPE_CHECKING:
    from common.multiplex.partitions import SMPartitions
    from common.runner.model_runner import ModelRunner

log = logging.getLogger(__name__)


def layers_per_part() -> int | None:
    """Layers launched per part of a chunk while sequences decode (`PDSERVE_MUX_LAYERS_PER_PART`;
    0, the default: the whole chunk at once, the form measured on the H200 so far)."""
    n = env_int("PDSERVE_MUX_LAYERS_PER_PART", 0, 0, 10_000)
    return n or None


def share_graphs_enabled() -> bool:
    """`PDSERVE_MUX_SHARE_GRAPHS=1`: each SM share gets prefill graphs captured on it, so chunks there
    launch as one graph too (common/runner/prefill_graphs.py); 0: chunks on shares launch eager."""
    return env_switch("PDSERVE_MUX_SHARE_GRAPHS", default=True)


def capture_share_graphs(runner: ModelRunner, partitions: SMPartitions) -> None:
    """A set of prefill graphs per SM share. Each set holds its own activation memory (the caching
    allocator reuses a block only on the stream that freed it), which the KV budget did not count:
    out of memory, the remaining shares launch their chunks eager."""
    graphs = runner.prefill_graphs
    if graphs is None:
        return
    for lane in partitions.lanes:
        if lane.sms is None:
            continue
        try:
            graphs.capture(lane)
        except torch.OutOfMemoryError:
            log.warning(
                "no memory for prefill graphs on the %d-SM share: it and the rest launch eager", lane.sms
            )
            return
