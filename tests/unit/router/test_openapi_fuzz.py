"""Fuzz the HTTP API from its own OpenAPI schema (schemathesis + hypothesis), without workers.

Per operation: schema-conforming requests ("positive"), schema-violating ones ("negative"), and a
valid body with random JSON put into its known fields ("mutated": type confusion deeper than the
schema's own negatives reach). The rule: no 5xx, except the expected 503s of a router with no workers
(a valid generation request -> code "no_workers"; /health -> status "unavailable"), and every error is
OpenAI error JSON. Deterministic (derandomized, no example database); the budget per operation and mode
is PDSERVE_FUZZ_EXAMPLES (default 200). Run with -s to see the case counts.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode

from router.config import RouterConfig
from router.protocol import ChatCompletionRequest, CompletionRequest
from router.server import build_router

EXAMPLES = int(os.environ.get("PDSERVE_FUZZ_EXAMPLES", "200"))
GENERATION = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}
STATUS = ["/v1/models", "/health", "/metrics", "/debug/index"]
VALID = {
    "/v1/completions": {"prompt": "hi"},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


def _settings(max_examples: int):
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture(scope="module")
def schema(model_dir, tokenizer):
    app, _ = build_router(RouterConfig(model=str(model_dir)), tokenizer)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def tally():
    counts: Counter = Counter()
    yield counts
    print(
        f"\nopenapi fuzz: {sum(counts.values())} cases, 0 unexpected 5xx; by operation/mode: {dict(counts)}"
    )


@pytest.mark.parametrize("path", list(GENERATION))
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_generation_endpoints_from_schema(schema, tally, path, mode) -> None:
    @_settings(EXAMPLES)
    @given(case=schema[path]["POST"].as_strategy(mode))
    def run(case) -> None:
        response = case.call()
        tally[f"{path} {mode.value}"] += 1
        _check(path, response.status_code, response.content)

    run()


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_tokenizer_endpoints_from_schema(schema, tally, path, mode) -> None:
    """The router's own tokenizer answers these (no worker): a schema-conforming case is a 200, a 400 (a
    check the schema does not state, e.g. an id past the vocabulary) or a 404 (a model name not served)."""

    @_settings(EXAMPLES // 4)  # a small surface; CI time is short
    @given(case=schema[path]["POST"].as_strategy(mode))
    def run(case) -> None:
        response = case.call()
        tally[f"{path} {mode.value}"] += 1
        _check(path, response.status_code, response.content)
        if mode is GenerationMode.POSITIVE:
            status = response.status_code
            assert status in (200, 400, 404), f"{status}: {response.content[:300]!r}"

    run()


@pytest.mark.parametrize("path", list(GENERATION))
def test_generation_endpoints_with_mutated_fields(schema, tally, path) -> None:
    fields = sorted(GENERATION[path].model_fields)
    operation = schema[path]["POST"]

    @_settings(EXAMPLES)
    @given(changes=st.dictionaries(st.sampled_from(fields), JSON_VALUES, min_size=1, max_size=4))
    def run(changes: dict) -> None:
        body = json.dumps(VALID[path] | changes).encode()
        case = operation.Case(body=body, media_type="application/json")
        response = case.call(headers={"content-type": "application/json"})
        tally[f"{path} mutated"] += 1
        _check(path, response.status_code, response.content)

    run()


@pytest.mark.parametrize("path", STATUS)
def test_status_endpoints_from_schema(schema, tally, path) -> None:
    @_settings(10)  # no parameters: every generated request is the same one
    @given(case=schema[path]["GET"].as_strategy())
    def run(case) -> None:
        response = case.call()
        tally[f"{path} positive"] += 1
        _check(path, response.status_code, response.content)

    run()


def _check(path: str, status: int, content: bytes) -> None:
    body = json.loads(content) if content[:1] in (b"{", b"[") else None
    if status >= 500:
        assert _expected_unavailable(path, status, body), f"{status} from {path}: {content[:300]!r}"
    if status >= 400 and path != "/health":
        error = (body or {}).get("error") if isinstance(body, dict) else None
        assert isinstance(error, dict), f"{status} is not OpenAI error JSON: {content[:300]!r}"
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"], error


def _expected_unavailable(path: str, status: int, body) -> bool:
    """A router without workers answers 503 for a valid request, and /health says so."""
    if status != 503 or not isinstance(body, dict):
        return False
    if path == "/health":
        return body.get("status") == "unavailable"
    return (body.get("error") or {}).get("code") == "no_workers"
