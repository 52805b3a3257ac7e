"""The authenticated cluster end to end (common/curve.py): `deploy.launch` makes the CURVE keys and
hands them to the router and the workers through their environment; the cluster serves the offline
engine's greedy answers over authenticated sockets (router <-> workers, prefill -> decode commands,
cache events, the KV transfer); the secret is on no command line and in no log; a rogue process
without the keys, or with keys of its own, cannot register."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from common.curve import PUBLIC_ENV, SECRET_ENV, CurveKeys
from common.hashing import probe_hash
from common.messages import WorkerRegister, encode
from common.sampling_params import SamplingParams
from tests.helpers.rogues import run_rogue
from tests.integration.launcher import LaunchedCluster, launch

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(model_dir, tmp_path_factory) -> LaunchedCluster:
    log_dir = tmp_path_factory.mktemp("curve-logs")
    flags = ["--prefill", "1", "--decode", "1", "--kv-transport", "tcp", "--num-kvcache-blocks", "256"]
    launched = launch(model_dir, log_dir, *flags)
    try:
        yield launched
    finally:
        assert launched.stop() == 0, launched.logs()


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


def test_the_cluster_serves_over_authenticated_sockets(cluster, offline, tokenizer) -> None:
    prompt = tokenizer.encode("The capital of France is")
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{cluster.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    want = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    assert r.json()["choices"][0]["text"] == tokenizer.decode(want["token_ids"])
    assert r.json()["usage"]["completion_tokens"] == len(want["token_ids"])


def test_the_secret_is_on_no_command_line_and_in_no_log(cluster) -> None:
    keys, _ = _cluster_keys(cluster)
    secret = keys.secret.decode()
    pids = [w["pid"] for w in cluster.health()["workers"]]
    for pid in pids:
        assert secret not in _proc_text(pid, "cmdline")
    assert secret not in cluster.logs() and secret not in "".join(cluster.output)


def test_a_rogue_without_the_keys_cannot_register(cluster) -> None:
    keys, inbox = _cluster_keys(cluster)
    reg = WorkerRegister(
        "rogue-0",
        "prefill",
        "127.0.0.1",
        1,
        "tcp://127.0.0.1:9",
        None,
        {},
        16,
        probe_hash(16),
        64,
        2048,
        512,
        "m",
    )
    for rogue in ("none", "wrong"):
        assert run_rogue("push", inbox, encode(reg), keys, rogue, seconds=1.5) == 0
    time.sleep(0.5)
    health = httpx.get(f"{cluster.url}/health", timeout=10)
    assert health.status_code == 200 and "rogue-0" not in health.text
    assert "refused a ZMQ peer presenting CURVE key" in (cluster.log_dir / "router.log").read_text()
