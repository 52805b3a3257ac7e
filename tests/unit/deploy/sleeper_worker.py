"""A stand-in worker for the Ray backend tests.

    python -m tests.unit.deploy.sleeper_worker FILE [--ignore-sigterm]

Appends one JSON line (pid, CUDA_VISIBLE_DEVICES, PDSERVE_TEST_MARK, PDSERVE_TEST_SECRET, argv) to FILE per
start, so restarts show as extra lines, then sleeps until SIGTERM (exit 0), or forever with
--ignore-sigterm.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading


def main(argv: list[str]) -> int:
    path, ignore_sigterm = argv[0], "--ignore-sigterm" in argv[1:]
    done = threading.Event()
    handler = signal.SIG_IGN if ignore_sigterm else (lambda *_: done.set())
    signal.signal(signal.SIGTERM, handler)
    record = {
        "pid": os.getpid(),
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "mark": os.environ.get("PDSERVE_TEST_MARK"),
        "secret": os.environ.get("PDSERVE_TEST_SECRET"),  # a test value standing in for the CURVE keys
        "argv": argv,
    }
    with open(path, "a") as f:  # one short write per line: readers never see half a record
        f.write(json.dumps(record) + "\n")
    done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
