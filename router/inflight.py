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
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from router.errors import APIError
from router.front_slots import FrontSlots
from router.route_planner import RETRY_AFTER
from router.router_metrics import RouterMetrics

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


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
        # No await between the read in `total` and the write in `_set`: this front admits at most one
        # request on a stale picture of the others (see router/front_slots.py).
        if self.total >= self.limit:
            self._metrics.requests.inc(status="rejected")
            return False
        self._set(self.count + 1)
        return True

    def leave(self) -> None:
        self._set(self.count - 1)

    def _set(self, count: int) -> None:
        self.count = count
        self._metrics.running.set(count)
        if self._slots is not None:
            self._slots.set_own(count)


class InflightGate:
    """ASGI middleware: admits a generation request only while the bound has room."""

    def __init__(self, app: ASGIApp, bound: InflightBound) -> None:
        self.app = app
        self.bound = bound

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_generation(scope):
            await self.app(scope, receive, send)
            return
        if not self.bound.try_enter():
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
