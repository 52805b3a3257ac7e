"""benchmarks/launch_ready.sh: the benchmark scripts' wait for a launcher, run by bash."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _wait_ready(log: Path, launcher: str, seconds: int) -> int:
    script = f'source benchmarks/launch_ready.sh; {launcher} & wait_ready "{log}" $! {seconds}'
    # A wait that missed the launcher's exit would run the whole `seconds`: the timeout catches it.
    return subprocess.run(["bash", "-c", script], cwd=ROOT, timeout=20).returncode


def test_a_ready_cluster_is_seen(tmp_path) -> None:
    log = tmp_path / "launch.txt"
    assert _wait_ready(log, f"(sleep 1; echo 'pdserve ready at http://h:1/v1' > {log}; sleep 5)", 60) == 0


def test_a_launcher_that_exits_ends_the_wait_at_once(tmp_path) -> None:
    log = tmp_path / "launch.txt"
    assert _wait_ready(log, f"(echo 'RuntimeError: no Ray' > {log}; exit 1)", 600) == 1


def test_the_wait_ends_after_its_seconds(tmp_path) -> None:
    assert _wait_ready(tmp_path / "never.txt", "sleep 30", 2) == 1
