"""Transports that prove their speed, in a real cluster on the CPU (router + worker processes started by
`deploy.launch`, tcp KV): each prefill/decode pair runs a probe transfer when it forms, the router
exports the transport and the measured GB/s, and with a floor no CPU link reaches the pairs are
degraded in /health and the `auto` cost model stops disaggregating over them (the decode worker
prefills locally), while every greedy answer still equals the offline engine's."""

from __future__ import annotations

import time

import httpx
import pytest

from common.sampling_params import SamplingParams
from tests.integration.launcher import LaunchedCluster, launch
from tests.integration.process_cluster import metric

pytestmark = pytest.mark.timeout(300)

FLOOR_GBPS = 1000.0  # far above what tcp on loopback moves: every pair ends up degraded
TEXTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,"]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def cluster(model_dir, tmp_path_factory) -> LaunchedCluster:
    log_dir = tmp_path_factory.mktemp("probe-logs")
    flags = ["--prefill", "1", "--decode", "2", "--kv-transport", "tcp", "--num-kvcache-blocks", "256"]
    flags += ["--disagg", "auto", "--kv-probe-mb", "4", "--kv-probe-min-gbps", str(FLOOR_GBPS)]
    launched = launch(model_dir, log_dir, *flags)
    try:
        yield launched
    finally:
        assert launched.stop() == 0, launched.logs()


def _pairs(cluster: LaunchedCluster, want: int, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pairs = cluster.health()["kv_pairs"]
        if len(pairs) == want:
            return pairs
        time.sleep(0.2)
    raise AssertionError(f"probes did not report within {timeout} s:\n{cluster.logs()}")


def test_every_pair_is_probed_exported_and_judged(cluster) -> None:
    pairs = _pairs(cluster, want=2)
    print("kv_pairs in /health:", pairs)  # what -s shows: the figures docs/reliability.md quotes
    assert {(p["prefill"], p["decode"]) for p in pairs} == {
        ("prefill-0", "decode-0"),
        ("prefill-0", "decode-1"),
    }
    text = cluster.metrics()
    for p in pairs:
        assert p["transport"] == "tcp" and p["error"] is None, p
        assert 0 < p["probe_gbps"] < FLOOR_GBPS and p["degraded"] is True
        labels = {"prefill": p["prefill"], "decode": p["decode"]}
        assert metric(text, "pdserve_kv_transport_info", **labels, transport="tcp") == 1
        assert metric(text, "pdserve_kv_transfer_probe_gbps", **labels) == pytest.approx(
            p["probe_gbps"], rel=1e-3
        )
        assert metric(text, "pdserve_kv_pair_degraded", **labels) == 1
    assert "KV pair prefill-0 -> decode-0 is degraded: tcp at" in (cluster.log_dir / "router.log").read_text()
    assert cluster.health()["status"] == "ok"  # a slow KV path costs speed, not service


def test_the_cost_model_does_not_disaggregate_over_degraded_pairs(cluster, offline, tokenizer) -> None:
    _pairs(cluster, want=2)
    before = cluster.metrics()
    prompts = [tokenizer.encode(t) for t in TEXTS]
    for prompt in prompts:
        body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        r = httpx.post(f"{cluster.url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        want = offline.generate(
            [prompt], SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False
        )
        assert r.json()["choices"][0]["text"] == tokenizer.decode(want[0]["token_ids"])
    after = cluster.metrics()

    def counted(decision: str) -> float:
        return (metric(after, "pdserve_disagg_decisions_total", decision=decision) or 0) - (
            metric(before, "pdserve_disagg_decisions_total", decision=decision) or 0
        )

    assert counted("local") == len(TEXTS) and counted("remote") == 0
