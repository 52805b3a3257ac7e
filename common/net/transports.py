"""The names of the KV transports, as worker flags and the launcher offer them. The names themselves are
part of the wire contract (a `HandOff` names its transport): `common.wire.handoff.TRANSPORTS`."""

from __future__ import annotations

from common.wire.handoff import TRANSPORTS as KV_TRANSPORTS

# "auto" picks one per sender/receiver pair (kvtransfer.resolve_transport).
KV_TRANSPORT_CHOICES = ("auto", *KV_TRANSPORTS)
