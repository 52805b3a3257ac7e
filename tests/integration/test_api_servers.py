"""Two router fronts on one port (`deploy.launch --api-servers 2`), real processes on the CPU: greedy
answers equal the offline engine's whichever front serves them, every front's prefix index sees the
same cache, one --max-running-requests bound holds across both fronts (up to one over when they race,
router/front_slots.py) and /metrics on either front sums both, and a front killed mid-stream loses
only its own streams (its clients see the connection close, the other front's streams finish, the
launcher restarts it, the workers free the dead front's requests: their load returns to zero)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.integration.launcher import LaunchedCluster, launch
from tests.integration.test_cluster import LONG_PREFIX, expected

pytestmark = pytest.mark.timeout(240)
MAX_TOKENS = 8
BOUND = 4  # --max-running-requests: one bound for both fronts
FRONTS = 2
SAMPLE = re.compile(r"^(\S+) (\S+)$")


@pytest.fixture(scope="module")
def fronts(model_dir, tmp_path_factory):
    flags = ["--api-servers", str(FRONTS), "--prefill", "1", "--decode", "1", "--kv-transport", "tcp"]
    flags += ["--max-running-requests", str(BOUND)]
    cluster = launch(model_dir, tmp_path_factory.mktemp("fronts"), *flags, "--num-kvcache-blocks", "128")
    yield cluster
    assert cluster.stop() == 0, cluster.logs()


def client_on(url: str, front: int, not_pid: int | None = None, timeout: float = 60.0) -> httpx.Client:
    """A client whose (kept-alive) connection the kernel gave to `front` (one whose pid is not `not_pid`):
    new connections land on either front, /health says which one answered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client = httpx.Client(base_url=url, timeout=60)
        try:
            report = client.get("/health").json()
            if report.get("front") == front and report.get("front_pid") != not_pid:
                return client
        except (httpx.HTTPError, ValueError):
            time.sleep(0.2)  # the front is (re)starting
        client.close()
    raise AssertionError(f"no connection reached front {front} within {timeout:.0f}s")


def front_views(url: str, path: str, count: int = 2, tries: int = 100) -> dict[int, dict]:
    """`path`'s JSON from each of `count` fronts (new connections until each has answered)."""
    views: dict[int, dict] = {}
    for _ in range(tries):
        view = httpx.get(f"{url}{path}", timeout=10).json()
        views[view["front"]] = view
        if len(views) == count:
            return views
    raise AssertionError(f"only fronts {sorted(views)} answered {path}")


def index_picture(view: dict) -> dict:
    return {w["worker_id"]: (w.get("cached_blocks"), w.get("last_event_seq")) for w in view["workers"]}


def test_greedy_answers_equal_offline_and_every_front_indexes_the_same(fronts, offline, tokenizer) -> None:
    prompts = [tokenizer.encode(LONG_PREFIX + f" Question {i}: when do you open?") for i in range(4)]
    clients = [client_on(fronts.url, i % 2) for i in range(len(prompts))]  # two requests per front
    try:
        with ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(lambda cp: _complete(*cp), zip(clients, prompts, strict=True)))
    finally:
        for client in clients:
            client.close()
    for want, resp in zip(expected(offline, tokenizer, prompts, MAX_TOKENS), got, strict=True):
        assert resp["choices"][0]["text"] == want["text"]
        assert resp["usage"]["completion_tokens"] == len(want["token_ids"])
    deadline = time.monotonic() + 20
    while True:  # the fronts apply the same published events, each at its own pace
        views = front_views(fronts.url, "/debug/index")
        pictures = [index_picture(v) for v in views.values()]
        if pictures[0] == pictures[1] and pictures[0]["prefill-0"][0] >= 3:
            break
        assert time.monotonic() < deadline, f"the fronts' indexes differ: {pictures}"
        time.sleep(0.2)
    assert views[0]["unique_blocks"] == views[1]["unique_blocks"] >= 3


