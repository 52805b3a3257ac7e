"""The prefill worker's KV senders: one per transport it may need, chosen per decode worker.

With `--kv-transport auto` on CUDA both ipc (decode worker on this host) and nccl (elsewhere) are
started; on the CPU only tcp works. An explicit transport starts just that one.
"""

from __future__ import annotations

import logging

import torch

from common.worker.net import split_tcp_address
from kvtransfer import Endpoint, KVSender, KVTransferConfig, Release, create_sender, resolve_transport

log = logging.getLogger(__name__)


class KVSenders:
    def __init__(self, requested: str, kv_cache: torch.Tensor, host: str, lease_s: float) -> None:
        self.requested = requested
        self.kv_cache = kv_cache
        self.host = host
        self.lease_s = lease_s
        self.device_type = kv_cache.device.type
        self._senders: dict[str, KVSender] = {}
        self._transport_of: dict[str, str] = {}  # request id -> transport it was published on

    @property
    def transports(self) -> list[str]:
        same, other = (resolve_transport(self.requested, self.device_type, s) for s in (True, False))
        return [same] if same == other else [same, other]

    def start(self) -> None:
        for transport in self.transports:
            config = KVTransferConfig(transport=transport, host=self.host, lease_s=self.lease_s)
            sender = create_sender(transport, self.kv_cache, config)
            sender.start()
            self._senders[transport] = sender
        log.info("KV senders: %s", ", ".join(self._senders))

    def summary(self) -> dict:
        """What the registration's `kv_endpoint` says (the router treats it as opaque)."""
        return {"transports": list(self._senders)}

    def choose(self, decode_command_addr: str) -> str:
        if len(self._senders) == 1:
            return next(iter(self._senders))
        try:
            same_host = split_tcp_address(decode_command_addr)[0] == self.host
        except ValueError:
            same_host = False
        return resolve_transport(self.requested, self.device_type, same_host)

    def publish(self, request_id: str, transport: str, block_ids: list[int]) -> Endpoint:
        """Pin `block_ids` for the request; returns the endpoint the decode worker pulls from."""
        endpoint = self._senders[transport].publish(request_id, block_ids, self.lease_s)
        self._transport_of[request_id] = transport
        return endpoint

    def cancel(self, request_id: str) -> bool:
        """Drop a publication; when this returns nothing reads its blocks any more."""
        transport = self._transport_of.pop(request_id, None)
        return transport is not None and self._senders[transport].cancel(request_id)

    def poll_released(self) -> list[Release]:
        released = [r for sender in self._senders.values() for r in sender.poll_released()]
        for release in released:
            self._transport_of.pop(release.request_id, None)
        return released

    def close(self) -> None:
        for sender in self._senders.values():
            sender.close()
        self._senders.clear()
