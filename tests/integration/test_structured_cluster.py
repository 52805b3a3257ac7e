"""Structured output through a real cluster (router + prefill worker + decode worker processes, KV over
tcp): the prefill worker samples the first token under the grammar, the decode worker rebuilds the
matcher from the grammar text in the DecodeRequest and advances it over that token. Greedy answers equal
the offline engine's, sampled ones validate, on both endpoints, streamed or not, with the decode
worker speculating (n-gram) or not."""

from __future__ import annotations

import json

import httpx
import pytest

from common.wire.sampling_params import SamplingParams
from common.wire.structured_output import GuidedRequest
from tests.helpers.structured_cases import CASES
from tests.integration.process_cluster import ProcessCluster

pytestmark = pytest.mark.timeout(300)
MAX_TOKENS = 64


@pytest.fixture(scope="module", params=[[], ["--speculative", "ngram"]], ids=["plain", "ngram"])
def cluster(request, model_dir, tmp_path_factory):
    flags = ["--num-kvcache-blocks", "96", *request.param]
    c = ProcessCluster(model_dir, tmp_path_factory.mktemp("structured"), worker_flags=flags)
    c.start(num_prefill=1, num_decode=1)
    yield c
    c.stop()


def _messages(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def _post(cluster: ProcessCluster, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{cluster.url}/v1/{path}", json=body, timeout=120)


# The offline engine's greedy answer per question, shared by both clusters (computed once).
_OFFLINE_ANSWERS: dict[str, str] = {}


def _offline_answer(offline, ids: list[int], case) -> str:
    if case.question not in _OFFLINE_ANSWERS:
        grammar = GuidedRequest(**case.request).grammar()
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, grammar=grammar)
        _OFFLINE_ANSWERS[case.question] = offline.generate([ids], params, use_tqdm=False)[0]["text"]
    return _OFFLINE_ANSWERS[case.question]


def test_greedy_answers_equal_offline_and_validate(cluster, offline, tokenizer) -> None:
    for case in CASES:
        ids = tokenizer.encode_chat(_messages(case.question), add_generation_prompt=True)
        want = _offline_answer(offline, ids, case)
        body = {"prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, **case.request}
        r = _post(cluster, "completions", body)
        assert r.status_code == 200, (case.question, r.text, cluster.logs())
        choice = r.json()["choices"][0]
        assert choice["text"] == want, case.question
        assert choice["finish_reason"] == "stop"
        case.check(choice["text"])
        if case is not CASES[0]:
            continue
        chat = _post(
            cluster,
            "chat/completions",
            {
                "messages": _messages(case.question),
                "temperature": 0,
                "max_tokens": MAX_TOKENS,
                **case.request,
            },
        )
        assert chat.json()["choices"][0]["message"]["content"] == want, case.question


def test_sampled_and_streamed_answers_validate(cluster) -> None:
    for i, case in enumerate(CASES):
        body = {"messages": _messages(case.question), "temperature": 1.0, "seed": i, "max_tokens": MAX_TOKENS}
        r = _post(cluster, "chat/completions", {**body, **case.request})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        case.check(choice["message"]["content"])
    for case in CASES[:2]:  # streamed: the first token (prefill worker) and the rest (decode) join up
        body = {"messages": _messages(case.question), "temperature": 1.0, "seed": 5, "stream": True}
        streamed = _post(cluster, "chat/completions", {**body, "max_tokens": MAX_TOKENS, **case.request})
        events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
        case.check("".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]))


def test_bad_schema_is_a_400_and_the_cluster_keeps_serving(cluster) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wizard"}}}
    r = _post(cluster, "completions", {"prompt": "x", "response_format": bad})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format"
    many = [f"option number {i}" for i in range(3000)]  # past llguidance's 2,000 alternatives a row
    r = _post(cluster, "completions", {"prompt": "x", "max_tokens": 16, "guided_choice": many})
    assert r.json()["choices"][0]["text"] in many
    ok = _post(cluster, "completions", {"prompt": "x", "max_tokens": 4, "guided_choice": ["yes", "no"]})
    assert ok.json()["choices"][0]["text"] in ("yes", "no")
