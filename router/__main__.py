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
import sys
from collections.abc import Sequence

from common.net.curve import CurveKeys
from common.net.flags import add_log_level
from common.net.gc_heap import freeze_startup_heap
from common.wire import request_log
from common.wire.generation_config import load_generation_defaults
from router.config import RouterConfig
from router.flags import ROUTER_FLAGS


def parse_args(argv: Sequence[str] | None = None) -> tuple[RouterConfig, str]:
    p = argparse.ArgumentParser(
        prog="python -m router", description="pdserve router (OpenAI-compatible HTTP)"
    )
    ROUTER_FLAGS.add_to(p)
    add_log_level(p)
    args = p.parse_args(argv)
    try:
        config = RouterConfig(
            **ROUTER_FLAGS.config_values(args),
            curve=CurveKeys.from_env(pop=True),  # out of the environment: children do not inherit it
        )
        # Read here too (the router reads it again when it starts) so that a bad file is a usage
        # error naming it, not a traceback from inside the server's start-up.
        load_generation_defaults(config.generation_config, config.model)
    except ValueError as e:
        p.error(str(e))
    return config, args.log_level


def main(argv: Sequence[str] | None = None) -> int:
    config, log_level = parse_args(argv)
    request_log.configure(log_level, "router")
    from router.server import serve  # imported late so that --help stays fast

    _tune_gc()
    with contextlib.suppress(KeyboardInterrupt):
        _event_loop_runner()(serve(config, log_level))
    return 0


def _tune_gc() -> None:
    """Every request allocates hundreds of container objects, so with CPython's default thresholds
    (700, 10, 10) the cyclic collector ran every request or so and its older generations often: about
    a tenth of the router's CPU per admitted request (py-spy --native; router_throughput.py
    --max-tokens 1: ~425 -> ~378 us per request). The modules imported by now are frozen out of the
    scans, and a young collection runs every 50,000 allocations. Only cyclic garbage waits longer;
    everything else is still freed by reference counting as it goes."""
    freeze_startup_heap(young_threshold=50_000)


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
