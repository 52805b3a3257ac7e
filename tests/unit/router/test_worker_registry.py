"""Registration parity checks, liveness and the load figures the policy sees."""

from __future__ import annotations

from dataclasses import replace

import pytest

from common.wire.hashing import probe_hash
from common.wire.messages import WorkerHeartbeat, WorkerRegister
from router.load_tracker import Assignment, LoadTracker
from router.worker_registry import HeartbeatOutcome, RegistrationOutcome, WorkerRegistry, WorkerState


def _reg(worker_id: str, role: str = "prefill", block_size: int = 16, **over) -> WorkerRegister:
    if "probe_hash" not in over:
        over["probe_hash"] = probe_hash(block_size)
    fields = dict(
        worker_id=worker_id,
        role=role,
        host="h",
        pid=1,
        command_addr=f"tcp://h:{len(worker_id)}",
        events_addr="tcp://h:2" if role == "prefill" else None,
        kv_endpoint={},
        block_size=block_size,
        num_kv_blocks=100,
        max_model_len=2048,
        max_num_batched_tokens=512,
        model_name="m",
    )
    return WorkerRegister(**(fields | over))


def _hb(
    worker_id: str, free: int = 80, total: int = 100, waiting: int = 0, running: int = 0, queued: int = 0
):
    return WorkerHeartbeat(worker_id, free, total, waiting, running, queued, 0.0)


def test_parity_check_rejects_mismatches() -> None:
    reg = WorkerRegistry(heartbeat_timeout=5)
    assert reg.register(_reg("p0"), 0).outcome is RegistrationOutcome.NEW
    assert reg.block_size == 16  # adopted from the first worker
    bad_bs = reg.register(_reg("p1", block_size=32), 0)
    assert bad_bs.outcome is RegistrationOutcome.REJECTED and "block_size" in bad_bs.reason
    bad_probe = reg.register(_reg("p2", probe_hash=probe_hash(16) ^ 1), 0)
    assert bad_probe.outcome is RegistrationOutcome.REJECTED and "probe_hash" in bad_probe.reason
    assert set(reg.rejected) == {"p1", "p2"} and [w.worker_id for w in reg.workers()] == ["p0"]
    fixed = WorkerRegistry(heartbeat_timeout=5, block_size=32)
    assert fixed.register(_reg("p0"), 0).outcome is RegistrationOutcome.REJECTED
    huge = WorkerRegistry(heartbeat_timeout=5).register(_reg("p0", block_size=1024, probe_hash=0), 0)
    assert huge.outcome is RegistrationOutcome.REJECTED and "probe" in huge.reason


def test_one_kv_cache_dtype_per_cluster() -> None:
    reg = WorkerRegistry(heartbeat_timeout=5)
    assert reg.register(_reg("p0", kv_endpoint={"transports": ["tcp"]}), 0).outcome is RegistrationOutcome.NEW
    assert reg.kv_dtype is None  # a worker that names no dtype fixes none
    bf16 = {"transports": ["tcp"], "kv_dtype": "bfloat16"}
    assert reg.register(_reg("d0", role="decode", kv_endpoint=bf16), 0).outcome is RegistrationOutcome.NEW
    assert reg.kv_dtype == "bfloat16"
    fp8 = reg.register(_reg("d1", role="decode", kv_endpoint={"kv_dtype": "float8_e4m3fn"}), 0)
    assert fp8.outcome is RegistrationOutcome.REJECTED
    assert "float8_e4m3fn" in fp8.reason and "--kv-cache-dtype" in fp8.reason
    assert reg.register(_reg("d2", role="decode", kv_endpoint=bf16), 0).outcome is RegistrationOutcome.NEW


def test_refresh_and_restart() -> None:
    reg = WorkerRegistry(heartbeat_timeout=5)
    reg.register(_reg("p0"), 0)
    assert reg.register(_reg("p0"), 1).outcome is RegistrationOutcome.REFRESHED
    assert reg.register(_reg("p0", pid=2), 2).outcome is RegistrationOutcome.REPLACED


def test_liveness_and_health() -> None:
    reg = WorkerRegistry(heartbeat_timeout=5)
    assert not reg.is_healthy()
    reg.register(_reg("p0"), 0)
    reg.register(_reg("d0", role="decode"), 0)
    assert reg.is_healthy() and reg.max_model_len() == 2048
    assert reg.heartbeat(_hb("p0"), 4) is HeartbeatOutcome.OK
    assert reg.sweep(5.5) == ["d0"]  # p0 was heard at 4
    assert reg.get("d0").state is WorkerState.DOWN and not reg.is_healthy()
    assert reg.sweep(6) == []  # reported once
    assert reg.max_model_len() is None  # no live decode worker
    assert reg.heartbeat(_hb("d0"), 7) is HeartbeatOutcome.REVIVED
    assert reg.is_healthy()
    assert reg.heartbeat(_hb("stranger"), 7) is HeartbeatOutcome.UNKNOWN
    with pytest.raises(ValueError, match="heartbeat_timeout"):
        WorkerRegistry(heartbeat_timeout=0)


