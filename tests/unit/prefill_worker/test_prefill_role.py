"""The prefill role on a real (tiny) engine and a real tcp KV sender, with the sockets faked."""

from __future__ import annotations

import math
import time

import pytest

from common.wire.cache_messages import KVEventBatch, Snapshot, SnapshotRequest
from common.wire.codec import decode, encode
from common.wire.hashing import block_hashes
from common.wire.kv_events import BlockStored
from common.wire.messages import Abort, DecodeRequest, RequestFailed, TokenOutput
from prefill_worker.role import PrefillRole
from tests.unit.prefill_worker.harness import make_service, prefill_request, run_until

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]  # 2 full blocks of 16 + 8 tokens


@pytest.fixture
def prefill(tiny_model_dirs):
    service = make_service(PrefillRole(), tiny_model_dirs["llama"], kv_lease_s=30.0)
    yield service
    service.close()


def handed_off(service) -> bool:
    return bool(service.engine.scheduler.handed_off)


def test_first_token_goes_to_the_router_before_the_decode_request(prefill) -> None:
    prefill.handle(prefill_request("r1", PROMPT))
    run_until([prefill], lambda: prefill.channels.peers)
    first = prefill.channels.of_type(TokenOutput)
    assert len(first) == 1
    out = first[0]
    assert (out.index, out.finish_reason, out.num_prompt_tokens, out.cached_tokens) == (0, None, 40, 0)
    ((addr, req),) = prefill.channels.peers
    assert addr == "tcp://127.0.0.1:9" and isinstance(req, DecodeRequest)
    assert req.first_token_id == out.token_ids[0] and req.prompt_token_ids == PROMPT
    assert req.handoff.transport == "tcp" and req.handoff.request_id == req.request_id
    assert req.handoff.num_blocks == math.ceil(40 / 16)
    assert handed_off(prefill)  # the blocks stay pinned until the decode side acknowledges


def test_request_finished_by_its_first_token_involves_no_decode_worker(prefill) -> None:
    free = prefill.engine.block_manager.num_free_blocks
    prefill.handle(prefill_request("r1", PROMPT, max_tokens=1))
    run_until([prefill], lambda: prefill.channels.of_type(TokenOutput))
    (out,) = prefill.channels.of_type(TokenOutput)
    assert out.finish_reason == "length" and out.index == 0
    assert prefill.channels.peers == [] and not handed_off(prefill)
    assert prefill.engine.block_manager.num_free_blocks == free


def test_invalid_requests_fail_without_retry(prefill) -> None:
    # Bad sampling values cannot reach a role: the message does not validate, and the worker's I/O
    # thread answers the frame with RequestFailed (tests/unit/common/worker/test_worker_runtime.py).
    prefill.handle(prefill_request("r1", [999_999]))  # a token outside the vocabulary
    (failed,) = prefill.channels.of_type(RequestFailed)
    assert failed.request_id == "r1" and failed.retryable is False
    assert not prefill.engine.has_unfinished


def test_a_sampling_token_id_outside_the_vocabulary_fails_that_request_alone(prefill) -> None:
    # min_tokens bans the stop ids on the logits, a bias adds to them: an id past them once failed
    # the whole step, and with it every request in the batch.
    prefill.handle(prefill_request("stop", PROMPT, stop_token_ids=[999_999], min_tokens=2))
    prefill.handle(prefill_request("bias", PROMPT, logit_bias={999_999: 1.0}))
    prefill.handle(prefill_request("good", PROMPT))
    failed = prefill.channels.of_type(RequestFailed)
    assert sorted(f.request_id for f in failed) == ["bias", "stop"]
    assert all(not f.retryable and f.invalid and "outside the vocabulary" in f.error for f in failed)
    run_until([prefill], lambda: prefill.channels.of_type(TokenOutput))
    assert [o.request_id for o in prefill.channels.of_type(TokenOutput)] == ["good"]


def test_abort_of_a_handed_off_request_unpins_its_blocks(prefill) -> None:
    free = prefill.engine.block_manager.num_free_blocks
    prefill.handle(prefill_request("r1", PROMPT))
    run_until([prefill], lambda: handed_off(prefill))
    prefill.handle(Abort("r1"))
    prefill.handle(Abort("r1"))  # idempotent
    assert not handed_off(prefill)
    assert prefill.engine.block_manager.num_free_blocks == free
    assert prefill.role.kv.poll_released() == []  # cancelled: no release follows


def test_expired_lease_releases_the_blocks(tiny_model_dirs) -> None:
    service = make_service(PrefillRole(), tiny_model_dirs["llama"], kv_lease_s=0.2)
    try:
        service.handle(prefill_request("r1", PROMPT))
        run_until([service], lambda: handed_off(service))
        t0 = time.monotonic()
        run_until([service], lambda: not handed_off(service), timeout=10)
        assert time.monotonic() - t0 < 5
        assert service.role.jobs == {}
    finally:
        service.close()


def test_cache_events_and_snapshot(prefill) -> None:
    prefill.handle(prefill_request("r1", PROMPT))
    run_until([prefill], lambda: prefill.channels.events)
    (published,) = prefill.channels.events
    batch = decode(encode(published))  # as the router gets it, every field checked
    assert isinstance(batch, KVEventBatch) and batch.seq == 1
    stored = [h for e in batch.events if isinstance(e, BlockStored) for h in e.hashes]
    assert stored == block_hashes(PROMPT, 16)
    prefill.handle(SnapshotRequest("prefill-test"))
    (snap,) = prefill.channels.of_type(Snapshot)
    assert snap.seq == 1 and sorted(snap.hashes) == sorted(stored)


def test_a_repeated_prefix_is_reported_as_cached(prefill) -> None:
    for rid in ("r1", "r2"):
        prefill.handle(prefill_request(rid, PROMPT))
        run_until([prefill], lambda rid=rid: any(o.request_id == rid for o in prefill.channels.router))
    first, second = prefill.channels.of_type(TokenOutput)
    assert first.cached_tokens == 0 and second.cached_tokens == 32
    assert first.token_ids == second.token_ids


def test_deadline_before_the_first_token_fails_the_request(prefill) -> None:
    prefill.handle(prefill_request("r1", PROMPT, deadline=time.time() - 1))
    prefill.run_once()
    (failed,) = prefill.channels.of_type(RequestFailed)
    assert "deadline" in failed.error and not prefill.engine.has_unfinished


def test_an_engine_error_fails_the_requests_and_the_worker_keeps_serving(prefill, monkeypatch) -> None:
    real_step = prefill.engine.step

    def broken_step():
        raise RuntimeError("device fell over")

    monkeypatch.setattr(prefill.engine, "step", broken_step)
    prefill.handle(prefill_request("r1", PROMPT))
    prefill.run_once()
    (failed,) = prefill.channels.of_type(RequestFailed)
    assert failed.retryable and "device fell over" in failed.error and prefill.role.jobs == {}
    monkeypatch.setattr(prefill.engine, "step", real_step)
    prefill.handle(prefill_request("r2", PROMPT))
    run_until([prefill], lambda: prefill.channels.of_type(TokenOutput))
