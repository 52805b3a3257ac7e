"""The backend interface of multiplexed mode: SM shares of the device that a prefill chunk runs on.

Only the prefill side is restricted. Decode steps (CUDA graphs captured the ordinary way) run on the
engine's usual stream over the whole device; a prefill chunk runs on a `PrefillLane`, a stream bound
to a share of the SMs (a CUDA green context), so the decode kernels always find the SMs outside that
share free. When no decode batch runs, the chunk takes the whole-device lane.

Backends:
* `InlinePartitions` (CPU, and any device without green contexts): one whole-device lane whose work
  runs synchronously on the caller's stream; a chunk is complete when its launch returns. It runs the
  multiplexing logic exactly, without overlap, which is what the CPU tests check.
* `common.multiplex.green_contexts.GreenContextPartitions` (CUDA): imported only on CUDA.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from common.config import EngineConfig
from common.device import DevicePlatform

log = logging.getLogger(__name__)


class Completion(Protocol):
    """The end of the work launched on a lane so far (a recorded CUDA event, or already done)."""

    def done(self) -> bool:
        """True once the work has finished (never blocks)."""
        ...

    def wait(self) -> None:
        """Block until the work has finished."""
        ...


class PrefillLane(Protocol):
    """A stream on a share of the device's SMs. `sms` None: the whole device."""

    sms: int | None

    def activate(self) -> contextlib.AbstractContextManager[None]:
        """Make the lane's stream current; work launched inside runs after everything already
        launched on the engine's stream (so it sees finished KV and inputs)."""
        ...

    def resume(self) -> contextlib.AbstractContextManager[None]:
        """Make the lane's stream current again, without waiting for the engine's stream (the next
        part of work that `activate` started)."""
        ...

    def record(self) -> Completion:
        """A completion for the work launched on the lane so far."""
        ...


class SMPartitions(Protocol):
    """The lanes a prefill chunk can run on, smallest share first; the last is the whole device."""

    @property
    def lanes(self) -> tuple[PrefillLane, ...]: ...

    def engine_scope(self) -> contextlib.AbstractContextManager[None]:
        """The stream every multiplexed step runs in (decode steps, chunk launches): the CUDA
        backend's high-priority decode stream, so that where the decode and prefill kernels meet
        on an SM the decode blocks are scheduled first."""
        ...


class _Done:
    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None


@dataclass
class InlineLane:
    """The caller's own stream: work is complete when its launch returns (the CPU)."""

    sms: int | None = None

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        yield

    def resume(self) -> contextlib.AbstractContextManager[None]:
        return self.activate()

    def record(self) -> Completion:
        return _Done()


class InlinePartitions:
    """One whole-device lane, no overlap (see the module docstring)."""

    def __init__(self) -> None:
        self._lanes: tuple[PrefillLane, ...] = (InlineLane(),)

    @property
    def lanes(self) -> tuple[PrefillLane, ...]:
        return self._lanes

    def engine_scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def partitions_for(config: EngineConfig, platform: DevicePlatform) -> SMPartitions | None:
    """The SM shares of multiplexed mode when `config` asks for it; None when not, or when the device
    offers no share that computes right (logged: the engine then runs aggregated, one batch a step)."""
    if not config.pd_multiplex:
        return None
    try:
        return build_partitions(platform)
    except RuntimeError as e:
        log.error("multiplexed mode refused, running aggregated: %s", e)
        return None


def build_partitions(platform: DevicePlatform) -> SMPartitions:
    """The partitions for `platform`: green contexts on CUDA (checked at start-up, see
    `green_contexts.py`; raises RuntimeError when no share passes), inline elsewhere."""
    if not platform.is_cuda:
        log.info("multiplexed mode on %s: prefill chunks run inline (no SM shares)", platform.type)
        return InlinePartitions()
    from common.multiplex.green_contexts import GreenContextPartitions

    return GreenContextPartitions.build(platform.torch_device)
