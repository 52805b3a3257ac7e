"""Waiting for background work in tests without fixed sleeps."""

from __future__ import annotations

import time


def poll_until(fn, timeout: float = 20.0):
    """`fn()`'s first truthy result, polled every 10 ms; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError("timed out")
