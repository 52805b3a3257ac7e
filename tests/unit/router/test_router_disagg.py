"""Mixed workers and conditional disaggregation end to end, against scripted workers on real sockets."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from common.wire.messages import Abort, DecodeRequest, GenerateRequest, PrefillRequest
from router.live_rates import EWMA_ALPHA
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import REPLY_TEXT, run_router, scripted_reply, wait_for

PROMPT = list(range(1000, 1040))  # two full blocks of 16 and a partial one


def _specs(tokenizer, **roles: tuple[str, Script]) -> list:
    reply = scripted_reply(tokenizer)
    out = []
    for worker_id, (role, script) in roles.items():
        script.reply = script.reply or reply
        out.append((worker_id.replace("_", "-"), role, script))
    return out


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def _complete(h, **body):
    return await h.client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 100} | body)


def test_mixed_workers_alone_serve_and_share_the_prefix_index(model_dir, tokenizer) -> None:
    specs = _specs(tokenizer, mixed_a=("mixed", Script()), mixed_b=("mixed", Script()))

    async def check(h):
        assert (await h.client.get("/health")).status_code == 200
        first = await _complete(h)
        assert first.status_code == 200 and first.json()["choices"][0]["text"] == REPLY_TEXT
        holder = "mixed-a" if h.worker("mixed-a").of_type(GenerateRequest) else "mixed-b"
        await wait_for(
            lambda: h.router.index.num_blocks(holder) >= 2, what="cache events from a mixed worker"
        )
        again = (await _complete(h, prompt=PROMPT + [7])).json()
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 32  # steered to the holder
        assert len(h.worker(holder).of_type(GenerateRequest)) == 2
        assert not any(w.of_type(PrefillRequest) or w.of_type(Abort) for w in h.workers)  # ended by worker
        metrics = (await h.client.get("/metrics")).text
        assert _metric(metrics, 'pdserve_disagg_decisions_total{decision="local"}') == 2
        assert _metric(metrics, f'pdserve_prefill_requests_total{{worker="{holder}"}}') == 2
        assert _metric(metrics, f'pdserve_prefix_index_blocks{{worker="{holder}"}}') >= 2
        debug = (await h.client.get("/debug/index")).json()
        assert debug["disagg"]["mode"] == "always"
        assert debug["disagg"]["learned"]["prefill_tokens_per_s"][holder]["samples"] == 2

    run_router(model_dir, tokenizer, specs, check)


def test_stop_string_deadline_and_failures_on_a_local_route(model_dir, tokenizer) -> None:
    specs = _specs(tokenizer, mixed_a=("mixed", Script(token_delay=0.01)))

    async def check(h):
        m = h.worker("mixed-a")
        r = (await _complete(h, stop=["世界"])).json()["choices"][0]
        assert r["text"] == " Hello 😀 " and r["finish_reason"] == "stop"
        await wait_for(lambda: m.of_type(Abort), what="abort")
        await asyncio.sleep(0.05)
        assert len(m.of_type(Abort)) == 1  # one worker holds a local request: one Abort
        m.script.silent = True
        r = await _complete(h, timeout=0.3)
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        await wait_for(lambda: len(m.of_type(Abort)) == 2, what="abort after the deadline")
        m.script.silent, m.script.fail_retryable = False, True
        r = await _complete(h)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_workers"
        assert h.router.registry.loads.in_flight("mixed-a") == 0  # nothing leaks from any of these

    run_router(model_dir, tokenizer, specs, check)


def test_a_lost_mixed_worker_is_replayed_on_another(model_dir, tokenizer) -> None:
    specs = _specs(
        tokenizer,
        mixed_a=("mixed", Script(token_delay=0.05)),
        mixed_b=("mixed", Script()),
    )

    async def check(h):
        h.router.registry.loads._outstanding["mixed-b"] = 10**6  # steer the first attempt to mixed-a
        task = asyncio.create_task(_complete(h, temperature=0))
        await wait_for(lambda: h.worker("mixed-a").of_type(GenerateRequest), what="dispatch")
        await asyncio.sleep(0.12)  # a few tokens reached the client
        h.worker("mixed-a").heartbeats_on = False
        h.router.registry.loads._outstanding["mixed-b"] = 0
        r = await task
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == REPLY_TEXT  # greedy: replayed
        assert h.worker("mixed-b").of_type(GenerateRequest)[0].request_id.endswith("~retry1")
        assert _metric((await h.client.get("/metrics")).text, "pdserve_retries_total") == 1

    run_router(model_dir, tokenizer, specs, check, heartbeat_timeout=0.3)


def test_always_disaggregates_onto_decode_and_mixed_targets(model_dir, tokenizer) -> None:
    specs = _specs(
        tokenizer,
        prefill_0=("prefill", Script()),
        decode_0=("decode", Script(num_kv_blocks=500)),
        mixed_0=("mixed", Script(num_kv_blocks=2000)),  # most free blocks: the decode target
    )

    async def check(h):
        r = await _complete(h)
        assert r.json()["choices"][0]["text"] == REPLY_TEXT
        sent = h.worker("prefill-0").of_type(PrefillRequest)[0]
        assert sent.decode_worker_id == "mixed-0" and h.worker("mixed-0").of_type(DecodeRequest)
        assert not h.worker("mixed-0").of_type(GenerateRequest)
        metrics = (await h.client.get("/metrics")).text
        assert _metric(metrics, 'pdserve_disagg_decisions_total{decision="remote"}') == 1
        assert _metric(metrics, 'pdserve_disagg_decisions_total{decision="local"}') == 0

    run_router(model_dir, tokenizer, specs, check)


def test_never_makes_decode_workers_prefill(model_dir, tokenizer) -> None:
    specs = _specs(tokenizer, prefill_0=("prefill", Script()), decode_0=("decode", Script()))

    async def check(h):
        r = (await _complete(h, stream=True)).text
        chunks = [json.loads(line[6:]) for line in r.split("\n\n") if line.startswith("data: {")]
        assert "".join(c["choices"][0]["text"] for c in chunks) == REPLY_TEXT
        assert r.rstrip().endswith("data: [DONE]")
        (sent,) = h.worker("decode-0").of_type(GenerateRequest)
        assert sent.prompt_token_ids == PROMPT and sent.deadline is not None
        assert not h.worker("prefill-0").of_type(PrefillRequest)
        health = await h.client.get("/health")
        assert health.status_code == 200

    run_router(model_dir, tokenizer, specs, check, disagg="never")


def test_auto_weighs_the_decode_batch_against_the_prefill_queue(model_dir, tokenizer) -> None:
    specs = _specs(
        tokenizer,
        prefill_0=("prefill", Script()),
        decode_0=("decode", Script(num_running=64)),  # a full decode batch: stalling it costs a lot
    )

    async def check(h):
        await _complete(h)
        assert len(h.worker("prefill-0").of_type(PrefillRequest)) == 1
        h.worker("prefill-0").script.queued_prefill_tokens = 10**8  # a prefill backlog of hours
        await wait_for(
            lambda: h.router.registry.prefill_loads()[0].queued_prefill_tokens == 10**8, what="heartbeat"
        )
        r = await _complete(h)
        assert r.json()["choices"][0]["text"] == REPLY_TEXT
        assert len(h.worker("decode-0").of_type(GenerateRequest)) == 1
        metrics = (await h.client.get("/metrics")).text
        assert _metric(metrics, 'pdserve_disagg_decisions_total{decision="remote"}') == 1
        assert _metric(metrics, 'pdserve_disagg_decisions_total{decision="local"}') == 1

    run_router(model_dir, tokenizer, specs, check, disagg="auto")


def test_stage_timings_reach_metrics_and_the_learned_figures(model_dir, tokenizer) -> None:
    specs = _specs(
        tokenizer,
        prefill_0=("prefill", Script(timings={"prefill_queue": 0.01, "prefill": 0.02})),
        decode_0=("decode", Script(timings={"transfer": 0.003, "decode_admission": 0.004})),
    )

    async def check(h):
        for _ in range(2):
            assert (await _complete(h)).status_code == 200
        metrics = (await h.client.get("/metrics")).text
        for stage in ("prefill_queue", "prefill", "transfer", "decode_admission", "router_queue", "decode"):
            assert _metric(metrics, f'pdserve_stage_seconds_count{{stage="{stage}"}}') == 2, stage
        assert _metric(metrics, 'pdserve_stage_seconds_sum{stage="prefill"}') == 0.04
        learned = (await h.client.get("/debug/index")).json()["disagg"]["learned"]
        # 40 new tokens in 0.02 s, then 8 (the second time 32 were cached)
        expected = 40 / 0.02 + EWMA_ALPHA * (8 / 0.02 - 40 / 0.02)
        assert learned["prefill_tokens_per_s"]["prefill-0"]["value"] == pytest.approx(expected)
        assert learned["decode_admission_s"]["decode-0"] == {"value": 0.004, "samples": 2}
        assert learned["transfer_bytes_per_s"]["prefill-0->decode-0"]["value"] == 1024 / 0.001
        assert learned["kv_bytes_per_token"]["value"] == 1024 / len(PROMPT)

    run_router(model_dir, tokenizer, specs, check)
