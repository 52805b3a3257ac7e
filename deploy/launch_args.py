"""The launcher's command line: `parse_args` turns `python -m deploy.launch` flags into a validated
`LaunchPlan` (deploy/plan.py) before anything starts; a bad flag or value ends in argparse's usage
error naming it."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from common.engine_args import add_engine_args, engine_overrides
from common.host import host_cores
from common.net.flags import add_log_level
from deploy.fronts import default_api_servers
from deploy.passthrough import (
    ROUTER_PASSTHROUGH,
    WORKER_PASSTHROUGH,
    add_launcher_read_args,
    add_passthrough_args,
    launcher_read_values,
    passthrough_argv,
)
from deploy.placement import parse_ray_resources
from deploy.plan import BACKENDS, LaunchPlan

PROG = "python -m deploy.launch"


def _front_count(asked: int | None, router_argv: Sequence[str]) -> int:
    """`--api-servers` as given, else one: with a fixed `--inbox-port` (a single inbox), else the
    host's default (deploy/fronts.py)."""
    if asked is not None:
        return asked
    return 1 if "--inbox-port" in router_argv else default_api_servers(host_cores())


def parse_args(argv: Sequence[str] | None = None, prog: str = PROG) -> LaunchPlan:
    p = argparse.ArgumentParser(prog=prog, description="start a pdserve cluster")
    p.add_argument("--model", default=None, help="HF model directory (default: the default model)")
    p.add_argument("--prefill", type=int, default=1, help="number of prefill workers")
    p.add_argument("--decode", type=int, default=1, help="number of decode workers")
    p.add_argument("--mixed", type=int, default=0, help="number of mixed (prefill + decode) workers")
    p.add_argument("--advertise-host", default=None, help="address workers use to reach the router")
    p.add_argument("--backend", choices=BACKENDS, default="ray", help="Ray actors or local subprocesses")
    p.add_argument("--ray-address", default=None, help="Ray cluster to join (default: RAY_ADDRESS or local)")
    p.add_argument(
        "--ray-resources",
        action="append",
        default=[],
        metavar="[ROLE=]JSON",
        help="custom Ray resources each worker (of ROLE) reserves, e.g. 'decode={\"decode_node\": 1}'",
    )
    p.add_argument("--gpus-per-worker", type=float, default=None, help="GPU share per worker (default: even)")
    p.add_argument("--log-dir", default=None, help="write router and worker logs here (default: stdout)")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument(
        "--api-servers",
        type=int,
        default=None,
        help="HTTP front processes on the one port (default: one per 4 cores, 1 to 4)",
    )
    p.add_argument(
        "--no-pd-multiplex",
        action="store_true",
        help="one GPU, --prefill 1 --decode 1: two workers instead of one multiplexed worker",
    )
    p.add_argument(
        "--mps",
        action="store_true",
        help="run the workers under a private CUDA MPS daemon (two workers on one GPU share its SMs)",
    )
    add_log_level(p)
    add_launcher_read_args(p)
    add_passthrough_args(p)
    add_engine_args(p)
    args = p.parse_args(argv)
    from common.tools.default_model import resolve_model
    from common.wire.generation_config import load_generation_defaults

    try:
        model = resolve_model(args.model)
        router_argv = passthrough_argv(args, ROUTER_PASSTHROUGH)
        generation_config = ROUTER_PASSTHROUGH.given(args).get("generation_config")
        if generation_config is not None:  # fail here, before anything starts, on a bad file
            load_generation_defaults(generation_config, model)
        return LaunchPlan(
            model=model,
            num_prefill=args.prefill,
            num_decode=args.decode,
            num_mixed=args.mixed,
            backend=args.backend,
            gpus_per_worker=args.gpus_per_worker,
            engine=engine_overrides(args),
            advertise_host=args.advertise_host,
            ray_address=args.ray_address,
            ray_resources=parse_ray_resources(args.ray_resources),
            log_dir=args.log_dir,
            log_level=args.log_level,
            startup_timeout_s=args.startup_timeout,
            api_servers=_front_count(args.api_servers, router_argv),
            pd_multiplex=not args.no_pd_multiplex,
            mps=args.mps,
            router_argv=router_argv,
            worker_argv=passthrough_argv(args, WORKER_PASSTHROUGH),
            **launcher_read_values(args),
        )
    except ValueError as e:
        p.error(str(e))
