"""ASGI middleware guarding request bodies before FastAPI sees them (OpenAI error JSON on every refusal).

- 413 for bodies over a byte limit: the declared Content-Length is checked first, then the bytes actually
  received are counted (a chunked upload has no Content-Length), so an oversized body is never parsed.
- For POST /v1/*: 415 unless the Content-Type is JSON, and 400 for a body that is not strict JSON
  (RFC 8259) holding an object. Python's `json` accepts NaN/Infinity and lone UTF-16 surrogate escapes
  ("\\ud800"), which no client should send and which would otherwise reach the sampler (NaN) or crash
  the tokenizer (a str it cannot encode) with a 500; FastAPI's own answer to an undecodable or
  too-deeply-nested body is a vague "error parsing the body". Checking here names the problem.

The body is read before the app runs, which is fine at the sizes allowed here (the limit bounds the
memory used). The parsed object is left in the request's state (`PARSED_BODY`), so the generation
routes (router/generation_routes.py) validate it without parsing the bytes again.
"""

from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.errors import APIError

JSON_BODY_PATH_PREFIX = "/v1/"
JSON_BODY_ROUTES = frozenset({"/tokenize", "/detokenize"})  # vLLM's, outside /v1/
PARSED_BODY = "json_body"  # key in scope["state"]
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # any \uD800-\uDFFF escape, paired or not


class BodyGuard:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large().response()(scope, receive, send)
            return
        messages, total = [], 0
        while True:
            message = await receive()
            messages.append(message)
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await self._too_large().response()(scope, receive, send)
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        replay = _replay(messages, receive)
        error = accept_json_body(scope, b"".join(m.get("body", b"") for m in messages))
        if error is not None:
            await error.response()(scope, replay, send)
            return
        await self.app(scope, replay, send)

    def _too_large(self) -> APIError:
        return APIError(413, f"request body exceeds {self.max_bytes} bytes", code="request_too_large")


def accept_json_body(scope: Scope, body: bytes) -> APIError | None:
    """Why this request's body is unacceptable, or None (also None for requests that take no JSON).
    An accepted JSON body is kept, parsed, in scope["state"][PARSED_BODY]."""
    path = scope.get("path", "")
    if scope.get("method") != "POST" or not (
        path.startswith(JSON_BODY_PATH_PREFIX) or path in JSON_BODY_ROUTES
    ):
        return None
    media_error = _content_type_error(_header(scope, b"content-type"))
    if media_error is not None:
        return media_error
    try:
        value = parse_strict_json(body)
    except ValueError as e:
        return APIError(400, str(e), code="invalid_json")
    if not isinstance(value, dict):
        return APIError(
            400, f"request body must be a JSON object, got {_json_kind(value)}", code="invalid_json"
        )
    scope.setdefault("state", {})[PARSED_BODY] = value
    return None


def _content_type_error(content_type: bytes | None) -> APIError | None:
    # FastAPI parses only JSON media types; anything else would reach validation as raw bytes and come
    # back as a confusing "Input should be a valid dictionary".
    text = (content_type or b"").decode("latin-1")
    media, _, params = text.partition(";")
    media = media.strip().lower()
    charset = params.lower().replace(" ", "").partition("charset=")[2].split(";")[0].strip('"')
    if (media == "application/json" or media.endswith("+json")) and charset in ("", "utf-8", "utf8"):
        return None
    shown = text.strip() or "none"
    return APIError(
        415, f"Content-Type must be application/json (UTF-8), got {shown}", code="unsupported_media_type"
    )


def parse_strict_json(body: bytes) -> object:
    """RFC 8259 JSON from UTF-8 bytes; ValueError saying what is wrong otherwise."""
    if not body.strip():
        raise ValueError("request body is empty; expected a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"request body is not valid UTF-8 (byte {e.start})") from None
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise ValueError("request body is nested too deeply") from None
    except ValueError as e:  # a syntax error, NaN/Infinity, or an integer literal of > 4300 digits
        raise ValueError(f"request body is not valid JSON: {e}") from None
    if _SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(value):
        raise ValueError("request body has a string with an unpaired UTF-16 surrogate (\\ud800-\\udfff)")
    return value


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


# One decoder for every body: json.loads with an argument builds a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _has_lone_surrogate(value: object) -> bool:
    """Iterative (not recursive) walk: the document may be nested as deeply as json.loads allows."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _json_kind(value: object) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _header(scope: Scope, name: bytes) -> bytes | None:
    return dict(scope.get("headers") or ()).get(name)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()  # later messages, e.g. http.disconnect while streaming

    return replay
