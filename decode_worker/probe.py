"""KV path probes on the decode side: fetch a prefill worker's probe blocks into scratch memory and
report how fast they came (`KVProbeResult`, to the router, which exports and judges it).

The scratch is a small cache of the engine's layout, allocated at the first probe (as many blocks as
that probe moves) on the engine's device, so a probe travels exactly the path a hand-off would (same
transport, same devices, same network) without touching a block the engine owns. Probes fetch without
verification: their blocks are whatever the prefill worker's cache holds at that moment, possibly
being rewritten, and what is measured is the path, not the content.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import NamedTuple

import torch

from common.wire.probe_messages import KVProbe, KVProbeResult
from kvtransfer import KVTransferConfig, TransferStatus
from kvtransfer.peers import KVReceiverSet

log = logging.getLogger(__name__)
MAX_PROBE_BYTES = 1 << 30  # a probe asking for more scratch than this is refused, not allocated


class ProbeAnswer(NamedTuple):
    """A finished probe's result and the front that asked for it (where the result goes)."""

    result: KVProbeResult
    reply_to: str | None


class ProbeReceiver:
    def __init__(self, kv_cache: torch.Tensor, config: KVTransferConfig, worker_id: str) -> None:
        self._template = kv_cache
        self._config = replace(config, verify=False)
        self._worker_id = worker_id
        self._receivers: KVReceiverSet | None = None
        self._pending: dict[str, KVProbe] = {}

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def start(self, msg: KVProbe) -> KVProbeResult | None:
        """Start timing a probe; a result at once when it cannot start."""
        n, transport = msg.handoff.num_blocks, msg.handoff.transport
        block_bytes = self._template[:, :, 0].numel() * self._template.element_size()
        if not 0 < n * block_bytes <= MAX_PROBE_BYTES:
            return self._result(msg, transport, error=f"a probe of {n} blocks is empty or too large")
        receivers = self._open(n)
        if n > self._capacity:
            error = f"a probe of {n} blocks does not fit the {self._capacity} scratch blocks"
            return self._result(msg, transport, error=error)
        if msg.probe_id in self._pending:
            return None  # a duplicate of a probe in flight: its result will come
        error = receivers.fetch(msg.handoff, list(range(n)))
        if error is not None:
            return self._result(msg, transport, error=error)
        self._pending[msg.probe_id] = msg
        return None

    def poll(self) -> list[ProbeAnswer]:
        if self._receivers is None:
            return []
        out = []
        for r in self._receivers.poll():
            msg = self._pending.pop(r.request_id, None)
            if msg is None:
                continue
            error = None if r.status is TransferStatus.DONE else (r.error or "failed")
            result = self._result(msg, msg.handoff.transport, r.num_bytes, r.seconds, error)
            out.append(ProbeAnswer(result, msg.reply_to))
        return out

    def close(self) -> None:
        if self._receivers is not None:
            self._receivers.close()

    def _open(self, num_blocks: int) -> KVReceiverSet:
        if self._receivers is None:
            shape = list(self._template.shape)
            shape[2] = max(num_blocks, 1)
            scratch = self._template.new_empty(shape)
            self._receivers = KVReceiverSet(scratch, self._config)
            self._receivers.start()
        return self._receivers

    @property
    def _capacity(self) -> int:
        return 0 if self._receivers is None else self._receivers.kv_cache.shape[2]

    def _result(
        self, msg: KVProbe, transport: str, num_bytes: int = 0, seconds: float = 0.0, error: str | None = None
    ) -> KVProbeResult:
        return KVProbeResult(
            msg.probe_id, msg.prefill_worker_id, self._worker_id, transport, num_bytes, seconds, error
        )
