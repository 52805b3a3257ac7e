"""The prefill role: batch prompts under the token budget, fill KV blocks (reusing cached prefixes),
sample the first token, send it to the router at once, then hand the blocks to the decode worker the
router chose (kvtransfer) and publish prefix-cache events.

    python -m prefill_worker --router-addr tcp://H:P [--model PATH] [--host H|auto] [--worker-id ID]
        [--kv-transport auto|tcp|ipc|nccl] [--kv-lease-s S] [engine flags]

`main(argv)` is the same entry point for in-process use (e.g. inside a Ray actor).
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from common.worker.main import run_worker
    from prefill_worker.role import PrefillRole

    return run_worker({"prefill": PrefillRole}, argv)
