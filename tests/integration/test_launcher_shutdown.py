"""The launcher's life cycle: a 1 prefill + 2 decode cluster serves the offline engine's greedy answer,
and whether the launcher is stopped (SIGTERM) or killed (SIGKILL) no process it started survives."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from common.net.process import process_alive
from common.wire.sampling_params import SamplingParams
from tests.integration.launcher import LaunchedCluster, launch

pytestmark = pytest.mark.timeout(240)
SMALL = ["--kv-transport", "tcp", "--num-kvcache-blocks", "64"]


def children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(p) for p in text]
    return out


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if process_alive(p)]
    return alive


def test_sigterm_stops_everything(model_dir, tmp_path, offline, tokenizer) -> None:
    cluster = launch(model_dir, tmp_path, "--prefill", "1", "--decode", "2", *SMALL)
    try:
        workers = cluster.health()["workers"]
        assert sorted(w["worker_id"] for w in workers) == ["decode-0", "decode-1", "prefill-0"]
        _assert_greedy_parity(cluster, offline, tokenizer)
        started = children(cluster.proc.pid)  # the router and the three workers
        assert len(started) == 4 and set(cluster.worker_pids()) <= set(started)
    finally:
        status = cluster.stop()
    assert status == 0, cluster.logs()
    assert wait_gone(started) == [], cluster.logs()


def test_killed_launcher_leaves_no_orphans(model_dir, tmp_path) -> None:
    cluster = launch(model_dir, tmp_path, "--prefill", "1", "--decode", "1", *SMALL)
    started = children(cluster.proc.pid)
    assert len(started) == 3
    cluster.proc.send_signal(signal.SIGKILL)
    cluster.proc.wait()
    assert wait_gone(started) == [], cluster.logs()


def _assert_greedy_parity(cluster: LaunchedCluster, offline, tokenizer) -> None:
    ids = tokenizer.encode("The tallest mountain in the world is")
    body = {"prompt": ids, "max_tokens": 10, "temperature": 0}
    resp = httpx.post(f"{cluster.url}/v1/completions", json=body, timeout=60).json()
    want = offline.generate([ids], SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)[0]
    assert resp["choices"][0]["text"] == tokenizer.decode(want["token_ids"])
