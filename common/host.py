"""Facts about the host a process runs on that sizing defaults read (torch-free)."""

from __future__ import annotations

import os


def host_cores() -> int:
    """Cores this process may run on (its affinity, which a container's CPU set narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
