"""Whether a process of this host still runs (the one rule for it: workers, transports and tests)."""

from __future__ import annotations

import os
from pathlib import Path


def process_alive(pid: int) -> bool:
    """True while `pid` runs; it may belong to another user. A zombie (exited, not yet reaped by its
    parent) counts as gone: it holds no memory, no GPU context and answers nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (not Linux), or it exited just now: trust kill(0)
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
