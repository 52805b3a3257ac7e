"""How Ray shows the workers' output in the launcher's log: read from the environment when `ray` is
imported, so `use_readable_ray_logs` runs before the launcher imports the Ray backend.

Ray forwards each actor's stdout/stderr to the driver (the launcher) prefixed with
"(ray actor of decode-0 pid=ACTOR_PID)". Its defaults suit an interactive terminal, not a log a
person reads later: it colours that prefix even when the output is a file, it folds lines that
differ only in numbers ("decode-1 ... ready" after "decode-0 ... ready") into a
"[repeated 3x across cluster]" summary printed seconds or a shutdown later, and it does not flush, so
a redirected log gets the workers' start-up lines in late blocks. A value the user set wins.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping


def use_readable_ray_logs(stdout_is_tty: bool, environ: MutableMapping[str, str] = os.environ) -> None:
    environ.setdefault("RAY_DEDUP_LOGS", "0")  # every worker's own line, in place
    environ.setdefault("RAY_FLUSH_DRIVER_LOGS", "1")  # each forwarded batch reaches the file at once
    if not stdout_is_tty:
        environ.setdefault("RAY_COLOR_PREFIX", "0")  # no escape codes in a file
