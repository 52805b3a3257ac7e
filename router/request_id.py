"""`X-Request-Id`: accepted from the client, generated when absent, echoed on every response.

An ASGI middleware, outermost, so that every answer carries the header, the router's own errors
(401, 413, 400) included. The id is kept in the request's state (`request.state.request_id`) for the
routes, which log it beside the completion id they create; it does not become the completion id
itself, because two clients may well send the same value and completion ids key the in-flight
streams. A value that is not 1-128 visible ASCII characters is refused with a 400 naming the header
(the answer carries a generated id instead, since the client's cannot be echoed safely). The
router's generated ids (`random_id`, and a completion's `new_id`) are made here too.
"""

from __future__ import annotations

import os

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.wire import request_log
from router.errors import bad_request

HEADER = "x-request-id"
MAX_LENGTH = 128


def valid_request_id(value: str) -> bool:
    """Visible ASCII only (no spaces or control characters), so it is safe in logs and headers."""
    return 0 < len(value) <= MAX_LENGTH and all(33 <= ord(c) < 127 for c in value)


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope)
        refused = given is not None and not valid_request_id(given)
        request_id = random_id() if given is None or refused else given
        scope.setdefault("state", {})["request_id"] = request_id
        echo = _with_header(send, request_id)
        if refused:
            error = bad_request(
                f"X-Request-Id must be 1 to {MAX_LENGTH} visible ASCII characters", param="X-Request-Id"
            )
            await error.response()(scope, receive, echo)
            return
        with request_log.bound(request_id):  # this request's task: its log lines name the id
            await self.app(scope, receive, echo)


def _header(scope: Scope) -> str | None:
    raw = next((v for k, v in scope.get("headers") or () if k == HEADER.encode()), None)
    return None if raw is None else raw.decode("latin-1")


def _with_header(send: Send, request_id: str) -> Send:
    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER.encode()]
            message = {**message, "headers": [*headers, (HEADER.encode(), request_id.encode())]}
        await send(message)

    return send_with_id


def random_id() -> str:
    """32 random hex digits, as a uuid4's hex and as unique, without building a UUID (a fifth of the
    cost; every request makes one or two)."""
    return os.urandom(16).hex()


def new_id(prefix: str) -> str:
    """`prefix-` and a `random_id`: a completion's id."""
    return f"{prefix}-{random_id()}"
