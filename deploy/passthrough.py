"""Launcher flags that are handed on unchanged to the router or to every worker.

Each is left out of the child's command line unless the user gave it, so the child's own default
stays the single source of truth.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from router.disagg import DISAGG_MODES


@dataclass(frozen=True)
class PassThrough:
    option: str
    type: type
    help: str
    choices: tuple[str, ...] | None = None  # checked by the launcher too, so a typo fails before any start

    @property
    def dest(self) -> str:
        return self.option.removeprefix("--").replace("-", "_")


ROUTER_FLAGS = (
    PassThrough("--request-timeout", float, "router: end-to-end seconds per request (0 = no limit)"),
    PassThrough("--heartbeat-timeout", float, "router: worker silence before it is marked down"),
    PassThrough("--max-running-requests", int, "router: requests in progress before answering 429"),
    PassThrough("--balance-threshold-tokens", int, "router: queue imbalance under which cache hits decide"),
    PassThrough("--disagg", str, "router: where prompts are prefilled (see router/disagg.py)", DISAGG_MODES),
    PassThrough("--disagg-stall-weight", float, "router (auto): cost of stalling each decoding sequence"),
    PassThrough("--kv-probe-mb", float, "router: MiB of each prefill/decode pair's probe transfer (0: none)"),
    PassThrough("--kv-probe-min-gbps", float, "router: probe GB/s below which a pair is degraded"),
    PassThrough(
        "--generation-config",
        str,
        "router: sampling defaults of requests that leave them out: auto (the model's "
        "generation_config.json, the default), vllm (the engine's own) or a directory",
    ),
)
WORKER_FLAGS = (
    PassThrough("--kv-lease-s", float, "workers: seconds blocks stay pinned waiting for the decode side"),
    PassThrough("--kv-fetch-timeout-s", float, "workers: seconds a KV fetch may take before recompute"),
)


def add_passthrough_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("passed to the router and workers")
    for flag in ROUTER_FLAGS + WORKER_FLAGS:
        group.add_argument(flag.option, type=flag.type, default=None, help=flag.help, choices=flag.choices)


def passthrough_argv(args: argparse.Namespace, flags: tuple[PassThrough, ...]) -> tuple[str, ...]:
    argv: list[str] = []
    for flag in flags:
        value = getattr(args, flag.dest, None)
        if value is not None:
            argv += [flag.option, str(value)]
    return tuple(argv)
