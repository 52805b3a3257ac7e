"""The launcher's router and worker flags, derived from the router's and the workers' own flag tables
(router/flags.py, common/worker/config.py): a flag is written once, where its config is.

Every router or worker flag is one of three kinds here:
- set by the launcher: it fills the value itself (the inbox it advertises, each worker's id, ...);
- read by the launcher: offered under the child's name and read into the LaunchPlan, because the
  launcher needs the value too and hands it on its own way (the API key through the environment);
- passed through: offered, and handed on unchanged only when given, so the child's own default stays
  the single source of truth. A flag both take (--served-model-name) reaches the router and the workers.
"""

from __future__ import annotations

import argparse
from typing import Any

from common.net.flags import FlagTable
from common.worker.config import WORKER_FLAGS
from router.flags import ROUTER_FLAGS

# --model is the launcher's own (it resolves the default model); --block-size follows the engine's
# --kvcache-block-size.
ROUTER_SET = ("model", "inbox_host", "ready_file", "block_size", "front", "reuse_port", "fronts_dir")
ROUTER_READ = ROUTER_FLAGS.only(("host", "port", "api_key", "protect_status"))
ROUTER_PASSTHROUGH = ROUTER_FLAGS.without((*ROUTER_SET, *ROUTER_READ.fields))

# node_id: the Ray backend adds it once the actor knows its node (deploy/ray_backend.py).
WORKER_SET = ("router_addr", "host", "worker_id", "node_id")
WORKER_READ = WORKER_FLAGS.only(("kv_transport",))
WORKER_PASSTHROUGH = WORKER_FLAGS.without((*WORKER_SET, *WORKER_READ.fields))


def add_launcher_read_args(parser: argparse.ArgumentParser) -> None:
    ROUTER_READ.add_to(parser, "router: ")
    WORKER_READ.add_to(parser, "workers: ")


def launcher_read_values(args: argparse.Namespace) -> dict[str, Any]:
    """The LaunchPlan fields these flags give (absent when not given: the plan's default stays)."""
    return {**ROUTER_READ.given(args), **WORKER_READ.given(args)}


def add_passthrough_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("passed to the router and workers")
    shared = set(_options(ROUTER_PASSTHROUGH)) & set(_options(WORKER_PASSTHROUGH))
    for flag in ROUTER_PASSTHROUGH.flags:
        flag.add_to(group, "router and workers: " if flag.name in shared else "router: ")
    for flag in WORKER_PASSTHROUGH.flags:
        if flag.name not in shared:
            flag.add_to(group, "workers: ")


def passthrough_argv(args: argparse.Namespace, flags: FlagTable) -> tuple[str, ...]:
    """The flags of `flags` the user gave, as the child's command line."""
    return tuple(flags.argv(flags.given(args)))


def _options(table: FlagTable) -> list[str]:
    return [flag.name for flag in table.flags]
