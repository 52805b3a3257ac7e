"""The router's HTTP API (FastAPI): OpenAI-compatible generation, health, metrics, debug views.

Every response carries `X-Request-Id` (the client's, or a generated one; router/request_id.py).
Answers, by case: 400 invalid request (OpenAI error JSON, naming the field), 401 missing or wrong API
key (with --api-key), 404 unknown model or route, 413 body too large, 415 body not JSON, 429 too many
requests in progress, 503 no usable workers, 504 request timeout. A streamed request that fails after
the first byte ends with an error event and [DONE].
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from router.access_log import LauncherProbeMiddleware
from router.auth import APIKeyAuth
from router.body_limit import BodyGuard
from router.errors import APIError, install_error_handlers, shorten
from router.fanout import run_sequences
from router.openai_responses import DONE, ChatFormatter, CompletionFormatter, sse
from router.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    new_id,
    now,
)
from router.request_builder import GenerationPlan
from router.request_id import RequestIdMiddleware
from router.request_lifecycle import SequenceRequest
from router.status_views import debug_index, health_report, refresh_worker_gauges

if TYPE_CHECKING:
    from router.server import Router

log = logging.getLogger(__name__)
DISCONNECT_POLL_SECONDS = 0.5
# Documented in the OpenAPI schema so that clients (and the schema fuzz test) know the error shape.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "Invalid request (the field at fault is in error.param)"),
        (401, "Missing or wrong API key (with --api-key)"),
        (404, "Unknown model"),
        (413, "Request body too large"),
        (415, "Request body is not JSON"),
        (429, "Too many requests in progress"),
        (503, "No live workers can serve requests"),
        (504, "Request timed out"),
    )
}
CLIENT_CLOSED_REQUEST = 499

# Overload and missing workers are transient: tell clients (and the OpenAI SDK) when to come back.
RETRY_AFTER = {"Retry-After": "1"}


class ClientDisconnected(Exception):
    """The client of a non-streaming request went away before the answer was ready."""


class _Ticket:
    """One admitted generation request; `finish` is idempotent and records the outcome once."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._open = True
        router.running += 1
        router.metrics.running.set(router.running)

    def finish(self, status: str) -> None:
        if self._open:
            self._open = False
            self._router.running -= 1
            self._router.metrics.running.set(self._router.running)
            self._router.metrics.requests.inc(status=status)


class _TicketedStream(StreamingResponse):
    """An SSE response that closes its ticket even if the client leaves before the body starts."""

    def __init__(self, content: AsyncIterator[str], ticket: _Ticket) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._ticket = ticket

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._ticket.finish("cancelled")  # no-op when the stream already recorded its outcome


def create_app(router: Router) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await router.start()
        try:
            yield
        finally:
            await router.stop()

    app = FastAPI(title="pdserve router", version="0.1.0", lifespan=lifespan)
    app.add_middleware(BodyGuard, max_bytes=router.config.max_body_bytes)
    if router.config.api_key is not None:
        # Added last, so outermost: a request without the key is refused before its body is read.
        app.add_middleware(
            APIKeyAuth, api_key=router.config.api_key, protect_status=router.config.protect_status
        )
    app.add_middleware(LauncherProbeMiddleware)  # outside the key check: a refused poll is quiet too
    app.add_middleware(RequestIdMiddleware)  # outermost: even a 401 or 413 carries X-Request-Id
    install_error_handlers(app)
    _add_generation_routes(app, router)
    _add_status_routes(app, router)
    return app


