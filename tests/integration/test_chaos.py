"""The chaos soak's short version (benchmarks/chaos/chaos.py): a real cluster (two router fronts + 2
prefill + 2 decode workers, default model, CPU, tcp) under ~20 s of mixed load while every kind of fault
is injected at least once (worker SIGKILL + restart, SIGSTOP/SIGCONT, a router front killed and
restarted while the other serves on, a client leaving mid-stream, dropped and delayed KV transfers).
The soak's own goals are the assertions: no request lost, every greedy answer the offline engine's, no
KV block held once the cluster is idle, every constrained (guided_choice) answer one of its choices.
The 30-minute run is in docs/reliability.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.chaos.chaos_faults import FAULT_KINDS
from tests.integration.launcher import REPO_ROOT

pytestmark = pytest.mark.timeout(600)


def test_short_chaos_soak_loses_nothing(model_dir, tmp_path) -> None:
    out = tmp_path / "chaos.json"
    soak = "benchmarks/chaos/chaos.py"
    cmd = [sys.executable, soak, "--model", model_dir, "--minutes", "0.35", "--seed", "3"]
    cmd += ["--max-tokens", "4,8", "--choice-share", "0.25"]
    cmd += ["--fault-every", "3", "--stop-max-s", "4", "--kv-drop", "0.2", "--kv-delay", "0.2"]
    cmd += ["--kv-delay-s", "1.5", "--kv-lease-s", "3", "--warmup-s", "5", "--rss-limit-pct", "50"]
    cmd += ["--json-out", str(out), "--log-dir", str(tmp_path / "logs")]
    cmd += ["--num-kvcache-blocks", "128", "--enforce-eager", "--api-servers", "2"]
    run = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=570)
    report = run.stdout + run.stderr
    print(report)
    summary = json.loads(out.read_text())
    assert (summary["lost"], summary["wrong"], summary["leaked_blocks"]) == (0, 0, 0), report
    assert not summary["not_live_at_end"], report
    assert run.returncode == 0, report
    assert summary["requests"] >= 10 and summary["greedy_checked"] >= 3, report
    assert summary["choice_checked"] >= 1, report  # a grammar request answered under the faults
    faults = summary["faults"]
    injected = [k for k in FAULT_KINDS if k != "disconnect"]
    assert all(faults.get(k, 0) + faults.get(f"skipped_{k}", 0) >= 1 for k in injected), faults
    assert sum(faults.get(k, 0) for k in ("kill_prefill", "kill_decode", "router_restart")) >= 2, faults
    assert faults.get("kv_drop", 0) + faults.get("kv_delay", 0) >= 1, faults
