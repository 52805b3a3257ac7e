"""Read-only views of the cluster for /health, /debug/index and the per-worker gauges of /metrics."""

from __future__ import annotations

from router.kv_probes import KVProbes, PairReport
from router.live_rates import LiveRates
from router.policy import DecodeLoad, PrefillLoad
from router.prefix_index import PrefixIndex, WorkerIndexStats
from router.router_metrics import RouterMetrics
from router.worker_registry import WorkerInfo, WorkerRegistry, WorkerState


def _worker_summary(w: WorkerInfo) -> dict:
    return {
        "worker_id": w.worker_id,
        "role": w.role,
        "host": w.reg.host,
        "node_id": w.reg.node_id,
        "pid": w.reg.pid,
        "state": w.state.value,
    }


def health_report(registry: WorkerRegistry, healthy: bool, probes: KVProbes | None = None) -> dict:
    """`ok`; `degraded` when a registered worker is down but requests are still served (the HTTP
    status is 503 either way, so a load balancer notices); `unavailable` when nothing can serve.
    `kv_pairs` lists each probed prefill/decode pair: its transport, probe GB/s and whether it is
    degraded (a slow or broken KV path costs speed, not correctness, so it leaves the status alone)."""
    serving = registry.can_serve()
    return {
        "status": "ok" if healthy else ("degraded" if serving else "unavailable"),
        "workers": [_worker_summary(w) for w in registry.workers()],
        "rejected_workers": [{"worker_id": k, "reason": v} for k, v in sorted(registry.rejected.items())],
        "kv_pairs": [_pair_view(r) for r in probes.reports()] if probes is not None else [],
    }


def _pair_view(r: PairReport) -> dict:
    return {
        "prefill": r.prefill,
        "decode": r.decode,
        "transport": r.transport,
        "probe_gbps": round(r.gbps, 4),
        "degraded": r.degraded,
        "error": r.error,
    }


def debug_index(registry: WorkerRegistry, index: PrefixIndex, policy_name: str, rates: LiveRates) -> dict:
    index_stats = {s.worker_id: s for s in index.stats()}
    loads: dict[str, PrefillLoad | DecodeLoad] = {p.worker_id: p for p in registry.prefill_loads()}
    loads.update((d.worker_id, d) for d in registry.decode_loads())
    workers = [
        _worker_summary(w)
        | {"kv_cache_usage": round(w.kv_usage(), 4)}
        | _kv_blocks_view(w)
        | _index_view(index_stats.get(w.worker_id))
        | _load_view(loads.get(w.worker_id))
        for w in registry.workers()
    ]
    return {
        "policy": policy_name,
        "block_size": registry.block_size,
        "unique_blocks": index.num_unique_blocks,
        "workers": workers,
        "rejected_workers": dict(sorted(registry.rejected.items())),
        "disagg": {"mode": registry.disagg, "learned": rates.snapshot()},
    }


def _kv_blocks_view(w: WorkerInfo) -> dict:
    """Blocks held by requests (or pinned hand-offs) per the last heartbeat: 0 on an idle worker, so a
    soak can count leaked blocks exactly (cached-but-free prefix blocks count as free)."""
    hb = w.heartbeat
    if hb is None:
        return {}
    return {
        "kv_blocks_used": hb.num_total_blocks - hb.num_free_blocks,
        "kv_blocks_total": hb.num_total_blocks,
    }


def _index_view(stats: WorkerIndexStats | None) -> dict:
    if stats is None:
        return {}
    return {
        "cached_blocks": stats.num_blocks,
        "last_event_seq": stats.last_seq,
        "awaiting_snapshot": stats.awaiting_snapshot,
        "buffered_event_batches": stats.num_buffered_batches,
    }


def _load_view(load: PrefillLoad | DecodeLoad | None) -> dict:
    if isinstance(load, PrefillLoad):
        return {"queued_prefill_tokens": load.queued_prefill_tokens, "in_flight": load.in_flight}
    if isinstance(load, DecodeLoad):
        return {
            "free_blocks": load.num_free_blocks,
            "total_blocks": load.num_total_blocks,
            "running": load.num_running,
            "queued_prefill_tokens": load.queued_prefill_tokens,
            "in_flight": load.in_flight,
        }
    return {}


def refresh_worker_gauges(
    metrics: RouterMetrics, registry: WorkerRegistry, index: PrefixIndex, probes: KVProbes | None = None
) -> None:
    """Rebuild the per-worker (and per-pair) gauges so workers that left disappear from the exposition."""
    for gauge in metrics.worker_views:
        gauge.clear()
    for r in probes.reports() if probes is not None else ():
        metrics.kv_transport_info.set(1, prefill=r.prefill, decode=r.decode, transport=r.transport)
        metrics.kv_probe_gbps.set(r.gbps, prefill=r.prefill, decode=r.decode)
        metrics.kv_pair_degraded.set(int(r.degraded), prefill=r.prefill, decode=r.decode)
    for w in registry.workers():
        metrics.worker_up.set(1 if w.state is WorkerState.LIVE else 0, role=w.role, worker=w.worker_id)
        metrics.kv_usage.set(w.kv_usage(), worker=w.worker_id)
    loads: list[PrefillLoad | DecodeLoad] = [*registry.prefill_loads(), *registry.decode_loads(("mixed",))]
    for load in loads:
        metrics.queued_prefill.set(load.queued_prefill_tokens, worker=load.worker_id)
    for worker_id in index.worker_ids:
        metrics.index_blocks.set(index.num_blocks(worker_id), worker=worker_id)
