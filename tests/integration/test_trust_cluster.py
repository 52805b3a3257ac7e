"""Trust in a real cluster on the CPU (router + worker processes started by `deploy.launch`, tcp KV), one
cluster for all of it to keep CI short:

* transports that prove their speed (router/kv_probes.py): each prefill/decode pair runs a probe
  transfer when it forms, the router exports the transport and the measured GB/s, and with a floor no
  CPU link reaches the pairs are degraded in /health and the `auto` cost model stops disaggregating over
  them (the decode worker prefills locally), while every greedy answer still equals the offline
  engine's;
* the authenticated cluster (common/net/curve.py): the launcher made the CURVE keys and handed them to the
  router and the workers through their environment; the cluster serves over authenticated sockets
  (router <-> workers, prefill -> decode commands, cache events, the KV transfer); the secret is on no
  command line and in no log; a rogue process without the keys, or with keys of its own, cannot
  register.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from common.net.curve import PUBLIC_ENV, SECRET_ENV, CurveKeys
from common.wire.messages import encode
from common.wire.sampling_params import SamplingParams
from tests.helpers.registration import placeholder_register
from tests.helpers.rogues import run_rogue
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
        # /health rounds to 4 decimals; the gauge keeps the measured float
        assert round(metric(text, "pdserve_kv_transfer_probe_gbps", **labels), 4) == p["probe_gbps"]
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


def _proc_text(pid: int, name: str) -> str:
    return Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def _cluster_keys(cluster: LaunchedCluster) -> tuple[CurveKeys, str]:
    """The keys as a worker process got them (its initial environment, readable by its own user only),
    and the router's inbox address from that worker's command line."""
    pid = cluster.health()["workers"][0]["pid"]
    env = dict(kv.split("=", 1) for kv in _proc_text(pid, "environ").split() if "=" in kv)
    argv = _proc_text(pid, "cmdline").split()
    keys = CurveKeys(env[PUBLIC_ENV].encode(), env[SECRET_ENV].encode())
    return keys, argv[argv.index("--router-addr") + 1]


def test_the_secret_is_on_no_command_line_and_in_no_log(cluster) -> None:
    keys, _ = _cluster_keys(cluster)
    secret = keys.secret.decode()
    pids = [w["pid"] for w in cluster.health()["workers"]]
    for pid in pids:
        assert secret not in _proc_text(pid, "cmdline")
    assert secret not in cluster.logs() and secret not in "".join(cluster.output)


def test_a_rogue_without_the_keys_cannot_register(cluster) -> None:
    keys, inbox = _cluster_keys(cluster)
    reg = placeholder_register("rogue-0", "prefill")
    for rogue in ("none", "wrong"):
        assert run_rogue("push", inbox, encode(reg), keys, rogue, seconds=1.5) == 0
    time.sleep(0.5)
    health = httpx.get(f"{cluster.url}/health", timeout=10)
    assert health.status_code == 200 and "rogue-0" not in health.text
    assert "refused a ZMQ peer presenting CURVE key" in (cluster.log_dir / "router.log").read_text()