def test_one_bound_across_fronts_and_metrics_summed_over_them(fronts) -> None:
    baseline = _agreed_metrics(fronts.url, lambda m: True)
    held: queue.Queue[int] = queue.Queue()
    release = threading.Event()
    threads = [
        threading.Thread(target=_hold_stream, args=(fronts.url, i % FRONTS, held, release), daemon=True)
        for i in range(2 * BOUND)  # twice the bound, all at once, half on each front
    ]
    for t in threads:
        t.start()
    try:
        codes = [held.get(timeout=120) for _ in threads]
        admitted = codes.count(200)
        # Racing fronts may each admit one on a stale count of the others: at most FRONTS - 1 over.
        assert BOUND <= admitted <= BOUND + FRONTS - 1 and codes.count(429) == len(codes) - admitted, codes
        for front in range(FRONTS):  # nothing races now: both fronts refuse, though each holds < BOUND
            assert _post(fronts.url, front).status_code == 429
        running = _agreed_metrics(fronts.url, lambda m: m["pdserve_requests_running"] == admitted)
        assert running["pdserve_router_fronts"] == FRONTS
    finally:
        release.set()  # the clients hang up: their streams end
    for t in threads:
        t.join(timeout=60)
    extra_rejected = sum(_admitted_eventually(fronts.url, front) for front in range(FRONTS))
    want_ok = baseline.get('pdserve_requests_total{status="success"}', 0) + FRONTS
    want_rejected = baseline.get('pdserve_requests_total{status="rejected"}', 0)
    want_rejected += len(threads) - admitted + FRONTS + extra_rejected
    after = _agreed_metrics(
        fronts.url,
        lambda m: (
            m.get('pdserve_requests_total{status="success"}') == want_ok
            and m.get('pdserve_requests_total{status="rejected"}') == want_rejected
            and m["pdserve_requests_running"] == 0
        ),
    )
    assert after["pdserve_time_to_first_token_seconds_count"] >= want_ok


def test_killed_front_loses_only_its_streams_and_comes_back(fronts, tokenizer) -> None:
    success = 'pdserve_requests_total{status="success"}'
    succeeded = _agreed_metrics(fronts.url, lambda m: True).get(success, 0)
    victim_pid = front_views(fronts.url, "/health")[1]["front_pid"]
    clients = [client_on(fronts.url, i % 2) for i in range(4)]
    started = threading.Barrier(len(clients) + 1, timeout=60)
    outcomes: list[str] = [""] * len(clients)
    threads = [
        threading.Thread(target=_stream, args=(c, started, outcomes, i), daemon=True)
        for i, c in enumerate(clients)
    ]
    for t in threads:
        t.start()
    started.wait()  # every stream has its first token
    os.kill(victim_pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=120)
    assert outcomes[0::2] == ["done", "done"], fronts.logs()  # front 0's streams finished in full
    assert all(o.startswith("error") for o in outcomes[1::2]), outcomes  # front 1's were cut off
    restarted = client_on(fronts.url, 1, not_pid=victim_pid, timeout=90)
    try:
        answer = _complete_once_workers_known(restarted, tokenizer.encode("The capital of France is"))
    finally:
        restarted.close()
    assert answer["choices"][0]["finish_reason"] == "length"
    _assert_loads_return_to_zero(fronts)
    # The restarted front carried on from its predecessor's counts: the sum only grew, by front 0's two
    # streams and the answer through the new front 1.
    _agreed_metrics(fronts.url, lambda m: m.get(success) == succeeded + 3)


def _hold_stream(url: str, front: int, held: queue.Queue, release: threading.Event) -> None:
    """Open a long stream on `front`; report its status once admitted (first token) or refused, and
    hold it open until `release` (then hang up: the router cancels it)."""
    body = {"prompt": "Count slowly:", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    client = client_on(url, front)
    try:
        with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code == 200:
                lines = resp.iter_lines()  # held to the end: closing it would close the connection
                while not next(lines).startswith("data: {"):
                    pass  # until the first token
            else:
                assert resp.headers["retry-after"] == "1"
            held.put(resp.status_code)
            release.wait(timeout=120)
    except BaseException:
        held.put(-1)  # the test fails on it instead of waiting
        raise
    finally:
        client.close()


def _post(url: str, front: int) -> httpx.Response:
    client = client_on(url, front)
    try:
        return client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2, "temperature": 0})
    finally:
        client.close()