def _add_generation_routes(app: FastAPI, router: Router) -> None:
    @app.post("/v1/completions", responses={200: {"model": CompletionResponse}, **ERROR_RESPONSES})
    async def completions(request: Request, body: CompletionRequest):
        _check_model(router, body.model)
        plan = router.builder.completion(body, router.registry.max_model_len())
        return await _serve(router, request, plan, new_id("cmpl"), CompletionFormatter)

    @app.post("/v1/chat/completions", responses={200: {"model": ChatCompletionResponse}, **ERROR_RESPONSES})
    async def chat_completions(request: Request, body: ChatCompletionRequest):
        _check_model(router, body.model)
        plan = router.builder.chat(body, router.registry.max_model_len())
        return await _serve(router, request, plan, new_id("chatcmpl"), ChatFormatter)


def _add_status_routes(app: FastAPI, router: Router) -> None:
    @app.get("/v1/models")
    async def models() -> ModelList:
        card = ModelCard(
            id=router.config.model_name,
            created=now(),
            root=router.config.model,
            max_model_len=router.registry.max_model_len(),
        )
        return ModelList(data=[card])

    @app.get("/health")
    async def health() -> JSONResponse:
        healthy = router.registry.is_healthy()
        report = health_report(router.registry, healthy, router.cluster.pairs.probes)
        return JSONResponse(report, status_code=200 if healthy else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        refresh_worker_gauges(router.metrics, router.registry, router.index, router.cluster.pairs.probes)
        text = router.metrics.registry.render()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/debug/index")
    async def debug() -> dict:
        return debug_index(router.registry, router.index, router.policy.name, router.lifecycle.rates)


def _check_model(router: Router, model: str | None) -> None:
    if not router.config.accepts_model(model):
        message = f"The model `{shorten(model or '')}` does not exist."
        raise APIError(404, message, param="model", code="model_not_found")


async def _serve(router: Router, request: Request, plan: GenerationPlan, request_id: str, formatter_cls):
    if not router.registry.can_serve():
        router.metrics.requests.inc(status="rejected")
        raise APIError(503, "no live workers can serve requests", code="no_workers", headers=RETRY_AFTER)
    if router.running >= router.config.max_running_requests:
        router.metrics.requests.inc(status="rejected")
        raise APIError(
            429, "too many requests in progress; retry later", code="too_many_requests", headers=RETRY_AFTER
        )
    ticket = _Ticket(router)
    # The one line that ties the client's X-Request-Id to the id every other log line uses.
    log.debug("X-Request-Id %s is %s", request.state.request_id, request_id)
    seqs = _sequences(request_id, plan)
    formatter = formatter_cls(request_id, router.config.model_name, now(), plan, router.tokenizer)
    updates = run_sequences(router.lifecycle, seqs)
    if plan.stream:
        return _TicketedStream(_sse(formatter, updates, ticket), ticket)
    try:
        body = await _until_disconnect(request, formatter.collect(updates))
    except APIError as e:
        ticket.finish(_status_of(e))
        raise
    except (ClientDisconnected, asyncio.CancelledError):
        ticket.finish("cancelled")
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it; nginx's code for the log
    except BaseException:
        ticket.finish("server_error")
        raise
    ticket.finish("success")
    return JSONResponse(body)


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


async def _sse(formatter, updates: AsyncGenerator, ticket: _Ticket) -> AsyncIterator[str]:
    status = "cancelled"  # unless we reach the end: the client went away and Starlette cancelled us
    try:
        async with contextlib.aclosing(formatter.stream(updates)) as lines:
            async for line in lines:
                yield line
        status = "success"
    except APIError as e:
        status = _status_of(e)
        yield sse(e.body())
        yield DONE
    except Exception:
        status = "server_error"
        yield sse(APIError(500, "internal server error", code="internal_error").body())
        yield DONE
    finally:
        await updates.aclose()
        ticket.finish(status)


async def _until_disconnect(request: Request, work: Awaitable[dict]) -> dict:
    """Run `work`, cancelling it (so its sequences abort their workers) if the client disconnects."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise ClientDisconnected()
    finally:
        if not task.done():
            task.cancel()


def _status_of(error: APIError) -> str:
    if error.status == 504:
        return "timeout"
    return "client_error" if error.status < 500 else "server_error"
