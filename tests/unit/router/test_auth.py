"""--api-key: Bearer auth on /v1/* (and on every route with --protect-status), 401 in OpenAI's shape."""

from __future__ import annotations

import asyncio
import logging

import pytest

from common.net.curve import CurveKeys
from deploy import fronts, launch
from router.__main__ import parse_args
from router.config import API_KEY_ENV, RouterConfig
from tests.unit.router.harness import running_router

KEY = "sk-test-0123456789abcdef"
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
GOOD = {"Authorization": f"Bearer {KEY}"}
STATUS_ROUTES = ["/health", "/metrics", "/debug/index", "/openapi.json"]

# Every way of not presenting the right key: none, wrong, other schemes, truncated, padded, non-ASCII.
BAD_HEADERS = [
    {},
    {"Authorization": ""},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer "},
    {"Authorization": "Bearer wrong"},
    {"Authorization": f"Bearer {KEY[:-1]}"},
    {"Authorization": f"Bearer {KEY}x"},
    {"Authorization": f"Bearer {KEY} x"},
    {"Authorization": KEY},
    {"Authorization": f"Basic {KEY}"},
    {"Authorization": f"Token {KEY}"},
    {"Authorization": f"Bearer{KEY}"},
    {"Authorization": "Bearer \u00e9t\u00e9".encode("latin-1")},
    {"X-API-Key": KEY},
]


def _run(model_dir, tokenizer, fn, **overrides):
    async def main():
        async with running_router(model_dir, tokenizer, [], **overrides) as h:
            return await fn(h.client)

    return asyncio.run(main())


def _assert_401(response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert error["param"] is None and KEY not in response.text


def test_wrong_missing_or_malformed_key_is_401(model_dir, tokenizer) -> None:
    async def check(client):
        for headers in BAD_HEADERS:
            _assert_401(await client.post(CMPL, json={"prompt": "x"}, headers=headers))
            _assert_401(await client.post(CHAT, json={"messages": []}, headers=headers))
            _assert_401(await client.get("/v1/models", headers=headers))
        # Refused before the body is looked at: no 400/413/415 leaks to a client without the key.
        _assert_401(await client.post(CMPL, content=b"{bad", headers={"content-type": "application/json"}))
        _assert_401(await client.post(CMPL, content=b"x" * 10_000, headers={"content-type": "text/plain"}))
        _assert_401(await client.post("/v1/nothing", json={}))

    _run(model_dir, tokenizer, check, api_key=KEY, max_body_bytes=4096)
    print(f"\nauth: {len(BAD_HEADERS)} bad headers x 3 routes + 3 bodies refused with 401")


def test_right_key_gets_the_usual_answers(model_dir, tokenizer) -> None:
    async def check(client):
        r = await client.post(CMPL, json={"prompt": "x"}, headers=GOOD)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_workers"  # as without auth
        r = await client.post(CHAT, json={"messages": []}, headers=GOOD)
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        r = await client.post(CMPL, json={"prompt": "x", "model": "gpt-9"}, headers=GOOD)
        assert r.status_code == 404
        lower = {"authorization": f"bearer {KEY}"}  # the scheme is case-insensitive (RFC 7235)
        assert (await client.get("/v1/models", headers=lower)).status_code == 200
        padded = {"authorization": f"  Bearer   {KEY}  "}
        assert (await client.get("/v1/models", headers=padded)).status_code == 200

    _run(model_dir, tokenizer, check, api_key=KEY)


def test_status_routes_stay_open_by_default(model_dir, tokenizer) -> None:
    async def check(client):
        for path in STATUS_ROUTES:
            r = await client.get(path)
            assert r.status_code in (200, 503) and "www-authenticate" not in r.headers, path
        assert (await client.get("/nope")).status_code == 404

    _run(model_dir, tokenizer, check, api_key=KEY)


def test_protect_status_guards_every_route(model_dir, tokenizer) -> None:
    async def check(client):
        for path in [*STATUS_ROUTES, "/nope"]:
            _assert_401(await client.get(path))
            _assert_401(await client.get(path, headers={"Authorization": "Bearer wrong"}))
        assert (await client.get("/health", headers=GOOD)).status_code == 503  # no workers: as usual
        assert (await client.get("/metrics", headers=GOOD)).status_code == 200
        assert (await client.get("/debug/index", headers=GOOD)).status_code == 200
        assert (await client.get("/nope", headers=GOOD)).status_code == 404

    _run(model_dir, tokenizer, check, api_key=KEY, protect_status=True)


def test_no_key_configured_means_no_auth(model_dir, tokenizer) -> None:
    async def check(client):
        assert (await client.get("/v1/models")).status_code == 200
        assert (await client.post(CMPL, json={"prompt": "x"})).status_code == 503

    _run(model_dir, tokenizer, check)


def test_key_is_never_logged(model_dir, tokenizer, caplog) -> None:
    async def check(client):
        await client.post(CMPL, json={"prompt": "x"}, headers=GOOD)
        await client.post(CMPL, json={"prompt": "x"}, headers={"Authorization": "Bearer wrong"})

    with caplog.at_level(logging.DEBUG):
        _run(model_dir, tokenizer, check, api_key=KEY)
    assert KEY not in caplog.text
    assert KEY not in repr(RouterConfig(model="/m", api_key=KEY))


@pytest.mark.parametrize("key", ["", "has space", "tab\tkey", "caf\u00e9", 5])
def test_config_rejects_unusable_keys(key) -> None:
    with pytest.raises(ValueError, match="api_key"):
        RouterConfig(model="/m", api_key=key)


def test_config_protect_status_needs_a_key() -> None:
    with pytest.raises(ValueError, match="protect_status"):
        RouterConfig(model="/m", protect_status=True)


def test_cli_flags_and_environment(monkeypatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert parse_args(["--model", "/m"])[0].api_key is None
    monkeypatch.setenv(API_KEY_ENV, "")  # empty means unset, not an empty key
    assert parse_args(["--model", "/m"])[0].api_key is None
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert parse_args(["--model", "/m"])[0].api_key == "from-env"
    config, _ = parse_args(["--model", "/m", "--api-key", KEY, "--protect-status"])
    assert config.api_key == KEY and config.protect_status is True


def test_launcher_passes_the_key_through_the_environment(monkeypatch, tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert launch.parse_args(["--model", str(tmp_path)]).api_key == "from-env"
    plan = launch.parse_args(["--model", str(tmp_path), "--api-key", KEY, "--protect-status"])
    assert plan.api_key == KEY and plan.protect_status and KEY not in repr(plan)
    spawned = {}
    monkeypatch.setattr(
        fronts, "spawn", lambda argv, env=None, log_path=None: spawned.update(argv=argv, env=env)
    )
    keys = CurveKeys.generate()  # the cluster's CURVE keys travel the same way
    with pytest.raises(launch.Interrupted):
        fronts.Fronts(plan, str(tmp_path), keys.to_env()).start(_interrupt, lambda: 0)  # no router starts
    assert "--protect-status" in spawned["argv"] and KEY not in spawned["argv"]  # argv is public (ps)
    assert keys.secret.decode() not in " ".join(spawned["argv"])
    assert spawned["env"] == {API_KEY_ENV: KEY, **keys.to_env()}


def _interrupt(*_args, **_kwargs) -> None:
    raise launch.Interrupted("test")
