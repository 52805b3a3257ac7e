"""A two-node Ray cluster on this machine, as `ray up` would give on two hosts: a head and a worker
node, each with its own custom resource. The launcher joins it with `--ray-address` and pins the
prefill worker to the head and the decode worker to the worker node with `--ray-resources`; /health
names each worker's Ray node, the KV moves between the nodes over tcp, greedy answers equal the
offline engine's, and stopping the launcher, then both nodes, leaves none of their processes.

The nodes come from `ray.cluster_utils.Cluster` rather than `ray start`: its node processes are
children of this test (a crashed test cannot leave daemons behind) and it stops exactly its own
processes, where `ray stop` stops every Ray process of the host, other users' clusters included.
Each node has its own ports (free ones, chosen by Ray or here), and both share one temporary directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from common.net.process import process_alive
from tests.integration.launcher import LaunchedCluster, launch
from tests.integration.test_launcher_shutdown import SMALL, _assert_greedy_parity, children, wait_gone

pytestmark = pytest.mark.timeout(170)
HEAD_RESOURCE, WORKER_RESOURCE = "pdserve_head", "pdserve_worker_node"
KV_BYTES_METRIC = "pdserve_kv_transfer_bytes_total"


@dataclass(frozen=True)
class TwoNodes:
    cluster: Cluster
    head_id: str
    worker_id: str

    @property
    def address(self) -> str:
        return self.cluster.address


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc), children before their own children."""
    found, todo = [], [pid]
    while todo:
        kids = [k for p in todo if process_alive(p) for k in _children_or_none(p)]
        found += kids
        todo = kids
    return found


def _children_or_none(pid: int) -> list[int]:
    try:
        return children(pid)
    except FileNotFoundError:  # exited while we looked
        return []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def two_nodes() -> Iterator[TwoNodes]:
    # A short path: Ray's unix sockets live under it, and a socket path is limited to 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="pdray-")
    node = {"num_cpus": 1, "temp_dir": temp_dir}
    # A free port for the head's dashboard agent: Ray's fixed default (52365) may be another cluster's.
    head = {**node, "resources": {HEAD_RESOURCE: 4}, "include_dashboard": False}
    head["dashboard_agent_listen_port"] = free_port()
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        worker = cluster.add_node(**node, resources={WORKER_RESOURCE: 4})
        cluster.wait_for_nodes()
        yield TwoNodes(cluster, cluster.head_node.node_id, worker.node_id)
    finally:
        try:
            cluster.shutdown()  # what `ray stop` does on each node, for this cluster's processes only
        finally:
            shutil.rmtree(temp_dir, ignore_errors=True)


def test_two_node_cluster_places_workers_and_stops_cleanly(
    two_nodes, model_dir, tmp_path, offline, tokenizer
) -> None:
    placement = [f'prefill={{"{HEAD_RESOURCE}": 1}}', f'decode={{"{WORKER_RESOURCE}": 1}}']
    extra = ["--ray-address", two_nodes.address, "--kv-probe-mb", "1"]
    extra += [arg for spec in placement for arg in ("--ray-resources", spec)]
    cluster = launch(model_dir, tmp_path, "--backend", "ray", *extra, *SMALL, timeout=120)
    try:
        _assert_placed_and_kv_between_nodes(cluster, two_nodes)
        _assert_greedy_parity(cluster, offline, tokenizer)
        assert _kv_bytes_moved(cluster.metrics()) > 0  # the answer's KV went prefill (head) -> decode
        started = descendants(os.getpid())  # the nodes' processes, the launcher's, the actors, the workers
        actors = [p for p in started if _cmdline(p).startswith("ray::_Supervisor")]
        workers = cluster.worker_pids()
        assert len(actors) == 2 and set(workers) <= set(started), cluster.logs()
    finally:
        status = cluster.stop(timeout=60)
    assert status == 0, cluster.logs()
    assert wait_gone(actors + workers, timeout=30) == [], cluster.logs()
    two_nodes.cluster.shutdown()  # the fixture's teardown does it too; here so the test can look
    assert wait_gone(started, timeout=30) == [], [_cmdline(p) for p in started if process_alive(p)]


def _assert_placed_and_kv_between_nodes(cluster: LaunchedCluster, nodes: TwoNodes) -> None:
    health = cluster.health()
    where = {w["worker_id"]: w["node_id"] for w in health["workers"]}
    assert where == {"prefill-0": nodes.head_id, "decode-0": nodes.worker_id}, health
    deadline = time.monotonic() + 60  # the pair's probe transfer runs after both registered
    while not health["kv_pairs"] and time.monotonic() < deadline:
        time.sleep(0.5)
        health = cluster.health()
    pairs = [(p["prefill"], p["decode"], p["transport"], p["error"]) for p in health["kv_pairs"]]
    assert pairs == [("prefill-0", "decode-0", "tcp", None)], health


def _kv_bytes_moved(metrics: str) -> float:
    samples = [line.split() for line in metrics.splitlines() if line.startswith(KV_BYTES_METRIC)]
    return sum(float(parts[-1]) for parts in samples)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
