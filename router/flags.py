"""RouterConfig's fields as flags (common/net/flags.py): `python -m router` is built from this table and
the launcher (deploy/passthrough.py) derives its router flags from it, so each is written once here.
Defaults are RouterConfig's own; the cluster's CURVE keys are no flag (environment only)."""

from __future__ import annotations

from common.net.flags import Flag, FlagTable
from router.config import API_KEY_ENV
from router.disagg import DISAGG_MODES
from router.policy import ROUTING_POLICIES


def _zero_means_no_limit(seconds: float) -> float | None:
    return seconds or None


ROUTER_FLAGS = FlagTable(
    "router",
    (
        Flag("model", str, "HF model directory (tokenizer files are read from it)", required=True),
        Flag("served_model_name", str, "name clients use (default: the directory name)"),
        Flag("host", str, "HTTP bind address"),
        Flag("port", int, "HTTP port (0: pick a free one)"),
        Flag("inbox_host", str, "this node's address as workers reach it"),
        Flag("inbox_port", int, "ZMQ inbox port (0: pick a free one)"),
        Flag(
            "routing",
            str,
            "how a request picks its worker (prefix: cached prefixes and load)",
            ROUTING_POLICIES,
        ),
        Flag(
            "balance_threshold_tokens",
            int,
            "prefix routing: queue imbalance (tokens) below which cache hits alone decide (0: count load)",
        ),
        Flag(
            "disagg",
            str,
            "always: prefill on prefill workers when any is live (else mixed workers serve alone); "
            "never: decode/mixed workers prefill every request; auto: per request, by a cost model",
            DISAGG_MODES,
        ),
        Flag(
            "disagg_stall_weight",
            float,
            "auto: weight of the latency a local prefill adds to each sequence decoding there",
        ),
        Flag(
            "generation_config",
            str,
            "sampling defaults for requests that leave them out: auto (the model's generation_config.json), "
            "vllm (the engine's own), or a directory holding a generation_config.json",
        ),
        Flag(
            "kv_probe_mb",
            float,
            "MiB each prefill/decode pair moves in its probe transfer when it forms (0: no probes)",
        ),
        Flag(
            "kv_probe_min_gbps",
            float,
            "a pair whose probe runs slower than this (GB/s), or fails, is degraded (0: only failures)",
        ),
        Flag("request_timeout", float, "seconds per request; 0 = no limit", to_field=_zero_means_no_limit),
        Flag("heartbeat_timeout", float, "silence before a worker is down"),
        Flag("max_retries", int, "times a request that failed retryably is tried again on another worker"),
        Flag("snapshot_retry_interval", float, "seconds before an unanswered cache snapshot is asked again"),
        Flag("block_size", int, "KV block size (default: the workers')"),
        Flag(
            "max_running_requests",
            int,
            "generation requests in flight beyond which a new one gets 429 before its body is read",
        ),
        Flag(
            "admission_wait_s",
            float,
            "seconds a request past --max-running-requests waits for a place before its 429 (0: none)",
            option="--admission-wait",
        ),
        Flag(
            "stream_interval",
            int,
            "tokens a streamed choice gathers per SSE chunk after its first (as vLLM's; 1: every message)",
        ),
        Flag("max_body_bytes", int, "beyond this, answer 413"),
        Flag("ready_file", str, 'write {"http": url, "inbox": addr} here when ready'),
        Flag("front", int, "this front's index among several (labels /metrics and /health)"),
        Flag("reuse_port", None, "bind the HTTP port with SO_REUSEPORT (several fronts share it)"),
        Flag(
            "fronts_dir",
            str,
            "with --front: the directory the launcher shares between fronts (one in-flight bound for all "
            "of them; /metrics sums them)",
        ),
        # The environment variable is the safer way to give the key: a command line is visible to every
        # user of the host (ps). An empty variable means "no key", as an unset one does.
        Flag(
            "api_key",
            str,
            f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV}; unset: no auth)",
            env=API_KEY_ENV,
        ),
        Flag(
            "protect_status",
            None,
            "also require the key on /health, /metrics, /debug/* and every other route",
        ),
        Flag(
            "disable_uvicorn_access_log",
            None,
            "write no access line per HTTP request (as vLLM's flag; errors are still logged)",
        ),
    ),
)
