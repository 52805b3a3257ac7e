"""The router's HTTP API: OpenAI-compatible generation, vLLM's /tokenize and /detokenize, health,
metrics, debug views.

Every response carries `X-Request-Id` (the client's, or a generated one; router/request_id.py).
Answers, by case: 400 invalid request (OpenAI error JSON, naming the field), 401 missing or wrong API
key (with --api-key), 404 unknown model or route, 413 body too large, 415 body not JSON, 429 too many
requests in flight (router/inflight.py, before the body is read), 503 no usable workers, 504 request
timeout. A streamed request that fails after the first byte ends with an error event and [DONE].

The two generation routes are served by router/generation_routes.py, a lean ASGI path in front of
FastAPI; FastAPI serves every other route and the OpenAPI schema of all of them.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp

from router.access_log import LauncherProbeMiddleware
from router.auth import APIKeyAuth
from router.body_limit import BodyGuard
from router.config import RouterConfig
from router.errors import install_error_handlers
from router.generation_routes import GenerationRoutes, check_model
from router.inflight import InflightGate
from router.protocol import ChatCompletionRequest, CompletionRequest
from router.request_id import RequestIdMiddleware
from router.response_models import (
    ChatCompletionResponse,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    now,
)
from router.responses_api import ResponsesRequest, add_stored_response_routes
from router.status_views import debug_index, health_report, refresh_worker_gauges
from router.tokenize_routes import add_tokenize_routes

if TYPE_CHECKING:
    from router.server import Router

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


def create_app(router: Router) -> ASGIApp:
    """The ASGI app, outermost first: X-Request-Id (even a 401 or 413 carries it), the launcher's
    quiet health polls (router/access_log.py), the API key (a
    request without it is refused before its body is read), the in-flight bound (likewise), the body
    guard (size, media type, strict JSON, parsed once), the generation routes, then FastAPI."""
    api = FastAPI(title="pdserve router", version="0.1.0", lifespan=_lifespan(router))
    install_error_handlers(api)
    _document_generation_routes(api)
    _add_status_routes(api, router)
    add_tokenize_routes(api, router, ERROR_RESPONSES)
    add_stored_response_routes(api, ERROR_RESPONSES)
    app: ASGIApp = GenerationRoutes(api, router)
    app = BodyGuard(app, max_bytes=router.config.max_body_bytes)
    app = InflightGate(app, router.inflight, router.config.admission_wait_s)
    if router.config.api_key is not None:
        app = APIKeyAuth(app, api_key=router.config.api_key, protect_status=router.config.protect_status)
    app = LauncherProbeMiddleware(app)  # outside the key check: a refused poll is quiet too
    return RequestIdMiddleware(app)


def _lifespan(router: Router):
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await router.start()
        try:
            yield
        finally:
            await router.stop()

    return lifespan


def _document_generation_routes(app: FastAPI) -> None:
    """The schema of the generation routes; GenerationRoutes answers every request to them, so these
    handlers never run (one would answer 500)."""

    @app.post("/v1/completions", responses={200: {"model": CompletionResponse}, **ERROR_RESPONSES})
    async def completions(body: CompletionRequest):
        raise RuntimeError("POST /v1/completions is served by router/generation_routes.py")

    @app.post("/v1/chat/completions", responses={200: {"model": ChatCompletionResponse}, **ERROR_RESPONSES})
    async def chat_completions(body: ChatCompletionRequest):
        raise RuntimeError("POST /v1/chat/completions is served by router/generation_routes.py")

    @app.post("/v1/responses", responses=ERROR_RESPONSES)
    async def responses(body: ResponsesRequest):
        raise RuntimeError("POST /v1/responses is served by router/generation_routes.py")


def _add_status_routes(app: FastAPI, router: Router) -> None:
    def card() -> ModelCard:
        return ModelCard(
            id=router.config.model_name,
            created=now(),
            root=router.config.model,
            max_model_len=router.registry.max_model_len(),
        )

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[card()])

    @app.get("/v1/models/{model_id:path}", responses=ERROR_RESPONSES)
    async def model(model_id: str) -> ModelCard:
        """OpenAI's retrieve: the served model's card under any name a request may use for it."""
        check_model(router, model_id)
        return card()

    @app.get("/health")
    async def health() -> JSONResponse:
        healthy = router.registry.is_healthy()
        report = health_report(router.registry, healthy, router.cluster.pairs.probes)
        report.update(_front_view(router.config))
        return JSONResponse(report, status_code=200 if healthy else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        refresh_worker_gauges(router.metrics, router.registry, router.index, router.cluster.pairs.probes)
        text = router.exposition()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/debug/index")
    async def debug() -> dict:
        view = debug_index(router.registry, router.index, router.policy.name, router.lifecycle.rates)
        return view | _front_view(router.config)


def _front_view(config: RouterConfig) -> dict:
    """Which of several fronts answered (its index and process id); nothing with a single front."""
    return {} if config.front is None else {"front": config.front, "front_pid": os.getpid()}
