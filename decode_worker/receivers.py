"""The decode worker's KV receivers, one per transport it accepts, picked by the sender's endpoint.

A decode worker may be fed by prefill workers on its own host (ipc) and on others (nccl), so with
`--kv-transport auto` it accepts every transport its device supports; an explicit transport accepts
only that one. A transfer it cannot take is reported as an error string: the caller recomputes.
"""

from __future__ import annotations

import logging

import torch

from kvtransfer import KVReceiver, KVTransferConfig, TransferResult, create_receiver, resolve_transport

log = logging.getLogger(__name__)


class KVReceivers:
    def __init__(self, requested: str, kv_cache: torch.Tensor, host: str, fetch_timeout_s: float) -> None:
        self.requested = requested
        self.kv_cache = kv_cache
        self.host = host
        self.fetch_timeout_s = fetch_timeout_s
        self._receivers: dict[str, KVReceiver] = {}

    @property
    def transports(self) -> list[str]:
        device = self.kv_cache.device.type
        same, other = (resolve_transport(self.requested, device, s) for s in (True, False))
        return [same] if same == other else [same, other]

    def start(self) -> None:
        for transport in self.transports:
            config = KVTransferConfig(
                transport=transport, host=self.host, fetch_timeout_s=self.fetch_timeout_s
            )
            receiver = create_receiver(transport, self.kv_cache, config)
            receiver.start()
            self._receivers[transport] = receiver
        log.info("KV receivers: %s", ", ".join(self._receivers))

    def summary(self) -> dict:
        return {"transports": list(self._receivers)}

    def fetch(self, request_id: str, endpoint: dict, src: list[int], dst: list[int]) -> str | None:
        """Start pulling `src` into `dst`; returns an error instead when the transfer cannot start."""
        transport = endpoint.get("transport") if isinstance(endpoint, dict) else None
        receiver = self._receivers.get(transport) if isinstance(transport, str) else None
        if receiver is None:
            return f"kv transport {transport!r} not accepted here (have {list(self._receivers)})"
        try:
            receiver.fetch(request_id, endpoint, src, dst, self.fetch_timeout_s)
        except (ValueError, RuntimeError) as e:
            return str(e)
        return None

    def flush(self) -> None:
        """Start the fetches admitted since the last call (batched per sender where the transport can)."""
        for receiver in self._receivers.values():
            receiver.flush()

    def poll(self) -> list[TransferResult]:
        return [r for receiver in self._receivers.values() for r in receiver.poll()]

    def close(self) -> None:
        for receiver in self._receivers.values():
            receiver.close()
        self._receivers.clear()