def test_loads_combine_heartbeats_with_router_dispatches() -> None:
    reg = WorkerRegistry(heartbeat_timeout=5)
    reg.register(_reg("p0"), 0)
    reg.register(_reg("d0", role="decode"), 0)
    reg.heartbeat(_hb("p0", queued=50), 0)
    reg.heartbeat(_hb("d0", free=80, running=3, waiting=1), 0)
    reg.loads.assign(Assignment("r1", "p0", "d0", new_prefill_tokens=200, prompt_blocks=13))
    (p,) = reg.prefill_loads()
    (d,) = reg.decode_loads()
    assert (p.queued_prefill_tokens, p.in_flight) == (200, 1)  # the router knows more than the heartbeat
    assert (d.num_free_blocks, d.num_total_blocks, d.num_running) == (67, 100, 4)
    reg.heartbeat(_hb("d0", free=67, running=5), 1)  # now the worker reports it
    assert reg.decode_loads()[0].num_free_blocks == 67 and reg.decode_loads()[0].num_running == 5


def test_load_tracker_release_is_idempotent() -> None:
    loads = LoadTracker()
    loads.assign(Assignment("r1", "p0", "d0", 100, 7))
    loads.assign(Assignment("r2", "p0", "d1", 50, 4))
    assert loads.requests_on("p0") == ["r1", "r2"] and loads.requests_on("d1") == ["r2"]
    loads.prefill_finished("r1")
    assert loads.outstanding_prefill_tokens("p0") == 50 and loads.requests_on("p0") == ["r2"]
    assert loads.release("r1").decode_id == "d0"
    assert loads.release("r1") is None
    loads.release("r2")
    for worker in ("p0", "d0", "d1"):
        assert loads.in_flight(worker) == 0 and loads.outstanding_prefill_tokens(worker) == 0
    loads.heartbeat_received("d1")
    assert loads.blocks_since_heartbeat("d1") == 0 and loads.blocks_since_heartbeat("d0") == 7


def test_open_paths_depend_on_the_disagg_mode() -> None:
    always, never = WorkerRegistry(5), WorkerRegistry(5, disagg="never")
    for reg in (always, never):
        reg.register(_reg("p0", max_model_len=4096), 0)
        reg.register(_reg("d0", role="decode", max_model_len=2048), 0)
    # always: prefill + decode (today's path); never: the decode worker prefills itself
    assert always.can_serve() and always.max_model_len() == 2048 and always.routing_loads().locals_ == []
    assert never.can_serve() and [w.worker_id for w in never.routing_loads().locals_] == ["d0"]
    alone = WorkerRegistry(5)  # a cluster of mixed workers alone serves under the default mode
    assert not alone.can_serve()
    alone.register(_reg("m0", role="mixed", events_addr="tcp://h:3", max_model_len=8192), 0)
    assert alone.is_healthy() and alone.max_model_len() == 8192
    assert [w.worker_id for w in alone.decode_loads()] == ["m0"]  # a decode target as well
    prefill_only = WorkerRegistry(5, disagg="never")
    prefill_only.register(_reg("p0"), 0)
    assert not prefill_only.can_serve() and prefill_only.max_model_len() is None
    with pytest.raises(ValueError, match="disagg"):
        WorkerRegistry(5, disagg="sometimes")


def test_a_local_request_counts_once_on_its_worker() -> None:
    reg = WorkerRegistry(heartbeat_timeout=5)
    reg.register(_reg("m0", role="mixed", events_addr="tcp://h:3"), 0)
    reg.heartbeat(_hb("m0", free=80, running=2, queued=30), 0)
    reg.loads.assign(Assignment("r1", "m0", "m0", new_prefill_tokens=100, prompt_blocks=7))
    assert reg.loads.get("r1").local
    (m,) = reg.routing_loads().locals_
    assert (m.in_flight, m.queued_prefill_tokens, m.num_free_blocks, m.num_running) == (1, 100, 73, 2)
    assert reg.loads.requests_on("m0") == ["r1"]
    reg.loads.prefill_finished("r1")  # first token: the prefill part is done, the decode part is not
    (m,) = reg.routing_loads().locals_
    assert (m.in_flight, m.queued_prefill_tokens) == (1, 30) and reg.loads.requests_on("m0") == ["r1"]
    reg.loads.release("r1")
    assert reg.loads.in_flight("m0") == 0 and reg.loads.outstanding_prefill_tokens("m0") == 0


