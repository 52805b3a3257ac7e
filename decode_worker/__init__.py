"""The decode role: take sequences whose prompt KV a prefill worker computed, pull the blocks
(kvtransfer), decode them in large batches and stream tokens to the router. A decode worker also
takes whole requests (`GenerateRequest`: it prefills the prompt itself), and with `--role mixed` it
is a mixed worker: the same code registered as both prefill- and decode-capable, publishing its
prefix-cache events like a prefill worker (see `role.py`).

    python -m decode_worker --router-addr tcp://H:P [--role decode|mixed] [--model PATH]
        [--host H|auto] [--worker-id ID] [--kv-transport auto|tcp|ipc|nccl] [--kv-fetch-timeout-s S]
        [engine flags]

`main(argv)` is the same entry point for in-process use (e.g. inside a Ray actor).
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from common.worker.main import run_worker
    from decode_worker.role import DecodeRole, MixedRole

    return run_worker({"decode": DecodeRole, "mixed": MixedRole}, argv)
