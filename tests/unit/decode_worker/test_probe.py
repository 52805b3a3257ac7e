"""KV path probes between a real prefill role and a real decode role over the tcp transport: the decode
side times the fetch into scratch blocks of its own and reports a KVProbeResult; the engine's cache is
never written; a probe that cannot be fetched is reported as failed, not dropped."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from common.wire.handoff import HandOff
from common.wire.messages import MessageError
from common.wire.probe_messages import KVProbe, KVProbeRequest, KVProbeResult
from tests.unit.prefill_worker.harness import Pair, run_until


@pytest.fixture
def pair(tiny_model_dirs):
    p = Pair.of(tiny_model_dirs["llama"], kv_fetch_timeout_s=2.0)
    yield p
    p.close()


def _probe(pair: Pair, probe_id: str, num_bytes: int) -> KVProbe:
    pair.prefill.handle(KVProbeRequest(probe_id, "decode-test", "tcp://127.0.0.1:9", num_bytes))
    ((_, msg),) = pair.prefill.channels.peers
    pair.prefill.channels.peers.clear()
    assert isinstance(msg, KVProbe)
    return msg


def _result(pair: Pair, probe_id: str) -> KVProbeResult:
    def found() -> list[KVProbeResult]:
        return [m for m in pair.decode.channels.of_type(KVProbeResult) if m.probe_id == probe_id]

    run_until([pair.prefill, pair.decode], found, timeout=30)
    return found()[0]


def test_a_probe_is_timed_into_scratch_blocks(pair) -> None:
    cache = pair.prefill.engine.kv_cache
    block_bytes = cache[:, :, 0].numel() * cache.element_size()
    probe = _probe(pair, "probe-1", 3 * block_bytes - 1)
    assert probe.handoff.num_blocks == 3 and probe.handoff.transport == "tcp"
    before = pair.decode.engine.kv_cache.clone()
    pair.decode.handle(probe)
    result = _result(pair, "probe-1")
    assert result.error is None and result.transport == "tcp"
    assert result.decode_worker_id == "decode-test" and result.prefill_worker_id == "prefill-test"
    assert result.num_bytes == 3 * block_bytes and result.gbps > 0
    assert torch.equal(pair.decode.engine.kv_cache, before)  # the engine's blocks were not touched
    assert not pair.decode.engine.has_unfinished and pair.decode.role.jobs == {}


def test_a_probe_that_cannot_run_is_reported_failed(pair) -> None:
    probe = _probe(pair, "probe-2", 1)
    pair.decode.handle(probe)
    assert _result(pair, "probe-2").error is None
    dead = replace(probe.handoff, request_id="probe-3", address="tcp://127.0.0.1:9")
    pair.decode.handle(KVProbe("probe-3", "prefill-test", dead))
    result = _result(pair, "probe-3")
    assert result.error and "timed out" in result.error and result.gbps == 0
    too_big = replace(probe.handoff, request_id="probe-4", num_blocks=4)
    pair.decode.handle(KVProbe("probe-4", "prefill-test", too_big))
    assert "scratch" in _result(pair, "probe-4").error
    huge = replace(probe.handoff, request_id="probe-5", num_blocks=1 << 40)
    pair.decode.handle(KVProbe("probe-5", "prefill-test", huge))
    assert "empty or too large" in _result(pair, "probe-5").error
    with pytest.raises(MessageError, match="num_blocks"):  # an empty probe does not get this far
        replace(probe.handoff, num_blocks=0)


def test_roles_ignore_the_probe_messages_meant_for_the_other_side(pair) -> None:
    pair.decode.handle(KVProbeRequest("probe-6", "decode-test", "tcp://127.0.0.1:9", 1))
    pair.prefill.handle(
        KVProbe("probe-7", "prefill-test", HandOff("tcp", "tcp://127.0.0.1:9", "probe-7", 1, 1, 1))
    )
    assert pair.decode.channels.router == [] and pair.prefill.channels.peers == []
