"""Keep the launcher's own /health polling out of the access log.

`python -m deploy.launch` polls `/health` every 0.25 s until the cluster is up (a minute on a small
CPU box: a hundred `GET /health 503` lines before anything a person wants to read). Those polls say
who they are with the User-Agent `LAUNCHER_AGENT`; the middleware marks such a request in a context
variable, and a filter on uvicorn's access logger drops its line. uvicorn writes the access line from
the `send` the application calls, so the line is emitted inside the request's context and the mark
is visible there. Every other access line (curl's /health included) is kept.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from starlette.types import ASGIApp, Receive, Scope, Send

LAUNCHER_AGENT = "pdserve-launch"
ACCESS_LOGGER = "uvicorn.access"
_LAUNCHER_PROBE: ContextVar[bool] = ContextVar("launcher_probe", default=False)


class LauncherProbeMiddleware:
    """Marks the launcher's `GET /health` polls (by their User-Agent) as not worth an access line."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != "/health" or not _from_launcher(scope):
            await self.app(scope, receive, send)
            return
        token = _LAUNCHER_PROBE.set(True)
        try:
            await self.app(scope, receive, send)
        finally:
            _LAUNCHER_PROBE.reset(token)


class LauncherProbeFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _LAUNCHER_PROBE.get()


def quiet_launcher_probes() -> None:
    """Install the filter on uvicorn's access logger (idempotent)."""
    access = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, LauncherProbeFilter) for f in access.filters):
        access.addFilter(LauncherProbeFilter())


def _from_launcher(scope: Scope) -> bool:
    agent = next((v for k, v in scope.get("headers") or () if k == b"user-agent"), b"")
    return agent.decode("latin-1") == LAUNCHER_AGENT
