"""process_alive: a running process is alive, an exited one is not, and neither is a zombie (exited,
not yet reaped: it holds nothing, so a peer waiting on it must not wait)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from common.net.process import process_alive


def test_running_exited_and_zombie_processes():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert process_alive(proc.pid)
        proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # not reaped yet: a zombie from here on
        assert not process_alive(proc.pid)
    finally:
        proc.wait()
    assert not process_alive(proc.pid)
