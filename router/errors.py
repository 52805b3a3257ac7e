"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status.

FastAPI's own 422 validation answer becomes a 400 in this shape, unknown routes a 404, and any
unexpected exception a 500 that does not leak a traceback to the client.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "invalid_request_error",  # what OpenAI sends for a bad key (code "invalid_api_key")
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
    504: "timeout",
}


class APIError(Exception):
    """An error answer for the client. `param` names the request field at fault, if any."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    @property
    def error_type(self) -> str:
        return _TYPE_BY_STATUS.get(
            self.status, "invalid_request_error" if self.status < 500 else "internal_error"
        )

    @property
    def outcome(self) -> str:
        """The request counter's status label for a request that ended with this error."""
        if self.status == 504:
            return "timeout"
        return "client_error" if self.status < 500 else "server_error"

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def shorten(value: str, limit: int = 80) -> str:
    """A client's value, cut for an error message: echoing a megabyte back doubles the traffic it cost."""
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_value" if param else None)


def from_value_error(error: ValueError) -> APIError:
    """SamplingParams and friends say "<field> must ..."; that first word is the param."""
    message = str(error)
    first = message.split(" ", 1)[0]
    return bad_request(message, param=first if first.isidentifier() else None)


_Model = TypeVar("_Model", bound=BaseModel)


def validated(model: type[_Model], body: Any) -> _Model:
    """`body` (a parsed JSON request) as `model`; its first validation error is a 400 naming the field."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from None


def from_validation_errors(errors: Sequence[Any]) -> APIError:
    """The 400 for pydantic's errors of a request body (FastAPI's, located under "body", or the
    model's own): the first error, naming the client's field."""
    if not errors:
        return bad_request("invalid request")
    first = errors[0]
    param = _param_of(first.get("loc", ()))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        return bad_request(f"request body is not valid JSON: {first.get('ctx', {}).get('error', msg)}")
    if first.get("type") == "missing":
        if param is None:  # the whole body is absent (the JSON guard normally answers this first)
            return bad_request("request body is required (a JSON object)")
        return APIError(400, f"{param} is required", param=param, code="missing_required_parameter")
    message = f"{param}: {msg}" if param else f"request body: {msg}"
    return bad_request(message, param=param)


_UNION_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


def _param_of(loc: tuple) -> str | None:
    """("body", "messages", 0, "content", "str") -> "messages.0.content": pydantic adds the union member
    it tried (a type name such as "str", "list[int]", "TextPart") to the location; the client's field
    ends before it."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, str) and _is_union_tag(part):
            break
        if part != "body" or parts:
            parts.append(str(part))
    return ".".join(parts) or None


def _is_union_tag(part: str) -> bool:
    return part in _UNION_TAGS or "[" in part or "-" in part or part[:1].isupper()


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation_errors(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return APIError(
            exc.status_code, message, code="not_found" if exc.status_code == 404 else None
        ).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return APIError(500, "internal server error", code="internal_error").response()
