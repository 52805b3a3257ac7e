"""Admission policy: in what order waiting requests get the KV cache, and which running one gives it up.

One `RequestQueue` orders every admission an engine host makes: the scheduler's waiting sequences
(admitted into a step's token budget as blocks allow) and a decode worker's transfer admissions
(DecodeRequests waiting for room to reserve their prompt's blocks, `decode_worker/role.py`). Today's
policy is first come, first served, as vLLM's FCFS request queue: arrivals join at the back, the head
is admitted first, a preempted request goes back to the head (it was admitted before everything still
waiting), and when the cache runs out the most recently admitted running request is the victim.

A different policy (priorities, fair share by client) is a change to this file only: callers use
the verbs below and never index the queue or pick a victim themselves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RequestQueue(Generic[T]):
    """Waiting requests in admission order (FCFS). Invariant: an item is in the queue at most once
    (callers push an item only when it is not queued; `remove` takes it out wherever it is)."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()

    def push(self, item: T) -> None:
        """A new arrival (or one whose transfer failed): it waits behind everything queued."""
        self._items.append(item)

    def requeue(self, item: T) -> None:
        """A preempted request: it goes first, ahead of the requests that arrived after it."""
        self._items.appendleft(item)

    def peek(self) -> T:
        """The request admitted next (raises IndexError when the queue is empty)."""
        return self._items[0]

    def pop(self) -> T:
        """Take the request admitted next (the one `peek` returned)."""
        return self._items.popleft()

    def remove(self, item: T) -> None:
        """Take `item` out wherever it waits (aborted, finished before admission)."""
        self._items.remove(item)

    @staticmethod
    def victim(running: list[T]) -> T:
        """The running request to preempt when the cache runs out: the most recently admitted
        (`running` is in admission order), so the longest-running requests keep their progress."""
        return running[-1]

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)
