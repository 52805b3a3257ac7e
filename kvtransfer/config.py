"""Transfer configuration (validated on construction, no I/O) and the `auto` transport choice."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from common.net.addresses import WILDCARD_HOSTS
from common.net.curve import CurveKeys
from common.net.transports import KV_TRANSPORT_CHOICES as TRANSPORT_CHOICES

DIST_BACKENDS = ("auto", "nccl", "gloo")


@dataclass(frozen=True)
class KVTransferConfig:
    """Settings shared by senders and receivers.

    - `host`: the interface the sender binds; its ports are always ephemeral and reported in the
      hand-offs `KVSender.publish` returns. On a receiver of the nccl transport over gloo, the
      interface gloo listens on.
    - `advertise_host`: the address written into hand-offs for peers to dial (default: `host`, or
      this machine's name when `host` is a wildcard).
    - `lease_s`: how long a publication stays pinned without an acknowledgement.
    - `fetch_timeout_s`: the default bound on one fetch, end to end.
    - `chunk_bytes`: the largest data frame of the tcp transport (allocations above ~32 MiB are fresh
      mmaps, i.e. page faults on every use).
    - `dist_backend`: the torch.distributed backend of the nccl transport ('auto': nccl for CUDA caches,
      gloo for CPU ones).
    - `poll_interval_s`: how often the I/O threads wake up to expire leases and deadlines.
    - `verify`: checksum the blocks at both ends and check each transfer's binding before reporting it
      DONE (`kvtransfer/verify.py`). Both ends must agree: a verifying receiver fails transfers from a
      sender that sends no checksums. Off only to measure what verification costs.
    - `curve`: the cluster's CURVE keys (common/net/curve.py): senders admit only receivers holding them,
      receivers authenticate with them. None: plain sockets.
    """

    transport: str = "tcp"
    host: str = "127.0.0.1"
    advertise_host: str | None = None
    fetch_timeout_s: float = 30.0
    lease_s: float = 60.0
    chunk_bytes: int = 16 << 20
    dist_backend: str = "auto"
    poll_interval_s: float = 0.05
    verify: bool = True
    curve: CurveKeys | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _choice("transport", self.transport, TRANSPORT_CHOICES)
        _choice("dist_backend", self.dist_backend, DIST_BACKENDS)
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        if self.advertise_host is not None and (
            not isinstance(self.advertise_host, str) or self.advertise_host in WILDCARD_HOSTS
        ):
            raise ValueError(f"advertise_host must be a dialable host name, got {self.advertise_host!r}")
        _positive_seconds("fetch_timeout_s", self.fetch_timeout_s)
        _positive_seconds("lease_s", self.lease_s)
        _positive_seconds("poll_interval_s", self.poll_interval_s)
        if self.curve is not None and not isinstance(self.curve, CurveKeys):
            raise ValueError("curve must be CurveKeys or None")
        if not isinstance(self.verify, bool):
            raise ValueError(f"verify must be a bool, got {self.verify!r}")
        if type(self.chunk_bytes) is not int or self.chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be a positive int, got {self.chunk_bytes!r}")


def resolve_transport(transport: str, device_type: str, same_host: bool) -> str:
    """Concrete transport for a sender/receiver pair: 'auto' means ipc on one host with CUDA caches,
    nccl across hosts with CUDA, tcp otherwise (CPU caches work only over tcp)."""
    _choice("transport", transport, TRANSPORT_CHOICES)
    _choice("device_type", device_type, ("cpu", "cuda"))
    if transport != "auto":
        return transport
    if device_type == "cuda":
        return "ipc" if same_host else "nccl"
    return "tcp"


def validate_seconds(name: str, value: object) -> str | None:
    """The error for a bad duration (used on values that arrive at runtime), or None."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return None if ok else f"{name} must be a positive finite number of seconds, got {value!r}"


def _positive_seconds(name: str, value: object) -> None:
    error = validate_seconds(name, value)
    if error:
        raise ValueError(error)


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
