"""Real clusters (router + worker processes, tcp KV) that prefill on decode or mixed workers, on the CPU:
greedy answers equal the offline engine's whichever way each request is served, and the router counts
its decisions.

  mixed  --prefill 0 --decode 0 --mixed 2: mixed workers alone, every request served whole locally
  never  --prefill 1 --decode 1 --disagg never: the decode worker prefills every prompt itself
  auto   --prefill 1 --decode 0 --mixed 1 --disagg auto: the router picks per request; its workers run
         their sockets in a channel process each (`--worker-io process`, common/worker/io_process.py:
         hand-offs and local requests both), the other setups on an I/O thread (this box's `auto`)
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from common.wire.sampling_params import SamplingParams
from tests.integration.launcher import LaunchedCluster, complete, running
from tests.integration.process_cluster import metric

pytestmark = pytest.mark.timeout(300)

SETUPS = {
    "mixed": ["--prefill", "0", "--decode", "0", "--mixed", "2"],
    "never": ["--prefill", "1", "--decode", "1", "--disagg", "never"],
    "auto": ["--prefill", "1", "--decode", "0", "--mixed", "1", "--disagg", "auto", "--worker-io", "process"],
}
TEXTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village nestled between rolling hills, there lived",
    "Explain photosynthesis in one sentence:",
    "1, 2, 3, 4, 5,",
    "The quick brown fox",
]
MAX_TOKENS = 10


@pytest.fixture(scope="module", params=list(SETUPS))
def cluster(request, model_dir, tmp_path_factory) -> LaunchedCluster:
    log_dir = tmp_path_factory.mktemp(f"{request.param}-logs")
    extra = [*SETUPS[request.param], "--kv-transport", "tcp", "--num-kvcache-blocks", "256"]
    with running(model_dir, log_dir, *extra) as launched:
        launched.setup = request.param  # type: ignore[attr-defined]
        yield launched


def test_answers_equal_the_offline_engine_and_decisions_are_counted(cluster, offline, tokenizer) -> None:
    prompts = [tokenizer.encode(t) for t in TEXTS]
    before = cluster.metrics()
    with ThreadPoolExecutor(len(prompts)) as pool:  # concurrent: the workers batch them
        got = list(pool.map(lambda p: complete(cluster, p, MAX_TOKENS), prompts))
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    want = offline.generate(prompts, params, use_tqdm=False)
    for text, w, resp in zip(TEXTS, want, got, strict=True):
        assert resp["choices"][0]["text"] == tokenizer.decode(w["token_ids"]), f"{cluster.setup}: {text!r}"
        assert resp["usage"]["completion_tokens"] == len(w["token_ids"])
    after = cluster.metrics()
    counted = {
        d: (metric(after, "pdserve_disagg_decisions_total", decision=d) or 0.0)
        - (metric(before, "pdserve_disagg_decisions_total", decision=d) or 0.0)
        for d in ("local", "remote")
    }
    assert counted["local"] + counted["remote"] == len(TEXTS)
    if cluster.setup in ("mixed", "never"):
        assert counted["remote"] == 0  # nothing can (mixed) or may (never) go to a prefill worker


def test_pairs_that_can_hand_off_are_probed_and_sound(cluster) -> None:
    """Without a floor a working pair is measured and not degraded; a cluster without prefill workers
    has no pair to probe (kv_pairs in /health, router/kv_probes.py)."""
    want = {
        "mixed": set(),
        "never": {("prefill-0", "decode-0")},
        "auto": {("prefill-0", "mixed-0")},
    }[cluster.setup]
    deadline = time.monotonic() + 60
    while {(p["prefill"], p["decode"]) for p in cluster.health()["kv_pairs"]} != want:
        assert time.monotonic() < deadline, cluster.health()
        time.sleep(0.2)
    for pair in cluster.health()["kv_pairs"]:
        assert pair["transport"] == "tcp" and pair["probe_gbps"] > 0 and not pair["degraded"], pair
