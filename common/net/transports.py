"""The names of the KV transports: the one list that worker flags, the launcher and kvtransfer check."""

from __future__ import annotations

KV_TRANSPORTS = ("tcp", "ipc", "nccl")
# "auto" picks one per sender/receiver pair (kvtransfer.resolve_transport).
KV_TRANSPORT_CHOICES = ("auto", *KV_TRANSPORTS)