def test_debug_index_shows_the_blocks_each_worker_holds() -> None:
    """`kv_blocks_used` (total - free from the last heartbeat) is what a soak counts leaks with: cached
    but unreferenced prefix blocks count as free, so an idle worker shows 0."""
    from router.live_rates import LiveRates
    from router.prefix_index import PrefixIndex
    from router.status_views import debug_index

    reg = WorkerRegistry(heartbeat_timeout=5)
    for worker_id, role in (("p0", "prefill"), ("d0", "decode"), ("d1", "decode")):
        reg.register(_reg(worker_id, role), 0)
    reg.heartbeat(_hb("p0", free=100), 1)
    reg.heartbeat(_hb("d0", free=67), 1)
    view = {w["worker_id"]: w for w in debug_index(reg, PrefixIndex(), "prefix", LiveRates())["workers"]}
    assert (view["p0"]["kv_blocks_used"], view["p0"]["kv_blocks_total"]) == (0, 100)
    assert (view["d0"]["kv_blocks_used"], view["d0"]["kv_cache_usage"]) == (33, 0.33)
    assert "kv_blocks_used" not in view["d1"]  # no heartbeat yet: unknown, not 0


def test_health_names_the_node_each_worker_runs_on() -> None:
    """The node id a worker registered with (the Ray node, from the Ray backend) is in /health, so an
    operator sees where each worker was placed; a worker that names none shows null."""
    from router.status_views import health_report

    reg = WorkerRegistry(heartbeat_timeout=5)
    reg.register(_reg("p0", "prefill", node_id="node-a"), 0)
    reg.register(_reg("d0", "decode"), 0)
    view = {w["worker_id"]: w for w in health_report(reg, healthy=True)["workers"]}
    assert (view["p0"]["node_id"], view["d0"]["node_id"]) == ("node-a", None)
    assert (view["p0"]["host"], view["p0"]["pid"]) == ("h", 1)


@pytest.mark.parametrize(
    "disagg, local_ids", [("auto", ["d0", "m0"]), ("always", ["m0"]), ("never", ["d0", "m0"])]
)
def test_routing_loads_build_each_live_worker_once(disagg: str, local_ids: list[str]) -> None:
    """One pass gives the prefill loads, the decode targets and the local candidates (the same objects
    as the targets), without the excluded or down workers, each with what the index says it caches;
    they equal what the per-kind views report."""
    reg = WorkerRegistry(heartbeat_timeout=5, disagg=disagg)
    for r in (
        _reg("p1"),
        _reg("p0"),
        _reg("m0", role="mixed", events_addr="tcp://h:3"),
        _reg("d0", role="decode"),
    ):
        reg.register(r, 0)
    reg.register(_reg("d1", role="decode"), 0)
    reg.heartbeat(_hb("d0", free=60, running=3, queued=12), 0)
    reg.get("d1").state = WorkerState.DOWN
    cached = {"p0": 4, "p1": 0, "d0": 2, "m0": 5}
    loads = reg.routing_loads({"p1"}, cached.__getitem__)
    assert [p.worker_id for p in loads.prefills] == ["p0"] and loads.prefills[0].cached_blocks == 4
    assert [d.worker_id for d in loads.targets] == ["d0", "m0"]
    assert [d.worker_id for d in loads.locals_] == local_ids
    assert all(any(d is t for t in loads.targets) for d in loads.locals_)
    d0 = loads.targets[0]
    assert d0.cached_blocks == 2 and d0 == replace(reg.decode_loads()[0], cached_blocks=2)
    assert [replace(w, cached_blocks=0) for w in reg.routing_loads().targets] == reg.decode_loads()


def test_the_sorted_view_follows_registrations_and_removals() -> None:
    reg = WorkerRegistry(heartbeat_timeout=5)
    reg.register(_reg("p1"), 0)
    assert [w.worker_id for w in reg.workers()] == ["p1"]
    reg.register(_reg("p0"), 0)
    assert [w.worker_id for w in reg.workers()] == ["p0", "p1"]
    reg.register(_reg("p0", pid=2), 0)  # a restart replaces the record the view holds
    assert reg.workers()[0].reg.pid == 2 and reg.routing_loads().prefills[0].worker_id == "p0"
    reg.remove("p0")
    assert [w.worker_id for w in reg.workers()] == ["p1"] and reg.live("prefill")[0].worker_id == "p1"
