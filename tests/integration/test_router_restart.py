"""A router killed and restarted on the same inbox address: the running workers re-register, the
router rebuilds its prefix index from their snapshots, and cached prefixes are routed to again."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration.launcher import complete
from tests.integration.process_cluster import ProcessCluster
from tests.integration.test_cluster import LONG_PREFIX

pytestmark = pytest.mark.timeout(240)


def test_restarted_router_relearns_workers_and_their_caches(model_dir, tmp_path, tokenizer) -> None:
    cluster = ProcessCluster(model_dir, tmp_path, [], ["--num-kvcache-blocks", "128"]).start(2, 1)
    try:
        prefix = tokenizer.encode(LONG_PREFIX)
        first = complete(cluster, prefix + tokenizer.encode(" Question: rye?", False), max_tokens=2)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        old_router = cluster.procs["router"]
        old_router.kill()
        old_router.wait()
        # Same inbox port, so the workers' sockets reconnect to the new router on their own.
        cluster.router_flags += ["--inbox-port", cluster.inbox.rsplit(":", 1)[1]]
        (tmp_path / "router-ready.json").unlink()
        deadline = time.monotonic() + 60
        cluster._start_router(deadline)
        while not cluster._all_live():  # workers re-register within a few seconds
            cluster._check(deadline, "workers re-registered with the new router")
            time.sleep(0.25)
        again = _complete_when_indexed(cluster, prefix + tokenizer.encode(" Question: spelt?", False))
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48
    finally:
        cluster.stop()


def _complete_when_indexed(cluster: ProcessCluster, prompt: list[int], timeout: float = 20.0) -> dict:
    """The new router learns the caches from snapshots a moment after each worker re-joins."""
    deadline = time.monotonic() + timeout
    while True:
        entries = cluster.workers()
        if any(w.get("cached_blocks", 0) >= 3 for w in entries.values()) or time.monotonic() > deadline:
            return complete(cluster, prompt, max_tokens=2)
        time.sleep(0.2)


def test_launcher_restarts_its_router_while_a_worker_is_down(model_dir, tmp_path) -> None:
    """`Cluster.restart_router` (the chaos soak's router fault) used to raise when any worker happened to
    be down at that moment ("worker(s) exited during start-up"), which ended the soak's fault loop. Now
    the new router serves on the same URL, and the worker started again joins it."""
    from deploy.launch import Cluster
    from deploy.launch_args import parse_args
    from deploy.local_backend import LocalBackend

    argv = ["--model", model_dir, "--backend", "local", "--port", "0", "--log-dir", str(tmp_path)]
    argv += ["--log-level", "warning", "--num-kvcache-blocks", "64", "--enforce-eager"]
    plan = parse_args(argv)
    cluster = Cluster(plan, LocalBackend(plan.log_dir))
    try:
        url = cluster.start()
        decode = next(w for w in cluster.workers if w.spec.role == "decode")
        decode.stop(grace_s=0.0)  # down, as after a SIGKILL before its supervisor restarts it
        old_pid = cluster.router.pid
        cluster.restart_router()
        assert cluster.router.pid != old_pid and cluster.url == url
        cluster.workers[cluster.workers.index(decode)] = cluster.backend.start(decode.spec)
        deadline = time.monotonic() + 120
        while not cluster.healthy():
            assert time.monotonic() < deadline, "the workers never joined the new router"
            time.sleep(0.25)
        body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"], answer.text
    finally:
        cluster.shutdown()
