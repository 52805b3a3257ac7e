"""A real cluster with an fp8 KV cache (`--kv-cache-dtype fp8`: router + 1 prefill + 1 decode worker,
tcp KV) on the default model, on the CPU: every request is handed off as fp8 blocks with their scales,
and the greedy answers equal the offline engine's with the same fp8 cache (the decode side reads the
bytes the prefill side wrote, so nothing may differ).

The requests go one at a time and the reference generates each prompt alone: an fp8 cache magnifies the
last-bit differences that another batch shape gives a CPU matmul (a value on a rounding edge of e4m3
lands one step apart, ~6%), which flipped a near-tie of the 135M model in one CI run; with equal shapes
on both sides the bytes must agree exactly."""

from __future__ import annotations

import pytest

from common import LLM
from common.wire.sampling_params import SamplingParams
from tests.integration.launcher import LaunchedCluster, complete, running
from tests.integration.process_cluster import metric

pytestmark = pytest.mark.timeout(300)

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village nestled between rolling hills, there lived",
    "Explain photosynthesis in one sentence:",
]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def cluster(model_dir, tmp_path_factory) -> LaunchedCluster:
    extra = ["--prefill", "1", "--decode", "1", "--kv-transport", "tcp", "--disagg", "always"]
    extra += ["--kv-cache-dtype", "fp8", "--num-kvcache-blocks", "256"]
    with running(model_dir, tmp_path_factory.mktemp("fp8-logs"), *extra) as launched:
        yield launched


def test_fp8_hand_offs_answer_as_the_offline_fp8_engine(cluster, model_dir, tokenizer) -> None:
    prompts = [tokenizer.encode(t) for t in TEXTS]
    before = metric(cluster.metrics(), "pdserve_disagg_decisions_total", decision="remote") or 0.0
    got = [complete(cluster, p, MAX_TOKENS)["choices"][0]["text"] for p in prompts]
    offline = LLM(model_dir, kv_cache_dtype="fp8", num_kvcache_blocks=256, enforce_eager=True)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    want = [offline.generate([p], params, use_tqdm=False)[0] for p in prompts]
    for text, w, answer in zip(TEXTS, want, got, strict=True):
        assert answer == tokenizer.decode(w["token_ids"]), text
    after = metric(cluster.metrics(), "pdserve_disagg_decisions_total", decision="remote") or 0.0
    assert after - before == len(TEXTS)  # every answer came through an fp8 hand-off
