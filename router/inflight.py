"""The bound on generation requests in flight, enforced before a request's body is read.

A request counts from the moment its headers arrive until its response (stream included) ends, so
the bound covers requests being parsed, tokenized, queued and streamed alike. Past the bound the
answer is a 429 with `Retry-After` and an OpenAI error JSON, sent without reading the body: an
overloaded router spends almost nothing on the requests it turns away, which keeps it serving the
ones it admitted instead of collapsing under parsing work it cannot finish.

With several fronts (deploy.launch --api-servers N) the bound is one for all of them: each front
publishes its own count in a shared slot and admits while the sum is below the limit (the mechanism,
and why it may admit up to N - 1 requests too many when fronts race, are in router/front_slots.py).
A front started alone (`python -m router`, or without --fronts-dir) counts only its own requests.

`--admission-wait S` (default 0: answer at once) holds a request that finds the bound full for up to S
seconds, first come first served, before the 429; it is admitted as soon as a place frees. The idea:
a shed request is gone, so places freed by a burst of completions stay empty until the next arrivals.
Measured on the CPU box at twice the capacity (docs/benchmarks.md): 0.5 s made no measurable
difference to the completed rate, so the default stays 0. At most `limit` requests wait; past that
the 429 is immediate. This front's own completions wake the first waiter at once; places freed on
other fronts are seen by polling the shared slots every `POLL_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from starlette.types import ASGIApp, Receive, Scope, Send

from router.errors import APIError
from router.front_slots import FrontSlots
from router.route_planner import RETRY_AFTER
from router.router_metrics import RouterMetrics

POLL_S = 0.01  # how often a waiting request rereads the other fronts' slots
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses"})


def is_generation(scope: Scope) -> bool:
    return scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path") in GENERATION_PATHS


class InflightBound:
    """Counts this front's generation requests in flight (`count`, what its /metrics shows) against
    `limit`, together with the other fronts' counts when `shared` slots are given (mapped by `open`)."""

    def __init__(self, limit: int, metrics: RouterMetrics, shared: FrontSlots | None = None) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        self.limit = limit
        self.count = 0
        self._metrics = metrics
        self._shared = shared
        self._slots: FrontSlots | None = None  # `shared` once mapped
        self._waiting: deque[asyncio.Event] = deque()  # requests held for a place, first come first

    def open(self) -> None:
        """Map the shared slots (zeroing this front's: a restarted front holds nothing yet)."""
        if self._shared is not None:
            self._shared.open()
            self._slots = self._shared

    def close(self) -> None:
        """Unmap the slots; requests still ending afterwards count only here."""
        if self._slots is not None:
            self._slots.set_own(0)
            self._slots.close()
            self._slots = None

    @property
    def total(self) -> int:
        """Requests in flight on every front sharing the bound (this one alone without shared slots)."""
        return self.count + (self._slots.others() if self._slots is not None else 0)

    def try_enter(self) -> bool:
        """Admit now if there is room and nobody waits; else count the rejection."""
        if not self._waiting and self._admit():
            return True
        self._metrics.requests.inc(status="rejected")
        return False

    async def enter(self, wait_s: float) -> bool:
        """Admit now, or within `wait_s` seconds once a place frees (first come, first served)."""
        if wait_s <= 0 or len(self._waiting) >= self.limit or (not self._waiting and self.total < self.limit):
            return self.try_enter()
        turn = asyncio.Event()
        self._waiting.append(turn)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        try:
            while not (self._waiting[0] is turn and self._admit()):
                left = deadline - loop.time()
                if left <= 0:
                    self._metrics.requests.inc(status="rejected")
                    return False
                turn.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(turn.wait(), min(left, POLL_S) if self._slots else left)
            return True
        finally:
            self._waiting.remove(turn)
            if self._waiting:
                self._waiting[0].set()  # the next in line looks at once

    def leave(self) -> None:
        self._set(self.count - 1)
        if self._waiting:
            self._waiting[0].set()

    def _admit(self) -> bool:
        # No await between the read in `total` and the write in `_set`: this front admits at most one
        # request on a stale picture of the others (see router/front_slots.py).
        if self.total >= self.limit:
            return False
        self._set(self.count + 1)
        return True

    def _set(self, count: int) -> None:
        self.count = count
        self._metrics.running.set(count)
        if self._slots is not None:
            self._slots.set_own(count)


class InflightGate:
    """ASGI middleware: admits a generation request only while the bound has room (or once it has,
    within `wait_s`)."""

    def __init__(self, app: ASGIApp, bound: InflightBound, wait_s: float = 0.0) -> None:
        self.app = app
        self.bound = bound
        self.wait_s = wait_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_generation(scope):
            await self.app(scope, receive, send)
            return
        if not await self.bound.enter(self.wait_s):
            await too_many_requests().response()(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.bound.leave()


def too_many_requests() -> APIError:
    return APIError(
        429, "too many requests in progress; retry later", code="too_many_requests", headers=RETRY_AFTER
    )
