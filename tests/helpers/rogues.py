"""Run the rogue process (tests/helpers/rogue.py) from a test: a real separate process with real ZMQ
sockets, given the cluster's keys in its environment only when it plays the honest control."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from common.net.curve import CurveKeys

REPO_ROOT = Path(__file__).resolve().parents[2]


def _command(mode: str, addr: str, payload: bytes, keys: str, seconds: float) -> list[str]:
    args = [mode, addr, payload.hex(), "--keys", keys, "--seconds", str(seconds)]
    return [sys.executable, "-m", "tests.helpers.rogue", *args]


def _env(cluster: CurveKeys, keys: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDSERVE_CURVE")}
    if keys == "cluster":
        env.update(cluster.to_env())
    elif keys == "wrong":  # the rogue knows the cluster's public key, not its secret
        env["PDSERVE_CURVE_PUBLIC_KEY"] = cluster.public.decode()
    return env


def run_rogue(
    mode: str, addr: str, payload: bytes, cluster: CurveKeys, keys: str, seconds: float = 1.5
) -> int:
    """Run it to the end (blocking); returns its exit status (fetch: 3 = it got a reply)."""
    cmd = _command(mode, addr, payload, keys, seconds)
    return subprocess.run(cmd, env=_env(cluster, keys), cwd=REPO_ROOT, timeout=60).returncode


async def run_rogue_async(
    mode: str, addr: str, payload: bytes, cluster: CurveKeys, keys: str, seconds: float = 1.5
) -> int:
    """The same without blocking an event loop that serves the sockets under attack."""
    cmd = _command(mode, addr, payload, keys, seconds)
    proc = await asyncio.create_subprocess_exec(*cmd, env=_env(cluster, keys), cwd=REPO_ROOT)
    return await asyncio.wait_for(proc.wait(), 60)
