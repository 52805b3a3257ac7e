"""A real cluster (`deploy.launch --backend local`: router + 2 prefill + 2 decode workers over tcp) on
the default model, on the CPU: parity with the offline engine, streaming, concurrency, the official
OpenAI client, and prefix-aware routing."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from benchmarks.chaos.chaos_load import SHARED_PREFIX as LONG_PREFIX
from benchmarks.chaos.chaos_load import TEXTS
from common.wire.sampling_params import SamplingParams
from tests.integration.launcher import LaunchedCluster, complete, running

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def cluster(model_dir, tmp_path_factory) -> LaunchedCluster:
    log_dir = tmp_path_factory.mktemp("cluster-logs")
    extra = ["--prefill", "2", "--decode", "2", "--kv-transport", "tcp", "--num-kvcache-blocks", "256"]
    with running(model_dir, log_dir, *extra) as launched:
        yield launched


@pytest.fixture(scope="module")
def client(cluster):
    import openai

    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", timeout=120)


@pytest.fixture(scope="module")
def model_name(client) -> str:
    return client.models.list().data[0].id


def expected(offline, tokenizer, prompts: list[list[int]], max_tokens: int = MAX_TOKENS) -> list[dict]:
    outs = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    return [{**o, "text": tokenizer.decode(o["token_ids"])} for o in outs]


def test_greedy_outputs_equal_offline_engine(cluster, offline, tokenizer) -> None:
    prompts = [tokenizer.encode(t) for t in TEXTS]
    with ThreadPoolExecutor(len(prompts)) as pool:  # concurrent, so the workers batch them
        got = list(pool.map(lambda p: complete(cluster, p, MAX_TOKENS), prompts))
    for want, resp in zip(expected(offline, tokenizer, prompts), got, strict=True):
        choice = resp["choices"][0]
        assert choice["text"] == want["text"]
        assert resp["usage"]["completion_tokens"] == len(want["token_ids"])
        assert choice["finish_reason"] == want["finish_reason"]


def test_chat_through_openai_client_equals_offline(client, model_name, offline, tokenizer) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    resp = client.chat.completions.create(
        model=model_name, messages=messages, temperature=0, max_tokens=MAX_TOKENS
    )
    ids = tokenizer.encode_chat(messages)
    want = expected(offline, tokenizer, [ids])[0]
    assert resp.choices[0].message.content == want["text"]
    assert resp.usage.prompt_tokens == len(ids)
    assert resp.choices[0].finish_reason == want["finish_reason"]


def test_logit_bias_through_the_cluster_equals_offline(client, model_name, offline, tokenizer) -> None:
    """OpenAI's logit_bias (token ids as string keys) reaches the workers' sampler: the answer equals the
    offline engine's with the same bias, which bans the greedy answer's first two tokens."""
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.encode_chat(messages)
    plain = expected(offline, tokenizer, [ids])[0]["token_ids"]
    bias = {plain[0]: -100.0, plain[1]: -100.0}
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logit_bias=bias)
    want = offline.generate([ids], params, use_tqdm=False)[0]["token_ids"]
    assert want != plain and not set(want) & set(bias)
    resp = client.chat.completions.create(
        model=model_name,
        messages=messages,
        temperature=0,
        max_tokens=MAX_TOKENS,
        logit_bias={str(t): b for t, b in bias.items()},
    )
    assert resp.choices[0].message.content == tokenizer.decode(want)


def test_streaming_gives_the_same_text(client, model_name) -> None:
    for text in TEXTS[:3]:
        plain = client.completions.create(model=model_name, prompt=text, temperature=0, max_tokens=MAX_TOKENS)
        stream = client.completions.create(
            model=model_name, prompt=text, temperature=0, max_tokens=MAX_TOKENS, stream=True
        )
        chunks = list(stream)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
        assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    messages = [{"role": "user", "content": "Name three colors."}]
    plain_chat = client.chat.completions.create(
        model=model_name, messages=messages, temperature=0, max_tokens=8
    )
    deltas = client.chat.completions.create(
        model=model_name, messages=messages, temperature=0, max_tokens=8, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in deltas if c.choices)
    assert text == plain_chat.choices[0].message.content


def test_32_concurrent_requests_all_complete(cluster) -> None:
    prompts = [f"Request number {i}: tell me a fact about the number {i}." for i in range(32)]
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda p: complete(cluster, p, 6), prompts))
    for resp in results:
        assert resp["choices"][0]["finish_reason"] in ("stop", "length")
        assert 1 <= resp["usage"]["completion_tokens"] <= 6


def test_shared_prefix_goes_to_the_worker_holding_it(cluster, tokenizer) -> None:
    prefix = tokenizer.encode(LONG_PREFIX)
    assert len(prefix) >= 48  # at least three full blocks to reuse
    counts0, blocks0 = _prefill_counts(cluster), _cached_blocks(cluster)
    complete(cluster, prefix + tokenizer.encode(" Question: when do you open?", False), 2)
    counts1 = _prefill_counts(cluster)
    holder = next(w for w in counts1 if counts1[w] > counts0.get(w, 0))  # the worker that prefilled it
    _wait_for_blocks(cluster, holder, blocks0.get(holder, 0) + len(prefix) // 16)
    before = _prefill_counts(cluster)
    hits_before = _metric(cluster.metrics(), "pdserve_prefix_cache_hit_tokens_total")
    for q in ("Do you sell rye?", "Can I order thirty loaves today?", "Croissants on Monday?"):
        resp = complete(cluster, prefix + tokenizer.encode(f" Question: {q}", False), 2)
        assert resp["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48
    after = _prefill_counts(cluster)
    assert after[holder] - before.get(holder, 0) == 3
    assert sum(after.values()) - sum(before.values()) == 3
    assert _metric(cluster.metrics(), "pdserve_prefix_cache_hit_tokens_total") - hits_before >= 3 * 48
    # Unrelated prompts arriving together spread over both prefill workers.
    unrelated = [f"Topic {i}: " + " ".join(f"word{i}x{j}" for j in range(20)) for i in range(8)]
    with ThreadPoolExecutor(len(unrelated)) as pool:
        list(pool.map(lambda p: complete(cluster, p, 2), unrelated))
    spread = _prefill_counts(cluster)
    assert all(spread[w] > after.get(w, 0) for w in ("prefill-0", "prefill-1")), spread


SALTED_PREFIX = (
    "You answer questions for a lighthouse museum on a windy northern island. The museum opens at ten "
    "in the morning, the climb to the lamp room takes twenty minutes, children under six may not climb, "
    "dogs wait at the gate, and the last guided tour of the tower starts at four. Be brief and kind."
)


def test_a_cache_salt_reuses_a_prefix_only_within_its_salt(cluster, tokenizer) -> None:
    """vLLM's cache_salt: a prefix cached under one salt is a hit for that salt only (the router looks
    it up under the salted chain, the worker matches it there); another salt, or none, recomputes it."""
    prefix = tokenizer.encode(SALTED_PREFIX)
    assert len(prefix) >= 48  # at least three full blocks
    counts0, blocks0 = _prefill_counts(cluster), _cached_blocks(cluster)
    complete(cluster, prefix + tokenizer.encode(" Question: first?", False), 2, cache_salt="tenant-a")
    counts1 = _prefill_counts(cluster)
    holder = next(w for w in counts1 if counts1[w] > counts0.get(w, 0))
    _wait_for_blocks(cluster, holder, blocks0.get(holder, 0) + len(prefix) // 16)
    again = prefix + tokenizer.encode(" Question: again?", False)

    def cached(**salt: str) -> int:
        return complete(cluster, again, 2, **salt)["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached(cache_salt="tenant-a") >= 48
    assert cached(cache_salt="tenant-b") == 0
    assert cached() == 0


def _cached_blocks(cluster: LaunchedCluster) -> dict[str, int]:
    return {w["worker_id"]: w.get("cached_blocks", 0) for w in cluster.debug_index()["workers"]}


def _wait_for_blocks(cluster: LaunchedCluster, worker: str, min_blocks: int, timeout: float = 15.0) -> None:
    """Until the router's index (fed by cache events) shows `worker` holding at least `min_blocks`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _cached_blocks(cluster).get(worker, 0) >= min_blocks:
            return
        time.sleep(0.1)
    raise AssertionError(f"{worker} never reported the prefix: {cluster.debug_index()}")


def _prefill_counts(cluster: LaunchedCluster) -> dict[str, float]:
    pattern = r'pdserve_prefill_requests_total\{worker="([^"]+)"\} (\S+)'
    return {w: float(v) for w, v in re.findall(pattern, cluster.metrics())}


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_disconnects_and_stop_strings_free_every_block(cluster) -> None:
    body = {"prompt": TEXTS[3], "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{cluster.url}/v1/completions", json=body, timeout=60) as r:
        data = (line for line in r.iter_lines() if line.startswith("data:"))
        for _ in range(5):  # decoding is under way on a decode worker when the client leaves
            next(data)
    resp = complete(cluster, TEXTS[0], 50, stop=[" "], ignore_eos=True)
    assert resp["choices"][0]["finish_reason"] == "stop"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        kv = {w["worker_id"]: w["kv_cache_usage"] for w in cluster.debug_index()["workers"]}
        if not any(kv.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"blocks still in use after the requests ended: {kv}")