def _admitted_eventually(url: str, front: int, timeout: float = 60.0) -> int:
    """Ask `front` until it admits a request (the cancelled streams' places come free as the router
    notices each hang-up); returns how many 429s it answered meanwhile."""
    deadline = time.monotonic() + timeout
    refused = 0
    while (resp := _post(url, front)).status_code == 429:
        refused += 1
        assert time.monotonic() < deadline, f"front {front} still refuses: {resp.text}"
        time.sleep(0.2)
    assert resp.status_code == 200, resp.text
    return refused


def _agreed_metrics(url: str, done, timeout: float = 30.0) -> dict[str, float]:
    """The summed /metrics once every front shows the same figures and `done` holds for them: a front
    publishes its own figures every second, so the others' views of it catch up within that."""
    deadline = time.monotonic() + timeout
    while True:
        views = [_metrics_of(url, front) for front in range(FRONTS)]
        if all(v == views[0] for v in views) and done(views[0]):
            return views[0]
        assert time.monotonic() < deadline, f"the fronts' /metrics never agreed: {views}"
        time.sleep(0.3)


def _metrics_of(url: str, front: int) -> dict[str, float]:
    """Front `front`'s request figures (the worker gauges, replicas of one picture, are left out)."""
    client = client_on(url, front)
    try:
        text = client.get("/metrics").text
    finally:
        client.close()
    samples = (SAMPLE.match(line) for line in text.splitlines() if not line.startswith("#"))
    wanted = ("pdserve_requests_", "pdserve_time_to_first_token_seconds_count", "pdserve_router_fronts")
    return {m[1]: float(m[2]) for m in samples if m is not None and m[1].startswith(wanted)}


def _complete_once_workers_known(client: httpx.Client, prompt: list[int], timeout: float = 10.0) -> dict:
    """A completion through a front that has just started: the workers introduce themselves as soon as
    their links to it come back (common/worker/channels.py), so its clean 503 `no_workers` lasts
    moments; anything else, or a 503 past `timeout`, fails."""
    deadline = time.monotonic() + timeout
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    while True:
        resp = client.post("/v1/completions", json=body)
        if resp.status_code != 503 or time.monotonic() > deadline:
            assert resp.status_code == 200, resp.text
            return resp.json()
        assert resp.json()["error"]["code"] == "no_workers", resp.text
        time.sleep(0.05)


def _complete(client: httpx.Client, prompt: list[int]) -> dict:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    resp = client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _stream(client: httpx.Client, started: threading.Barrier, outcomes: list[str], i: int) -> None:
    # The streams on front 1 (odd i) would run for minutes: only the workers dropping them frees their KV.
    max_tokens = 1000 if i % 2 else 32
    body = {
        "prompt": "Count slowly:",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    first = True
    try:
        with client.stream("POST", "/v1/completions", json=body) as resp:
            for line in resp.iter_lines():
                if first and line.startswith("data: {"):
                    first = False
                    started.wait()
                if line == "data: [DONE]":
                    outcomes[i] = "done"
                elif line.startswith("data: {") and json.loads(line[6:]).get("error"):
                    outcomes[i] = "error in stream"
                    return
    except httpx.HTTPError as e:
        outcomes[i] = f"error: {type(e).__name__}"
    finally:
        client.close()
        if first:
            started.abort()  # never got a token: fail the test rather than hang it


def _assert_loads_return_to_zero(cluster: LaunchedCluster, timeout: float = 30.0) -> None:
    """Every worker's last heartbeat (as each front sees it) shows no blocks held and nothing running."""
    deadline = time.monotonic() + timeout
    while True:
        views = front_views(cluster.url, "/debug/index")
        held = {
            (front, w["worker_id"]): (w.get("kv_blocks_used"), w.get("running", 0), w.get("in_flight", 0))
            for front, view in views.items()
            for w in view["workers"]
        }
        if all(v == (0, 0, 0) for v in held.values()):
            return
        assert time.monotonic() < deadline, f"load left behind: {held}\n{cluster.logs()}"
        time.sleep(0.3)
