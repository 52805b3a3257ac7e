"""One sender (prefill side) or receiver (decode side) per transport a worker may need, chosen per peer.

A worker talks to peers on its own host and on others. With `auto` on CUDA it therefore starts both
ipc (same host) and nccl (elsewhere); on the CPU only tcp works; an explicit transport starts just
that one (`transports_for`). A sender picks the transport for each receiver from the receiver's
address (`transport_for_peer`); a receiver takes whatever transport the hand-off names, if it
started that one, and reports a transfer it cannot take as an error string (the caller recomputes).

Both sets follow the KVSender/KVReceiver rules in `base.py`: constructors do no I/O, `start()` binds,
`close()` is idempotent, and the engine-thread calls never block on the network.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace

import torch

from common.net.addresses import split_tcp_address
from common.wire.handoff import HandOff

from .base import KVReceiver, KVSender, Release, TransferResult
from .config import KVTransferConfig, resolve_transport
from .layout import CacheLayout
from .registry import create_receiver, create_sender

log = logging.getLogger(__name__)


def transports_for(requested: str, device_type: str) -> list[str]:
    """Every transport a worker needs to reach peers on its own host and on others."""
    same, other = (resolve_transport(requested, device_type, same_host) for same_host in (True, False))
    return [same] if same == other else [same, other]


def transport_for_peer(requested: str, device_type: str, own_host: str, peer_addr: str) -> str:
    """The transport to a peer reached at `peer_addr` (tcp://host:port); an address that cannot be
    parsed counts as another host (the transport that works anywhere)."""
    try:
        same_host = split_tcp_address(peer_addr)[0] == own_host
    except ValueError:
        same_host = False
    return resolve_transport(requested, device_type, same_host)


class _TransportSet(ABC):
    """Starts one endpoint (sender or receiver) per transport of `transports_for`."""

    kind: str

    def __init__(self, kv_cache: torch.Tensor, config: KVTransferConfig) -> None:
        self.kv_cache = kv_cache
        self.config = config  # config.transport may be "auto"
        self.device_type = kv_cache.device.type
        self._endpoints: dict = {}  # transport -> started KVSender / KVReceiver

    @property
    def transports(self) -> list[str]:
        return transports_for(self.config.transport, self.device_type)

    @abstractmethod
    def _create(self, transport: str, config: KVTransferConfig) -> KVSender | KVReceiver: ...

    def start(self) -> None:
        for transport in self.transports:
            endpoint = self._create(transport, replace(self.config, transport=transport))
            endpoint.start()
            self._endpoints[transport] = endpoint
        log.info("KV %s: %s", self.kind, ", ".join(self._endpoints))

    def summary(self) -> dict:
        """What a worker's registration says about its KV side: its transports, and its cache dtype
        (the router admits one per cluster: blocks of another dtype cannot be handed off)."""
        return {"transports": list(self._endpoints), "kv_dtype": CacheLayout.of(self.kv_cache).dtype}

    def close(self) -> None:
        for endpoint in self._endpoints.values():
            endpoint.close()
        self._endpoints.clear()


class KVSenderSet(_TransportSet):
    """Prefill side: publishes a request's blocks on the transport that suits its receiver."""

    kind = "senders"

    def __init__(self, kv_cache: torch.Tensor, config: KVTransferConfig) -> None:
        super().__init__(kv_cache, config)
        self._transport_of: dict[str, str] = {}  # request id -> transport it was published on

    def _create(self, transport: str, config: KVTransferConfig) -> KVSender:
        return create_sender(transport, self.kv_cache, config)

    def publish(
        self, request_id: str, peer_addr: str, block_ids: list[int], block_hashes: Sequence[int] = ()
    ) -> HandOff:
        """Pin `block_ids` (whose full blocks have the chain hashes `block_hashes`) for the request;
        returns the hand-off the receiver at `peer_addr` pulls by. Raises ValueError / RuntimeError as
        `KVSender.publish` does (the caller's bugs)."""
        transport = self._choose(peer_addr)
        sender = self._endpoints[transport]
        handoff = sender.publish(request_id, block_ids, self.config.lease_s, block_hashes)
        self._transport_of[request_id] = transport
        return handoff

    def _choose(self, peer_addr: str) -> str:
        if len(self._endpoints) == 1:
            return next(iter(self._endpoints))
        return transport_for_peer(self.config.transport, self.device_type, self.config.host, peer_addr)

    def cancel(self, request_id: str) -> bool:
        """Drop a publication; when this returns nothing reads its blocks any more."""
        transport = self._transport_of.pop(request_id, None)
        return transport is not None and self._endpoints[transport].cancel(request_id)

    def poll_released(self) -> list[Release]:
        released = [r for sender in self._endpoints.values() for r in sender.poll_released()]
        for release in released:
            self._transport_of.pop(release.request_id, None)
        return released


class KVReceiverSet(_TransportSet):
    """Decode side: pulls from whichever transport the hand-off names."""

    kind = "receivers"

    def _create(self, transport: str, config: KVTransferConfig) -> KVReceiver:
        return create_receiver(transport, self.kv_cache, config)

    def fetch(
        self, handoff: HandOff, dst: list[int], block_hashes: Sequence[int] | None = None
    ) -> str | None:
        """Start pulling the publication `handoff` names into `dst` (checked against the prompt's chain
        `block_hashes`); returns an error instead when the transfer cannot start."""
        receiver = self._endpoints.get(handoff.transport)
        if receiver is None:
            return f"kv transport {handoff.transport!r} not accepted here (have {list(self._endpoints)})"
        try:
            receiver.fetch(handoff, dst, self.config.fetch_timeout_s, block_hashes)
        except (ValueError, RuntimeError) as e:
            return str(e)
        return None

    def flush(self) -> None:
        """Start the fetches admitted since the last call (batched per sender where the transport can)."""
        for receiver in self._endpoints.values():
            receiver.flush()

    def poll(self) -> list[TransferResult]:
        return [r for receiver in self._endpoints.values() for r in receiver.poll()]
