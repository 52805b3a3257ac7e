"""POST /v1/completions, /v1/chat/completions and /v1/responses as a lean ASGI path in front of FastAPI.

These routes carry all the traffic, and FastAPI's per-request machinery (its middleware stack,
dependency solving, a second JSON parse, Starlette's StreamingResponse and its task group) cost
about as much router CPU as everything else a request needs. Here a request is parsed once (by
BodyGuard, which must run before this: it leaves the parsed body in the request's state), validated
once (the same pydantic models FastAPI would use, with the same 400 answers) and answered straight
through ASGI `send`. Every other route, and the OpenAPI schema of these, is FastAPI's.

Long text prompts are tokenized in a worker thread, so one huge prompt does not stall the event loop
that streams every other request's tokens; short ones are cheaper to tokenize in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable
from typing import TYPE_CHECKING

from pydantic import BaseModel
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from router.body_limit import PARSED_BODY
from router.chat_formatter import ChatFormatter
from router.client_watch import ClientWatch
from router.errors import APIError, shorten, validated
from router.fanout import run_sequences
from router.openai_responses import DONE, CompletionFormatter, Formatter, sse
from router.protocol import ChatCompletionRequest, CompletionRequest
from router.request_builder import GenerationPlan
from router.request_id import new_id
from router.request_lifecycle import SequenceRequest
from router.response_models import now
from router.responses_api import ResponsesFormatter, ResponsesRequest
from router.route_planner import RETRY_AFTER
from router.unsupported_fields import refuse_unsupported

if TYPE_CHECKING:
    from router.server import Router

log = logging.getLogger(__name__)
CLIENT_CLOSED_REQUEST = 499
# Prompt text (characters) above which tokenizing moves to a worker thread: below it, the thread hop
# costs more than the tokenizer.
INLINE_TOKENIZE_CHARS = 4096
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class GenerationRoutes:
    """ASGI: serves the two generation routes itself and hands every other request to `app`."""

    def __init__(self, app: ASGIApp, router: Router) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = scope.get("path") if scope["type"] == "http" and scope.get("method") == "POST" else None
        model = _MODELS.get(route) if route is not None else None
        if model is not None:
            await self._answer(scope, receive, send, model)
        else:
            await self.app(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send, model: type[BaseModel]) -> None:
        try:
            await self._serve(scope, receive, send, model)
        except APIError as e:
            await e.response()(scope, receive, send)
        except Exception:
            log.exception("unhandled error on POST %s", scope.get("path"))
            await _internal_error().response()(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, model: type[BaseModel]) -> None:
        router = self.router
        state = scope["state"]
        given = state.pop(PARSED_BODY)
        body = validated(model, given)
        refuse_unsupported(given, scope["path"])
        check_model(router, body.model)  # type: ignore[attr-defined]
        if isinstance(body, ResponsesRequest):
            body = body.as_chat()  # planned and generated as the chat request it means
        max_model_len = router.registry.max_model_len()  # None: no open path (503 once the body is checked)
        plan = await _plan(router, body, max_model_len)
        _check_capacity(router, max_model_len)
        prefix, formatter_class = _FORMATS[model]
        request_id = new_id(prefix)
        # The one line that ties the client's X-Request-Id to the id every other log line uses.
        log.debug("X-Request-Id %s is %s", state.get("request_id"), request_id)
        formatter = formatter_class(
            request_id, router.config.model_name, now(), plan, router.tokenizer, router.config.stream_interval
        )
        updates = run_sequences(router.lifecycle, _sequences(request_id, plan))
        watch = ClientWatch(receive)
        try:
            if plan.stream:
                status = await _stream(scope, receive, send, formatter.stream(updates), watch)
            else:
                status = await _respond(scope, receive, send, formatter.collect(updates), watch)
        finally:
            watch.close()
            await updates.aclose()
        router.metrics.requests.inc(status=status)


# The generation routes: the request model each validates, and each one's id prefix and formatter.
_MODELS: dict[str, type[BaseModel]] = {
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/responses": ResponsesRequest,
}
_FORMATS: dict[type[BaseModel], tuple[str, type[Formatter]]] = {
    CompletionRequest: ("cmpl", CompletionFormatter),
    ChatCompletionRequest: ("chatcmpl", ChatFormatter),
    ResponsesRequest: ("resp", ResponsesFormatter),
}


async def _plan(router: Router, body: BaseModel, max_model_len: int | None) -> GenerationPlan:
    if isinstance(body, ChatCompletionRequest):
        chars = sum(len(m.text()) for m in body.messages)
        build = router.builder.chat
    else:
        assert isinstance(body, CompletionRequest)
        prompt = body.prompt  # its shape is checked: a string, or a list of strings, of ids or of id lists
        if isinstance(prompt, str):
            chars = len(prompt)
        else:
            chars = sum(map(len, prompt)) if isinstance(prompt[0], str) else 0  # ids: nothing to tokenize
        build = router.builder.completion  # type: ignore[assignment]
    if chars <= INLINE_TOKENIZE_CHARS:
        return build(body, max_model_len)  # type: ignore[arg-type]
    return await asyncio.to_thread(build, body, max_model_len)  # type: ignore[arg-type]


def check_model(router: Router, model: str | None) -> None:
    """A 404 unless `model` names the served model (or is left out)."""
    if not router.config.accepts_model(model):
        message = f"The model `{shorten(model or '')}` does not exist."
        raise APIError(404, message, param="model", code="model_not_found")


def _check_capacity(router: Router, max_model_len: int | None) -> None:
    if max_model_len is None:  # what registry.can_serve() says, without asking it again
        router.metrics.requests.inc(status="rejected")
        raise APIError(503, "no live workers can serve requests", code="no_workers", headers=RETRY_AFTER)


def _sequences(request_id: str, plan: GenerationPlan) -> list[SequenceRequest]:
    n = plan.sampling.n
    return [
        SequenceRequest(
            f"{request_id}-{p * n + i}",
            prompt,
            plan.sequence_params(i),
            plan.skip_special_tokens,
            timeout=plan.timeout,
        )
        for p, prompt in enumerate(plan.prompts)
        for i in range(n)
    ]


async def _stream(
    scope: Scope, receive: Receive, send: Send, lines: AsyncGenerator[str], watch: ClientWatch
) -> str:
    """Send the SSE lines. The 200 and its headers go out with the first line (the first text), not
    before: the request's command then leaves for its worker before the router writes anything, and
    a request that fails before its first text gets a plain HTTP error (a 503 a client may retry,
    a 400, a 504). A failure after the first byte ends the stream with an error event and [DONE].
    Returns the outcome for the request counter."""
    async with contextlib.aclosing(lines):
        try:
            line = await anext(lines)
        except (Exception, asyncio.CancelledError) as e:
            return await _answer_failure(scope, receive, send, e, watch)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            return await _send_lines(send, line, lines)
        except asyncio.CancelledError:
            if not watch.disconnected:
                raise
            return "cancelled"  # nobody is left to send to


async def _send_lines(send: Send, line: str, lines: AsyncGenerator[str]) -> str:
    try:
        while True:
            # [DONE] ends every stream: it goes out with the end of the response, in one write.
            more = not line.endswith(DONE)
            await send({"type": "http.response.body", "body": line.encode(), "more_body": more})
            if not more:
                return "success"
            line = await anext(lines)
    except StopAsyncIteration:  # not reached: the formatter always ends with [DONE]
        await _send_last(send, DONE)
        return "success"
    except APIError as e:
        await _send_last(send, sse(e.body()) + DONE)
        return e.outcome
    except Exception:
        log.exception("stream failed")
        await _send_last(send, sse(_internal_error().body()) + DONE)
        return "server_error"


async def _send_last(send: Send, text: str) -> None:
    await send({"type": "http.response.body", "body": text.encode(), "more_body": False})


async def _respond(
    scope: Scope, receive: Receive, send: Send, work: Awaitable[dict], watch: ClientWatch
) -> str:
    """One JSON answer; the work is cancelled (aborting its workers) if the client disconnects."""
    try:
        body = await work
    except (Exception, asyncio.CancelledError) as e:
        return await _answer_failure(scope, receive, send, e, watch)
    watch.close()  # the answer goes out whole now, even if the client is leaving
    await JSONResponse(body)(scope, receive, send)
    return "success"


async def _answer_failure(
    scope: Scope, receive: Receive, send: Send, error: BaseException, watch: ClientWatch
) -> str:
    """Answer a request that failed before any byte of its response went out; returns the outcome.
    A cancellation that the client's departure did not cause is raised again."""
    disconnected = watch.disconnected
    watch.close()
    if isinstance(error, asyncio.CancelledError):
        if not disconnected:
            raise error
        await Response(status_code=CLIENT_CLOSED_REQUEST)(scope, receive, send)  # nginx's code, for the log
        return "cancelled"
    if isinstance(error, APIError):
        await error.response()(scope, receive, send)
        return error.outcome
    log.error("request failed", exc_info=error)
    await _internal_error().response()(scope, receive, send)
    return "server_error"


def _internal_error() -> APIError:
    return APIError(500, "internal server error", code="internal_error")
