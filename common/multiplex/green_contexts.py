"""CUDA backend of `SMPartitions`: prefill lanes on green contexts (torch.cuda.green_contexts).

Imported only on CUDA (`partitions.build_partitions`). At start-up it creates one green context per
share size (eighths of the device, rounded down to the SM granularity), takes one stream from each,
and checks each share with a bf16 GEMM against a float32 reference on the engine's stream: cuBLAS
picks its kernels from the whole device's SM count, and a kernel that assumes all of them are
resident (a persistent or stream-K kernel) can compute wrong results or never finish on a share.
A share that fails (wrong values, an error, or no completion within the timeout) is dropped with a
log line; when none passes, `build` raises RuntimeError and the engine runs aggregated instead.

The whole-device lane is a plain stream (no green context): it is what a chunk gets while nothing
decodes, and the top rung of the controller's ladder when decode is far under its target.

Decode steps run on a stream of the highest priority (`engine_scope`; `PDSERVE_MUX_DECODE_PRIORITY=0`
keeps the current stream instead): a prefill chunk on a share leaves the other SMs to decode, but
decode kernels launched with a grid for the whole device also queue for the share's SMs, and there
the block scheduler then serves them before the prefill's waiting blocks.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from common.env_flags import env_switch
from common.multiplex.partitions import Completion, PrefillLane

log = logging.getLogger(__name__)

# Green-context SM counts are multiples of this (Hopper's granularity; a multiple of Ampere's too).
SM_GRANULARITY = 8
# The bf16 GEMM's error, relative to the largest reference value, that still counts as right: bf16
# rounding of the output is 2^-8 of each value; a wrong kernel is off by O(1).
GEMM_TOLERANCE = 2e-2
# (m, k, n) of the check: a prefill-sized GEMM and a decode-sized (skinny) one.
GEMM_SHAPES = ((4096, 4096, 4096), (64, 4096, 4096))
GEMM_TIMEOUT_S = 20.0


def share_sizes(total_sms: int, granularity: int = SM_GRANULARITY) -> list[int]:
    """SM counts of the green-context shares: 2/8 .. 7/8 of the device, rounded down to `granularity`,
    without repeats, each at least `granularity` and less than the whole device."""
    if total_sms <= 0 or granularity <= 0:
        raise ValueError(f"total_sms and granularity must be positive, got {total_sms}, {granularity}")
    sizes = {(total_sms * eighths // 8) // granularity * granularity for eighths in range(2, 8)}
    return sorted(s for s in sizes if granularity <= s < total_sms)


@dataclass
class CudaCompletion:
    event: torch.cuda.Event

    def done(self) -> bool:
        return self.event.query()

    def wait(self) -> None:
        self.event.synchronize()


@dataclass
class CudaLane:
    """A stream on `sms` SMs (None: a plain stream on the whole device); `owner` keeps its green
    context alive (destroying the context destroys its streams)."""

    sms: int | None
    stream: Any  # torch.cuda.Stream or ExternalStream
    device: torch.device
    owner: Any = field(default=None, repr=False)

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield

    def resume(self) -> contextlib.AbstractContextManager[None]:
        return torch.cuda.stream(self.stream)

    def record(self) -> Completion:
        event = torch.cuda.Event()
        event.record(self.stream)
        return CudaCompletion(event)


class GreenContextPartitions:
    """Green-context lanes that passed the GEMM check, smallest first, then the whole-device lane.
    Build with `build` (creates contexts and runs kernels: no work in the constructor).
    `gemm_errors`: each checked share's measured relative error (inf: it failed to run)."""

    def __init__(
        self, lanes: tuple[PrefillLane, ...], gemm_errors: dict[int, float], decode_stream: Any = None
    ) -> None:
        self._lanes = lanes
        self.gemm_errors = gemm_errors
        self.decode_stream = decode_stream  # None: steps run on the caller's current stream

    @property
    def lanes(self) -> tuple[PrefillLane, ...]:
        return self._lanes

    @contextlib.contextmanager
    def engine_scope(self) -> Iterator[None]:
        """Run the step on the decode stream, ordered after the caller's stream on entry and before
        it on exit (work outside the step, such as a CUDA-graph capture or a test's own reads,
        stays on the caller's stream)."""
        if self.decode_stream is None:
            yield
            return
        caller = torch.cuda.current_stream(self.decode_stream.device)
        self.decode_stream.wait_stream(caller)
        try:
            with torch.cuda.stream(self.decode_stream):
                yield
        finally:
            caller.wait_stream(self.decode_stream)

    @classmethod
    def build(cls, device: torch.device) -> GreenContextPartitions:
        total = torch.cuda.get_device_properties(device).multi_processor_count
        lanes: list[PrefillLane] = []
        errors: dict[int, float] = {}
        for sms in share_sizes(total):
            lane, errors[sms] = _checked_lane(sms, device)
            if lane is not None:
                lanes.append(lane)
        if not lanes:
            raise RuntimeError(
                f"no SM share passed the bf16 GEMM check (relative errors {errors}); "
                "multiplexed mode is refused on this device"
            )
        lanes.append(CudaLane(None, torch.cuda.Stream(device=device), device))
        log.info("prefill SM shares in use: %s of %d SMs", [lane.sms for lane in lanes[:-1]], total)
        decode = None
        if env_switch("PDSERVE_MUX_DECODE_PRIORITY", True):
            decode = torch.cuda.Stream(device=device, priority=-100)  # clamped to the highest there is
        return cls(tuple(lanes), errors, decode)


