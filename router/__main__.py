"""`python -m router --model PATH [--host H] [--port P] [--inbox-host H] [--inbox-port P] ...`

The cluster's CURVE keys (common/net/curve.py) come from $PDSERVE_CURVE_PUBLIC_KEY and
$PDSERVE_CURVE_SECRET_KEY (`deploy.launch` sets them); without them the ZMQ inbox is unauthenticated.
`--api-key KEY` (or $PDSERVE_API_KEY) turns on Bearer-key auth; `--protect-status` extends it to every
route (see router/auth.py). `--disagg always|never|auto` chooses where prompts are prefilled (see
router/disagg.py). `--generation-config auto|vllm|PATH` chooses the sampling defaults of requests that
leave them out (see common/wire/generation_config.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence

from common.net.curve import CurveKeys
from common.wire import request_log
from common.wire.generation_config import GENERATION_CONFIG_AUTO, load_generation_defaults
from router.config import API_KEY_ENV, RouterConfig
from router.disagg import DEFAULT_DISAGG, DEFAULT_STALL_WEIGHT, DISAGG_MODES
from router.kv_probes import DEFAULT_PROBE_BYTES
from router.policy import ROUTING_POLICIES


def parse_args(argv: Sequence[str] | None = None) -> tuple[RouterConfig, str]:
    p = argparse.ArgumentParser(
        prog="python -m router", description="pdserve router (OpenAI-compatible HTTP)"
    )
    p.add_argument("--model", required=True, help="HF model directory (tokenizer files are read from it)")
    p.add_argument("--served-model-name", default=None, help="name clients use (default: the directory name)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0: pick a free one)")
    p.add_argument("--inbox-host", default="127.0.0.1", help="this node's address as workers reach it")
    p.add_argument("--inbox-port", type=int, default=0, help="ZMQ inbox port (0: pick a free one)")
    p.add_argument("--routing", choices=ROUTING_POLICIES, default="prefix")
    p.add_argument(
        "--balance-threshold-tokens",
        type=int,
        default=2048,
        help="prefix routing: queue imbalance (tokens) below which cache hits alone decide (0: count load)",
    )
    p.add_argument(
        "--disagg",
        choices=DISAGG_MODES,
        default=DEFAULT_DISAGG,
        help="always: prefill on prefill workers when any is live (else mixed workers serve alone); "
        "never: decode/mixed workers prefill every request; auto: per request, by a cost model",
    )
    p.add_argument(
        "--disagg-stall-weight",
        type=float,
        default=DEFAULT_STALL_WEIGHT,
        help="auto: weight of the latency a local prefill adds to each sequence decoding there",
    )
    p.add_argument(
        "--generation-config",
        default=GENERATION_CONFIG_AUTO,
        help="sampling defaults for requests that leave them out: auto (the model's "
        "generation_config.json), vllm (the engine's own), or a directory holding a generation_config.json",
    )
    p.add_argument(
        "--kv-probe-mb",
        type=float,
        default=DEFAULT_PROBE_BYTES / (1 << 20),
        help="MiB each prefill/decode pair moves in its probe transfer when it forms (0: no probes)",
    )
    p.add_argument(
        "--kv-probe-min-gbps",
        type=float,
        default=0.0,
        help="a pair whose probe runs slower than this (GB/s), or fails, is degraded (0: only failures)",
    )
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request; 0 = no limit")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0, help="silence before a worker is down")
    p.add_argument("--block-size", type=int, default=None, help="KV block size (default: the workers')")
    p.add_argument("--max-running-requests", type=int, default=4096, help="beyond this, answer 429")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024, help="beyond this, answer 413")
    p.add_argument("--ready-file", default=None, help='write {"http": url, "inbox": addr} here when ready')
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _add_auth_args(p)
    args = p.parse_args(argv)
    try:
        config = RouterConfig(
            model=args.model,
            served_model_name=args.served_model_name,
            host=args.host,
            port=args.port,
            inbox_host=args.inbox_host,
            inbox_port=args.inbox_port,
            routing=args.routing,
            balance_threshold_tokens=args.balance_threshold_tokens,
            request_timeout=args.request_timeout or None,
            heartbeat_timeout=args.heartbeat_timeout,
            block_size=args.block_size,
            max_running_requests=args.max_running_requests,
            max_body_bytes=args.max_body_bytes,
            ready_file=args.ready_file,
            api_key=args.api_key,
            protect_status=args.protect_status,
            disagg=args.disagg,
            disagg_stall_weight=args.disagg_stall_weight,
            generation_config=args.generation_config,
            kv_probe_mb=args.kv_probe_mb,
            kv_probe_min_gbps=args.kv_probe_min_gbps,
            curve=CurveKeys.from_env(pop=True),  # out of the environment: children do not inherit it
        )
        # Read here too (the router reads it again when it starts) so that a bad file is a usage
        # error naming it, not a traceback from inside the server's start-up.
        load_generation_defaults(config.generation_config, config.model)
    except ValueError as e:
        p.error(str(e))
    return config, args.log_level


def _add_auth_args(p: argparse.ArgumentParser) -> None:
    # The environment variable is the safer way to give the key: a command line is visible to every
    # user of the host (ps). An empty variable means "no key", as an unset one does.
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV}; unset: no auth)",
    )
    p.add_argument(
        "--protect-status",
        action="store_true",
        help="also require the key on /health, /metrics, /debug/* and every other route",
    )


def main(argv: Sequence[str] | None = None) -> int:
    config, log_level = parse_args(argv)
    request_log.configure(log_level, "router")
    from router.server import serve  # imported late so that --help stays fast

    with contextlib.suppress(KeyboardInterrupt):
        _event_loop_runner()(serve(config, log_level))
    return 0


def _event_loop_runner():
    """uvloop when it is installed (an optional speed-up: a cheaper event loop on the per-token path,
    see docs/benchmarks-log.md), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


if __name__ == "__main__":
    sys.exit(main())
