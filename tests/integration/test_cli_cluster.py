"""`pdserve serve` starts a real cluster on the CPU and `pdserve bench` drives it, both through the
entry point pyproject declares (as pip's generated script runs it)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.launcher import REPO_ROOT, launch, script_command

pytestmark = pytest.mark.timeout(300)


def test_pdserve_serve_then_bench(model_dir, tmp_path) -> None:
    entry = [*script_command()[1:], "serve"]
    cluster = launch(
        model_dir, tmp_path / "logs", "--prefill", "1", "--decode", "1", "--kv-transport", "tcp", entry=entry
    )
    try:
        report = tmp_path / "bench.json"
        bench = [
            *script_command(),
            "bench",
            f"--base-url={cluster.url}/v1",
            "--num-prompts=4",
            "--input-len=16",
            "--output-len=4",
            f"--json-out={report}",
        ]
        out = subprocess.run(bench, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stdout + out.stderr
        summary = json.loads(report.read_text())["summary"]
        assert summary["completed"] == 4 and not json.loads(report.read_text())["errors"]
    finally:
        assert cluster.stop() == 0, cluster.logs()
