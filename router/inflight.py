"""The bound on generation requests in flight, enforced before a request's body is read.

A request counts from the moment its headers arrive until its response (stream included) ends, so
the bound covers requests being parsed, tokenized, queued and streamed alike. Past the bound the
answer is a 429 with `Retry-After` and an OpenAI error JSON, sent without reading the body: an
overloaded router spends almost nothing on the requests it turns away, which keeps it serving the
ones it admitted instead of collapsing under parsing work it cannot finish.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from router.errors import APIError
from router.route_planner import RETRY_AFTER
from router.router_metrics import RouterMetrics

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


def is_generation(scope: Scope) -> bool:
    return scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path") in GENERATION_PATHS


class InflightBound:
    """Counts generation requests in flight against `limit`; `count` is what /metrics shows."""

    def __init__(self, limit: int, metrics: RouterMetrics) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        self.limit = limit
        self.count = 0
        self._metrics = metrics

    def try_enter(self) -> bool:
        if self.count >= self.limit:
            self._metrics.requests.inc(status="rejected")
            return False
        self.count += 1
        self._metrics.running.set(self.count)
        return True

    def leave(self) -> None:
        self.count -= 1
        self._metrics.running.set(self.count)


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