def _checked_lane(sms: int, device: torch.device) -> tuple[CudaLane | None, float]:
    """A lane on a new `sms`-SM green context and its GEMM error; no lane when the share fails."""
    try:
        context, stream = green_stream(sms, device)
        lane = CudaLane(sms, stream, device, owner=context)
        error = gemm_error(lane)
    except (RuntimeError, TypeError, AttributeError) as exc:  # no green contexts, a CUDA error
        log.warning("SM share of %d SMs dropped: %s: %s", sms, type(exc).__name__, exc)
        return None, math.inf
    if not error <= GEMM_TOLERANCE:
        log.warning("SM share of %d SMs dropped: bf16 GEMM relative error %.3g", sms, error)
        return None, error
    return lane, error


# (device index, SMs) -> (green context, its stream), kept for the life of the process. Memory used on
# a stream records an event there when it is freed (pinned host buffers, cached device blocks), in
# whatever order the garbage collector frees an engine; a destroyed context makes that record abort the
# process ("context is destroyed"). So contexts are never destroyed, and a later engine reuses them.
_GREEN_STREAMS: dict[tuple[int, int], tuple[Any, Any]] = {}


def green_stream(sms: int, device: torch.device) -> tuple[Any, Any]:
    """(green context, one of its streams) on `sms` SMs of `device`; the same pair for the process."""
    from torch.cuda.green_contexts import GreenContext

    index = device.index if device.index is not None else torch.cuda.current_device()
    if (index, sms) not in _GREEN_STREAMS:
        try:
            context = GreenContext.create(num_sms=sms, device_id=index)
        except TypeError:  # releases whose binding takes the arguments by position only
            context = GreenContext.create(sms, index)
        _GREEN_STREAMS[index, sms] = (context, context.Stream())
    return _GREEN_STREAMS[index, sms]


def gemm_error(lane: CudaLane, timeout_s: float = GEMM_TIMEOUT_S) -> float:
    """Largest relative error of bf16 GEMMs (`GEMM_SHAPES`) run on `lane` against float32 references
    computed on the current stream; RuntimeError when the lane does not finish within `timeout_s`."""
    gen = torch.Generator(device=lane.device).manual_seed(0)
    worst = 0.0
    for m, k, n in GEMM_SHAPES:
        a = torch.randn(m, k, device=lane.device, generator=gen).to(torch.bfloat16)
        b = torch.randn(k, n, device=lane.device, generator=gen).to(torch.bfloat16)
        ref = a.float() @ b.float()
        with lane.activate():
            out = a @ b
        _wait(lane.record(), timeout_s, lane.sms)
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        worst = max(worst, err if math.isfinite(err) else math.inf)
    return worst


def _wait(done: Completion, timeout_s: float, sms: int | None) -> None:
    deadline = time.monotonic() + timeout_s
    while not done.done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"a GEMM on the {sms}-SM share did not finish within {timeout_s:.0f} s")
        time.sleep(0.001)
