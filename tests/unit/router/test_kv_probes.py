"""KV path probes on the router side (router/kv_probes.py): which pairs are probed when, how results
are judged against the floor, and what the route planner and the cost model make of a degraded pair."""

from __future__ import annotations

import asyncio

import pytest

from common.wire.probe_messages import KVProbeRequest, KVProbeResult
from common.wire.sampling_params import SamplingParams
from router.disagg import LOCAL, REMOTE, DisaggInputs, decide
from router.kv_probes import KVProbes, PairProber
from router.live_rates import LiveRates
from router.policy import make_policy
from router.prefix_index import PrefixIndex
from router.route_planner import RoutePlanner
from router.worker_registry import WorkerRegistry
from tests.unit.router.test_disagg import _local, _remote
from tests.unit.router.test_worker_registry import _reg

MB = 1 << 20


def _result(order, gbps: float = 2.0, error: str | None = None, transport: str = "tcp") -> KVProbeResult:
    seconds, num_bytes = (0.0, 0) if error else (MB / (gbps * 1e9), MB)
    return KVProbeResult(order.probe_id, order.prefill, order.decode, transport, num_bytes, seconds, error)


def test_each_pair_is_probed_once_and_judged_against_the_floor() -> None:
    probes = KVProbes(min_gbps=1.0, num_bytes=MB)
    orders = probes.due(["p0", "p1"], ["d0"], now=0.0)
    assert sorted((o.prefill, o.decode) for o in orders) == [("p0", "d0"), ("p1", "d0")]
    assert probes.due(["p0", "p1"], ["d0"], now=1.0) == []  # in flight: not sent twice
    fast, slow = orders if orders[0].prefill == "p0" else orders[::-1]
    assert not probes.record(_result(fast, gbps=3.0), now=1.0).degraded
    report = probes.record(_result(slow, gbps=0.5), now=1.0)
    assert report.degraded and report.gbps == pytest.approx(0.5) and report.transport == "tcp"
    assert probes.record(_result(slow), now=1.0) is None  # a result nobody awaits any more
    assert probes.due(["p0", "p1"], ["d0"], now=100.0) == []  # measured pairs are not probed again
    assert [r.degraded for r in probes.reports()] == [False, True]


def test_failed_and_unanswered_probes_degrade_the_pair_and_are_retried() -> None:
    probes = KVProbes(num_bytes=MB, timeout_s=10.0, retry_s=30.0)
    (failed,) = probes.due(["p0"], ["d0"], now=0.0)
    assert probes.record(_result(failed, error="cannot connect"), now=0.0).degraded  # no floor needed
    assert probes.degraded("p0", "d0")
    (silent,) = probes.due(["p1"], ["d0"], now=0.0)
    assert probes.expire(now=5.0) == []
    (expired,) = probes.expire(now=10.0)
    assert expired.degraded and "no probe result" in expired.error
    assert probes.record(_result(silent), now=11.0) is None  # too late: already counted as failed
    assert probes.due(["p0", "p1"], ["d0"], now=20.0) == []
    assert len(probes.due(["p0", "p1"], ["d0"], now=40.0)) == 2  # retried after retry_s


def test_a_worker_that_registers_again_is_probed_again_and_self_pairs_never() -> None:
    probes = KVProbes(num_bytes=MB)
    (order,) = probes.due(["p0"], ["d0"], now=0.0)
    probes.record(_result(order), now=0.0)
    probes.forget_worker("d0")
    assert probes.report("p0", "d0") is None
    assert len(probes.due(["p0"], ["d0"], now=1.0)) == 1
    assert probes.due(["m0"], ["m0"], now=0.0) == []
    assert KVProbes(num_bytes=0).due(["p0"], ["d0"], now=0.0) == []  # probes turned off


def test_the_prober_sends_requests_to_the_prefill_side_and_feeds_the_rates() -> None:
    registry = WorkerRegistry(heartbeat_timeout=5)
    registry.register(_reg("p0"), 0.0)
    registry.register(_reg("d0", role="decode"), 0.0)
    sent: list[tuple[str, object]] = []

    async def send(worker_id, msg) -> bool:
        sent.append((worker_id, msg))
        return True

    rates = LiveRates()
    prober = PairProber(KVProbes(num_bytes=MB), registry, rates, send)
    asyncio.run(prober.tick(0.0))
    ((worker, request),) = sent
    assert worker == "p0" and isinstance(request, KVProbeRequest)
    assert request.decode_command_addr == registry.get("d0").reg.command_addr and request.num_bytes == MB
    result = KVProbeResult(request.probe_id, "p0", "d0", "tcp", MB, MB / 4e9)
    prober.on_result(result, 1.0)
    assert rates.transfer_bytes_per_s("p0", "d0") == pytest.approx(4e9)  # until real transfers are seen
    rates.observe_transfer("p0", "d0", 10**6, 1e-3, 100)
    assert rates.transfer_bytes_per_s("p0", "d0") == pytest.approx(1e9)


def test_auto_prefers_local_over_a_degraded_pair_but_always_still_disaggregates() -> None:
    fast_remote = _remote(new=10, transfer_bytes_per_s=1e12)  # by the estimate, remote would win
    assert decide(DisaggInputs("auto", fast_remote, _local(running=50))).kind == REMOTE
    degraded = _remote(new=10, transfer_bytes_per_s=1e12, degraded=True)
    assert decide(DisaggInputs("auto", degraded, _local(running=50))).kind == LOCAL
    assert decide(DisaggInputs("always", degraded, _local())).kind == REMOTE
    assert decide(DisaggInputs("auto", degraded, None)).kind == REMOTE  # the only way to serve


def test_the_planner_picks_a_decode_target_over_a_sound_pair() -> None:
    registry = WorkerRegistry(heartbeat_timeout=5)
    for reg in (_reg("p0"), _reg("d0", role="decode"), _reg("d1", role="decode", num_kv_blocks=50)):
        registry.register(reg, 0.0)
    probes = KVProbes(min_gbps=1.0, num_bytes=MB)
    planner = RoutePlanner(registry, PrefixIndex(), make_policy("prefix", 2048), LiveRates(), 1.0, probes)
    prompt = list(range(40))
    assert (
        planner.plan(prompt, SamplingParams(max_tokens=8), set()).decode_id == "d0"
    )  # the policy's choice: more free blocks
    for order in probes.due(["p0"], ["d0", "d1"], now=0.0):
        probes.record(_result(order, gbps=0.1 if order.decode == "d0" else 5.0), now=0.0)
    assert planner.plan(prompt, SamplingParams(max_tokens=8), set()).decode_id == "d1"
    assert (
        planner.plan(prompt, SamplingParams(max_tokens=8), {"d1"}).decode_id == "d0"
    )  # degraded beats nothing
