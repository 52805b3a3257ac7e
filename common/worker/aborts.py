"""Abort memory: an Abort may overtake the request it names (the router sends it to the decode worker
while the DecodeRequest is still on its way from the prefill worker), so aborted ids are remembered
for a while and a late request with such an id is dropped instead of run for nobody."""

from __future__ import annotations

from collections import OrderedDict


class AbortBook:
    """Request ids aborted recently; entries expire after `ttl_s` and the book holds at most `capacity`."""

    def __init__(self, ttl_s: float = 120.0, capacity: int = 100_000) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._seen: OrderedDict[str, float] = OrderedDict()  # request id -> expiry, oldest first

    def remember(self, request_id: str, now: float) -> None:
        """Record an Abort (idempotent: a repeat only refreshes the expiry)."""
        self._seen.pop(request_id, None)
        self._seen[request_id] = now + self.ttl_s
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def was_aborted(self, request_id: str, now: float) -> bool:
        expiry = self._seen.get(request_id)
        return expiry is not None and expiry > now

    def expire(self, now: float) -> None:
        while self._seen:
            request_id, expiry = next(iter(self._seen.items()))
            if expiry > now:
                return
            del self._seen[request_id]

    def __len__(self) -> int:
        return len(self._seen)
