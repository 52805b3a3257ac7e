"""Registration parity checks, liveness and the load figures the policy sees."""

from __future__ import annotations

import pytest

from common.hashing import probe_hash
from common.messages import WorkerHeartbeat, WorkerRegister
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
