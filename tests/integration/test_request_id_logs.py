"""X-Request-Id in the logs: one request through a real cluster (router, prefill and decode worker
processes, debug logging) leaves lines naming its id in every process's log, and every line that
mentions the request names it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.integration.process_cluster import ProcessCluster

pytestmark = pytest.mark.timeout(240)
DEBUG = ["--log-level", "debug"]
PROCESSES = ("router", "prefill-0", "decode-0")


@pytest.fixture(scope="module")
def cluster(model_dir, tmp_path_factory):
    c = ProcessCluster(
        model_dir, tmp_path_factory.mktemp("request_id_logs"), router_flags=DEBUG, worker_flags=DEBUG
    )
    c.start(num_prefill=1, num_decode=1)
    yield c
    c.stop()


def _lines_naming(log_dir: Path, name: str, text: str) -> list[str]:
    return [line for line in (log_dir / f"{name}.log").read_text().splitlines() if text in line]


def _complete(cluster: ProcessCluster, headers: dict) -> httpx.Response:
    body = {"prompt": "Count: one, two, three,", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{cluster.url}/v1/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r


def _finish_lines(cluster: ProcessCluster, log_id: str) -> list[str]:
    return [
        line for line in _lines_naming(cluster.log_dir, "decode-0", f"[{log_id}]") if "finished (" in line
    ]


def _wait_for_finish(cluster: ProcessCluster, log_id: str, timeout: float = 10.0) -> None:
    """The decode worker logs the finish just after sending the last token: it may trail the answer."""
    deadline = time.monotonic() + timeout
    while not _finish_lines(cluster, log_id) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.parametrize("given", [True, False], ids=["client-id", "generated-id"])
def test_the_request_id_is_in_every_log_line_of_the_request(cluster, given) -> None:
    sent = {"X-Request-Id": f"trace-{time.time_ns()}"} if given else {}
    r = _complete(cluster, sent)
    log_id = r.headers["x-request-id"]
    if given:
        assert log_id == sent["X-Request-Id"]
    completion_id = r.json()["id"]
    _wait_for_finish(cluster, log_id)
    for name in PROCESSES:
        tagged = _lines_naming(cluster.log_dir, name, f"[{log_id}]")
        assert tagged, f"no line of {name} names {log_id}:\n{cluster.logs()}"
        # Every line about this request (it names the completion id, or a sub-request of it) names it.
        about = _lines_naming(cluster.log_dir, name, completion_id)
        untagged = [line for line in about if f"[{log_id}]" not in line]
        assert not untagged, untagged
    # The workers' lines are the engine loop's too, not only the command handler's: the decode worker
    # logs the finish, steps after it took the request.
    assert _finish_lines(cluster, log_id), cluster.logs()
