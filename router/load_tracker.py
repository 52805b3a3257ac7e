"""What the router itself has put on each worker since it last heard from it.

Heartbeats arrive every ~0.5 s, so a burst of requests would all see the same stale load and pile onto
one worker. The tracker closes that gap with the router's own, exact, tally:
- in flight: sequences assigned to a worker and not yet released (prefill: until its first token);
- outstanding prefill tokens: uncached prompt tokens sent to a prefill worker, until its first token;
- blocks since heartbeat: prompt blocks assigned to a decode worker since its last heartbeat (which
  does not yet reflect them).

A request a decode or mixed worker prefills itself (`--disagg`, router/disagg.py) has the same
worker as prefill_id and decode_id: it counts once in flight there, its uncached tokens count as that
worker's outstanding prefill until the first token, and its blocks as assigned since the heartbeat.

Invariant: every counter equals the sum over live assignments, so `release` is idempotent and a
request can never leave a counter negative.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass
class Assignment:
    request_id: str
    prefill_id: str
    decode_id: str
    new_prefill_tokens: int
    prompt_blocks: int
    prefill_pending: bool = True  # the prefill worker has not produced the first token yet

    @property
    def local(self) -> bool:
        """The decode-side worker prefills the prompt itself (a GenerateRequest)."""
        return self.prefill_id == self.decode_id


class LoadTracker:
    def __init__(self) -> None:
        self._assignments: dict[str, Assignment] = {}
        self._in_flight: Counter[str] = Counter()
        self._outstanding: Counter[str] = Counter()
        self._blocks_since_hb: Counter[str] = Counter()

    def assign(self, a: Assignment) -> None:
        self.release(a.request_id)
        self._assignments[a.request_id] = a
        if not a.local:
            self._in_flight[a.prefill_id] += 1
        self._outstanding[a.prefill_id] += a.new_prefill_tokens
        self._in_flight[a.decode_id] += 1
        self._blocks_since_hb[a.decode_id] += a.prompt_blocks

    def prefill_finished(self, request_id: str) -> None:
        """The first token arrived: the prefill worker's part is done."""
        a = self._assignments.get(request_id)
        if a is not None and a.prefill_pending:
            a.prefill_pending = False
            if not a.local:
                self._in_flight[a.prefill_id] -= 1
            self._outstanding[a.prefill_id] -= a.new_prefill_tokens

    def release(self, request_id: str) -> Assignment | None:
        self.prefill_finished(request_id)
        a = self._assignments.pop(request_id, None)
        if a is not None:
            self._in_flight[a.decode_id] -= 1
        return a

    def heartbeat_received(self, worker_id: str) -> None:
        self._blocks_since_hb.pop(worker_id, None)

    def get(self, request_id: str) -> Assignment | None:
        return self._assignments.get(request_id)

    def requests_on(self, worker_id: str) -> list[str]:
        """Requests that still depend on this worker (prefill ones only until their first token)."""
        return [
            a.request_id
            for a in self._assignments.values()
            if a.decode_id == worker_id or (a.prefill_id == worker_id and a.prefill_pending)
        ]

    def in_flight(self, worker_id: str) -> int:
        return self._in_flight[worker_id]

    def outstanding_prefill_tokens(self, worker_id: str) -> int:
        return self._outstanding[worker_id]

    def blocks_since_heartbeat(self, worker_id: str) -> int:
        return self._blocks_since_hb[worker_id]
