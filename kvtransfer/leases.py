"""The sender's table of live publications: each is pinned until an ack, a receiver's error, a
cancel or the end of its lease ends it, and every end but a cancel is reported once as a `Release`.

Shared by the engine's thread (publish, cancel, poll the releases) and the sender's I/O thread
(claim, end, expire), so every access takes the table's lock.
"""

from __future__ import annotations

import queue
import threading
import time

from common.wire.kv_messages import KVFetch

from .base import Release, TransferStatus
from .publication import FetchRejected, Publication

# A served fetch keeps its blocks pinned at least this long past the receiver's own timeout, so a
# receiver still inside its deadline never reads blocks the engine has already reused.
CLAIM_GRACE_S = 5.0


class Leases:
    def __init__(self) -> None:
        self._pubs: dict[str, Publication] = {}
        self._lock = threading.Lock()  # guards _pubs
        self._released: queue.SimpleQueue[Release] = queue.SimpleQueue()

    # ---- engine thread ----------------------------------------------------------------------------

    def add(self, request_id: str, pub: Publication) -> None:
        with self._lock:
            if request_id in self._pubs:
                raise ValueError(f"request_id {request_id!r} is already published")
            self._pubs[request_id] = pub

    def remove(self, request_id: str) -> bool:
        """Forget a publication without reporting it (a cancel); False if it was not live."""
        with self._lock:
            return self._pubs.pop(request_id, None) is not None

    def poll_released(self) -> list[Release]:
        out = []
        while True:
            try:
                out.append(self._released.get_nowait())
            except queue.Empty:
                return out

    # ---- I/O thread -------------------------------------------------------------------------------

    def claim(self, req: KVFetch, layout_error: str | None) -> Publication:
        """The publication `req` names (request id and nonce), with its lease stretched over the
        receiver's deadline; a named publication whose receiver's cache layout does not match
        (`layout_error`) ends FAILED."""
        with self._lock:
            pub = self._pubs.get(req.request_id)
            if pub is None or pub.nonce != req.nonce:
                raise FetchRejected(
                    f"unknown publication {req.request_id!r} at the sender "
                    "(never published, cancelled, its lease expired, or another nonce)"
                )
            if layout_error:
                self._end_locked(req.request_id, TransferStatus.FAILED, layout_error)
                raise FetchRejected(layout_error)
            pub.xid = req.xid
            pub.deadline = max(pub.deadline, time.monotonic() + req.timeout_s + CLAIM_GRACE_S)
            return pub

    def is_live(self, request_id: str, pub: Publication) -> bool:
        """Whether `pub` is still the live publication of `request_id` (not cancelled or ended)."""
        with self._lock:
            return self._pubs.get(request_id) is pub

    def end(self, request_id: str, xid: int, status: TransferStatus, error: str | None) -> None:
        """A receiver's ack or error for fetch attempt `xid`."""
        with self._lock:
            pub = self._pubs.get(request_id)
            if pub is not None and pub.xid == xid:  # else stale, or for a request never claimed
                self._end_locked(request_id, status, error)
                return
        if xid == 0:  # a receiver that reads without claiming (ipc) gave up on this publication
            self.end_unclaimed([request_id], status, error)

    def end_unclaimed(self, request_ids: list[str], status: TransferStatus, error: str | None) -> None:
        """End publications that receivers read without a fetch (no attempt number to match)."""
        with self._lock:
            for rid in request_ids:
                pub = self._pubs.get(rid)
                if pub is not None and pub.xid is None:
                    self._end_locked(rid, status, error)

    def fail(self, request_id: str, error: str) -> None:
        with self._lock:
            if request_id in self._pubs:
                self._end_locked(request_id, TransferStatus.FAILED, error)

    def expire(self, now: float) -> None:
        with self._lock:
            expired = [(rid, p) for rid, p in self._pubs.items() if p.deadline <= now]
            for rid, pub in expired:
                error = f"lease of {pub.lease_s:g} s expired without an ack"
                self._end_locked(rid, TransferStatus.FAILED, error)

    def _end_locked(self, request_id: str, status: TransferStatus, error: str | None) -> None:
        del self._pubs[request_id]
        self._released.put(Release(request_id, status, error))
