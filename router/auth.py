"""API-key check: `Authorization: Bearer KEY` on /v1/* (and on every route with `protect_status`).

An ASGI middleware rather than a FastAPI dependency so that it runs before the body is read and parsed:
a client without the key cannot make the router buffer or parse a large body. The comparison is
`hmac.compare_digest` of SHA-256 digests (constant time, length included; bytes, so non-ASCII header
bytes raise nothing). The key is
never logged or echoed: the 401 says only whether a key was missing or wrong.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from router.errors import APIError

PROTECTED_PREFIX = "/v1/"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


class APIKeyAuth:
    def __init__(self, app: ASGIApp, api_key: str, protect_status: bool = False) -> None:
        self.app = app
        self._key_digest = hashlib.sha256(api_key.encode("utf-8")).digest()
        self._protect_status = protect_status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._guards(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        error = self._check(bearer_token(scope))
        if error is not None:
            await error.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _guards(self, path: str) -> bool:
        # protect_status covers everything else too (/health, /metrics, /debug/*, the OpenAPI docs):
        # an operator who hides the cluster's state wants no route left open.
        return self._protect_status or path.startswith(PROTECTED_PREFIX)

    def _check(self, token: bytes | None) -> APIError | None:
        if token is None:
            return _unauthorized(
                "Missing or malformed API key: send an 'Authorization: Bearer <key>' header."
            )
        # Digests first so that even the key's length does not show in the timing.
        if not hmac.compare_digest(hashlib.sha256(token).digest(), self._key_digest):
            return _unauthorized("Incorrect API key provided.")
        return None


def bearer_token(scope: Scope) -> bytes | None:
    """The token of the first Authorization header if it uses the Bearer scheme (any case, per RFC
    7235), else None (absent, another scheme, or no token)."""
    value = next((v for k, v in scope.get("headers") or () if k == b"authorization"), None)
    if value is None:
        return None
    scheme, _, token = value.strip().partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        return None
    return token


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key", headers=dict(_CHALLENGE))
