"""benchmarks/engine/gc_pause.py on a tiny model, in a child process (it freezes its process's heap):
it loads and serves, reports the tracked objects, and a full collection after the freeze scans almost
nothing of what start-up left."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.integration.launcher import REPO_ROOT


def test_freezing_the_loaded_engine_leaves_full_collections_little_to_scan(tiny_model_dirs) -> None:
    argv = [sys.executable, "benchmarks/engine/gc_pause.py", "--model", tiny_model_dirs["qwen2"]]
    out = subprocess.run(
        [*argv, "--repeats", "2", "--requests", "4"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    counts = re.search(r"objects tracked: ([\d,]+); frozen: ([\d,]+)", out.stdout)
    assert counts, out.stdout
    tracked, frozen = (int(c.replace(",", "")) for c in counts.groups())
    assert tracked > 50_000 and frozen >= 0.99 * tracked  # torch's and the model's objects, frozen
    medians = [float(m) for m in re.findall(r"median\s+([\d.]+) ms", out.stdout)]
    assert len(medians) == 2 and medians[1] < medians[0] / 5, out.stdout
