"""vLLM's tokenizer endpoints, answered by the router's own tokenizer (no worker is asked).

POST /tokenize takes a `prompt` (text) or chat `messages` (rendered exactly as /v1/chat/completions
renders them, so `count` is that request's `usage.prompt_tokens`) and answers `{count, max_model_len,
tokens}` (`token_strs` too with `return_token_strs`); `add_special_tokens` defaults to true for a
prompt and false for messages, whose template writes its own. POST /detokenize takes `tokens` and
answers `{prompt}`. GET /version answers `{version}`. Bad input is a 400 naming the field, as on the
generation routes.
"""

from __future__ import annotations

import asyncio
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from common.wire.token_ids import check_token_ids
from router.body_limit import PARSED_BODY
from router.errors import bad_request, validated
from router.generation_routes import INLINE_TOKENIZE_CHARS, check_model
from router.protocol import ChatPromptFields, Int64, _Strict

if TYPE_CHECKING:
    from router.server import Router


class _TokenizeOptions(_Strict):
    model: str | None = None
    return_token_strs: bool = False


class TokenizePromptRequest(_TokenizeOptions):
    prompt: str
    add_special_tokens: bool = True  # as a completion's (messages: as a chat request's, false)


class TokenizeChatRequest(_TokenizeOptions, ChatPromptFields):
    pass


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[Int64]


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


def add_tokenize_routes(app: FastAPI, router: Router, error_responses: dict) -> None:
    @app.post("/tokenize", responses=error_responses)
    async def tokenize(request: Request) -> TokenizeResponse:
        """A `prompt` or chat `messages` as the model's token ids (module docstring)."""
        given = _body(request)
        body: TokenizePromptRequest | TokenizeChatRequest = (
            validated(TokenizeChatRequest, given)
            if "messages" in given
            else validated(TokenizePromptRequest, given)
        )
        check_model(router, body.model)
        tokens = await _tokenize(router, body)
        max_model_len = router.registry.max_model_len()
        strs = [router.tokenizer.token_text(t) for t in tokens] if body.return_token_strs else None
        return TokenizeResponse(
            count=len(tokens), max_model_len=max_model_len, tokens=tokens, token_strs=strs
        )

    @app.post("/detokenize", responses=error_responses)
    async def detokenize(request: Request) -> DetokenizeResponse:
        """Token ids as text (special tokens included)."""
        body = validated(DetokenizeRequest, _body(request))
        check_model(router, body.model)
        try:
            check_token_ids("tokens", body.tokens, router.tokenizer.vocab_size)
        except ValueError as e:
            raise bad_request(str(e), param="tokens") from None
        return DetokenizeResponse(prompt=router.tokenizer.decode(body.tokens, skip_special_tokens=False))

    @app.get("/version")
    async def server_version() -> VersionResponse:
        return VersionResponse(version=_package_version())

    _document_bodies(app)


# The request bodies of the routes above, by path: a client's choice of one of them for /tokenize.
_BODIES: dict[str, tuple[type[BaseModel], ...]] = {
    "/tokenize": (TokenizePromptRequest, TokenizeChatRequest),
    "/detokenize": (DetokenizeRequest,),
}


def _document_bodies(app: FastAPI) -> None:
    """FastAPI documents a request body only for a handler parameter, and these handlers take the body
    BodyGuard already parsed (router/body_limit.py): their schemas join the generated document here."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        document = generate()  # FastAPI keeps it as app.openapi_schema: completed here once
        mode: Literal["validation"] = "validation"
        models = [(model, mode) for models in _BODIES.values() for model in models]
        refs, defs = models_json_schema(models, ref_template="#/components/schemas/{model}")
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in defs.get("$defs", {}).items():
            schemas.setdefault(name, schema)
        for path, bodies in _BODIES.items():
            choices = [refs[(model, mode)] for model in bodies]
            schema = choices[0] if len(choices) == 1 else {"anyOf": choices}
            body = {"required": True, "content": {"application/json": {"schema": schema}}}
            document["paths"][path]["post"]["requestBody"] = body
        return document

    app.openapi = openapi  # type: ignore[method-assign]


async def _tokenize(router: Router, body: TokenizePromptRequest | TokenizeChatRequest) -> list[int]:
    """The ids; not checked against the context window (the answer carries max_model_len for that),
    as vLLM's; the body limit bounds the work, and a long text is tokenized off the event loop."""
    text = body.prompt if isinstance(body, TokenizePromptRequest) else router.builder.chat_text(body)
    if len(text) <= INLINE_TOKENIZE_CHARS:
        return router.tokenizer.encode(text, body.add_special_tokens)
    return await asyncio.to_thread(router.tokenizer.encode, text, body.add_special_tokens)


def _body(request: Request) -> Any:
    """The JSON body BodyGuard parsed and checked (an object) for this request."""
    return request.scope["state"].pop(PARSED_BODY)


def _package_version() -> str:
    try:
        return version("pdserve")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"
