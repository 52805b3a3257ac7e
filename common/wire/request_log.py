"""Every log line about a request names its X-Request-Id, in the router and in the workers.

Torch-free; the router and the workers install it the same way (`configure`). Two ways a line gets
the id, both through the standard logging machinery rather than pasted into messages:

* the context: code running on behalf of one request (the router's request task and the tasks it
  starts, a worker handling that request's command) runs inside `bound(log_id)`, and the handler's
  `RequestIdFilter` reads the context variable;
* an adapter: code that handles many requests in turn (a worker's engine loop) logs through the
  request's own `for_request(logger, log_id)`.

Lines that belong to no request show "-". The id travels to the workers in the wire messages that
already carry request ids (`WorkRequest.log_id`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar

REQUEST_LOG_ID: ContextVar[str | None] = ContextVar("request_log_id", default=None)
NO_REQUEST = "-"


class RequestIdFilter(logging.Filter):
    """Gives every record a `request_id` attribute: the adapter's, else the context's, else "-"."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_LOG_ID.get() or NO_REQUEST
        return True


def configure(level: str, who: str = "") -> None:
    """basicConfig with the request id in every line, and the filter on every root handler (so loggers
    of libraries that log during a request, uvicorn's included, get it too)."""
    prefix = f"{who} " if who else ""
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s %(levelname)s {prefix}[%(request_id)s] %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RequestIdFilter) for f in handler.filters):
            handler.addFilter(RequestIdFilter())


@contextlib.contextmanager
def bound(log_id: str | None) -> Iterator[None]:
    """Run the block on behalf of the request `log_id` (None: leave the context as it is)."""
    if log_id is None:
        yield
        return
    token = REQUEST_LOG_ID.set(log_id)
    try:
        yield
    finally:
        REQUEST_LOG_ID.reset(token)


def for_request(logger: logging.Logger, log_id: str) -> logging.LoggerAdapter:
    """A logger whose lines name `log_id` wherever they are emitted."""
    return logging.LoggerAdapter(logger, {"request_id": log_id})


def current() -> str | None:
    """The request the running code works for, if any."""
    return REQUEST_LOG_ID.get()
