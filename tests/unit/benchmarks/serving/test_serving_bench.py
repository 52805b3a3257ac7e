"""benchmarks/serving/serving.py: workloads, arrival times, metric math, and the client against a real HTTP
server.

The server is a small aiohttp app on 127.0.0.1 (ephemeral port) that streams OpenAI-style completion
chunks; it reports 16 cached prompt tokens when it has seen the prompt's first 16 tokens before.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections import Counter
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from benchmarks.serving import serving
from benchmarks.serving.serving import (
    TOKEN_RANGE,
    RequestResult,
    RunConfig,
    arrival_offsets,
    is_good,
    random_workload,
    run_benchmark,
    shared_prefix_workload,
    summarize,
)
from common.core.percentile import percentile
from router.router_metrics import RouterMetrics

FIRST_TOKEN_DELAY_S = 0.05
CACHE_PROBE = 16
HTTP_FAIL, STREAM_FAIL = 1, 2  # first prompt token that makes the fake server fail the request


# --- workloads and arrivals -------------------------------------------------------------------


def test_random_workload_is_deterministic_with_the_seed():
    a = random_workload(8, input_len=20, output_len=7, seed=3)
    assert a == random_workload(8, input_len=20, output_len=7, seed=3)
    assert a != random_workload(8, input_len=20, output_len=7, seed=4)
    assert all(len(r.prompt) == 20 and r.max_tokens == 7 for r in a)
    assert all(TOKEN_RANGE[0] <= t < TOKEN_RANGE[1] for r in a for t in r.prompt)


def test_shared_prefix_workload_really_shares_its_prefixes():
    kwargs = dict(num_prefixes=4, prefix_len=50, suffix_len=6, output_len=3)
    reqs = shared_prefix_workload(30, **kwargs, seed=0)
    assert reqs == shared_prefix_workload(30, **kwargs, seed=0)
    assert reqs != shared_prefix_workload(30, **kwargs, seed=1)
    prefixes: dict[int, tuple] = {}
    for r in reqs:
        assert len(r.prompt) == 56 and r.max_tokens == 3
        assert prefixes.setdefault(r.prefix_id, tuple(r.prompt[:50])) == tuple(r.prompt[:50])
    assert len(prefixes) == 4 and len(set(prefixes.values())) == 4
    assert sorted(Counter(r.prefix_id for r in reqs).values()) == [7, 7, 8, 8]  # used about equally
    assert len({tuple(r.prompt[50:]) for r in reqs}) == 30  # suffixes differ


def test_arrival_offsets():
    assert arrival_offsets(5, math.inf, seed=0) == [0.0] * 5
    offsets = arrival_offsets(20_000, 50.0, seed=1)
    assert offsets == arrival_offsets(20_000, 50.0, seed=1)
    assert offsets[0] == 0.0 and all(b >= a for a, b in zip(offsets, offsets[1:], strict=False))
    assert offsets[-1] / (len(offsets) - 1) == pytest.approx(1 / 50.0, rel=0.05)  # Poisson: mean gap 1/rate


# --- metric math --------------------------------------------------------------------------------


def test_tpot_and_goodput_rules():
    r = RequestResult(latency_s=1.1, ttft_s=0.1, output_tokens=11)
    assert r.ok and r.tpot_s == pytest.approx(0.1)  # (1.1 - 0.1) / (11 - 1)
    assert RequestResult(latency_s=0.5, ttft_s=0.5, output_tokens=1).tpot_s is None
    assert is_good(r, None, None)
    assert is_good(r, ttft_ms=100, tpot_ms=100) and not is_good(r, ttft_ms=99, tpot_ms=None)
    assert not is_good(r, ttft_ms=None, tpot_ms=99)
    assert is_good(RequestResult(latency_s=0.05, ttft_s=0.05, output_tokens=1), 60, 1)  # no TPOT to miss
    assert not is_good(RequestResult(error="HTTP 500"), None, None)
    r.itl_s = [0.1, 0.02, 0.18]  # the mean gap meets 100 ms, one stall does not
    assert is_good(r, None, tpot_ms=100) and not is_good(r, None, None, itl_ms=100)
    assert is_good(r, None, None, itl_ms=180)


def test_summarize_aggregates():
    results = [
        RequestResult(latency_s=1.1, ttft_s=0.1, output_tokens=11, prompt_tokens=100, cached_tokens=64),
        RequestResult(latency_s=2.2, ttft_s=0.2, output_tokens=11, prompt_tokens=100, cached_tokens=0),
        RequestResult(error="HTTP 503: busy", itl_s=[9.0]),  # a failed request's gaps do not count
    ]
    results[0].itl_s, results[1].itl_s = [0.1, 0.1], [0.2, 0.4]
    s = summarize(results, duration_s=2.0, ttft_ms=150, tpot_ms=None)
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["request_throughput_per_s"] == 1.0 and s["output_tokens_per_s"] == 11.0
    assert (s["total_prompt_tokens"], s["total_cached_tokens"], s["cached_token_ratio"]) == (200, 64, 0.32)
    assert s["ttft_ms"] == pytest.approx({"mean": 150.0, "p50": 150.0, "p99": 199.0})
    assert s["tpot_ms"] == pytest.approx({"mean": 150.0, "p50": 150.0, "p99": 199.0})
    # every gap of every request, pooled: 100, 100, 200, 400 ms
    assert s["itl_ms"] == pytest.approx({"mean": 200.0, "p50": 150.0, "p99": 394.0, "max": 400.0})
    assert s["goodput_per_s"] == 0.5  # only the first meets TTFT <= 150 ms
    assert summarize(results, 2.0)["goodput_per_s"] is None  # no SLO given
    assert summarize(results, 2.0, itl_ms=250)["goodput_per_s"] == 0.5  # the second's 400 ms gap
    table = serving.format_table(s)
    assert "ttft_ms p99" in table and "goodput_per_s" in table


def test_the_longest_gaps_are_placed_in_time():
    # Sent at Unix 1000.0: first token at +0.1 s, then gaps of 0.1 and 0.3 s; the other at 1000.5.
    a = RequestResult(latency_s=0.5, ttft_s=0.1, output_tokens=3, sent_at=1000.0, itl_s=[0.1, 0.3])
    b = RequestResult(latency_s=0.3, ttft_s=0.1, output_tokens=2, sent_at=1000.5, itl_s=[0.2])
    longest = summarize([a, b, RequestResult(error="HTTP 500", itl_s=[5.0])], 1.0)["itl_longest"]
    assert [(round(g["ms"]), round(g["ended_at"], 6), g["token"]) for g in longest] == [
        (300, 1000.5, 2),
        (200, 1000.8, 1),
        (100, 1000.2, 1),
    ]
    lines = [line for line in serving.format_table({"itl_longest": longest}).splitlines()]
    assert len(lines) == 3 and lines[0].startswith("itl_longest 1") and "300.0 ms to " in lines[0]
    assert lines[0].endswith("(token 2)")


def test_settings_are_validated_naming_the_field():
    with pytest.raises(ValueError, match="request_rate"):
        RunConfig("http://h/v1", request_rate=0)
    with pytest.raises(ValueError, match="max_concurrency"):
        RunConfig("http://h/v1", max_concurrency=0)


# --- the client against a real HTTP server ------------------------------------------------------


@dataclass
class FakeState:
    bodies: list[dict] = field(default_factory=list)
    seen_prefixes: set[tuple] = field(default_factory=set)
    in_flight: int = 0
    max_in_flight: int = 0
    metrics: RouterMetrics = field(default_factory=RouterMetrics)  # the router's real exposition


def _sse(payload) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


def make_app(state: FakeState) -> web.Application:
    async def models(_request):
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def completions(request):
        body = await request.json()
        state.bodies.append(body)
        prompt = body["prompt"]
        if prompt[0] == HTTP_FAIL:
            return web.json_response({"error": {"message": "overloaded", "code": 503}}, status=503)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            return await stream(request, body, prompt)
        finally:
            state.in_flight -= 1

    async def stream(request, body, prompt):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        cached = CACHE_PROBE if tuple(prompt[:CACHE_PROBE]) in state.seen_prefixes else 0
        state.seen_prefixes.add(tuple(prompt[:CACHE_PROBE]))
        await resp.write(b": keep-alive\n\n")
        await asyncio.sleep(FIRST_TOKEN_DELAY_S)
        n = body["max_tokens"]
        for i in range(n):
            if prompt[0] == STREAM_FAIL and i == 1:
                await resp.write(_sse({"error": {"message": "worker lost", "code": 500}}))
                return resp
            finish = "length" if i == n - 1 else None
            choice = {"index": 0, "text": "tok", "logprobs": None, "finish_reason": finish}
            await resp.write(_sse({"object": "text_completion", "choices": [choice], "usage": None}))
            await asyncio.sleep(0.005)
        state.metrics.stage_seconds.observe(0.004, stage="prefill")  # as a pdserve router records stages
        state.metrics.stage_seconds.observe(0.2, stage="decode")
        usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
        await resp.write(_sse({"object": "text_completion", "choices": [], "usage": usage}))
        await resp.write(_sse("[DONE]"))
        return resp

    async def metrics(_request):
        return web.Response(text=state.metrics.registry.render())

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


@pytest.fixture
def fake_server():
    """The app on its own event loop in a thread, so the code under test can run asyncio.run itself."""
    state, loop = FakeState(), asyncio.new_event_loop()
    runner = web.AppRunner(make_app(state))
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    host, port = runner.addresses[0][:2]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://{host}:{port}/v1", state
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_streams_measures_and_counts_cached_tokens(fake_server):
    base_url, state = fake_server
    workload = shared_prefix_workload(12, num_prefixes=3, prefix_len=32, suffix_len=4, output_len=5, seed=0)
    cfg = RunConfig(base_url, request_rate=400.0, max_concurrency=4, seed=0)
    results, duration = asyncio.run(run_benchmark(cfg, workload))
    assert all(r.ok for r in results), [r.error for r in results]
    for r in results:
        assert (r.output_tokens, r.prompt_tokens) == (5, 36)
        assert FIRST_TOKEN_DELAY_S <= r.ttft_s <= r.latency_s and r.tpot_s > 0
        # 5 text chunks, the server sleeps 5 ms between them: one gap each, and the last cannot arrive
        # before it was sent (a single gap can be shorter, when a loaded host delivers two chunks late)
        assert len(r.itl_s) == 4 and min(r.itl_s) >= 0
        assert r.ttft_s + sum(r.itl_s) >= FIRST_TOKEN_DELAY_S + 4 * 0.005
    body = state.bodies[0]
    assert body["model"] == "fake-model"  # taken from /v1/models
    assert body["ignore_eos"] is True and body["max_tokens"] == 5 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert state.max_in_flight <= 4
    summary = summarize(results, duration)
    assert summary["total_cached_tokens"] == CACHE_PROBE * (12 - 3)  # every prefix but its first use
    assert summary["total_output_tokens"] == 60 and summary["ttft_ms"]["p50"] >= 1e3 * FIRST_TOKEN_DELAY_S
    itl = summary["itl_ms"]
    assert itl["max"] >= itl["p99"] >= itl["p50"] > 0


def test_failed_requests_are_counted_not_fatal(fake_server):
    base_url, _ = fake_server
    workload = random_workload(4, input_len=8, output_len=3, seed=0)
    workload[1] = serving.WorkloadRequest([HTTP_FAIL] + workload[1].prompt[1:], 3)
    workload[2] = serving.WorkloadRequest([STREAM_FAIL] + workload[2].prompt[1:], 3)
    results, duration = asyncio.run(run_benchmark(RunConfig(base_url, model="m"), workload))
    assert [r.ok for r in results] == [True, False, False, True]
    assert results[1].error.startswith("HTTP 503") and "worker lost" in results[2].error
    assert summarize(results, duration)["failed"] == 2


def test_cli_writes_json(fake_server, tmp_path, capsys):
    base_url, _ = fake_server
    out = tmp_path / "result.json"
    argv = ["--base-url", base_url, "--num-prompts", "6", "--input-len", "8", "--output-len", "4"]
    argv += ["--request-rate", "inf", "--goodput-ttft-ms", "10000", "--json-out", str(out)]
    assert serving.main(argv) == 0
    doc = json.loads(out.read_text())  # strict JSON: the unlimited rate is written as null
    assert doc["args"]["request_rate"] is None and doc["summary"]["completed"] == 6
    assert doc["summary"]["goodput_per_s"] > 0 and doc["errors"] == []
    assert "output_tokens_per_s" in capsys.readouterr().out


def test_client_processes_share_the_workload(fake_server):
    base_url, state = fake_server
    workload = random_workload(12, input_len=8, output_len=4, seed=1)
    cfg = RunConfig(base_url, model="m", request_rate=200.0, max_concurrency=4, client_procs=3)
    results, duration = asyncio.run(run_benchmark(cfg, workload))
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.prompt_tokens for r in results] == [8] * 12 and sum(r.output_tokens for r in results) == 48
    assert sorted(tuple(b["prompt"]) for b in state.bodies) == sorted(tuple(w.prompt) for w in workload)
    assert state.max_in_flight <= 6  # each of the 3 processes caps its share: ceil(4 / 3) = 2
    assert duration < 30
    with pytest.raises(ValueError, match="client_procs"):
        RunConfig(base_url, client_procs=0)


def test_cli_prints_the_runs_stage_breakdown(fake_server, tmp_path, capsys):
    base_url, state = fake_server
    state.metrics.stage_seconds.observe(9.0, stage="prefill")  # before the run: must not count
    out = tmp_path / "result.json"
    argv = ["--base-url", base_url, "--num-prompts", "4", "--input-len", "8", "--output-len", "3"]
    assert serving.main(argv + ["--json-out", str(out), "--client-procs", "2"]) == 0
    stages = json.loads(out.read_text())["stages"]
    assert stages["prefill"]["count"] == 4 and stages["prefill"]["mean_ms"] == pytest.approx(4.0)
    assert stages["decode"]["count"] == 4 and 100 < stages["decode"]["p50_ms"] <= 250  # in (0.1, 0.25]
    printed = capsys.readouterr().out
    assert "stage" in printed and "prefill" in printed and "p99_ms" in printed


# --- concurrency sweeps and pictures ------------------------------------------------------------


def test_concurrency_list_parses_and_rejects_bad_values(capsys):
    assert serving.concurrency_list("1,4,16,64,256") == [1, 4, 16, 64, 256]
    a, cfg = serving.parse_args(["--base-url", "http://h/v1", "--max-concurrency", "8"])
    assert a.concurrencies == [8] and cfg.max_concurrency == 8
    assert serving.parse_args(["--base-url", "http://h/v1"])[1].max_concurrency is None
    for bad in ("0", "4,-1", "a", "4,,8", "", "4,4", "1.5"):
        with pytest.raises(SystemExit) as exc:
            serving.parse_args(["--base-url", "http://h/v1", "--max-concurrency", bad])
        assert exc.value.code == 2 and "--max-concurrency" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serving.parse_args(
            ["--base-url", "http://h/v1", "--workload", "multi-turn", "--max-concurrency", "1,2"]
        )
    assert "request-count workload" in capsys.readouterr().err


def test_cli_sweeps_concurrency_and_plots(fake_server, tmp_path):
    base_url, state = fake_server
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    argv = ["--base-url", base_url, "--num-prompts", "8", "--input-len", "8", "--output-len", "4"]
    assert serving.main(argv + ["--max-concurrency", "1,4", "--json-out", str(out), "--plot", str(png)]) == 0
    doc = json.loads(out.read_text())
    assert [run["max_concurrency"] for run in doc["sweep"]] == [1, 4]
    assert len(state.bodies) == 16 and state.max_in_flight <= 4
    for run in doc["sweep"]:
        ttft, tpot = run["requests"]["ttft_ms"], run["requests"]["tpot_ms"]
        assert len(ttft) == len(tpot) == 8 and min(ttft) >= 1e3 * FIRST_TOKEN_DELAY_S
        assert all(round(v, 2) == v for v in ttft + tpot)
        assert run["summary"]["ttft_ms"]["p50"] == pytest.approx(percentile(ttft, 50), abs=0.01)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
