"""The router's metric set (names are part of the operations contract; see docs/architecture.md)."""

from __future__ import annotations

from router.metrics import Gauge, MetricsRegistry

TOKEN_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.5,
)
STAGE_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
TRANSFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = MetricsRegistry()
        self.requests = r.counter(
            "pdserve_requests_total", "HTTP generation requests by outcome.", ["status"]
        )
        self.prompt_tokens = r.counter("pdserve_prompt_tokens_total", "Prompt tokens of finished sequences.")
        self.generation_tokens = r.counter("pdserve_generation_tokens_total", "Generated tokens.")
        self.prefix_hit_tokens = r.counter(
            "pdserve_prefix_cache_hit_tokens_total", "Prompt tokens served from a prefill worker's cache."
        )
        self.prefill_requests = r.counter(
            "pdserve_prefill_requests_total",
            "Sequences prefilled by each worker (a prefill worker, or a decode/mixed worker locally).",
            ["worker"],
        )
        self.decode_requests = r.counter(
            "pdserve_decode_requests_total", "Sequences assigned to each decode worker.", ["worker"]
        )
        self.ttft = r.histogram("pdserve_time_to_first_token_seconds", "Time from arrival to first token.")
        self.tpot = r.histogram(
            "pdserve_time_per_output_token_seconds",
            "Mean time between output tokens after the first, per sequence.",
            buckets=TOKEN_LATENCY_BUCKETS,
        )
        self.itl = r.histogram(
            "pdserve_inter_token_latency_seconds",
            "Seconds between a sequence's successive token deliveries at the router (one per update: tokens"
            " that arrive together count once).",
            buckets=TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = r.histogram("pdserve_e2e_request_latency_seconds", "Time from arrival to the last token.")
        self.kv_transfer_bytes = r.counter(
            "pdserve_kv_transfer_bytes_total", "KV bytes moved prefill -> decode."
        )
        self.kv_transfer_seconds = r.histogram(
            "pdserve_kv_transfer_seconds", "KV transfer time per sequence.", buckets=TRANSFER_BUCKETS
        )
        self.disagg_decisions = r.counter(
            "pdserve_disagg_decisions_total",
            "Sequences prefilled on a prefill worker (remote) or where they decode (local).",
            ["decision"],
        )
        self.stage_seconds = r.histogram(
            "pdserve_stage_seconds",
            "Seconds per sequence in each stage (workers' timings plus router_queue and decode).",
            ["stage"],
            buckets=STAGE_BUCKETS,
        )
        self.retries = r.counter(
            "pdserve_retries_total", "Sequences re-dispatched after a retryable failure."
        )
        self.running = r.gauge("pdserve_requests_running", "HTTP generation requests in progress.")
        self.worker_up = r.gauge(
            "pdserve_worker_up", "1 if the worker is registered and live.", ["role", "worker"]
        )
        self.kv_usage = r.gauge(
            "pdserve_kv_cache_usage_ratio", "Used / total KV blocks per worker.", ["worker"]
        )
        self.queued_prefill = r.gauge(
            "pdserve_queued_prefill_tokens",
            "Prompt tokens waiting on each prefill or mixed worker.",
            ["worker"],
        )
        self.kv_transport_info = r.gauge(
            "pdserve_kv_transport_info",
            "1 for each probed prefill/decode pair, labelled with the KV transport it uses.",
            ["prefill", "decode", "transport"],
        )
        self.kv_probe_gbps = r.gauge(
            "pdserve_kv_transfer_probe_gbps",
            "GB/s of each pair's probe transfer (0: the probe failed).",
            ["prefill", "decode"],
        )
        self.kv_pair_degraded = r.gauge(
            "pdserve_kv_pair_degraded",
            "1 if the pair's probe failed or ran below --kv-probe-min-gbps.",
            ["prefill", "decode"],
        )
        self.index_blocks = r.gauge(
            "pdserve_prefix_index_blocks", "Block hashes the index holds per worker.", ["worker"]
        )
        self.fronts = r.gauge(
            "pdserve_router_fronts", "Router fronts whose request figures this exposition sums."
        )
        self.fronts.set(1)

    @property
    def worker_views(self) -> tuple[Gauge, ...]:
        """The gauges rebuilt at each scrape from this front's picture of the workers
        (router/status_views.py). Every front holds a replica of the same picture, so several fronts'
        values are never summed: the front that answers shows its own."""
        return (
            self.worker_up,
            self.kv_usage,
            self.queued_prefill,
            self.index_blocks,
            self.kv_transport_info,
            self.kv_probe_gbps,
            self.kv_pair_degraded,
        )

    @property
    def front_owned(self) -> frozenset[str]:
        """The metrics each front counts for the requests it owns (requests, tokens, latencies, running,
        ...): /metrics sums them over the fronts."""
        local = {m.name for m in self.worker_views} | {self.fronts.name}
        return frozenset(self.registry.names) - local

    @property
    def cumulative(self) -> frozenset[str]:
        """The front-owned counters and histograms: totals since start, which a restarted front carries
        on from its predecessor's (router/front_metrics.py); gauges such as requests running do not."""
        return frozenset(name for name in self.front_owned if self.registry.kind(name) != "gauge")
