"""The same cluster under the Ray backend (a local Ray instance), each worker's sockets in a channel
process of its own (`--worker-io process`): greedy answers equal the offline engine's, and stopping the
launcher leaves none of the workers it placed, nor their channel processes."""

from __future__ import annotations

import pytest

from tests.helpers.channel_process import channel_process
from tests.integration.launcher import launch
from tests.integration.test_launcher_shutdown import SMALL, _assert_greedy_parity, wait_gone

pytestmark = pytest.mark.timeout(300)


def test_ray_backend_serves_and_stops_cleanly(model_dir, tmp_path, offline, tokenizer) -> None:
    shape = ["--prefill", "1", "--decode", "2", "--worker-io", "process"]
    cluster = launch(model_dir, tmp_path, "--backend", "ray", *shape, *SMALL)
    try:
        workers = cluster.health()["workers"]
        assert sorted(w["worker_id"] for w in workers) == ["decode-0", "decode-1", "prefill-0"]
        _assert_greedy_parity(cluster, offline, tokenizer)
        worker_pids = cluster.worker_pids()
        channel_pids = [channel_process(pid) for pid in worker_pids]
    finally:
        status = cluster.stop(timeout=60)
    assert status == 0, cluster.logs()
    assert wait_gone(worker_pids + channel_pids, timeout=30) == [], cluster.logs()
