"""ASGI middleware answering 413 (OpenAI error JSON) for request bodies over a byte limit.

Checks the declared Content-Length first, then counts the bytes actually received (a chunked upload
has no Content-Length), so an oversized body is never parsed. The body is read before the app runs,
which is fine at the sizes allowed here (the limit bounds the memory used).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.errors import APIError


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        messages, total = [], 0
        while True:
            message = await receive()
            messages.append(message)
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        await self.app(scope, _replay(messages, receive), send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = APIError(413, f"request body exceeds {self.max_bytes} bytes", code="request_too_large")
        await error.response()(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()  # later messages, e.g. http.disconnect while streaming

    return replay
