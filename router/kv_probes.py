"""Transports that prove their speed: one probe transfer per prefill/decode pair, and what it showed.

When a prefill worker and a decode target (decode or mixed worker) are both live and their pair has
no probe result yet, the router asks the prefill worker to probe (`KVProbeRequest`); the decode
worker times the fetch and reports `KVProbeResult`. A result says which transport the pair uses and
how fast it moved the probe's bytes. A pair whose probe failed, or ran below `min_gbps`, is
degraded: /health lists it so, /metrics exports it, and the route planner avoids it (another decode
target when one exists; under `--disagg auto`, local prefill over a degraded remote one).

A worker that registers anew (first time or after a restart) has its pairs forgotten, so they are
probed again. A probe with no result after `timeout_s` counts as failed; failed probes are retried
after `retry_s`. `KVProbes` is pure state; `PairProber` sends the probes (through the cluster
client's `send`) and takes their results. Both are owned by the router's event loop: no locks.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from common.wire.messages import Message
from common.wire.probe_messages import KVProbeRequest, KVProbeResult
from router.disagg import DECODE_TARGET_ROLES
from router.live_rates import LiveRates
from router.worker_registry import WorkerRegistry

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 30.0
PROBE_RETRY_S = 30.0
DEFAULT_PROBE_BYTES = 32 << 20

Pair = tuple[str, str]  # (prefill worker id, decode worker id)


@dataclass(frozen=True)
class PairReport:
    """What the router knows about one pair's KV path."""

    prefill: str
    decode: str
    transport: str
    gbps: float
    degraded: bool
    error: str | None
    measured_at: float


@dataclass(frozen=True)
class ProbeOrder:
    """A probe to send: KVProbeRequest(probe_id, decode, ...) to `prefill`."""

    probe_id: str
    prefill: str
    decode: str


class KVProbes:
    def __init__(
        self,
        min_gbps: float = 0.0,
        num_bytes: int = DEFAULT_PROBE_BYTES,
        timeout_s: float = PROBE_TIMEOUT_S,
        retry_s: float = PROBE_RETRY_S,
    ) -> None:
        self.min_gbps = min_gbps
        self.num_bytes = num_bytes
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self._reports: dict[Pair, PairReport] = {}
        self._pending: dict[str, tuple[Pair, float]] = {}  # probe id -> (pair, sent at)
        self._ids = itertools.count(1)

    @property
    def enabled(self) -> bool:
        return self.num_bytes > 0

    def due(self, prefills: list[str], decodes: list[str], now: float) -> list[ProbeOrder]:
        """The probes to send now: live pairs never measured, or whose failed probe may be retried.
        Each returned order is counted as sent at `now`."""
        if not self.enabled:
            return []
        in_flight = {pair for pair, _ in self._pending.values()}
        orders = []
        for pair in itertools.product(prefills, decodes):
            if pair[0] == pair[1] or pair in in_flight or not self._wants(pair, now):
                continue
            probe_id = f"kvprobe-{next(self._ids)}-{pair[0]}-{pair[1]}"
            self._pending[probe_id] = (pair, now)
            orders.append(ProbeOrder(probe_id, *pair))
        return orders

    def _wants(self, pair: Pair, now: float) -> bool:
        report = self._reports.get(pair)
        return report is None or (report.error is not None and now - report.measured_at >= self.retry_s)

    def record(self, result: KVProbeResult, now: float) -> PairReport | None:
        """Take a probe's result; None for a result of a probe not (or no longer) awaited."""
        entry = self._pending.pop(result.probe_id, None)
        if entry is None or entry[0] != (result.prefill_worker_id, result.decode_worker_id):
            return None
        gbps = result.gbps
        degraded = result.error is not None or gbps < self.min_gbps
        report = PairReport(*entry[0], result.transport, gbps, degraded, result.error, now)
        self._reports[entry[0]] = report
        return report

    def expire(self, now: float) -> list[PairReport]:
        """Probes unanswered for `timeout_s`: recorded as failed (degraded) pairs."""
        out = []
        for probe_id, (pair, sent_at) in list(self._pending.items()):
            if now - sent_at >= self.timeout_s:
                del self._pending[probe_id]
                error = f"no probe result within {self.timeout_s:g} s"
                old = self._reports.get(pair)
                transport = old.transport if old is not None else "unknown"
                self._reports[pair] = report = PairReport(*pair, transport, 0.0, True, error, now)
                out.append(report)
        return out

    def forget_worker(self, worker_id: str) -> None:
        """A worker (re)registered: its pairs are probed again."""
        self._reports = {p: r for p, r in self._reports.items() if worker_id not in p}
        self._pending = {k: v for k, v in self._pending.items() if worker_id not in v[0]}

    def report(self, prefill: str, decode: str) -> PairReport | None:
        return self._reports.get((prefill, decode))

    def degraded(self, prefill: str, decode: str) -> bool:
        report = self._reports.get((prefill, decode))
        return report is not None and report.degraded

    def reports(self) -> list[PairReport]:
        return [self._reports[pair] for pair in sorted(self._reports)]


class PairProber:
    """Sends the probes `KVProbes` says are due and feeds their results to it and to the live rates."""

    def __init__(
        self,
        probes: KVProbes,
        registry: WorkerRegistry,
        rates: LiveRates,
        send: Callable[[str, Message], Awaitable[bool]],
        reply_to: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.probes, self.registry, self.rates, self._send = probes, registry, rates, send
        self._reply_to = reply_to  # this front's inbox: where the probe's result must come back

    async def tick(self, now: float) -> None:
        """Expire unanswered probes, then ask prefill workers to probe the pairs that are due."""
        for report in self.probes.expire(now):
            _log(report)
        prefills = [w.worker_id for w in self.registry.live("prefill")]
        targets = {w.worker_id: w for w in self.registry.live(*DECODE_TARGET_ROLES)}
        for order in self.probes.due(prefills, list(targets), now):
            addr = targets[order.decode].reg.command_addr
            # Undelivered, it times out and is retried like a failed probe.
            await self._send(
                order.prefill,
                KVProbeRequest(order.probe_id, order.decode, addr, self.probes.num_bytes, self._reply_to()),
            )

    def on_result(self, msg: KVProbeResult, now: float) -> None:
        report = self.probes.record(msg, now)
        if report is None:
            log.debug("ignoring a result of probe %s, which is not awaited", msg.probe_id)
            return
        self.rates.observe_probe(report.prefill, report.decode, report.gbps * 1e9)
        _log(report)


def _log(r: PairReport) -> None:
    if r.error is not None:
        log.warning("KV pair %s -> %s is degraded: probe failed: %s", r.prefill, r.decode, r.error)
    elif r.degraded:
        log.warning("KV pair %s -> %s is degraded: %s at %.3f GB/s", r.prefill, r.decode, r.transport, r.gbps)
    else:
        log.info("KV pair %s -> %s: %s at %.3f GB/s", r.prefill, r.decode, r.transport, r.gbps)
